"""provenance.json of a run: host, software, what each variant really ran, model, job, command.

Each target names the commit it was built from and the file its engine module was imported
from as reported by the variant process itself (not what the build expected), so a reviewer
can see that `pr` really ran the branch's code.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import logging
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from coldbench.engine.adapter_traits import starts_server
from coldbench.evidence.analysis.peaks import table_peak
from coldbench.evidence.contract.canonical import sha256_hex, sha256_json
from coldbench.evidence.contract.schemas import (
    BUILTIN_CORPUS,
    CorpusInfo,
    DevicePeak,
    HostInfo,
    HostNoise,
    JobRequest,
    JobSpec,
    ModelInfo,
    ModelShape,
    Provenance,
    SoftwareInfo,
    TargetInfo,
    VariantSpec,
    default_adapter,
)
from coldbench.evidence.contract.spec_text import flag_text
from coldbench.evidence.spec.options import HostOption
from coldbench.worker.build import Build
from coldbench.worker.checkout import Checkout
from coldbench.worker.config import RepositoryConfig

log = logging.getLogger(__name__)

# Keys a variant process's `ready` line may use for the file its engine module came from.
_MODULE_FILE_KEYS = ("engine_module_file", "module_file", "mlx_lm_file", "file")


def _version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def coldbench_version() -> str | None:
    found = _version("coldbench")
    if found:
        return found
    try:  # running from a checkout that is not installed
        return str(importlib.import_module("coldbench").__version__)
    except (ImportError, AttributeError):
        return None


@functools.cache
def pip_freeze_sha256(python: str = sys.executable) -> str | None:
    """Digest of `pip freeze` of an interpreter: any package change changes it."""
    try:
        done = subprocess.run(
            [python, "-m", "pip", "freeze", "--all"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    lines = sorted(line for line in done.stdout.splitlines() if line.strip())
    return sha256_hex("\n".join(lines).encode())


def software_info() -> SoftwareInfo:
    return SoftwareInfo(
        python=platform.python_version(),
        mlx=_version("mlx"),
        mlx_lm=_version("mlx-lm"),
        coldbench=coldbench_version(),
        pip_freeze_sha256=pip_freeze_sha256(sys.executable),
        python_executable=sys.executable,
    )


def module_file_of(ready_target: Mapping[str, Any] | None) -> str | None:
    for key in _MODULE_FILE_KEYS:
        value = (ready_target or {}).get(key)
        if isinstance(value, str) and value:
            return value
    return None


def target_info(
    variant: VariantSpec,
    *,
    adapter: str,
    ready_target: Mapping[str, Any] | None,
    checkout: Checkout | None = None,
    build: Build | None = None,
) -> TargetInfo:
    """What one variant ran: its code (repository, commit, build) and what the process saw."""
    ready = dict(ready_target or {})
    info = TargetInfo(
        variant=variant.name,
        adapter=adapter,  # type: ignore[arg-type]
        flags=dict(variant.flags),
        engine_module_file=module_file_of(ready),
        software=ready.get("software") if isinstance(ready.get("software"), dict) else None,
        ready=ready,
    )
    if checkout is not None:
        info.repository = checkout.url
        info.ref = checkout.ref
        info.commit = checkout.commit
        info.source_dirty = checkout.source_dirty  # type: ignore[attr-defined]
        info.checkout = str(checkout.path)  # type: ignore[attr-defined]
    if build is not None:
        info.recipe = build.recipe
        info.build_command = list(build.command)
        info.build_log_sha256 = build.log_sha256
        info.native_modules = dict(build.native_modules)
        info.dirty = build.dirty
        info.diff_sha256 = build.diff_sha256
        info.build_python = build.python  # type: ignore[attr-defined]
        # What the build venv holds on top of the host's packages (the checkout's install).
        info.pip_freeze_sha256 = pip_freeze_sha256(build.python)  # type: ignore[attr-defined]
        info.build_cached = build.cached  # type: ignore[attr-defined]
        # The build checked its import path; the variant process reports its own. Both must
        # lie inside the checkout, and the evidence keeps both.
        info.build_module_file = build.engine_module_file  # type: ignore[attr-defined]
    return info


def model_info(name: str, path: Path) -> ModelInfo:
    from coldbench.engine.checkpoints import inspect_checkpoint

    inspected = inspect_checkpoint(path)
    return ModelInfo(
        name=name,
        path=str(path),
        architecture=inspected.get("architecture"),
        parameters=inspected.get("parameters"),
        quantization=inspected.get("quantization"),
        config_sha256=inspected.get("config_sha256"),
        weights_sha256=inspected.get("weights_sha256"),
        tokenizer_sha256=inspected.get("tokenizer_sha256"),
        dtype=inspected.get("dtype"),
        shape=ModelShape.from_config(json.loads((path / "config.json").read_text())),
    )


def device_peak(host: HostInfo, python: str = sys.executable) -> DevicePeak | None:
    """The peak FLOP rate of the device the cells ran on: the chip table's
    (evidence/analysis/peaks.py), or on a CPU host a short matmul measured now in a child
    interpreter (engine/peak.py), so the orchestrator never imports MLX. None when neither applies
    or the measurement fails."""
    from coldbench.worker.variants import child_env

    found = table_peak(host)
    if found is not None or host.backend != "cpu":
        return found
    try:
        done = subprocess.run(
            [python, "-m", "coldbench.engine.peak"],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        value = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("tflops"), float):
        log.warning("the CPU's peak could not be measured")
        return None
    return DevicePeak(
        device=f"CPU: {host.cpu or 'unknown'}",
        tflops=value["tflops"],
        dtype=str(value.get("dtype")),
        source=f"measured on this host: {value.get('method')}",
        measured=True,
    )


def corpus_info(name: str, path: Path | None) -> CorpusInfo:
    """The corpus a run's prompts come from: the built-in one's pinned digest, or the sha256 of
    the host's file as it is now (each record also carries the digest its process read)."""
    from coldbench.engine.corpus import corpus_sha256
    from coldbench.engine.prompts import PROMPT_VERSION

    if name == BUILTIN_CORPUS or path is None:
        return CorpusInfo(sha256=corpus_sha256(), prompt_version=PROMPT_VERSION)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return CorpusInfo(
        name=name, sha256=digest.hexdigest(), source="host", prompt_version=PROMPT_VERSION
    )


