"""The `portable-spec` command line (top layer)."""

from .main import main

__all__ = ["main"]
