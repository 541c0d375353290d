"""The `portable-spec` command line (top layer)."""

from portable_spec.cli.main import main

__all__ = ["main"]
