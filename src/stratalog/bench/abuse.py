"""`stratalog bench abuse`: a well-behaved producer's latency while hostile connections misbehave.

One `stratalog serve` child process on 127.0.0.1 (an ephemeral port, the bench's data directory, its
default settings). One producer in this process (confluent-kafka, acks=all, linger.ms=0) sends one record
at a time at a fixed rate and times each from the send call to its acknowledgement, first with nothing
else running (the baseline), then while a separate hostile process (:mod:`stratalog.bench.abuse_hostile`)
keeps N connections busy in one family of abuse, each family in turn, then all families at once (N
split between them), then alone again (the broker should recover). Each phase records the producer's
p50/p99/p999, its p99 over the baseline's, the broker's resident memory at its peak (VmRSS, sampled) and
the sockets it held at the peak, how many log lines it wrote, and whether it still answered a fresh
connection afterwards.

The producer, the broker and the hostile process share the machine's cores: the figures that matter are
the ratios to the baseline measured in the same run, and the hostile process's CPU time is reported.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue as queues
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stratalog.bench import abuse_wire as wire
from stratalog.bench.abuse_hostile import HostilePlan, hostile_main
from stratalog.bench.common import summarize_latency_ms
from stratalog.chaos.broker_process import BrokerProcess, start_broker

BASELINE, ALL, BASELINE_AFTER = "baseline", "all", "baseline after"
GOOD_TOPIC = "abuse-good"
FETCH_TOPIC = "abuse-fetch"
#: Partitions of the topic the fetch_all family asks for everything of.
FETCH_PARTITIONS = 4
FETCH_RECORD_BYTES = 1 << 10
#: How often the broker's memory is sampled, and its sockets (a listing of its fds: dearer) every Nth time.
SAMPLE_INTERVAL_S = 0.1
SOCKETS_EVERY = 5
#: A produce not acknowledged this long after its send is a failure (the producer's message.timeout.ms).
ACK_WAIT_S = 30.0
#: Poll step while waiting for one acknowledgement: poll returns as soon as the report is there.
ACK_POLL_S = 0.1
#: The hostile process gets this long beyond the phase to open its connections and to stop.
HOSTILE_MARGIN_S = 30.0
#: How long the hostile process may take to report and exit once told to stop; then it is killed.
HOSTILE_STOP_TIMEOUT_S = 30.0
#: A hostile process that has exited may have put its report just before: it is awaited this long more.
EXITED_REPORT_WAIT_S = 5.0
#: After a phase, the broker should let go of the hostile connections' sockets within this long.
SOCKETS_RELEASE_WAIT_S = 15.0
#: A fresh connection's ApiVersions must be answered within this long for the broker to count as up.
ANSWER_TIMEOUT_S = 10.0
#: Records the producer sends before the baseline, unmeasured: connections, metadata, the first batches.
WARMUP_RECORDS = 50
#: Broker stop: SIGTERM, then SIGKILL after this long.
STOP_TIMEOUT_S = 30.0


class BenchAbortedError(RuntimeError):
    """The broker could not be started or prepared: nothing was measured."""


@dataclass(frozen=True, slots=True)
class AbuseBenchPlan:
    connections: int
    families: tuple[str, ...]
    phase_s: float
    rate_per_s: float
    record_bytes: int
    repeat_interval_s: float
    slowloris_byte_interval_s: float
    slowloris_claim_bytes: int
    pipeline_requests_max: int
    fetch_topic_bytes: int
    ramp_s_max: float
    #: The target: the broker's resident memory at its peak stays under this in every phase.
    memory_budget_mib: int
    #: A phase is cut short once the broker's memory passes this (a safety stop for the machine).
    rss_abort_mib: int
    data_dir: Path

    def phases(self) -> list[tuple[str, dict[str, int]]]:
        """(name, connections per family) in run order."""
        out: list[tuple[str, dict[str, int]]] = [(BASELINE, {})]
        out += [(family, {family: self.connections}) for family in self.families]
        if len(self.families) > 1:
            share, extra = divmod(self.connections, len(self.families))
            out.append((ALL, {f: share + (1 if i < extra else 0) for i, f in enumerate(self.families)}))
        out.append((BASELINE_AFTER, {}))
        return out


# The broker child ---------------------------------------------------------------------------------------


def read_status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` line of /proc/<pid>/status (VmRSS, VmHWM), or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds the process has used (/proc/<pid>/stat), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def count_sockets(pid: int) -> int | None:
    """Sockets among the process's open files: its connections, listener and event-loop wake-up pair."""
    try:
        with os.scandir(f"/proc/{pid}/fd") as entries:
            count = 0
            for entry in entries:
                with contextlib.suppress(OSError):
                    count += os.readlink(entry.path).startswith("socket:")
            return count
    except OSError:
        return None


