"""The benchmark commands still run: tiny sizes, and the shape of what they print (no figures asserted).

They run ``bench/`` code, so they are benchmark runs with a make target of their own: ``make bench-check``
(``--bench-check`` or ``NR_BENCH_CHECK=1``); the default suite skips them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from tests.support.databases import database_name
from tests.support.processes import REPO_ROOT

pytestmark = [pytest.mark.process, pytest.mark.bench]

SERVER_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def bench_database() -> Iterator[str]:
    """A benchmark database name of this run, dropped afterwards."""
    name = database_name(f"nr_bench_smoke_{os.getpid()}")
    yield name
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def bench_process(
    module: str, database: str, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run a benchmark module on the local server's ``database``, whatever its exit status."""
    env = {**os.environ, "DATABASE_URL": SERVER_URL, "NR_BENCH_DATABASE_NAME": database}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-m", module, *args, "--server", "url"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_bench(module: str, database: str, *args: str, timeout: float = 240) -> str:
    done = bench_process(module, database, *args, timeout=timeout)
    # Exit 1 is a missed target (figures on a busy machine); anything else is a broken benchmark.
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def table_rows(text: str, first_cells: list[str]) -> dict[str, list[str]]:
    """The cells (split on runs of 2+ spaces) of the lines starting with each of ``first_cells``."""
    found = {}
    for line in text.splitlines():
        for cell in first_cells:
            if line.startswith(cell):
                found[cell] = re.split(r"\s{2,}", line.strip())
    return found


def test_ceiling_table_has_ratios_first_then_each_drain(bench_database: str) -> None:
    out = run_bench(
        "bench.run",
        bench_database,
        "--only",
        "ceiling",
        "--rows",
        "400",
        "--rounds",
        "1",
        "--leased-rows",
        "200",
        "--competitor-jobs",
        "50",
    )
    assert "## Against the lean ceiling" in out
    ratios = table_rows(
        out, ["worker / lean, rows/s (inline)", "worker / lean, WAL per notification (leased)"]
    )
    assert len(ratios) == 2, out
    assert re.fullmatch(r"\d+\.\d\d", ratios["worker / lean, rows/s (inline)"][1]), ratios
    drains = [
        "lean, inline",
        "raw SQL on the own table, inline",
        "worker (stub), inline",
        "lean, leased",
        "worker (webhook",
    ]
    rows = table_rows(out, drains)
    assert set(rows) == set(drains), out
    for cells in rows.values():
        rate, _cpu, wal, commits = cells[2:6]
        assert float(rate.replace(",", "")) > 0 and float(wal.replace(",", "")) > 0, cells
        assert float(commits) > 0, cells
    assert out.index("worker / lean") < out.index("lean, inline"), "ratios come first"
    assert "Targets missed:" in out


def test_latency_drain_prints_the_client_alone_each_logging_and_the_engine_alone(bench_database: str) -> None:
    out = run_bench(
        "bench.run", bench_database, "--only", "latency", "--concurrency", "4", "--latency-rows", "200"
    )
    lines = [line for line in out.splitlines() if line.startswith("max_concurrency   4, 200 ")]
    assert [line.split(",")[2].split(":")[0].strip() for line in lines] == [
        "aiohttp alone",
        "native logging",
        "stdlib logging",
        "the engine alone (a provider that waits 20 ms",
    ], out
    for line in lines[1:]:
        assert re.search(r"ratio \d+%", line) and re.search(r"\d+% of a core", line), line
        # The worker's thread ready to run but kept off a core (Linux's per-thread schedstat).
        waited = re.search(r"waited for a core (\d+)% of the drain", line)
        assert waited and 0 <= int(waited.group(1)) <= 100, line


def test_command_drain_times_the_users_command_against_the_lean_drain(bench_database: str) -> None:
    out = run_bench("bench.run", bench_database, "--only", "command", "--rows", "300", "--rounds", "1")
    assert "## No-op drain as a user runs it" in out
    ratios = table_rows(out, ["command / lean, rows/s"])
    assert re.fullmatch(r"\d+\.\d\d", ratios["command / lean, rows/s"][1]), out
    rows = table_rows(out, ["lean, inline", "manage.py retry_worker --once"])
    assert len(rows) == 2, out
    assert rows["manage.py retry_worker --once"][1] == "300", rows
    assert "The same command on an empty backlog" in out


