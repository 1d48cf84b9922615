"""Two network namespaces joined by a veth pair, and the faults a test puts on that link.

The worker runs in one namespace, its servers (PostgreSQL, the webhook receiver) in the other; every packet
between them crosses the veth pair, where a test adds latency, random loss or a partition. Nothing leaves
the two namespaces: they have no other interface and no route.

Faults are made with ``tc qdisc ... netem`` where the kernel has ``sch_netem``. Where it does not
(minimal kernels), the same faults are made with netfilter in the two namespaces: loss with the
``statistic`` match, a partition with DROP, latency by queueing packets to :mod:`tests.faults.nfqueue_delay`,
which lets each one go after the delay. Both drop packets on their way *in*, so the sender sees no error
(an OUTPUT drop would fail ``connect()`` at once with EPERM, which no real partition does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass

from tests.support.processes import REPO_ROOT

IP = "ip"
TC = "tc"
IPTABLES = "iptables"
#: The queue number the latency fallback uses; queues are per namespace, so any number is free in ours.
DELAY_QUEUE = 7


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


def unavailable_reason() -> str | None:
    """Why this machine cannot make the test's namespaces and faults, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run `make faults` as root)"
    if shutil.which(IP) is None:
        return "`ip` is missing (Debian's iproute2: bash scripts/ensure-netns-tools)"
    probe = f"nrprobe{uuid.uuid4().hex[:6]}"
    made = _run(IP, "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        if not _netem_works(probe) and shutil.which(IPTABLES) is None:
            return "the kernel has no netem and `iptables` is missing (bash scripts/ensure-netns-tools)"
    finally:
        _run(IP, "netns", "delete", probe, check=False)
    return None


def _netem_works(namespace: str) -> bool:
    _run(IP, "-n", namespace, "link", "set", "lo", "up", check=False)
    added = _run(
        IP,
        "netns",
        "exec",
        namespace,
        TC,
        "qdisc",
        "add",
        "dev",
        "lo",
        "root",
        "netem",
        "delay",
        "1ms",
        check=False,
    )
    return added.returncode == 0


@dataclass(frozen=True)
class Side:
    """One namespace of the pair: its name, its end of the veth and that end's address."""

    namespace: str
    device: str
    address: str

    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it in the namespace."""
        return [IP, "netns", "exec", self.namespace]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(*self.exec_prefix(), *args, check=check)


class NetworkPair:
    """``worker`` and ``servers`` namespaces on a /30 of a veth pair; :meth:`destroy` removes both."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        # A random private /30, so two runs on one machine do not share addresses.
        third, fourth = int(tag[:2], 16), int(tag[2:4], 16) & 0xFC
        self.worker = Side(f"nrw{tag}", f"nrw{tag}", f"10.213.{third}.{fourth + 1}")
        self.servers = Side(f"nrs{tag}", f"nrs{tag}", f"10.213.{third}.{fourth + 2}")
        self.netem = False
        self._delayer: subprocess.Popen[bytes] | None = None

    def create(self) -> NetworkPair:
        for side in (self.worker, self.servers):
            _run(IP, "netns", "add", side.namespace)
        _run(IP, "link", "add", self.worker.device, "type", "veth", "peer", "name", self.servers.device)
        for side in (self.worker, self.servers):
            _run(IP, "link", "set", side.device, "netns", side.namespace)
            _run(IP, "-n", side.namespace, "addr", "add", f"{side.address}/30", "dev", side.device)
            _run(IP, "-n", side.namespace, "link", "set", side.device, "up")
            _run(IP, "-n", side.namespace, "link", "set", "lo", "up")
        self.netem = _netem_works(self.worker.namespace)
        if self.netem:
            self.worker.run(TC, "qdisc", "del", "dev", "lo", "root", check=False)
        return self

    @property
    def method(self) -> str:
        """How the faults are made here, for the printed figures."""
        return "tc netem" if self.netem else "netfilter (statistic, DROP, NFQUEUE delay)"

    def delay(self, milliseconds: int) -> None:
        """Add ``milliseconds`` to every packet from the servers to the worker (one way, as netem does)."""
        self.clear()
        if self.netem:
            self._netem(self.servers, "delay", f"{milliseconds}ms")
            return
        self._delayer = subprocess.Popen(
            [
                *self.worker.exec_prefix(),
                sys.executable,
                "-m",
                "tests.faults.nfqueue_delay",
                "--queue",
                str(DELAY_QUEUE),
                "--delay-ms",
                str(milliseconds),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
        )
        assert self._delayer.stdout is not None
        if self._delayer.stdout.readline().strip() != b"bound":
            raise RuntimeError("the NFQUEUE delayer did not bind its queue")
        self._inbound(self.worker, "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass")

    def loss(self, percent: float) -> None:
        """Drop ``percent`` % of the packets in each direction, at random."""
        self.clear()
        for side in (self.worker, self.servers):
            if self.netem:
                self._netem(side, "loss", f"{percent}%")
            else:
                probability = f"{percent / 100:.4f}"
                self._inbound(
                    side, "-m", "statistic", "--mode", "random", "--probability", probability, "-j", "DROP"
                )

    def partition(self) -> None:
        """Drop every packet both ways, silently: established connections hang, new ones get no answer.

        The servers' side first, and without clearing the fault before: from its first command on, nothing
        the worker sends arrives, so a transaction open at the call is stranded as it is.
        """
        for side in (self.servers, self.worker):
            if self.netem:
                self._netem(side, "loss", "100%")
            else:
                side.run(IPTABLES, "-I", "INPUT", "1", "-i", side.device, "-j", "DROP")

    def clear(self) -> None:
        """Remove every fault: the link is clean again."""
        for side in (self.worker, self.servers):
            if self.netem:
                side.run(TC, "qdisc", "del", "dev", side.device, "root", check=False)
            else:
                side.run(IPTABLES, "-F", "INPUT", check=False)
        if self._delayer is not None:
            self._delayer.terminate()
            self._delayer.wait(10)
            self._delayer = None

    def destroy(self) -> None:
        self.clear()
        for side in (self.worker, self.servers):
            # Deleting a namespace takes its end of the veth pair, and with it the pair, along.
            _run(IP, "netns", "delete", side.namespace, check=False)

    def _netem(self, side: Side, *spec: str) -> None:
        side.run(TC, "qdisc", "replace", "dev", side.device, "root", "netem", *spec)

    def _inbound(self, side: Side, *rule: str) -> None:
        side.run(IPTABLES, "-A", "INPUT", "-i", side.device, *rule)
