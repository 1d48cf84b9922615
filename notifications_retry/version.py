"""The package's version: its one home (pyproject.toml reads it; the webhook's User-Agent names it)."""

__version__ = "0.2.0"
