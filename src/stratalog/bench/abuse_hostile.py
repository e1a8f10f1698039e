"""The hostile side of `stratalog bench abuse`: one child process that keeps many raw asyncio connections to
the broker busy misbehaving, in families, until it is told to stop or its own deadline passes.

It runs apart from the measuring process so that its event loop does not take CPU time from the
well-behaved producer's thread in-process (the machine's cores are still shared: the report says how much
CPU it used). Every loop is bounded in time (the process's deadline) and in count (``ACTIONS_MAX`` per
connection), and it connects to the given 127.0.0.1 address only.

Families (one coroutine per connection):

* ``slowloris``: a frame's size and half a header, then one byte every few seconds, never the whole frame.
* ``idle``: connects and sends nothing.
* ``oversize``: a frame claiming 2 GiB, then waits for the broker to close; again each repeat interval.
* ``garbage``: a malformed frame (wire.garbage_frames, in turn), then waits for the close; again.
* ``pipeline``: Metadata requests sent without ever reading a response, up to a count, then held.
* ``fetch_all``: Fetch of every partition with every byte limit at its maximum and the longest wait: even
  connections from offset 0 (everything there is, read back, again each repeat interval), odd ones at
  the end (the broker holds them for its longest fetch wait).
* ``churn``: connect and close at once, again each repeat interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import time
from dataclasses import dataclass, field
from typing import Any

from stratalog.bench import abuse_wire as wire

FAMILIES = ("slowloris", "idle", "oversize", "garbage", "pipeline", "fetch_all", "churn")
#: Iterations of one connection's loop at most (reconnects, frames sent, fetches): a bound besides time.
ACTIONS_MAX = 100_000
#: How long a connection waits for the broker to close it after sending a frame it must refuse.
CLOSE_WAIT_S = 10.0
#: How long a connection attempt may take (the broker's accept backlog may drop SYNs under a flood).
CONNECT_TIMEOUT_S = 10.0
#: Pipelined requests are sent in runs of this many between waits for the kernel to take them.
PIPELINE_RUN = 50
#: How often the process looks at its stop event, its deadline and its parent.
STOP_POLL_S = 0.1
#: The broker holds a fetch at the end of its log at most this long (BrokerConfig.fetch_wait_ms_max is
#: 30 s); a hostile waits a little longer for its answer before it gives the connection up.
FETCH_ANSWER_WAIT_S = 40.0


@dataclass(frozen=True, slots=True)
class HostilePlan:
    """What the hostile process does; picklable, so a spawned process can take it."""

    host: str
    port: int
    #: Connections per family, e.g. {"slowloris": 1000}.
    connections: dict[str, int]
    #: The process stops itself this long after it starts, whatever happens to its parent.
    duration_s_max: float
    #: Opening every connection may take this long at most; the phase starts with those open by then.
    ramp_s_max: float
    #: Looping families (oversize, garbage, fetch_all, churn) act once per connection this often.
    repeat_interval_s: float
    slowloris_byte_interval_s: float
    #: What a slowloris frame claims: within the broker's request_bytes_max, so the frame is awaited.
    slowloris_claim_bytes: int
    pipeline_requests_max: int
    fetch_topic: str
    fetch_end_offsets: tuple[int, ...]


@dataclass(slots=True)
class FamilyStats:
    connections: int = 0
    opened: int = 0
    connect_errors: int = 0
    #: The broker closed (or reset) the connection: for oversize and garbage, the answer wanted.
    closed_by_broker: int = 0
    #: A frame the broker must refuse that was not closed within CLOSE_WAIT_S.
    not_closed: int = 0
    actions: int = 0
    sent_bytes: int = 0
    read_bytes: int = 0
    first_error: str = ""
    #: Seconds from the connection's open to the broker's close, for families that wait on it.
    held_s: list[float] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        held = sorted(self.held_s)
        return {"connections": self.connections, "opened": self.opened, "connect_errors": self.connect_errors,
                "closed_by_broker": self.closed_by_broker, "not_closed": self.not_closed, "actions": self.actions,
                "sent_bytes": self.sent_bytes, "read_bytes": self.read_bytes, "first_error": self.first_error,
                "held_s_max": held[-1] if held else None}


class _Run:
    def __init__(self, plan: HostilePlan) -> None:
        self.plan = plan
        self.stats = {name: FamilyStats(connections=count) for name, count in plan.connections.items() if count}
        self.connected = 0
        self.total = sum(s.connections for s in self.stats.values())
        self.all_connected = asyncio.Event()
        self.writers: set[asyncio.StreamWriter] = set()
        #: Set before the tasks are cancelled: every loop checks it too, because a cancellation that lands
        #: as asyncio.wait_for's inner call completes is lost (Python 3.11) and the loop would go on.
        self.stopping = False

    async def connect(self, family: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        stats = self.stats[family]
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.plan.host, self.plan.port),
                                                    CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as e:
            stats.connect_errors += 1
            stats.first_error = stats.first_error or f"connect: {type(e).__name__}: {e}"
            await asyncio.sleep(self.plan.repeat_interval_s)
            return None
        stats.opened += 1
        self.writers.add(writer)
        return reader, writer

    def first_open(self, seen: list[bool]) -> None:
        """A connection's first successful open counts towards the ramp."""
        if not seen:
            seen.append(True)
            self.connected += 1
            if self.connected >= self.total:
                self.all_connected.set()

    async def close(self, writer: asyncio.StreamWriter) -> None:
        self.writers.discard(writer)
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()

    async def await_close(self, family: str, reader: asyncio.StreamReader, opened_s: float,
                          timeout_s: float) -> bool:
        """Read (and drop) until the broker closes the connection; True if it did within ``timeout_s``."""
        stats = self.stats[family]
        deadline = time.monotonic() + timeout_s
        try:
            while (left_s := deadline - time.monotonic()) > 0:
                chunk = await asyncio.wait_for(reader.read(1 << 16), left_s)
                if not chunk:
                    break
                stats.read_bytes += len(chunk)
            else:
                return False
        except TimeoutError:
            return False
        except OSError:
            pass  # reset by the broker: closed as well
        stats.closed_by_broker += 1
        stats.held_s.append(time.monotonic() - opened_s)
        return True

    # Families --------------------------------------------------------------------------------------------

    async def slowloris(self, index: int) -> None:
        await self._held("slowloris", wire.slowloris_head(self.plan.slowloris_claim_bytes),
                         self.plan.slowloris_byte_interval_s)

    async def idle(self, index: int) -> None:
        await self._held("idle", b"", None)

    async def _held(self, family: str, head: bytes, byte_interval_s: float | None) -> None:
        """Hold a connection (trickling a byte each ``byte_interval_s``); reopen it when the broker closes it."""
        stats, seen = self.stats[family], list[bool]()
        for _ in range(ACTIONS_MAX):
            if self.stopping:
                return
            opened = await self.connect(family)
            if opened is None:
                continue
            reader, writer = opened
            self.first_open(seen)
            opened_s = time.monotonic()
            writer.write(head)
            stats.sent_bytes += len(head)
            while True:
                wait_s = byte_interval_s if byte_interval_s is not None else self.plan.duration_s_max
                if await self.await_close(family, reader, opened_s, wait_s):
                    break
                if byte_interval_s is not None:
                    try:
                        writer.write(b"\0")
                    except (OSError, RuntimeError):
                        break
                    stats.sent_bytes += 1
                    stats.actions += 1
            await self.close(writer)
            await asyncio.sleep(self.plan.repeat_interval_s)

    async def oversize(self, index: int) -> None:
        await self._refused("oversize", lambda _: wire.oversize_claim())

    async def garbage(self, index: int) -> None:
        frames = list(wire.garbage_frames().values())
        await self._refused("garbage", lambda i: frames[(index + i) % len(frames)])

    async def _refused(self, family: str, payload: Any) -> None:
        """Send a frame the broker must refuse, wait for its close, again each repeat interval."""
        stats, seen = self.stats[family], list[bool]()
        for i in range(ACTIONS_MAX):
            if self.stopping:
                return
            opened = await self.connect(family)
            if opened is None:
                continue
            reader, writer = opened
            self.first_open(seen)
            data: bytes = payload(i)
            try:
                writer.write(data)
                stats.sent_bytes += len(data)
            except (OSError, RuntimeError):
                pass
            stats.actions += 1
            if not await self.await_close(family, reader, time.monotonic(), CLOSE_WAIT_S):
                stats.not_closed += 1
            await self.close(writer)
            await asyncio.sleep(self.plan.repeat_interval_s)

    async def churn(self, index: int) -> None:
        stats, seen = self.stats["churn"], list[bool]()
        for _ in range(ACTIONS_MAX):
            if self.stopping:
                return
            opened = await self.connect("churn")
            if opened is None:
                continue
            self.first_open(seen)
            stats.actions += 1
            await self.close(opened[1])
            await asyncio.sleep(self.plan.repeat_interval_s)

    async def pipeline(self, index: int) -> None:
        stats, seen = self.stats["pipeline"], list[bool]()
        opened = None
        while opened is None:
            if self.stopping:
                return
            opened = await self.connect("pipeline")
        self.first_open(seen)
        _, writer = opened
        request = wire.metadata_all_request(index)
        for i in range(self.plan.pipeline_requests_max):
            if writer.transport.is_closing():  # the broker closed it: nothing more to push
                stats.closed_by_broker += 1
                break
            writer.write(request)
            stats.sent_bytes += len(request)
            stats.actions += 1
            if i % PIPELINE_RUN == PIPELINE_RUN - 1:
                try:
                    await writer.drain()  # blocks once the kernel's buffers are full: the broker stopped reading
                except OSError:
                    stats.closed_by_broker += 1
                    break
        await asyncio.sleep(self.plan.duration_s_max)  # held, never read

    async def fetch_all(self, index: int) -> None:
        stats, seen = self.stats["fetch_all"], list[bool]()
        tail = index % 2 == 1
        offsets = list(self.plan.fetch_end_offsets) if tail else [0] * len(self.plan.fetch_end_offsets)
        request = wire.fetch_request(index, self.plan.fetch_topic, offsets, max_wait_ms=wire.INT32_MAX,
                                     min_bytes=wire.INT32_MAX)
        opened = None
        for _ in range(ACTIONS_MAX):
            if self.stopping:
                return
            if opened is None:
                opened = await self.connect("fetch_all")
                if opened is None:
                    continue
                self.first_open(seen)
            reader, writer = opened
            try:
                writer.write(request)
                stats.sent_bytes += len(request)
                head = await asyncio.wait_for(reader.readexactly(4), FETCH_ANSWER_WAIT_S)
                body = await asyncio.wait_for(reader.readexactly(wire.FRAME_SIZE.unpack(head)[0]),
                                              FETCH_ANSWER_WAIT_S)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                stats.closed_by_broker += 1
                stats.first_error = stats.first_error or f"fetch: {type(e).__name__}: {e}"
                await self.close(writer)
                opened = None
                await asyncio.sleep(self.plan.repeat_interval_s)
                continue
            stats.read_bytes += 4 + len(body)
            stats.actions += 1
            if not tail:
                await asyncio.sleep(self.plan.repeat_interval_s)

    # Running ---------------------------------------------------------------------------------------------

    async def run(self, stop: Any, ready: Any) -> dict[str, Any]:
        start_s = time.monotonic()
        deadline_s = start_s + self.plan.duration_s_max
        parent = os.getppid()
        tasks = [asyncio.create_task(getattr(self, family)(i), name=f"{family}-{i}")
                 for family, stats in self.stats.items() for i in range(stats.connections)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_connected.wait(), self.plan.ramp_s_max)
        ready.put({"connected": self.connected, "of": self.total, "ramp_s": time.monotonic() - start_s})
        why = "deadline"
        while time.monotonic() < deadline_s:
            if stop.is_set():
                why = "told to stop"
                break
            if os.getppid() != parent:
                why = "parent gone"
                break
            await asyncio.sleep(STOP_POLL_S)
        self.stopping = True
        for task in tasks:
            task.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        for writer in list(self.writers):
            writer.transport.abort()
        failures = [r for r in done if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"stopped": why, "seconds": time.monotonic() - start_s, "cpu_s": usage.ru_utime + usage.ru_stime,
                "task_failures": len(failures), "first_failure": repr(failures[0]) if failures else "",
                "families": {name: stats.document() for name, stats in self.stats.items()}}


def hostile_main(plan: HostilePlan, stop: Any, ready: Any, results: Any) -> None:
    """The child process's entry point: misbehave until ``stop`` is set or the deadline, then report."""
    # asyncio warns on every write to a connection the broker has closed, which is what a hostile
    # connection is here for: the counts in the report say how often it happened.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    async def main() -> dict[str, Any]:
        return await _Run(plan).run(stop, ready)

    results.put(asyncio.run(main()))
