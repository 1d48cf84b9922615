"""Logs, masking, metrics, tracing and liveness: how the app is seen from outside."""
