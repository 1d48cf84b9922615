"""Real SMTP servers on 127.0.0.1 for the email provider's tests.

:class:`ScriptedSMTPServer` is aiosmtpd in a thread of the test process; what it answers is chosen by
the recipient's (or sender's) local part, so one server scripts every row of the failure table:

* ``r421@…``, ``r450@…``, ``r550@…``… : that reply (with an enhanced status code) to RCPT TO;
* ``mail451@…`` as the *sender*: 451 to MAIL FROM;
* ``data554@…``: the recipient is accepted, the data refused with 554;
* ``hang@…``: the data is read and never answered (the client times out);
* ``drop@…``: the connection is closed after the data, with no answer;
* anything else: accepted, kept in ``messages``.

:class:`GreetingRefusal` answers every connection with a 421 greeting and hangs up.
"""

from __future__ import annotations

import asyncio
import email
import email.message
import email.policy
import re
import socket
import threading
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.support.processes import free_port

#: Texts of the scripted replies: code → the reply line, enhanced status code first.
REPLIES = {
    421: "421 4.3.2 Service shutting down, try later",
    450: "450 4.2.1 Mailbox busy, try later",
    451: "451 4.3.0 Local error in processing",
    452: "452 4.3.1 Insufficient system storage",
    550: "550 5.1.1 No such user here",
    551: "551 5.1.6 User not local",
    552: "552 5.2.2 Mailbox full",
    553: "553 5.1.3 Mailbox name not allowed",
    554: "554 5.7.1 Message rejected as spam",
}
_CODE = re.compile(r"^(?:r|mail|data)(\d{3})@")


class _Handler:
    def __init__(self, owner: ScriptedSMTPServer) -> None:
        self.owner = owner

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, mail_options: list[str]
    ) -> str:
        match = _CODE.match(address)
        if address.startswith("mail") and match:
            return REPLIES[int(match.group(1))]
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 2.1.0 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, rcpt_options: list[str]
    ) -> str:
        match = _CODE.match(address)
        if address.startswith("r") and match:
            return REPLIES[int(match.group(1))]
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        recipient = envelope.rcpt_tos[0] if envelope.rcpt_tos else ""
        self.owner.data_received.set()
        if recipient.startswith("hang@"):
            # Hold the answer until the client gives up and closes (or hang_seconds pass).
            self.owner.hang_started()
            try:
                transport = server.transport
                loop = asyncio.get_running_loop()
                until = loop.time() + self.owner.hang_seconds
                while transport is not None and not transport.is_closing() and loop.time() < until:
                    await asyncio.sleep(0.02)
            finally:
                self.owner.hang_ended()
            return "451 4.3.0 gave up waiting"
        if recipient.startswith("drop@"):
            assert server.transport is not None
            server.transport.close()
            return "250 2.0.0 never heard"
        match = _CODE.match(recipient)
        if recipient.startswith("data") and match:
            return REPLIES[int(match.group(1))]
        content = envelope.content
        raw = content if isinstance(content, bytes) else str(content).encode()
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        with self.owner.lock:
            self.owner.messages.append(parsed)
        return "250 2.0.0 Queued"


class _CountingController(Controller):
    """Counts the connections the server accepts (``owner.connections``)."""

    def __init__(self, owner: ScriptedSMTPServer, *args: Any, **kwargs: Any) -> None:
        self.owner = owner
        super().__init__(*args, **kwargs)

    def factory(self) -> SMTP:
        owner = self.owner

        class Counting(SMTP):
            def connection_made(self, transport: Any) -> None:
                with owner.lock:
                    owner.connections += 1
                super().connection_made(transport)

        return Counting(self.handler, **self.SMTP_kwargs)


class ScriptedSMTPServer:
    """aiosmtpd on 127.0.0.1, a free port, answering as the module describes; ``connections`` counts
    the connections it accepted."""

    def __init__(self, hang_seconds: float = 5.0) -> None:
        self.hang_seconds = hang_seconds
        self.messages: list[email.message.EmailMessage] = []
        self.lock = threading.Lock()
        self.data_received = threading.Event()
        self.hanging = 0  # clients whose data is held unanswered right now
        self.max_hanging = 0
        self.connections = 0
        self.port = free_port()
        # A fixed greeting name: the default would look the machine's name up.
        self.controller = _CountingController(
            self, _Handler(self), hostname="127.0.0.1", port=self.port, server_hostname="smtp.test"
        )

    def start(self) -> ScriptedSMTPServer:
        self.controller.start()
        return self

    def hang_started(self) -> None:
        with self.lock:
            self.hanging += 1
            self.max_hanging = max(self.max_hanging, self.hanging)

    def hang_ended(self) -> None:
        with self.lock:
            self.hanging -= 1

    def stop(self) -> None:
        self.controller.stop()

    def backend_options(self, **extra: Any) -> dict[str, Any]:
        """``backend_options`` for Django's SMTP backend pointed at this server."""
        return {"host": "127.0.0.1", "port": self.port, **extra}


class GreetingRefusal:
    """A server that greets every client with ``421`` and closes: a 4xx at connect."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)  # closing a socket does not wake accept(): poll a stop flag
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> GreetingRefusal:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.sendall(b"421 4.3.2 Too busy, come back later\r\n")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
