"""jobs: models, service, router and API schemas."""
