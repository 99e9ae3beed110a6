"""github: pull requests asking for evidence and getting it on the pull request.

Webhook deliveries (signature checked before parsing, de-duplicated by id), `/coldbench`
commands and labels turned into jobs on the pull request's pinned base and head commits, and
the answer: one comment edited in place and a commit status or check run per job. Models,
service (asking), answer (answering), comment, router, Celery tasks, the GitHub client
(gidgethub) and the per-repository configuration.
"""
