"""``python -m bench.log_event``: what the per-record log event costs the worker, in µs per record.

Reports outcomes through :class:`~notifications_retry.engine.reporting.OutcomeReporter` (counters,
the ``item-sent`` event with its masking, the renderer) with each logging pipeline of
:func:`bench.settings.configure_logging`, writing to ``/dev/null``. No database is used.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

#: Outcomes reported together, as a claim of the worker's default size settles them.
CLAIM_ROWS = 500


def measure(pipeline: str, records: int) -> float:
    """Microseconds per reported outcome through ``pipeline`` (``native`` or ``stdlib``)."""
    import structlog

    from bench.settings import configure_logging
    from notifications_retry.engine.reporting import OutcomeReporter, TickStats
    from notifications_retry.rules.outcomes import SENT, ClaimedRecord, Outcome

    configure_logging(pipeline)
    reporter = OutcomeReporter({1: "hook"})
    bound = structlog.get_logger("notifications_retry.worker").bind(
        job_run_id=uuid.uuid4().hex, lane="default"
    )
    reporter.begin_tick(TickStats(run_id="bench"), bound)
    outcomes = [
        Outcome(
            ClaimedRecord(
                id=uuid.uuid4(),
                tenant_id=None,
                channel_id=1,
                recipient="ana@example.com",
                payload={"text": "hi"},
                notification_type="transactional",
                priority=5,
                status="pending",
                attempts=1,
                expires_at=None,
                correlation_id=f"req-{n}",
                requeue_count=0,
                claim_token=None,
            ),
            SENT,
            provider_message_id="m-1",
            duration_ms=20.5,
        )
        for n in range(records)
    ]
    started = time.perf_counter()
    for start in range(0, records, CLAIM_ROWS):  # the worker reports a claim's outcomes together
        reporter.record_all(outcomes[start : start + CLAIM_ROWS])
    return (time.perf_counter() - started) * 1e6 / records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    import django

    django.setup()
    for pipeline in ("native", "stdlib"):
        print(f"{pipeline} logging: {measure(pipeline, args.records):.1f} µs per record event")


if __name__ == "__main__":
    main()
