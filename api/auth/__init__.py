"""auth: models, service, router and API schemas."""
