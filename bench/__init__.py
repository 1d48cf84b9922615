"""The throughput benchmark (``make bench``): not part of the default test run."""