def broker_answers(host: str, port: int) -> float | None:
    """Milliseconds for a fresh connection's ApiVersions to be answered, or None if it is not."""
    start_s = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=ANSWER_TIMEOUT_S) as sock:
            sock.sendall(wire.api_versions_request(7))
            head = _recv_exactly(sock, 4)
            if head is None:
                return None
            body = _recv_exactly(sock, struct.unpack(">i", head)[0])
            if body is None or body[:4] != struct.pack(">i", 7):
                return None
    except OSError:
        return None
    return (time.perf_counter() - start_s) * 1000.0


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class Sampler:
    """Samples the broker's resident memory and sockets on a thread; keeps each phase's peaks."""

    def __init__(self, pid: int, rss_abort_kib: int) -> None:
        self.pid = pid
        self.rss_abort_kib = rss_abort_kib
        self.over_abort = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.rss_kib_peak = 0
        self.sockets_peak = 0
        self.sockets_last = 0
        self._thread = threading.Thread(target=self._run, name="abuse-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(STOP_TIMEOUT_S)

    def reset(self) -> None:
        with self._lock:
            self.rss_kib_peak = read_status_kib(self.pid, "VmRSS") or 0
            self.sockets_peak = self.sockets_last = count_sockets(self.pid) or 0

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            rss = read_status_kib(self.pid, "VmRSS")
            sockets = count_sockets(self.pid) if tick % SOCKETS_EVERY == 0 else None
            tick += 1
            with self._lock:
                if rss is not None:
                    self.rss_kib_peak = max(self.rss_kib_peak, rss)
                    if rss > self.rss_abort_kib:
                        self.over_abort.set()
                if sockets is not None:
                    self.sockets_last = sockets
                    self.sockets_peak = max(self.sockets_peak, sockets)


# The well-behaved producer ------------------------------------------------------------------------------


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    # NewTopic lives in confluent_kafka.admin, whose type stubs leave it out of __all__.
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=30).values():
        future.result(60)


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                     "message.timeout.ms": int(ACK_WAIT_S * 1000)})


