"""The ASGI app built from the environment's settings (`uvicorn api.main:app`)."""

from api.app import create_app

app = create_app()