def job_spec_sha256(spec: JobSpec) -> str:
    return sha256_json(spec.model_dump(mode="json", by_alias=True))


def _variant_arguments(spec: JobSpec) -> list[str]:
    """`--variant` options, or for a history, a bisection and a commits job the commits their
    way (those modes take one configuration and refuse refs in `--variant`): a history's
    commits as `--commits`, a bisection step's stretch as `--good`/`--bad` (what is left to
    search), a commits job's line as `--base`/`--head` (its resolved ends)."""
    if spec.mode not in ("history", "bisect", "commits"):
        return [arg for v in spec.variants for arg in ("--variant", _variant_option(v))]
    template = _variant_option(spec.variants[0].model_copy(update={"ref": None}))
    argv = ["--variant", template]
    if spec.commits is not None:
        ends = spec.commits.line
        base, head = (ends[0], ends[-1]) if ends else (spec.commits.base, spec.commits.head)
        return [*argv, "--base", base, "--head", head, *(["--alone"] if spec.commits.alone else [])]
    if spec.bisect is not None:
        line = spec.bisect.line
        good, bad = (line[0], line[-1]) if line else (spec.bisect.good, spec.bisect.bad)
        return [*argv, "--good", good, "--bad", bad, "--direction", spec.bisect.direction]
    if spec.needs_host_resolution and spec.history is not None:
        argv += ["--range", spec.history.range]
        argv += ["--every", str(spec.history.every)] if spec.history.every else []
        return argv + (["--last", str(spec.history.last)] if spec.history.last else [])
    return [*argv, "--commits", ",".join(v.ref or "" for v in spec.variants)]


def _variant_option(variant: VariantSpec) -> str:
    pairs = []
    if variant.ref is not None:
        pairs.append(f"ref={variant.ref}")
    if variant.recipe is not None:
        pairs.append(f"recipe={variant.recipe}")
    pairs += [flag_text(k, v) for k, v in variant.flags.items()]
    return variant.name + (":" + ",".join(pairs) if pairs else "")


def option_toml(declaration: HostOption) -> str:
    """An option declaration as the inline TOML table `coldbench run --option` reads."""
    items = []
    for key, value in declaration.model_dump(exclude_none=True).items():
        if key == "env":
            if not value:
                continue
            text = "{" + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
            items.append(f"{key} = {text}}}")
        elif key == "argv" and not value:
            continue
        else:
            items.append(f"{key} = {json.dumps(list(value) if key == 'argv' else value)}")
    return "{" + ", ".join(items) + "}"


