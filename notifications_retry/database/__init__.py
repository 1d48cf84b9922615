"""The database's own parts.

:mod:`.locks` holds the advisory locks a worker holds on a direct connection of its own (the lane's
lock, or its share of the lane's partitions) and how long a held lock can be trusted;
:mod:`.tcp_settings` are libpq's TCP settings for the worker's connections; :mod:`.triggers` are the
django-pgtrigger triggers and their SQL that keep the tables' rules.
"""
