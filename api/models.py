"""Every table, imported once so `Base.metadata` is complete (Alembic, create_all)."""

from coldbench.api.artifacts.models import Artifact
from coldbench.api.auth.models import ApiKey, AuditEvent, EnrollmentToken
from coldbench.api.database import Base
from coldbench.api.evidence.models import Evidence
from coldbench.api.github.models import GitHubDelivery, PullRequest, PullRequestJob
from coldbench.api.hosts.models import Host
from coldbench.api.jobs.models import Job
from coldbench.api.reproductions.models import EvidenceReproduction
from coldbench.api.runs.models import Cell, Run, RunAttempt

__all__ = [
    "ApiKey",
    "Artifact",
    "AuditEvent",
    "Base",
    "Cell",
    "EnrollmentToken",
    "Evidence",
    "EvidenceReproduction",
    "GitHubDelivery",
    "Host",
    "Job",
    "PullRequest",
    "PullRequestJob",
    "Run",
    "RunAttempt",
]
