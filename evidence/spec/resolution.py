"""Specs a host resolves: a history's range, a bisection's good..bad and a commits job's
base..head name refs that only the host's mirror can turn into commits, so the submitted spec
carries one variant without a ref (`JobSpec.needs_host_resolution`) and the host runs the spec
it resolved. The server accepts that spec only if it is exactly what the one rule builds from
the commits it names (`history_spec`, `step_spec`, `commits_spec`): a host chooses commits,
never anything else of the job.
"""

from __future__ import annotations

import re

from coldbench.evidence.analysis.bisect import step_spec
from coldbench.evidence.analysis.commits import commits_spec
from coldbench.evidence.analysis.history import history_spec
from coldbench.evidence.contract.schemas import JobSpec

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def resolution_problem(submitted: JobSpec, resolved: JobSpec) -> str | None:
    """None when `resolved` is a resolution of `submitted`; else what is wrong, in one line."""
    if not submitted.needs_host_resolution:
        return None if resolved == submitted else "the spec the host ran is not the job's"
    if resolved.needs_host_resolution or resolved.mode != submitted.mode:
        return "the host did not resolve the job's commits"
    refs = [v.ref or "" for v in resolved.variants]
    if not all(_COMMIT.fullmatch(ref) for ref in refs):
        return "the host resolved refs to something other than full commit ids"
    if submitted.mode == "history":
        reference, *commits = refs
        if not commits:
            return "the host resolved the range to no commit"
        try:
            expected = history_spec(submitted, reference, commits)
        except ValueError as error:
            return f"the resolved commits do not make a history: {str(error).splitlines()[0]}"
    elif submitted.mode == "commits":
        if resolved.commits is None or resolved.commits.line is None:
            return "the host did not resolve base..head to a line of commits"
        try:
            expected = commits_spec(submitted, resolved.commits.line)
        except ValueError as error:
            return f"the resolved commits do not make a commits job: {str(error).splitlines()[0]}"
    else:
        if resolved.bisect is None or resolved.bisect.line is None:
            return "the host did not resolve good..bad to a line of commits"
        expected = step_spec(submitted, resolved.bisect.line, [])
    if resolved != expected:
        return "the spec the host ran differs from the job's in more than its commits"
    return None
