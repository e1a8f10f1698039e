"""`stratalog bench produce-path`'s second part: one Produce through a live broker, timed at each hand-over.

A broker runs in this process (its event loop in the main thread, as `stratalog serve` runs it) and a
client thread sends one batch of one 256 B record per request (acks=all) over a plain connection, paced
as `bench kafka`'s latency runs (50 a second) and then back to back. The broker's code runs unchanged: the
timestamps come from wrapping, in this process only, the functions at each step's edge (the Produce
handler, its append, the WAL's block write, the response write). The rest of a round trip (the socket,
reading and decoding the request, the client) is what the client measures beyond the broker's steps.

Read it beside `bench log`: at 50 a second every step starts cold (idle CPUs woken, caches emptied by the
wait), which is where a produce's latency goes beyond the disk's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
import socket
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener, SecurityProtocol

#: Each step: the mark it starts at, the mark it ends at, what happens in it.
STEPS = (
    ("handler", "appended", "checked and appended: in the WAL's block, the block handed to the writer"),
    ("appended", "io_done", "the writer's thread wakes, writes and syncs on the device; the result back in "
     "Python (the event loop's wake-up; or the reaper's, then the GIL)"),
    ("io_done", "durable", "the appends completed in offset order, the event loop told (a wake-up if the "
     "reaper completed them)"),
    ("durable", "answered", "the response built"),
    ("answered", "written", "the response handed to the socket"),
)
MARKS = ("handler", "appended", "io_done", "durable", "answered", "written")
#: (name, seconds between requests): bench kafka's latency pace, and none.
PATTERNS = (("50 a second", 1 / 50), ("back to back", 0.0))
VALUE_BYTES = 256
#: Requests sent before those timed: the connection, the topic's creation and first appends.
WARMUP_REQUESTS = 20
TOPIC = "trace"


class _Tracer:
    """Marks of each Produce request the wrapped functions see; one request in flight at a time."""

    def __init__(self) -> None:
        self.requests: list[dict[str, float]] = []
        self.current: dict[str, float] | None = None

    def mark(self, name: str) -> None:
        if self.current is not None and name not in self.current:
            self.current[name] = time.perf_counter()


@contextmanager
def _wrapped(tracer: _Tracer) -> Iterator[None]:
    """The broker's functions at each step's edge, wrapped to mark the time; restored on the way out."""
    from stratalog.broker import api_log, server
    from stratalog.wal import log as wal_log

    produce, check_and_append = api_log.produce, api_log._check_and_append
    block_done = wal_log.WriteAheadLog._block_done
    write_response, apis = server.write_response, api_log.APIS

    async def traced_produce(broker: Any, request: Any, session: Any) -> Any:
        tracer.current = marks = {"handler": time.perf_counter()}
        out = await produce(broker, request, session)
        marks["answered"] = time.perf_counter()
        tracer.requests.append(marks)
        return out

    def traced_append(*args: Any) -> Any:
        out = check_and_append(*args)
        marks = tracer.current
        if marks is not None:
            marks["appended"] = time.perf_counter()
            out[0].add_done_callback(lambda _f: marks.setdefault("durable", time.perf_counter()))
        return out

    def traced_block_done(self: Any, token: object, error: BaseException | None) -> None:
        # The block of the request being handled: requests come one at a time, and the one before was
        # answered only after its block's completion, which runs in this call.
        tracer.mark("io_done")
        block_done(self, token, error)

    def traced_write_response(transport: Any, frame: Any) -> None:
        tracer.mark("written")
        write_response(transport, frame)

    api_log.APIS = tuple(  # type: ignore[assignment]
        dataclasses.replace(a, handler=traced_produce) if a.handler is produce else a for a in apis)
    api_log._check_and_append = traced_append  # type: ignore[assignment]
    wal_log.WriteAheadLog._block_done = traced_block_done  # type: ignore[method-assign]
    server.write_response = traced_write_response
    try:
        yield
    finally:
        api_log.APIS, api_log._check_and_append = apis, check_and_append
        wal_log.WriteAheadLog._block_done = block_done  # type: ignore[method-assign]
        server.write_response = write_response


def _client(bootstrap: str, requests: int, tracer: _Tracer, out: dict[str, Any], listening: threading.Event,
            progress: Callable[[], None], stop: Callable[[], None]) -> None:
    """Send each pattern's requests one at a time; each round trip and the marks the broker left."""
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.schema.types import TopicName
    from kio.static.primitive import Records, i16, i32, i32Timedelta

    from stratalog.kafka.client import KafkaConnection
    from stratalog.kafka.records import encode_batch

    def request() -> ProduceRequest:
        batch = encode_batch([(None, os.urandom(VALUE_BYTES), (), int(time.time() * 1000))], base_offset=0)
        return ProduceRequest(acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                              transactional_id=None, topic_data=(TopicProduceData(
                                  name=TopicName(TOPIC), partition_data=(
                                      PartitionProduceData(index=i32(0), records=Records(batch)),)),))

    try:
        listening.wait()
        with KafkaConnection(bootstrap, {}) as connection:
            for name, gap_s in PATTERNS:
                rounds: list[float] = []
                tracer.requests.clear()
                for i in range(WARMUP_REQUESTS + requests):
                    body = request()
                    started = time.perf_counter()
                    (partition,) = connection.call(0, 9, body).responses[0].partition_responses
                    rounds.append(time.perf_counter() - started)
                    if partition.error_code:
                        raise RuntimeError(f"the broker answered error {partition.error_code}")
                    time.sleep(gap_s)
                    if i >= WARMUP_REQUESTS:
                        progress()
                out[name] = {"round_trips_s": rounds[WARMUP_REQUESTS:],
                             "marks": list(tracer.requests[WARMUP_REQUESTS:])}
    except BaseException as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        stop()  # the broker finishes what is in flight, as on Ctrl-C


