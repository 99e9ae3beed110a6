"""hosts: models, service, router and API schemas."""