def server_arguments(repository: RepositoryConfig) -> list[str]:
    """The `coldbench run` arguments that declare a server repository as worker.toml did."""
    argv = ["--server-command", shlex.join(repository.server_command or ())]
    for name, declaration in sorted(repository.options.items()):
        argv += ["--option", f"{name}={option_toml(declaration)}"]
    for path in repository.wipe:
        argv += ["--wipe", path]
    argv += ["--first-token-timeout-s", f"{repository.first_token_timeout_s:g}"]
    return argv


def reproduce_command(
    spec: JobSpec,
    *,
    repository_url: str | None = None,
    repository: RepositoryConfig | None = None,
    commits: Mapping[str, str] | None = None,
    local_arguments: Mapping[str, str] | None = None,
) -> str:
    """The `coldbench run` line that repeats this run's plan on one machine: each variant at
    the commit it measured (`commits`: variant name -> commit, where the ref was a branch or a
    tag that may have moved since), and no `--out`, so every repetition writes a new folder
    (`coldbench run`'s default is named after the time). `local_arguments` replace `--model`
    and `--corpus` where the run named a folder or a file of this machine; a residency the job
    asked for (not `auto`), `--until rounds` and a time budget are repeated."""
    if repository is not None:
        repository_url = repository.url
    local = dict(local_arguments or {})
    if commits:
        spec = spec.model_copy(
            update={
                "variants": [
                    variant.model_copy(update={"ref": commits.get(variant.name, variant.ref)})
                    if variant.ref is not None
                    else variant
                    for variant in spec.variants
                ]
            }
        )
    argv = [
        "coldbench",
        "run",
        "--model",
        local.get("--model", spec.model),
        "--contexts",
        ",".join(str(c) for c in spec.contexts),
        "--rounds",
        str(spec.rounds),
        "--decode-tokens",
        str(spec.decode_tokens),
        "--seed",
        str(spec.seed),
        "--mode",
        spec.mode,
    ]
    if spec.features:
        argv += ["--features", ",".join(spec.features)]
    if spec.corpus != BUILTIN_CORPUS:
        argv += ["--corpus", local.get("--corpus", f"{spec.corpus}=CORPUS_FILE")]
    if repository_url:
        argv += ["--repo", repository_url]
    # `--repo` alone means an mlx-lm checkout, no `--repo` the embedded engine.
    if spec.adapter != default_adapter(repository_url):
        argv += ["--adapter", spec.adapter]
    if repository is not None and starts_server(repository.adapter):
        argv += server_arguments(repository)
    argv += _variant_arguments(spec)
    if spec.fresh_process:
        argv.append("--fresh-process")
    if spec.rounds_per_process is not None:
        argv += ["--rounds-per-process", str(spec.rounds_per_process)]
    # Options the command line would otherwise take at a default other than the job's.
    asked = JobRequest.model_fields
    if spec.precision != asked["precision"].default:
        argv += ["--precision", str(spec.precision)]
    if spec.until != asked["until"].default:
        argv += ["--until", spec.until]
    if spec.budget_minutes is not None:
        argv += ["--budget-minutes", f"{spec.budget_minutes:g}"]
    if spec.residency != "auto":
        argv += ["--residency", spec.residency]
    return shlex.join(argv)


def run_provenance(
    *,
    run_id: str,
    host: HostInfo,
    software: SoftwareInfo,
    targets: Sequence[TargetInfo],
    model: ModelInfo,
    spec: JobSpec | None,
    command: str,
    labels: Sequence[str] = (),
    corpus: CorpusInfo | None = None,
    noise: HostNoise | None = None,
    peak: DevicePeak | None = None,
) -> Provenance:
    if labels:
        # The labels the run was matched by belong to the host as it was then.
        host = host.model_copy(update={"labels": list(labels)})
    return Provenance(
        run_id=run_id,
        created_at=datetime.now(UTC),
        host=host,
        software=software,
        targets=list(targets),
        model=model,
        job_spec_sha256=job_spec_sha256(spec) if spec is not None else None,
        command=command,
        corpus=corpus,
        noise=noise,
        device_peak=peak,
    )
