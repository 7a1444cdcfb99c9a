"""The OpenAI-compatible HTTP API (Starlette): see :func:`create_app`."""

from servehall.api.app import create_app

__all__ = ["create_app"]
