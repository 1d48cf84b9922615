"""The example project's embedded PostgreSQL (the ``pgserver`` package) in ``./.pgdata``.

Used only when ``DATABASE_URL`` is unset. Every process that opens it registers itself, and the last
one to exit stops the server (pgserver's ``stop`` cleanup), so ``make demo`` leaves nothing running.
A SIGTERM ends a process that has no handler of its own for it as Ctrl-C does (a ``KeyboardInterrupt``),
so ``kill``, ``timeout`` or a container stop still lets it stop the server. A process that was killed
(SIGKILL) cannot stop it: ``make demo-stop`` (``python -m
example_project.embedded_postgres stop``) does, and ``make clean`` runs it before deleting ``.pgdata``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
# pgserver runs the server as this user when started by root (PostgreSQL refuses to run as root).
_ROOT_SERVER_USER = "pgserver"


def data_dir() -> Path:
    return Path(os.environ.get("PGSERVER_DATA_DIR", BASE_DIR / ".pgdata"))


#: Said when pgserver cannot be imported: not installed, or a Python it publishes no wheel for.
MISSING = (
    "the example project's embedded PostgreSQL needs the pgserver package (pip install -e '.[example]'), "
    "which has no wheels for Python 3.13 and later: set DATABASE_URL=postgres://... to use a server instead"
)


def _pgserver():  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        # platformdirs complains about XDG_RUNTIME_DIR in containers; pgserver does not need it.
        warnings.simplefilter("ignore")
        try:
            import pgserver
        except ImportError as exc:
            raise RuntimeError(MISSING) from exc

    return pgserver


def database_url(directory: Path) -> str:
    """Start (or join) the server in ``directory``; it stops when the last process using it exits."""
    server = _pgserver().get_server(directory, cleanup_mode="stop")
    _interrupt_on_sigterm()
    return str(server.get_uri())


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _interrupt_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, unless the process handles it itself.

    By default SIGTERM ends Python without running its exit handlers, and pgserver stops the server
    from one: ``runserver`` (``demo_admin``) stopped by SIGTERM left PostgreSQL running. Commands that
    install their own handler later (``retry_worker``, ``outbox_relay``) replace this one and exit
    normally, which runs the exit handlers too.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL,
        None,
    ):
        signal.signal(signal.SIGTERM, _interrupt)


def running_pid(directory: Path) -> int | None:
    """The server's pid when one runs in ``directory`` (its ``postmaster.pid`` names a live process)."""
    try:
        pid = int((directory / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by the server's own user
    return pid


def stop(directory: Path) -> bool:
    """Stop the server running in ``directory``; False when none was running."""
    pid = running_pid(directory)
    if pid is not None:
        user = _ROOT_SERVER_USER if os.geteuid() == 0 else None
        _pgserver().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=directory, user=user, timeout=60)
    # Forget the processes registered as using it: a killed one would keep the next server running.
    with contextlib.suppress(FileNotFoundError):
        (directory / ".handle_pids.json").unlink()
    return pid is not None


def main(argv: list[str]) -> int:
    directory = data_dir()
    if argv == ["stop"]:
        print(
            f"stopped the PostgreSQL server in {directory}"
            if stop(directory)
            else f"none running in {directory}"
        )
        return 0
    if argv == ["status"]:
        pid = running_pid(directory)
        print(f"PostgreSQL runs in {directory} (pid {pid})" if pid else f"none running in {directory}")
        return 0 if pid else 1
    print("usage: python -m example_project.embedded_postgres stop|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
