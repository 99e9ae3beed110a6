"""One job measured on several hosts, from their bundles: `coldbench compare A B [C...]`.

Each source is a bundle (folder or zip) or an evidence URL (`https://.../e/<id>`, whose zip is
fetched and must be that evidence). A bundle of one run is one host; a bundle of several runs
(a job that asked for several hosts) is each of its runs. Every bundle must be intact.

Hosts are compared only when they measured the same job: the job spec with each variant's ref
pinned to the commit it measured (`pinned_spec`: a branch may have moved since), the model's
digests and the prompts' digest (`job_identity`). Otherwise the comparison is refused naming
what differs. Per comparison (context, variant against the baseline) each host's ratio and
interval sit side by side with the test of their difference (coldbench.evidence.analysis.agreement),
and each host's fingerprint, software and MLX build beside them.

May import: the layers below (`bundle`, `markdown`, `agreement`, ...), httpx (an evidence
URL's zip), the standard library.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from coldbench.evidence.analysis.agreement import HostResult, Outcome, host_agreement
from coldbench.evidence.analysis.reproduction import host_result
from coldbench.evidence.analysis.summary import host_names
from coldbench.evidence.bundles.bundle import (
    JOB_FILE,
    PROVENANCE_FILE,
    SUMMARY_JSON_FILE,
    BundleError,
    provenances_of,
    read_bundle,
    read_zip,
    summary_of,
    verify_files,
)
from coldbench.evidence.contract.canonical import sha256_json
from coldbench.evidence.contract.schemas import JobSpec, Provenance
from coldbench.evidence.contract.summary_schema import Summary, Verdict, first_difference
from coldbench.evidence.contract.variant import baseline_name
from coldbench.evidence.rendering.markdown import reproduction_machines

EVIDENCE_URL = re.compile(r"^(https?://[^\s?#]+)/e/([0-9a-f]{16,64})(?:\.(?:zip|html|md|json))?/?$")
REPRODUCES_FILE = "reproduces.json"
# an evidence zip is a few MB (report.html inlines plotly.js); refuse what is far beyond
MAX_FETCH_BYTES = 512 << 20


class CompareError(ValueError):
    """A source that cannot be compared: unreadable, altered, or another job."""


@dataclass(frozen=True)
class Source:
    """A bundle's files, where they came from, and the evidence id they must be."""

    name: str
    files: dict[str, bytes]
    expect: str | None = None


@dataclass
class HostRun:
    """One host's run of the job, as the comparison reads it."""

    label: str
    source: str
    evidence_id: str
    provenance: Provenance
    spec: JobSpec
    results: dict[tuple[int, str], tuple[HostResult, Verdict]] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    context_tokens: int
    variant: str
    baseline: str
    hosts: list[tuple[str, HostResult, Verdict]]
    outcome: Outcome


@dataclass(frozen=True)
class HostComparison:
    hosts: list[HostRun]
    rows: list[Row]
    identity_sha256: str

    @property
    def disagreements(self) -> list[Row]:
        return [row for row in self.rows if row.outcome.agree is False]


def fetch_evidence(url: str, *, timeout_s: float = 60.0) -> Source:
    """The zip of an evidence URL (`<base>/e/<id>`), checked to be that evidence later."""
    import httpx

    found = EVIDENCE_URL.fullmatch(url)
    if found is None:
        raise CompareError(f"{url}: not an evidence URL (https://HOST/e/<id>)")
    base, evidence_id = found.groups()
    zip_url = f"{base}/e/{evidence_id}.zip"
    try:
        with httpx.stream("GET", zip_url, timeout=timeout_s, follow_redirects=True) as response:
            if response.status_code != 200:
                raise CompareError(f"{zip_url}: HTTP {response.status_code}")
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_FETCH_BYTES:
                    raise CompareError(f"{zip_url}: larger than {MAX_FETCH_BYTES} bytes")
                chunks.append(chunk)
    except httpx.HTTPError as error:
        raise CompareError(f"{zip_url}: {error}") from None
    try:
        files = read_zip(b"".join(chunks))
    except BundleError as error:
        raise CompareError(f"{zip_url}: {error}") from None
    return Source(name=url, files=files, expect=evidence_id)