def prefill_fetch_topic(bootstrap: str, total_bytes: int) -> tuple[int, ...]:
    """Write ``total_bytes`` of 1 KiB records over the fetch topic's partitions; their end offsets."""
    _create_topic(bootstrap, FETCH_TOPIC, FETCH_PARTITIONS)
    per_partition = max(1, total_bytes // FETCH_RECORD_BYTES // FETCH_PARTITIONS)
    producer = _producer(bootstrap)
    payload = os.urandom(FETCH_RECORD_BYTES)
    for i in range(per_partition * FETCH_PARTITIONS):
        while True:
            try:
                producer.produce(FETCH_TOPIC, payload, partition=i % FETCH_PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(ACK_WAIT_S):
        raise BenchAbortedError("the fetch topic's records were not all acknowledged")
    return (per_partition,) * FETCH_PARTITIONS


@dataclass(slots=True)
class ProducerRun:
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    seconds: float = 0.0


def _reporter(done: list[tuple[Any, float]]) -> Callable[[Any, Any], None]:
    def on_delivery(err: Any, _msg: Any) -> None:
        done.append((err, time.perf_counter()))
    return on_delivery


def produce_one_at_a_time(producer: Any, payload: bytes, rate_per_s: float, duration_s: float,
                          stop: threading.Event, tick: Callable[[float], None]) -> ProducerRun:
    """Send a record, wait for its acknowledgement, wait for the next send time; ``duration_s`` of it."""
    run = ProducerRun()
    count = max(1, round(duration_s * rate_per_s))
    interval_s = 1.0 / rate_per_s
    start_s = time.perf_counter()
    for i in range(count):
        if stop.is_set():
            break
        wait_s = start_s + i * interval_s - time.perf_counter()
        if wait_s > 0:
            time.sleep(wait_s)
        done: list[tuple[Any, float]] = []
        sent_s = time.perf_counter()
        producer.produce(GOOD_TOPIC, payload, on_delivery=_reporter(done))
        run.sent += 1
        deadline_s = sent_s + ACK_WAIT_S + ACK_POLL_S * 10
        while not done and time.perf_counter() < deadline_s:
            producer.poll(ACK_POLL_S)
        if not done:
            run.errors.append(f"record {i}: no delivery report in {ACK_WAIT_S:g} s")
            break
        err, acked_s = done[0]
        if err is not None:
            run.errors.append(f"record {i}: {err}")
        else:
            run.latencies_s.append(acked_s - sent_s)
        if i % 50 == 0:
            tick(i / count)
    run.seconds = time.perf_counter() - start_s
    return run


# One phase ----------------------------------------------------------------------------------------------


def _get(q: Any, process: Any, timeout_s: float) -> Any:
    """The next item of ``q``, or None if ``process`` exits or ``timeout_s`` passes without one."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        try:
            return q.get(timeout=0.25)
        except queues.Empty:
            if not process.is_alive():
                # What it put just before exiting may still be on its way through the pipe.
                with contextlib.suppress(queues.Empty):
                    return q.get(timeout=EXITED_REPORT_WAIT_S)
                return None
    return None


@contextlib.contextmanager
def hostile_process(plan: AbuseBenchPlan, broker: BrokerProcess, counts: dict[str, int],
                    fetch_end_offsets: tuple[int, ...]) -> Iterator[dict[str, Any]]:
    """Start the hostile process, yield once its connections are open (or its ramp time is up), then stop it;
    the yielded dict gets its ramp and, on the way out, its report."""
    ctx = multiprocessing.get_context("spawn")  # no copy of this process's client threads
    stop, ready, results = ctx.Event(), ctx.Queue(), ctx.Queue()
    hplan = HostilePlan(host=broker.host, port=broker.port, connections=counts,
                        duration_s_max=plan.ramp_s_max + plan.phase_s + HOSTILE_MARGIN_S,
                        ramp_s_max=plan.ramp_s_max, repeat_interval_s=plan.repeat_interval_s,
                        slowloris_byte_interval_s=plan.slowloris_byte_interval_s,
                        slowloris_claim_bytes=plan.slowloris_claim_bytes,
                        pipeline_requests_max=plan.pipeline_requests_max, fetch_topic=FETCH_TOPIC,
                        fetch_end_offsets=fetch_end_offsets)
    process = ctx.Process(target=hostile_main, args=(hplan, stop, ready, results), name="abuse-hostile",
                          daemon=True)
    doc: dict[str, Any] = {}
    process.start()
    try:
        doc["ramp"] = _get(ready, process, plan.ramp_s_max + HOSTILE_MARGIN_S) or {"error": "no ramp report"}
        yield doc
    finally:
        stop.set()
        report = _get(results, process, HOSTILE_STOP_TIMEOUT_S)
        process.join(HOSTILE_STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join(STOP_TIMEOUT_S)
        doc["report"] = report or {"error": f"no report (exit status {process.exitcode})"}


def run_phase(name: str, counts: dict[str, int], plan: AbuseBenchPlan, broker: BrokerProcess, producer: Any,
              sampler: Sampler, fetch_end_offsets: tuple[int, ...], payload: bytes,
              tick: Callable[[float], None]) -> dict[str, Any]:
    sampler.reset()
    log_lines_before = len(broker.output)
    doc: dict[str, Any] = {"name": name, "connections": sum(counts.values()), "families": counts}
    with contextlib.ExitStack() as stack:
        hostile = stack.enter_context(hostile_process(plan, broker, counts, fetch_end_offsets)) if counts else {}
        if sampler.over_abort.is_set():
            run = ProducerRun()
        else:
            run = produce_one_at_a_time(producer, payload, plan.rate_per_s, plan.phase_s, sampler.over_abort,
                                        tick)
        doc["broker_sockets_during_phase_end"] = sampler.sockets_last
    doc["hostile"] = hostile
    doc["produce_ms"] = summarize_latency_ms(np.array(run.latencies_s, dtype=np.float64))
    doc.update(sent=run.sent, seconds=run.seconds, errors=run.errors[:5], error_count=len(run.errors))
    doc["broker_rss_mib_peak"] = sampler.rss_kib_peak / 1024
    doc["broker_sockets_peak"] = sampler.sockets_peak
    doc["aborted"] = (f"broker RSS passed {plan.rss_abort_mib:,} MiB: phase cut short"
                      if sampler.over_abort.is_set() else "")
    doc["broker_log_lines"] = len(broker.output) - log_lines_before
    doc["broker_alive"] = broker.process.poll() is None
    doc["answer_ms"] = broker_answers(broker.host, broker.port) if doc["broker_alive"] else None
    doc["broker_up"] = doc["broker_alive"] and doc["answer_ms"] is not None
    doc["broker_sockets_after"] = _sockets_settled(broker.process.pid)
    return doc


def _sockets_settled(pid: int) -> int | None:
    """The broker's sockets once their count stops falling (hostile connections let go), bounded in time."""
    deadline_s = time.monotonic() + SOCKETS_RELEASE_WAIT_S
    last = count_sockets(pid)
    while time.monotonic() < deadline_s:
        time.sleep(0.5)
        now = count_sockets(pid)
        if now is None or now == last:
            return now
        last = now
    return last


# The run ------------------------------------------------------------------------------------------------


def run_abuse_bench(plan: AbuseBenchPlan, bar: Any) -> dict[str, Any]:
    """Start the broker, prepare the topics, run every phase, stop the broker (also on errors)."""
    bar.phase("starting the broker")
    broker = start_broker(plan.data_dir / "broker")
    try:
        return _measure(plan, broker, bar)
    finally:
        if broker.process.poll() is None:
            broker.stop()
        broker.close_output()


def _measure(plan: AbuseBenchPlan, broker: BrokerProcess, bar: Any) -> dict[str, Any]:
    pid = broker.process.pid
    out: dict[str, Any] = {"broker": {"address": broker.bootstrap, "pid": pid,
                                      "command": [str(a) for a in broker.process.args]}}  # type: ignore[union-attr]
    _create_topic(broker.bootstrap, GOOD_TOPIC, 1)
    offsets = prefill_fetch_topic(broker.bootstrap, plan.fetch_topic_bytes)
    out["fetch_topic"] = {"name": FETCH_TOPIC, "partitions": FETCH_PARTITIONS, "end_offsets": list(offsets),
                          "bytes": sum(offsets) * FETCH_RECORD_BYTES}
    producer = _producer(broker.bootstrap)
    payload = os.urandom(plan.record_bytes)
    never = threading.Event()
    warm = produce_one_at_a_time(producer, payload, plan.rate_per_s, WARMUP_RECORDS / plan.rate_per_s, never,
                                 lambda _: None)
    if warm.errors:
        raise BenchAbortedError(f"the producer's warm-up failed: {warm.errors[0]}")
    out["broker"]["rss_mib_before"] = (read_status_kib(pid, "VmRSS") or 0) / 1024
    out["broker"]["sockets_before"] = count_sockets(pid)
    phases = []
    with Sampler(pid, plan.rss_abort_mib * 1024) as sampler:
        for name, counts in plan.phases():
            what = f"{sum(counts.values()):,} hostile connections" if counts else "no abuse"
            bar.phase(f"{name}: {what}, producer at {plan.rate_per_s:g}/s for {plan.phase_s:g} s")
            phases.append(run_phase(name, counts, plan, broker, producer, sampler, offsets, payload, bar.advance))
            if not phases[-1]["broker_alive"]:
                break  # nothing left to measure
    producer.flush(ACK_WAIT_S)
    baseline_p99 = phases[0]["produce_ms"]["p99"] if phases[0]["produce_ms"]["samples"] else None
    for phase in phases:
        p99 = phase["produce_ms"]["p99"] if phase["produce_ms"]["samples"] else None
        phase["p99_over_baseline"] = p99 / baseline_p99 if p99 is not None and baseline_p99 else None
    out["broker"]["rss_mib_hwm"] = (read_status_kib(pid, "VmHWM") or 0) / 1024
    out["broker"]["cpu_s"] = cpu_s(pid)
    out["broker"]["alive_at_end"] = broker.process.poll() is None
    out["phases"] = phases
    return out


def rss_mib_peak(doc: dict[str, Any]) -> float:
    return max((p["broker_rss_mib_peak"] for p in doc["phases"]), default=0.0)

