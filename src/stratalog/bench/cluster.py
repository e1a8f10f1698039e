"""`stratalog bench cluster`: what several brokers give on this machine, and what a failover costs.

Over one PostgreSQL and one SeaweedFS of its own (``chaos/cluster_process.py``), all on 127.0.0.1:

1. **Throughput**: a cluster of 1, then 2, then 3 brokers (each a fresh database and object prefix),
   a 6-partition topic, one confluent-kafka producer (idempotent, acks=all, 1 KiB records) sending as
   fast as the brokers take it; acknowledged records per second over ``seconds`` after a warm-up. Every
   broker, SeaweedFS, PostgreSQL and the client share the machine's cores, so the scaling shown is that
   of this machine, not of the design.
2. **Produce latency**: one broker with its write-ahead log in the object store (``--cluster``) against
   one plain broker with its WAL on the local device, in the same run, at the same paced rate; from
   ``produce()`` to the acknowledgement.
3. **Failover**: three brokers under a light paced load; a broker killed with SIGKILL, the time until
   every partition has a live leader that answers for it; restarted and the partitions spread again
   before the next round.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stratalog.bench.common import KIB_BYTES, MIB_BYTES, machine_info, summarize_latency_ms
from stratalog.chaos.broker_process import running_broker
from stratalog.chaos.cluster_load import wait_for
from stratalog.chaos.cluster_probe import PartitionView, served_without
from stratalog.chaos.cluster_process import (
    CLUSTER_TOML,
    BrokerCluster,
    ClusterServices,
    running_cluster,
    running_services,
)
from stratalog.chaos.harness import ChaosHarnessError

TOPIC = "bench"
PARTITIONS = 6
RECORD_BYTES = KIB_BYTES
BROKER_COUNTS = (1, 2, 3)
#: Sending before the measured window: connections made, batches flowing.
WARM_UP_S = 2.0
#: A warm-up with no record acknowledged by then is a broken cluster, not a slow one.
WARM_UP_S_MAX = 120.0
#: Between rounds of the failover phase's light load: one record per partition every 0.05 s.
FAILOVER_ROUND_S = 0.05
#: How long a failover, and the spread of partitions after a restart, may take.
FAILOVER_S_MAX = 60.0
REBALANCE_S_MAX = 120.0
#: How long the producer may take to have its last records answered.
FLUSH_S_MAX = 60.0
#: librdkafka's own queue of records not yet acknowledged: bounded so that a saturated run measures the
#: brokers, not a queue growing in the client.
QUEUE_RECORDS_MAX = 20_000


@dataclass(frozen=True, slots=True)
class ClusterBenchPlan:
    seconds: float
    latency_rate_per_s: float
    failover_rounds: int
    seed: int
    dir_path: Path


class Phases:
    """What the command shows while the bench runs: one call per phase begun."""

    def __init__(self, on_phase: Callable[[str], None]) -> None:
        self.on_phase = on_phase

    def begin(self, what: str) -> None:
        self.on_phase(what)


def _producer(bootstrap: str, linger_ms: int) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                     "linger.ms": linger_ms, "message.timeout.ms": 120_000, "log_level": 0,
                     "queue.buffering.max.messages": QUEUE_RECORDS_MAX})


def produce_for(bootstrap: str, seconds: float, rate_per_s: float | None) -> dict[str, Any]:
    """Send 1 KiB records round robin over the partitions, as fast as they are taken (``rate_per_s`` None)
    or paced: a warm-up, then ``seconds`` measured; count those acknowledged in the window, and the latency
    of those sent in it. The warm-up lasts WARM_UP_S and until a first record is acknowledged (a busy
    machine may take longer to connect: the window starts once records flow, never before)."""
    producer = _producer(bootstrap, 5 if rate_per_s is None else 0)
    value = bytes(RECORD_BYTES)
    started = time.monotonic()
    #: The measured window, once the warm-up has ended (inf: not yet).
    window = [math.inf, math.inf]
    latencies_s: list[float] = []
    counts = {"acked_in_window": 0, "failed": 0, "sent": 0, "acked": 0}

    def delivered(error: object, _message: object, sent_at: float) -> None:
        now = time.monotonic()
        if error is not None:
            counts["failed"] += 1
            return
        counts["acked"] += 1
        if window[0] <= now < window[1]:
            counts["acked_in_window"] += 1
        if window[0] <= sent_at < window[1]:
            latencies_s.append(now - sent_at)

    while (now := time.monotonic()) < window[1]:
        if window[0] == math.inf and counts["acked"] and now >= started + WARM_UP_S:
            window[:] = [now, now + seconds]
        elif now > started + WARM_UP_S_MAX and not counts["acked"]:
            raise ChaosHarnessError(f"no record was acknowledged within {WARM_UP_S_MAX:.0f} s of the first "
                                    f"send to {bootstrap}")
        if rate_per_s is not None:
            due = started + counts["sent"] / rate_per_s
            if due > now:
                producer.poll(min(due - now, 0.01))
                continue
        try:
            producer.produce(TOPIC, value=value, partition=counts["sent"] % PARTITIONS,
                             on_delivery=functools.partial(delivered, sent_at=now))
        except BufferError:
            producer.poll(0.005)
            continue
        counts["sent"] += 1
        producer.poll(0)
    unanswered = producer.flush(FLUSH_S_MAX)
    records = counts["acked_in_window"]
    return {
        "seconds": seconds, "records": records, "records_per_s": records / seconds,
        "mib_per_s": records * RECORD_BYTES / MIB_BYTES / seconds, "sent": counts["sent"],
        "failed": counts["failed"], "unanswered": unanswered,
        "latency_ms": summarize_latency_ms(np.array(latencies_s, dtype=np.float64)) if latencies_s else None,
    }


def _create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)


def _spread(cluster: BrokerCluster) -> dict[int, PartitionView] | None:
    """Each partition's leader once every partition is served and the live brokers' loads differ by one
    at most."""
    live = cluster.live()
    view = served_without(cluster, live[0], TOPIC, PARTITIONS)
    if view is None:
        return None
    loads = Counter(v.leader_id for v in view.values())
    counts = [loads.get(i, 0) for i in live]
    return view if max(counts) - min(counts) <= 1 else None


@contextlib.contextmanager
def _ready_cluster(services: ClusterServices, base: Path, count: int) -> Iterator[BrokerCluster]:
    """A fresh cluster of ``count`` brokers with the topic made and spread over them; killed on exit."""
    with running_cluster(base, services.fresh_database(), services.objects(), count, CLUSTER_TOML) as cluster:
        _create_topic(cluster.bootstrap())
        wait_for(lambda: _spread(cluster), "the topic's partitions spread over the brokers", REBALANCE_S_MAX, 0.2)
        yield cluster


def throughput(services: ClusterServices, plan: ClusterBenchPlan, phases: Phases) -> list[dict[str, Any]]:
    rows = []
    for count in BROKER_COUNTS:
        phases.begin(f"throughput, {count} broker{'s' if count > 1 else ''}")
        with _ready_cluster(services, plan.dir_path / f"throughput-{count}", count) as cluster:
            rows.append({"brokers": count, **produce_for(cluster.bootstrap(), plan.seconds, None)})
    return rows


def latency(services: ClusterServices, plan: ClusterBenchPlan, phases: Phases) -> list[dict[str, Any]]:
    phases.begin("latency, one broker, WAL in the object store")
    with _ready_cluster(services, plan.dir_path / "latency-object", 1) as cluster:
        objects = produce_for(cluster.bootstrap(), plan.seconds, plan.latency_rate_per_s)
    phases.begin("latency, one plain broker, WAL on the device")
    with running_broker(plan.dir_path / "latency-device") as broker:
        _create_topic(broker.bootstrap)
        device = produce_for(broker.bootstrap, plan.seconds, plan.latency_rate_per_s)
    return [{"wal": "object", "serve": "serve --cluster", **objects},
            {"wal": "device", "serve": "serve", **device}]


class _LightLoad:
    """A paced producer in a thread during the failover rounds: the clients' retries are part of what a
    failover costs."""

    def __init__(self, bootstrap: str) -> None:
        self.acked = 0
        self.failed = 0
        self._stop = threading.Event()
        self._producer = _producer(bootstrap, 5)
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-cluster-load")
        self._thread.start()

    def _delivered(self, error: object, _message: object) -> None:
        if error is None:
            self.acked += 1
        else:
            self.failed += 1

    def _run(self) -> None:
        while not self._stop.wait(FAILOVER_ROUND_S):
            for p in range(PARTITIONS):
                self._producer.produce(TOPIC, value=bytes(RECORD_BYTES), partition=p, on_delivery=self._delivered)
            self._producer.poll(0)
        self._producer.flush(FLUSH_S_MAX)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=FLUSH_S_MAX + 30)


def failover(services: ClusterServices, plan: ClusterBenchPlan, phases: Phases) -> dict[str, Any]:
    rng = random.Random(plan.seed)
    rounds: list[dict[str, Any]] = []
    with _ready_cluster(services, plan.dir_path / "failover", 3) as cluster:
        load = _LightLoad(cluster.bootstrap())
        try:
            wait_for(lambda: load.acked > 0, "the first acknowledgement", FAILOVER_S_MAX)
            for index in range(plan.failover_rounds):
                phases.begin(f"failover, round {index + 1} of {plan.failover_rounds}")
                victim = rng.choice(cluster.live())
                killed_at = time.monotonic()
                cluster.brokers[victim].kill9()
                survivor = next(i for i in cluster.live() if i != victim)
                wait_for(functools.partial(served_without, cluster, survivor, TOPIC, PARTITIONS, frozenset({victim})),
                         f"the partitions of broker {victim} served by the others", FAILOVER_S_MAX, 0.05)
                rounds.append({"broker_id": victim, "failover_s": time.monotonic() - killed_at})
                cluster.start(victim)
                wait_for(functools.partial(_spread, cluster), "the partitions spread again", REBALANCE_S_MAX, 0.2)
        finally:
            load.stop()
    times = [r["failover_s"] for r in rounds]
    return {"rounds": rounds, "min_s": min(times), "p50_s": statistics.median(times), "max_s": max(times),
            "load_records_acknowledged": load.acked, "load_failed": load.failed}


def run_cluster_bench(plan: ClusterBenchPlan, on_phase: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every phase over one PostgreSQL and one SeaweedFS; everything started is stopped on return."""
    phases = Phases(on_phase)
    phases.begin("starting PostgreSQL and SeaweedFS")
    busy_before_s, tree_before_s = _busy_cpu_s(), _tree_cpu_s()
    with running_services(plan.dir_path) as services:
        doc = {
            "machine": machine_info(plan.dir_path),
            "settings": {"seconds": plan.seconds, "warm_up_s": WARM_UP_S, "record_bytes": RECORD_BYTES,
                         "partitions": PARTITIONS, "latency_rate_per_s": plan.latency_rate_per_s,
                         "failover_rounds": plan.failover_rounds, "seed": plan.seed,
                         "cluster_toml": CLUSTER_TOML.strip()},
            "throughput": throughput(services, plan, phases),
            "latency": latency(services, plan, phases),
            "failover": failover(services, plan, phases),
        }
    # Every server this run started has been stopped and waited for by now, so their CPU time is in
    # this process's children's: what is left of the machine's busy time is everything else's.
    other_cpu_s = (_busy_cpu_s() - busy_before_s) - (_tree_cpu_s() - tree_before_s)
    doc["other_activity"] = {"other_cpu_s": max(0.0, other_cpu_s)}
    return doc


def _tree_cpu_s() -> float:
    """CPU time of this process and of its children that have ended (the brokers, the servers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _busy_cpu_s() -> float:
    """User + nice + system CPU time of the whole machine since boot."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:4]]
    return sum(fields) / os.sysconf("SC_CLK_TCK")
