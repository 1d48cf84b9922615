"""The database's own parts.

:mod:`.locks` holds the cycle's advisory lock on a direct connection of its own; :mod:`.tcp_settings`
are libpq's TCP settings for the worker's connections; :mod:`.triggers` are the django-pgtrigger
triggers and their SQL that keep the tables' rules.
"""
