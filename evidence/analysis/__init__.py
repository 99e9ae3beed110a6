"""evidence.analysis: everything computed from validated records, assembled into summary.json.

Owns the paired statistics and every verdict rule (`stats`), the hosts' agreement
(`agreement`), the sections (`ablation`, `bisect`, `builds`, `canary`, `commits`, `drift`,
`history`, `parity`, `peak` with the chips' table `peaks`, `reproduction`, `telemetry`) and the
one assembly of a `Summary` (`summary`).

May import: evidence.contract, numpy, scipy, ruptures and the standard library; never the spec,
rendering or bundles rooms.
"""
