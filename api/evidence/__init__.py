"""evidence: models, service, router and API schemas."""