def load_source(source: str) -> Source:
    """A bundle folder, zip or evidence URL as its files; CompareError saying why not."""
    if re.match(r"^https?://", source):
        return fetch_evidence(source)
    try:
        return Source(name=source, files=read_bundle(Path(source)))
    except BundleError as error:
        raise CompareError(f"{source}: {error}") from None


def checked(source: Source) -> tuple[str, Summary, list[Provenance], JobSpec]:
    """(evidence id, summary, provenances, job spec) of an intact bundle; CompareError naming
    the first problem of one that is not, or lacks what a comparison needs."""
    verification = verify_files(source.files)
    if not verification.is_intact:
        raise CompareError(f"{source.name}: not intact: {verification.problems[0]}")
    assert verification.evidence_id is not None
    if source.expect is not None and verification.evidence_id != source.expect:
        raise CompareError(
            f"{source.name}: the bundle served is evidence {verification.evidence_id}, "
            f"not {source.expect}"
        )
    for name in (JOB_FILE, SUMMARY_JSON_FILE):
        if name not in source.files:
            raise CompareError(f"{source.name}: no {name} (a bundle of a run that measured)")
    summary, problem = summary_of(source.files[SUMMARY_JSON_FILE])
    if summary is None:
        raise CompareError(f"{source.name}: {problem}")
    spec = JobSpec.model_validate_json(source.files[JOB_FILE])
    provenances = provenances_of(json.loads(source.files[PROVENANCE_FILE]))
    return verification.evidence_id, summary, provenances, spec


def pinned_spec(spec: JobSpec, provenance: Provenance) -> JobSpec:
    """The job as measured: each variant's ref replaced by the commit its target ran (a
    branch or tag may have moved since); a variant without a commit (the embedded engine, an
    installed server) keeps its spec."""
    commits = {t.variant: t.commit for t in provenance.targets if t.commit}
    return spec.model_copy(
        update={
            "variants": [
                variant.model_copy(update={"ref": commits[variant.name]})
                if variant.ref is not None and variant.name in commits
                else variant
                for variant in spec.variants
            ]
        }
    )


def job_identity(spec: JobSpec, provenance: Provenance) -> dict[str, Any]:
    """What makes two runs the same job: the pinned spec, the model's digests, the prompts'."""
    model = provenance.model
    corpus = provenance.corpus
    return {
        "job": pinned_spec(spec, provenance).model_dump(mode="json", by_alias=True),
        "model": {
            "config_sha256": model.config_sha256,
            "weights_sha256": model.weights_sha256,
            "tokenizer_sha256": model.tokenizer_sha256,
        },
        "prompts": None
        if corpus is None
        else {"sha256": corpus.sha256, "prompt_version": corpus.prompt_version},
    }


def _value_at(document: Any, path: str) -> Any:
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path.split(" (")[0]):
        if part.startswith("["):
            index = int(part[1:-1])
            document = document[index] if isinstance(document, list) else None
        else:
            document = document.get(part) if isinstance(document, dict) else None
    return document


def identity_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """Where two jobs differ, with both values: `job.variants[1].ref: abc... vs def...`."""
    where = first_difference(dict(a), dict(b))
    if where is None:
        return None
    left, right = _value_at(a, where), _value_at(b, where)
    return f"{where}: {json.dumps(left)[:80]} vs {json.dumps(right)[:80]}"


