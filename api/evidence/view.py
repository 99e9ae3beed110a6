"""A published bundle as the pages read it: `BundleView`, parsed once from the bundle's files.

A leaf of api/evidence/: the service makes views (publishing, reading a stored zip) and the
page renders them, and neither imports the other for this type. May import evidence/ alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from coldbench.evidence.bundles.bundle import bundle_records, provenances_of
from coldbench.evidence.contract.schemas import Provenance, Record
from coldbench.evidence.contract.summary_schema import Summary


@dataclass(frozen=True, eq=False)
class BundleView:
    """What the pages and the PR Markdown read of a published bundle, parsed once (hashed
    by identity: one object per cached bundle, so renderings can be cached by it)."""

    summary: Summary
    provenances: list[Provenance]
    records: list[Record]
    file_digests: dict[str, str]


def view_of_files(files: dict[str, bytes]) -> BundleView:
    """The view of a bundle's files (name -> bytes, as the zip holds them)."""
    manifest = json.loads(files["manifest.json"])
    return BundleView(
        # A summary that does not match the contract raises pydantic's ValidationError (a
        # ValueError), as a bundle that is no zip raises BundleError: callers fall back to
        # the bundle's own files.
        summary=Summary.model_validate_json(files["summary.json"]),
        provenances=provenances_of(json.loads(files["provenance.json"])),
        records=bundle_records(files),
        file_digests={name: entry["sha256"] for name, entry in manifest["files"].items()},
    )