#: How the broker runs: `stratalog serve`'s own function (the command passes it in), given the data
#: directory, the config, no object store URI, and its ready and stop events.
RunBroker = Callable[..., Awaitable[None]]


def trace(data_dir: Path, requests: int, progress: Callable[[], None], run_broker: RunBroker,
          config: BrokerConfig) -> dict[str, Any]:
    """Run the broker here (in the main thread: it also takes SIGINT) with ``config`` on a free loopback
    port, under a client thread; the per-step milliseconds of each pattern."""
    tracer = _Tracer()
    out: dict[str, Any] = {}
    listening = threading.Event()
    with socket.socket() as probe:  # a free port for the broker (nothing else binds it in between here)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    config = dataclasses.replace(config, listeners=(Listener(SecurityProtocol.PLAINTEXT, "127.0.0.1", port),))

    loop_of: list[asyncio.AbstractEventLoop] = []
    stopping = asyncio.Event()

    def stop() -> None:
        with contextlib.suppress(IndexError, RuntimeError):  # the broker never started, or has ended
            loop_of[0].call_soon_threadsafe(stopping.set)

    async def serve() -> None:
        loop_of.append(asyncio.get_running_loop())
        ready = asyncio.Event()

        async def tell_client() -> None:
            await ready.wait()
            listening.set()

        told = asyncio.create_task(tell_client())
        try:
            await run_broker(data_dir, config, None, ready=ready, stop=stopping)
        finally:
            told.cancel()
            listening.set()  # a broker that failed to start lets the client end too

    disk = _disk_reference(data_dir.parent / "disk-reference", requests)
    client = threading.Thread(target=_client, args=(address, requests, tracer, out, listening, progress, stop),
                              name="produce-trace-client", daemon=True)
    with _wrapped(tracer):
        client.start()
        try:
            asyncio.run(serve())
        finally:
            listening.set()
            client.join()
    if "error" in out:
        raise RuntimeError(f"the trace client failed: {out['error']}")
    return {"value_bytes": VALUE_BYTES, "requests": requests, "disk_reference": disk,
            "patterns": [_summary(name, out[name]) for name, _ in PATTERNS]}


class _Quiet:
    def phase(self, description: str) -> None:
        pass

    def advance(self, fraction: float) -> None:
        pass


def _disk_reference(path: Path, requests: int) -> dict[str, Any]:
    """The bare disk's own synced 4 KiB write at the first pattern's pace (`bench log`'s reference)."""
    from stratalog.bench.log import BenchFailedError, disk_reference

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        run = disk_reference(path, 1 / PATTERNS[0][1], requests * PATTERNS[0][1], _Quiet())
    except (BenchFailedError, OSError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    ms = sorted(float(v) * 1e3 for v in run.latencies_s)
    return {"pattern": PATTERNS[0][0], "p50_ms": _pct(ms, 50), "p90_ms": _pct(ms, 90), "p99_ms": _pct(ms, 99)}


def _summary(name: str, run: dict[str, Any]) -> dict[str, Any]:
    complete = [m for m in run["marks"] if all(k in m for k in MARKS)]
    steps = []
    for start, end, what in STEPS:
        ms = sorted((m[end] - m[start]) * 1e3 for m in complete)
        steps.append({"step": what, "p50_ms": _pct(ms, 50), "p90_ms": _pct(ms, 90), "p99_ms": _pct(ms, 99)})
    inside = sorted((m["written"] - m["handler"]) * 1e3 for m in complete)
    rounds = sorted(s * 1e3 for s in run["round_trips_s"])
    return {"pattern": name, "samples": len(complete), "steps": steps,
            "broker_p50_ms": _pct(inside, 50), "round_trip_p50_ms": _pct(rounds, 50),
            "round_trip_p90_ms": _pct(rounds, 90), "round_trip_p99_ms": _pct(rounds, 99),
            "round_trip_mean_ms": statistics.fmean(rounds)}


def _pct(values: list[float], percent: float) -> float:
    """The nearest-rank percentile of sorted ``values``."""
    return values[min(len(values) - 1, max(0, round(percent / 100 * len(values) + 0.5) - 1))]