def host_runs(source: Source) -> list[HostRun]:
    """The hosts of one bundle: its run, or each of its runs (a job of several hosts)."""
    evidence_id, summary, provenances, spec = checked(source)
    names = host_names(provenances)
    hosts = []
    if summary.reproductions is None:
        provenance = provenances[0]  # provenances_of: at least one
        host = HostRun(names[provenance.run_id], source.name, evidence_id, provenance, spec)
        for c in summary.comparisons:
            result = HostResult(
                host.label,
                c.ratio_median,
                c.ci_low,
                c.ci_high,
                c.ci_level,
                interval_level=c.interval_level,
                units=c.blocks or c.n,
            )
            host.results[(c.context_tokens, c.variant)] = (result, c.verdict)
        return [host]
    # the section's runs are in the order of the records' first appearance
    by_run = {p.run_id: p for p in provenances}
    order = [run.run_id for run in summary.reproductions.comparisons[0].runs]
    for position, provenance in enumerate(by_run[run_id] for run_id in order):
        host = HostRun(names[provenance.run_id], source.name, evidence_id, provenance, spec)
        for row in summary.reproductions.comparisons:
            run = row.runs[position]
            result = dataclasses.replace(host_result(run), host=host.label)
            host.results[(row.context_tokens, row.variant)] = (result, run.verdict)
        hosts.append(host)
    return hosts


def compare_hosts(hosts: Sequence[HostRun]) -> HostComparison:
    """The hosts' results side by side and their agreement; CompareError where they are not
    one job (saying what differs) or fewer than two."""
    if len(hosts) < 2:
        raise CompareError("give at least two hosts' bundles (or a bundle of several runs)")
    labels = [h.label for h in hosts]
    for position, host in enumerate(hosts):
        if labels.count(host.label) > 1:
            # one machine's runs (or machines sharing a hostname): told apart by evidence
            host.label = f"{host.label} ({host.evidence_id[:8]})"
            if [h.label for h in hosts].count(host.label) > 1:
                host.label = f"{host.label} #{position + 1}"
    reference = job_identity(hosts[0].spec, hosts[0].provenance)
    for host in hosts[1:]:
        difference = identity_difference(reference, job_identity(host.spec, host.provenance))
        if difference is not None:
            raise CompareError(
                f"{hosts[0].source} and {host.source} are different jobs (spec digests "
                f"{sha256_json(reference)[:12]} and "
                f"{sha256_json(job_identity(host.spec, host.provenance))[:12]}): {difference}"
            )
    keys = [key for key in hosts[0].results if all(key in h.results for h in hosts)]
    baseline = baseline_name(hosts[0].spec)
    drafts = [[(h.label, *_relabelled(h.results[key], h.label)) for h in hosts] for key in keys]
    outcomes = host_agreement([[result for _, result, _ in draft] for draft in drafts])
    rows = [
        Row(key[0], key[1], baseline, draft, outcome)
        for key, draft, outcome in zip(keys, drafts, outcomes, strict=True)
    ]
    return HostComparison(hosts=list(hosts), rows=rows, identity_sha256=sha256_json(reference))


def _relabelled(found: tuple[HostResult, Verdict], label: str) -> tuple[HostResult, Verdict]:
    result, verdict = found
    return dataclasses.replace(result, host=label), verdict


def interval_text(result: HostResult) -> str:
    if result.ratio_median is None:
        return "-"
    if result.ci_low is None or result.ci_high is None:
        return f"{result.ratio_median:.3f}"
    level = f" ({100 * result.ci_level:.4g}% interval)" if result.ci_level else ""
    return f"{result.ratio_median:.3f} [{result.ci_low:.3f}, {result.ci_high:.3f}]{level}"


