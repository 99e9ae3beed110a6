"""Evidence rows and the rendered files they point to in the artifact store."""

from __future__ import annotations

import re

from sqlalchemy.orm import Session

from api.errors import NotFound
from api.evidence.models import Evidence

EVIDENCE_ID = re.compile(r"^[0-9a-f]{16,64}$")

# URL suffix -> (file in the evidence row, media type)
EVIDENCE_FILES = {
    "": ("report.html", "text/html; charset=utf-8"),
    ".md": ("summary.md", "text/markdown; charset=utf-8"),
    ".json": ("summary.json", "application/json"),
    ".zip": ("bundle.zip", "application/zip"),
}


def get_evidence(*, db_session: Session, evidence_id: str) -> Evidence:
    if not EVIDENCE_ID.fullmatch(evidence_id):
        raise NotFound(f"no evidence {evidence_id!r}")
    row = db_session.get(Evidence, evidence_id)
    if row is None:
        raise NotFound(f"no evidence {evidence_id!r}")
    return row


def split_evidence_path(path: str) -> tuple[str, str]:
    """`abc.md` -> ("abc", ".md"); `abc` -> ("abc", "")."""
    for suffix in (".md", ".json", ".zip", ".html"):
        if path.endswith(suffix):
            return path.removesuffix(suffix), "" if suffix == ".html" else suffix
    return path, ""
