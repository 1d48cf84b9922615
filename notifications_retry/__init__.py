"""notifications_retry: a PostgreSQL-backed retry worker for Django notifications."""

__version__ = "0.1.0"
