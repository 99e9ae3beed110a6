"""artifacts: models, service, router and API schemas."""