def test_fillfactor_sets_the_notification_tables_for_the_run(bench_database: str) -> None:
    out = run_bench("bench.run", bench_database, "--only", "claim", "--fillfactor", "40")
    assert "the notification table's fillfactor: 40" in out, out
    with psycopg.connect(SERVER_URL, dbname=bench_database) as conn:
        row = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'notifications_retry_notificationentity'"
        ).fetchone()
    assert row is not None and "fillfactor=40" in row[0], row


def test_a_fillfactor_out_of_range_is_refused_before_anything_runs(bench_database: str) -> None:
    done = bench_process("bench.run", bench_database, "--fillfactor", "5", timeout=60)
    assert done.returncode == 2 and "a fillfactor is a percentage from 10 to 100, not 5" in done.stderr
    assert "benchmark" not in done.stdout, "nothing measured"


def test_profile_prints_the_top_functions(bench_database: str) -> None:
    out = run_bench("bench.run", bench_database, "--profile", "--profile-rows", "300")
    assert "## Profile of a 300-row no-op drain" in out
    assert "cumulative" in out and "retry_worker" in out


def test_schema_costs_prints_every_variant(bench_database: str) -> None:
    out = run_bench("bench.schema_costs", bench_database, "--rows", "300", "--rounds", "1")
    variants = ["as is", "triggers off", "no admin-only indexes", "fillfactor 100", "outbox trigger off"]
    assert set(table_rows(out, variants)) == set(variants), out


def test_fairness_bench_reports_the_small_tenants_lateness_and_the_drain(bench_database: str) -> None:
    out = run_bench("bench.fairness", bench_database, "--a-rows", "400", "--b-rows", "3", "--b-every", "0.1")
    line = table_rows(out, ["tenant B (3 rows)"])
    assert line and len(line["tenant B (3 rows)"]) == 4, out
    assert "tenant A's drain took" in out and "Targets missed:" in out


def test_call_timeline_splits_a_calls_time_and_the_loops(bench_database: str) -> None:
    out = run_bench(
        "bench.call_timeline", bench_database, "--rows", "200", "--concurrency", "8", "--rounds", "1"
    )
    assert "written→headers" in out and "outside loop" in out, out
    line = table_rows(out, ["1 "])
    assert line and len(line["1 "]) == 13, out
    # The worker's thread on a core and waiting for one (Linux's per-thread schedstat): two shares.
    on_core, waiting = (int(cell.rstrip("%")) for cell in line["1 "][-2:])
    assert 0 < on_core <= 100 and 0 <= waiting <= 100, out


def test_wakeup_cut_bench_reports_the_lateness_of_both_scenarios(bench_database: str) -> None:
    out = run_bench("bench.wakeup_cut", bench_database, "--trials", "1", "--settle", "0.5")
    lines = table_rows(out, ["cut  ", "cut, beside year-12000 rows"])
    assert [len(cells) for cells in lines.values()] == [5, 5], out
    assert "Targets missed:" in out, out


def test_bulk_insert_bench_compares_the_wakeup_triggers(bench_database: str) -> None:
    out = run_bench("bench.bulk_insert", bench_database, "--rows", "300")
    variants = ["per statement (shipped)", "per row (migration 0015, before 0017)", "no wake-up trigger"]
    cells_of = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("300 ")]
    lines = [cells for cells in cells_of if len(cells) == 4]  # the table, not the progress line
    assert [cells[1] for cells in lines] == variants, out
    assert all(float(cells[2]) > 0 for cells in lines), out


def test_bookkeeping_bench_compares_the_windows(bench_database: str) -> None:
    out = run_bench("bench.bookkeeping", bench_database, "--rows", "400")
    assert "after every tick" in out and "(shipped)" in out, out
    assert re.search(r"shipped / after every tick: \d+\.\d\d", out), out


def test_crash_bench_reports_lost_duplicates_and_recovery(bench_database: str) -> None:
    out = run_bench(
        "bench.crash", bench_database, "--rows", "200", "--kills", "2", "--concurrency", "4", timeout=280
    )
    line = table_rows(out, ["4 "])
    assert line, out
    cells = line["4 "]
    assert cells[2] == "0", f"rows lost: {out}"
    outbox, sent = (int(x.replace(",", "")) for x in cells[3].split(" / "))
    assert outbox == sent >= 200, out
    assert re.fullmatch(r"\d+ \([\d,]+ of [\d,]+ charged\)", cells[6]), out
    assert "Targets missed:" in out


