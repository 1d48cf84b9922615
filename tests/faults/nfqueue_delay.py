"""Hold every packet of an NFQUEUE queue for a fixed time, then let it go: latency where netem is missing.

``tc qdisc ... netem delay`` needs the kernel's ``sch_netem``; some kernels (minimal VM images) are built
without it. Netfilter's queue (``iptables -j NFQUEUE``) is there nearly everywhere: the kernel hands each
packet to this process, which gives the verdict ACCEPT ``--delay-ms`` later. The delay is fixed, so the
order of packets is kept, as netem keeps it. Pure Python over a netlink socket (no libnetfilter_queue):
only the packet id is copied to user space, never the payload.

Run inside the namespace whose traffic it delays:
``ip netns exec NS python -m tests.faults.nfqueue_delay --queue 7 --delay-ms 200``.
It prints ``bound`` once the queue is bound, and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import errno
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQNL_COPY_META = 1
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
NF_ACCEPT = 1
NLMSG_HEADER = struct.Struct("=IHHII")
NFGEN_HEADER_SIZE = 4
# Enough queued packets for 200 ms of a busy drain; past this the kernel drops, as a full netem queue does.
QUEUE_MAXLEN = 65536


def _attribute(kind: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


class QueueSocket:
    """A netlink socket bound to one NFQUEUE queue number, in metadata-only copy mode."""

    def __init__(self, queue: int) -> None:
        self.queue = queue
        self.sequence = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self.sock.bind((0, 0))
        family = socket.AF_INET
        self._send(
            NFQNL_MSG_CONFIG,
            family,
            _attribute(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_BIND, socket.htons(family))),
        )
        self._send(
            NFQNL_MSG_CONFIG, family, _attribute(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
        )
        self._send(
            NFQNL_MSG_CONFIG, family, _attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))
        )

    def _send(self, message: int, family: int, attributes: bytes) -> None:
        self.sequence += 1
        body = struct.pack("=BBH", family, 0, socket.htons(self.queue)) + attributes
        header = NLMSG_HEADER.pack(
            NLMSG_HEADER.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | message, NLM_F_REQUEST, self.sequence, 0
        )
        self.sock.send(header + body)

    def accept(self, packet_id: int) -> None:
        attributes = _attribute(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
        self._send(NFQNL_MSG_VERDICT, socket.AF_UNSPEC, attributes)

    def packet_ids(self) -> list[int]:
        """The ids of the packets in one read of the socket (errors from the kernel are printed)."""
        try:
            data = self.sock.recv(1 << 20)
        except OSError as exc:
            if (
                exc.errno == errno.ENOBUFS
            ):  # the kernel dropped messages: those packets are lost, as on a wire
                return []
            raise
        ids: list[int] = []
        offset = 0
        while offset + NLMSG_HEADER.size <= len(data):
            length, kind = NLMSG_HEADER.unpack_from(data, offset)[:2]
            if kind == NLMSG_ERROR:
                code = struct.unpack_from("=i", data, offset + NLMSG_HEADER.size)[0]
                if code:
                    print(f"netlink error {code}", file=sys.stderr, flush=True)
            elif kind & 0xFF == NFQNL_MSG_PACKET:
                ids.extend(self._packet_id(data, offset, length))
            offset += (length + 3) & ~3
        return ids

    @staticmethod
    def _packet_id(data: bytes, offset: int, length: int) -> list[int]:
        position = offset + NLMSG_HEADER.size + NFGEN_HEADER_SIZE
        while position + 4 <= offset + length:
            size, kind = struct.unpack_from("=HH", data, position)
            if kind & 0x7FFF == NFQA_PACKET_HDR:
                return [struct.unpack_from("!I", data, position + 4)[0]]
            position += (size + 3) & ~3
        return []


def run(queue: int, delay: float) -> None:
    """Accept each queued packet ``delay`` seconds after it arrived, until SIGTERM."""
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    queue_socket = QueueSocket(queue)
    held: collections.deque[tuple[float, int]] = collections.deque()
    print("bound", flush=True)
    while not stopping:
        now = time.monotonic()
        while held and held[0][0] <= now:
            queue_socket.accept(held.popleft()[1])
        wait = max(0.0, held[0][0] - now) if held else 0.5
        try:
            readable, _, _ = select.select([queue_socket.sock], [], [], wait)
        except InterruptedError:
            continue
        if readable:
            release_at = time.monotonic() + delay
            held.extend((release_at, packet_id) for packet_id in queue_socket.packet_ids())
    for _, packet_id in held:  # let nothing stay queued in the kernel once the delay is lifted
        queue_socket.accept(packet_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    options = parser.parse_args()
    run(options.queue, options.delay_ms / 1000.0)


if __name__ == "__main__":
    main()
