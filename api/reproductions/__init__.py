"""Reproductions of published evidence uploaded by other hosts (`coldbench reproduce --api`):
the rows, the checks an upload passes, and the hosts' section the evidence page shows. Imports
coldbench.evidence and the api's own services, never worker."""
