"""runs: models, service, router and API schemas."""
