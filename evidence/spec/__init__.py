"""evidence.spec: what a person asks for, and how it becomes a `JobSpec`.

Owns the job options declared once, the one builder from them to a request and the one resolver
of a request to the spec that runs (`job_options`: every front end's options, defaults per mode,
every problem in one pass, the rounds a job leaves out), the flags each
adapter's engine takes (`engine_flags`, checked at submit), host-declared server options
(`options`) and the specs a host resolves from its mirror (`resolution`: a history's range, a
bisection's step, a commits job's base..head).

May import: evidence.contract, evidence.analysis (the verdict rule's units, the modes' step
specs), typer (the options' declarations), pydantic and the standard library; never the
rendering or bundles rooms.
"""
