"""A real PgBouncer (Debian's package) in front of the test server, on a free loopback port.

Each instance has its own config, auth file and log in a temp dir. One server connection per pool
(``default_pool_size = 1``), so every client of a database shares one server session: what one client
leaves on it, the next one sees.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.support.processes import free_port

PGBOUNCER_CANDIDATES = ("pgbouncer", "/usr/sbin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, or None (installed by scripts/ensure-pgbouncer)."""
    for candidate in PGBOUNCER_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


class PgBouncer:
    """``pgbouncer`` in ``pool_mode`` forwarding every database to ``server_host:server_port``."""

    def __init__(
        self,
        server_host: str,
        server_port: int,
        *,
        pool_mode: str = "transaction",
        ignore_startup_parameters: str = "",
    ) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise FileNotFoundError("pgbouncer is not installed (bash scripts/ensure-pgbouncer)")
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="nr-pgbouncer-"))
        self.port = free_port()
        self.server_host = server_host
        self.server_port = server_port
        self.pool_mode = pool_mode
        self.ignore_startup_parameters = ignore_startup_parameters
        self.proc: subprocess.Popen[bytes] | None = None
        # PgBouncer refuses to run as root: as root it runs as the ``postgres`` user.
        self._user = "postgres" if os.geteuid() == 0 else None

    @property
    def log_path(self) -> Path:
        return self.dir / "pgbouncer.log"

    def url(self, dbname: str, user: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{dbname}"

    def _write_config(self) -> Path:
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        config = self.dir / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'users.txt'}\n"
            f"pool_mode = {self.pool_mode}\ndefault_pool_size = 1\nmax_client_conn = 50\n"
            f"ignore_startup_parameters = {self.ignore_startup_parameters}\n"
            "server_reset_query_always = 0\n"
        )
        if self._user:
            pw = pwd.getpwnam(self._user)
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, pw.pw_uid, pw.pw_gid)
        return config

    def start(self) -> PgBouncer:
        config = self._write_config()
        kwargs: dict[str, Any] = {"user": self._user} if self._user else {}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, str(config)], stdout=log, stderr=subprocess.STDOUT, **kwargs
            )
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start:\n{self.log()}")
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    message = f"pgbouncer did not answer on port {self.port}:\n{self.log()}"
                    raise RuntimeError(message) from None
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