def comparison_lines(comparison: HostComparison) -> list[str]:
    """What `coldbench compare` prints: the job, each host, each comparison's agreement."""
    hosts = comparison.hosts
    lines = [
        f"job {comparison.identity_sha256[:12]}: the same spec, commits, model and prompts "
        f"on {len(hosts)} hosts",
    ]
    for host, machine in zip(
        hosts, reproduction_machines([h.provenance for h in hosts]), strict=True
    ):
        lines.append(f"- {host.label}: evidence {host.evidence_id}; {machine}")
    width = max(len(h.label) for h in hosts)
    for row in comparison.rows:
        lines += ["", f"{row.variant} / {row.baseline} at {row.context_tokens} tokens:"]
        for label, result, verdict in row.hosts:
            lines.append(f"  {label.ljust(width)}  {interval_text(result)}  {verdict}")
        lines.append(f"  {row.outcome.statement}")
        if row.outcome.test is not None:
            lines.append(f"  ({row.outcome.test.detail})")
    disagree = comparison.disagreements
    tested = [row for row in comparison.rows if row.outcome.agree is not None]
    lines.append("")
    if disagree:
        where = ", ".join(f"{r.variant} @ {r.context_tokens}" for r in disagree)
        lines.append(f"hosts disagree at {len(disagree)} of {len(comparison.rows)}: {where}")
    elif tested:
        lines.append(
            f"hosts agree at every comparison tested ({len(tested)} of {len(comparison.rows)})"
        )
    else:
        lines.append("nothing tested: no comparison has a 95% interval on every host")
    return lines


def host_run_document(host: HostRun) -> dict[str, Any]:
    """A host's run as a service keeps it (canonical JSON values): enough to set it beside
    other hosts again without its bundle."""
    return {
        "label": host.label,
        "evidence_id": host.evidence_id,
        "provenance": host.provenance.model_dump(mode="json", by_alias=True),
        "spec": host.spec.model_dump(mode="json", by_alias=True),
        "results": [
            {
                "context_tokens": context,
                "variant": variant,
                "verdict": str(verdict),
                **dataclasses.asdict(result),
            }
            for (context, variant), (result, verdict) in host.results.items()
        ],
    }


def host_run_of(document: Mapping[str, Any]) -> HostRun:
    """Inverse of `host_run_document`."""
    host = HostRun(
        label=document["label"],
        source=f"evidence {document['evidence_id']}",
        evidence_id=document["evidence_id"],
        provenance=Provenance.model_validate(document["provenance"]),
        spec=JobSpec.model_validate(document["spec"]),
    )
    fields = {f.name for f in dataclasses.fields(HostResult)}
    for entry in document["results"]:
        result = HostResult(**{k: v for k, v in entry.items() if k in fields})
        host.results[(entry["context_tokens"], entry["variant"])] = (
            result,
            cast(Verdict, entry["verdict"]),
        )
    return host


def comparison_markdown(comparison: HostComparison) -> list[str]:
    """The hosts' section of a page or PR Markdown: per comparison each host's ratio and
    verdict, the agreement statement and its test, the rule, and each host's machine."""
    from coldbench.evidence.analysis.agreement import RULE
    from coldbench.evidence.rendering.escaping import escape_html, md_text

    hosts = comparison.hosts
    header = ["context", "variant", *(md_text(h.label) for h in hosts), "hosts", "test"]
    lines = [
        "### Reproduced on other hosts",
        "",
        f"The same job (spec digest `{comparison.identity_sha256[:12]}`: spec, commits, model "
        f"and prompts) on {len(hosts)} hosts.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in comparison.rows:
        cells = [f"{interval_text(result)} {verdict}" for _, result, verdict in row.hosts]
        statement = md_text(row.outcome.statement)
        if row.outcome.agree is False:
            statement = f"**{statement}**"
        detail = md_text(row.outcome.test.detail) if row.outcome.test else "-"
        lines.append(
            "| "
            + " | ".join([str(row.context_tokens), md_text(row.variant), *cells, statement, detail])
            + " |"
        )
    lines += ["", f"Agreement: {md_text(RULE)}.", ""]
    machines = reproduction_machines([h.provenance for h in hosts])
    for host, machine in zip(hosts, machines, strict=True):
        lines.append(f"- evidence `{host.evidence_id}`: {machine}")
    return [escape_html(line) for line in lines]
