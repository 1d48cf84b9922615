"""The outbox's way out: :mod:`.relay` (claims, publishes, marks) and :mod:`.publishers` (where to)."""
