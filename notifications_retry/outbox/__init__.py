"""The outbox's way out: the relay and its publishers."""
