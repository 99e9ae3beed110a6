"""Every table, imported once so `Base.metadata` is complete (Alembic, create_all)."""

from api.artifacts.models import Artifact
from api.auth.models import ApiKey, AuditEvent, EnrollmentToken
from api.database import Base
from api.evidence.models import Evidence
from api.github.models import GitHubDelivery, PullRequest, PullRequestJob
from api.hosts.models import Host
from api.jobs.models import Job
from api.runs.models import Cell, Run, RunAttempt

__all__ = [
    "ApiKey",
    "Artifact",
    "AuditEvent",
    "Base",
    "Cell",
    "EnrollmentToken",
    "Evidence",
    "GitHubDelivery",
    "Host",
    "Job",
    "PullRequest",
    "PullRequestJob",
    "Run",
    "RunAttempt",
]