def test_recovery_bench_reports_the_drain_with_and_without_the_job(bench_database: str) -> None:
    out = run_bench(
        "bench.recovery",
        bench_database,
        "--rows",
        "2000",
        "--drain-rows",
        # Enough for the drain to outlast the job's process start (about a second) at the worker's rate.
        "60000",
        "--window",
        "2",
        timeout=280,
    )
    cells = table_rows(out, ["0 "])
    assert cells, out
    assert len(cells["0 "]) == 7 and all(float(x.replace(",", "")) > 0 for x in cells["0 "][1:]), out


def test_evidence_wal_prints_a_row_per_variant(bench_database):
    out = run_bench("bench.evidence_wal", bench_database, "--rows", "20", "--attempts", "2")
    rows = [line for line in out.splitlines() if line.startswith("| before") or line.startswith("| after")]
    assert len(rows) == 4, out


def test_signing_prints_the_signing_cost_and_the_whole_request():
    done = subprocess.run(
        [sys.executable, "-m", "bench.signing", "--requests", "40", "--rounds", "1", "--number", "200"],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("| whsec_ x2 (rotation) |") == 2, done.stdout


def test_scale_bench_prints_ratios_duplicates_the_rate_window_and_the_claims_reading(bench_database):
    out = run_bench(
        "bench.scale",
        bench_database,
        *("--rows", "400", "--rate-seconds", "1", "--claim-rows", "20000", "--repeat", "2"),
        timeout=280,
    )
    assert "Latency-bound drain" in out and "busiest 1-s window" in out, out
    drains = table_rows(out, ["1 ", "2 ", "4 "])
    assert set(drains) == {"1 ", "2 ", "4 "}, out
    assert "one SIGKILLed" in out and "Index Scan" in out and "Targets missed:" in out
    assert "TENANT_RATE_LIMITS 50/s for each of 4 tenants" in out, out
    tenant_part = out.split("TENANT_RATE_LIMITS 50/s")[1].split("Claim of")[0]
    tenants = table_rows(tenant_part, ["1 ", "4 "])
    assert set(tenants) == {"1 ", "4 "}, out
    # Each tenant's busiest second, in the run's order of workers: within the limit and its margin.
    peaks = [int(p) for cells in tenants.values() for p in cells[1].split(" / ")]
    assert len(peaks) == 8 and max(peaks) <= 52, out


def test_machine_bound_bench_prints_each_drains_cpu_a_row_by_part(bench_database):
    out = run_bench("bench.machine_bound", bench_database, "--rows", "4000", "--max-concurrency", "32")
    assert "CPU ms a row while the receiver was being sent to" in out, out
    drains = table_rows(out, ["1 ", "2 "])
    assert set(drains) == {"1 ", "2 "}, out
    # rows/s, share, workers, receiver, PostgreSQL (not counted on --server url), machine, cores busy
    assert all(len(cells) == 8 and cells[5] == "—" for cells in drains.values()), out
    assert "leaves the machine at most" in out, out


def test_prune_bench_prints_the_claim_alone_and_beside_the_prune_and_the_prune_s_rate(bench_database):
    out = run_bench(
        "bench.prune",
        bench_database,
        "--rows",
        "3000",
        "--due",
        "300",
        "--window",
        "1",
        "--unpublished",
        "0",
        "10",
    )
    claims = table_rows(out, ["alone, before ", "beside the prune ", "alone, after "])
    assert set(claims) == {"alone, before ", "beside the prune ", "alone, after "}, out
    prunes = table_rows(out, ["beside the claims ", "alone ", "a pass, nothing to delete "])
    assert prunes["beside the claims "][1] == "3,000" and prunes["a pass, nothing to delete "][1] == "0", out
    assert "10 unpublished among 3,000 published" in out, out


def test_suppression_bench_compares_the_claim_with_and_without_the_lookup(bench_database):
    out = run_bench(
        "bench.suppression",
        bench_database,
        "--rows",
        "10000",
        "--suppressed",
        "1000",
        "--repeat",
        "2",
        "--rounds",
        "1",
    )
    assert "claim" in out and "with the check" in out and "without" in out, out
    assert "ratio with/without" in out and "the lookup's plan" in out, out  # a small list is read whole


def test_modules_bench_counts_the_modules_a_one_record_tick_runs(bench_database):
    out = run_bench("bench.modules_run", bench_database)
    counts = [int(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "package modules that ran" in line]
    assert len(counts) == 2 and counts[1] < counts[0], out  # the relay's modules run only with the relay
    assert "by folder: engine" in out, out
