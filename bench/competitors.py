"""Other PostgreSQL-backed job and mail queues, drained the same way where installed (the ``bench`` extra).

Each ``prepare_*`` seeds its queue and returns the drain to measure (it returns the rows it delivered
and closes its connections), or None when the library is not installed:

* procrastinate: its worker (``run_worker(wait=False)``) running no-op jobs;
* django-post_office: ``send_queued_mail_until_done`` with Django's dummy e-mail backend.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from bench.db import bench_dbname, connect, conninfo

Drain = Callable[[], int]


def post_office_installed() -> bool:
    try:
        import post_office  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


def prepare_procrastinate(jobs: int, concurrency: int) -> Drain | None:
    """Defer ``jobs`` no-op jobs; the drain runs procrastinate's worker until the queue is empty."""
    try:
        import procrastinate
    except ImportError:
        return None
    import logging

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo(bench_dbname())))

    @app.task(queue="bench", name="bench.noop")
    def noop(i: int) -> None:
        return None

    with app.open():
        with connect(autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
            exists = bool(row and row[0])
            if exists:
                conn.execute("TRUNCATE procrastinate_jobs CASCADE")
        if not exists:
            app.schema_manager.apply_schema()
        for lo in range(0, jobs, 1000):
            noop.batch_defer(*[{"i": i} for i in range(lo, min(jobs, lo + 1000))])  # type: ignore[arg-type]

    def drain() -> int:
        app.run_worker(queues=["bench"], concurrency=concurrency, wait=False, install_signal_handlers=False)
        with connect() as conn:
            row = conn.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            ).fetchone()
        finished = int(row[0]) if row else 0
        if finished != jobs:
            raise RuntimeError(f"procrastinate finished {finished} of {jobs} jobs")
        return finished

    return drain


def prepare_post_office(mails: int) -> Drain | None:
    """Queue ``mails`` e-mails; the drain runs ``send_queued_mail_until_done`` with the dummy backend."""
    if not post_office_installed():
        return None
    import logging

    from django.db import connections
    from post_office.mail import send_queued_mail_until_done  # type: ignore[import-untyped]
    from post_office.models import STATUS, Email  # type: ignore[import-untyped]

    Email.objects.all().delete()
    Email.objects.bulk_create(
        [
            Email(
                from_email="bench@example.com",
                to=[f"user{i}@example.com"],
                subject="Hello",
                message="Your order shipped",
                status=STATUS.queued,
            )
            for i in range(mails)
        ],
        batch_size=1000,
    )
    with connect(autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE post_office_email")
    connections.close_all()
    # post_office logs every batch at INFO on its own handler; the benchmark prints its own figures.
    logging.getLogger("post_office").setLevel(logging.WARNING)
    lockfile = os.path.join(tempfile.mkdtemp(prefix="nr-bench-"), "post_office")

    def drain() -> int:
        send_queued_mail_until_done(lockfile=lockfile, processes=1)
        sent = int(Email.objects.filter(status=STATUS.sent).count())
        connections.close_all()
        if sent != mails:
            raise RuntimeError(f"post_office sent {sent} of {mails} mails")
        return sent

    return drain
