"""`stratalog bench kafka`'s transactional phases, run against stratalog only, after each size's
plain phases of :mod:`stratalog.bench.kafka`, whose producer processes, settings and consumer they reuse.

Produce: the same producer processes and message counts as the plain throughput produce, each with a
``transactional.id`` of its own: init_transactions before the clock starts, then a transaction begun,
its messages produced, and committed every ``COMMIT_INTERVAL_S`` (librdkafka's commit_transaction first
waits for every message of the transaction to be acknowledged). Its rate over the plain produce's of the
same run is the first ratio (target: 0.8x, in :mod:`stratalog.bench.kafka_report`). A transactional
producer is idempotent: the same producers once more with enable.idempotence=true and no transactions
split that ratio into what idempotence costs and what the transactions add to it.

What idempotence costs here is librdkafka's (2.16), not the broker's. Its per-partition bound on requests
in flight (5, the broker's window of remembered batches) is checked against the partition's count of
*messages* in flight, so once a request of 5 messages or more is out no other leaves for that partition
(rdkafka_broker.c, ``rd_kafka_toppar_producer_serve``; librdkafka pull request 4989): one produce
request per partition in flight, where the plain producer keeps a queue of them. And while it waits with
a batch ready, its broker thread polls its sockets with a zero timeout in a loop (``strace -c`` of that
thread at 1 KiB: 109,472 polls in 2 s against 376 for the plain producer), taking CPU from the broker and
the other producers on a machine of few vCPUs. The broker appends a connection's pipelined produces
without waiting for the durability of the one before (tests/test_broker_produce_pipeline.py), so a client
that keeps several in flight gets them appended at once; ``--server-cpus`` keeps the server's vCPUs its
own.

Tail read: a transactional run small enough to stay in the broker's log cache (the produce run itself,
or one of its own as in the plain phases) is read back at once by the plain phases' consumer, with
isolation.level=read_uncommitted and with read_committed, so that Fetch computes the last stable offset
and the aborted transactions of each range, and the client skips the commit markers. The read_committed
rate over the read_uncommitted one is the second ratio (target: 0.9x).

The peers are not measured here: NATS is not a Kafka broker, and the issue measures stratalog's
transactions against its own plain phases (their results say so instead of holding figures).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stratalog.bench.kafka import (
    DRAIN_TIMEOUT_S,
    KafkaBenchPlan,
    Server,
    await_upload,
    kafka_consume_throughput,
    kafka_create_topic,
    kafka_producer_main,
    last_object_id,
    process_cpu_s,
    produce_queued,
    produce_throughput,
    store_setting,
    summarize_ms,
    throughput_producer_config,
    with_server_cpu,
    within_upload_interval,
)

#: How often each producer commits: every 100 ms, a typical exactly-once app's commit
#: interval (Kafka Streams commits every 100 ms with exactly-once on), long enough that a commit's flush and
#: EndTxn are a small part of it, short enough that read_committed readers lag by little.
COMMIT_INTERVAL_S = 0.1
#: The producer looks at the clock once every this many messages: at 100 B a producer sends one about every
#: 2 us, so 256 messages are well under 1 ms of a 100 ms transaction, and a clock read per message would
#: add to the loop the plain producers do not run.
COMMIT_CHECK_EVERY = 256
#: The two consumers of the tail read, as librdkafka's isolation.level values.
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
#: The tail is read in rounds, one read at each isolation level per round, the order alternating (ABBA...),
#: each level's figure the median of its reads: a read's timed part lasts 0.05-0.5 s here and one stall of
#: the shared CPUs or disk moves it by tens of percent (2x between two reads of the same level, seen).
#: Another round starts only if it can end before the broker's upload interval since the tail run's first
#: append (less READ_MARGIN_S), so that every read comes from the log cache: at least one round, and at
#: most this many.
READ_ROUNDS_MAX = 5
#: Left of the upload interval when rounds stop: about a round's length, which varies by as much.
READ_MARGIN_S = 1.0
#: The idempotent reference producers' settings beside the plain ones: a transactional producer's, less
#: its transactional.id.
IDEMPOTENT_CONFIGS = {"enable.idempotence": True}
#: Why a peer has no transactional phases.
NOT_MEASURED = {
    "nats": "not a Kafka broker: no transactions",
    "tansu": "the transactional phases measure stratalog against its own plain phases",
}


@dataclass(slots=True)
class _Tally:
    """One producer process's transactions: what was committed and aborted, and how long each commit took,
    in its two parts: the flush (every message of the transaction acknowledged) and the end (EndTxn)."""

    committed: int = 0
    aborted: int = 0
    flush_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def end(self, producer: Any, messages: int) -> bool:
        """Commit the open transaction of ``messages``; abort it if the commit says so. False: the producer
        cannot go on (a fatal error)."""
        from confluent_kafka import KafkaException

        began_s = time.monotonic()
        # commit_transaction flushes first anyway; flushed here, the two parts are timed apart.
        producer.flush(DRAIN_TIMEOUT_S)
        flushed_s = time.monotonic()
        try:
            producer.commit_transaction(DRAIN_TIMEOUT_S)
        except KafkaException as e:
            self.errors.append(f"commit: {e.args[0]}")
            if not e.args[0].txn_requires_abort():
                return False
            producer.abort_transaction(DRAIN_TIMEOUT_S)
            self.aborted += messages
            return True
        self.flush_s.append(flushed_s - began_s)
        self.end_s.append(time.monotonic() - flushed_s)
        self.committed += messages
        return True


def kafka_txn_producer_main(bootstrap: str, topic: str, size: int, count: int, index: int, progress: Any,
                            ready: Any, go: Any, results: Any) -> None:
    """One transactional producer process: the plain producer's settings and loop, a transaction committed
    every COMMIT_INTERVAL_S; the clock runs to the last commit's end."""
    from confluent_kafka import Producer

    acked = [0, 0]  # acknowledged, failed

    def on_delivery(err: Any, _msg: Any) -> None:
        acked[0 if err is None else 1] += 1

    producer = Producer({**throughput_producer_config(bootstrap, on_delivery),
                         "transactional.id": f"bench-{topic}-{index}"})
    producer.init_transactions(DRAIN_TIMEOUT_S)  # the coordinator's id and epoch, before the clock starts
    producer.list_topics(topic, timeout=30)
    payload = os.urandom(size)
    tally = _Tally()
    ready.put(index)
    go.wait()
    start_s = opened_s = time.monotonic()
    start_cpu_s = process_cpu_s()
    producer.begin_transaction()
    opened_at = 0  # the index of the open transaction's first message
    going = True
    for i in range(count):
        produce_queued(producer, topic, payload)
        if i % 10_000 == 0:
            producer.poll(0)
            progress[index] = acked[0]
        if i % COMMIT_CHECK_EVERY == 0 and time.monotonic() - opened_s >= COMMIT_INTERVAL_S:
            going = tally.end(producer, i + 1 - opened_at)
            if not going:
                break
            producer.begin_transaction()
            opened_s, opened_at = time.monotonic(), i + 1
    if going:
        tally.end(producer, count - opened_at)
    end_s = time.monotonic()
    progress[index] = acked[0]
    results.put({"index": index, "start_s": start_s, "end_s": end_s, "acknowledged": acked[0], "failed": acked[1],
                 "unacknowledged": len(producer), "error": tally.errors[0] if tally.errors else None,
                 "committed": tally.committed, "aborted": tally.aborted, "flush_s": tally.flush_s,
                 "end_txn_s": tally.end_s, "cpu_s": process_cpu_s() - start_cpu_s})


def _transactions(done: list[dict[str, Any]]) -> dict[str, Any]:
    """What the producers' transactions add to the produce result: the messages committed and aborted, the
    commits, how long their two parts took, and the share of the producers' time spent in each."""
    flush_s = np.array([s for d in done for s in d["flush_s"]], dtype=np.float64)
    end_s = np.array([s for d in done for s in d["end_txn_s"]], dtype=np.float64)
    busy_s = sum(d["end_s"] - d["start_s"] for d in done)
    return {"committed": sum(d["committed"] for d in done), "aborted": sum(d["aborted"] for d in done),
            "transactions": int(end_s.size), "flush_ms": summarize_ms(flush_s), "end_txn_ms": summarize_ms(end_s),
            "flush_share": float(flush_s.sum()) / busy_s if busy_s else 0.0,
            "end_txn_share": float(end_s.sum()) / busy_s if busy_s else 0.0}


def produce_transactional(server: Server, topic: str, size: int, count: int, plan: KafkaBenchPlan,
                          bar: Any) -> dict[str, Any]:
    """``count`` messages into a new ``topic`` by the plan's producers, in transactions; ok only if every
    message was committed."""
    try:
        kafka_create_topic(server.address, topic)
        result = with_server_cpu(server, lambda: produce_throughput(
            kafka_txn_producer_main, (server.address, topic), size, count, plan.producers, bar.advance, _transactions))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if result["committed"] != count:
        result["ok"] = False
        result["errors"].append(f"{result['committed']:,} of {count:,} messages committed")
    return {**result, "topic": topic, "commit_interval_ms": COMMIT_INTERVAL_S * 1000}


def produce_idempotent(server: Server, topic: str, size: int, count: int, plan: KafkaBenchPlan,
                       bar: Any) -> dict[str, Any]:
    """The plain produce's producers with IDEMPOTENT_CONFIGS: what the transactional ones are without
    transactions."""
    try:
        kafka_create_topic(server.address, topic)
        result = with_server_cpu(server, lambda: produce_throughput(
            kafka_producer_main, (server.address, topic, IDEMPOTENT_CONFIGS), size, count, plan.producers,
            bar.advance))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {**result, "topic": topic, "producer_configs": IDEMPOTENT_CONFIGS}


def read_both_levels(server: Server, topic: str, size: int, count: int, deadline_s: float,
                     bar: Any) -> dict[str, dict[str, Any]]:
    """``topic`` read from the start at each isolation level, in rounds (ABBA...) while another round ends
    before ``deadline_s`` (time.monotonic), READ_ROUNDS_MAX at most; per level, the median of its reads."""
    reads: dict[str, list[dict[str, Any]]] = {level: [] for level in ISOLATION_LEVELS}
    round_s = 0.0
    for round_index in range(READ_ROUNDS_MAX):
        if round_index and time.monotonic() + round_s > deadline_s:
            break
        began_s = time.monotonic()
        for level in ISOLATION_LEVELS if round_index % 2 == 0 else ISOLATION_LEVELS[::-1]:
            try:
                reads[level].append(kafka_consume_throughput(server.address, topic, size, count, bar.advance,
                                                             level))
            except Exception as e:
                reads[level].append({"error": f"{type(e).__name__}: {e}", "isolation_level": level})
        round_s = time.monotonic() - began_s
    return {level: _median_read(level, runs) for level, runs in reads.items()}


def _median_read(level: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One level's reads as one figure: the median rate of reads that each took every message, or the
    first read that fell short (then the level has no rate to compare)."""
    short = [r for r in runs if not r.get("ok")]
    if short:
        return {**short[0], "reads": runs, "summary": "a read fell short"}
    return {"isolation_level": level, "messages": runs[0]["messages"], "expected": runs[0]["expected"],
            "ok": True, "errors": [], "msg_per_s": statistics.median(r["msg_per_s"] for r in runs),
            "mb_per_s": statistics.median(r["mb_per_s"] for r in runs), "reads": runs,
            "summary": f"the median of {len(runs)} reads"}


def _tail_reads(server: Server, topic: str, size: int, produced: dict[str, Any], mark: int | None,
                plan: KafkaBenchPlan, bar: Any) -> dict[str, Any]:
    """The committed messages of ``topic``, written by the produce run that just returned, read at both
    levels; whether no upload ran since ``mark`` (taken before the writes): then every read came from the
    log cache."""
    # The broker uploads once its oldest entry is upload_interval_s old: that entry is the run's first.
    first_append_s = time.monotonic() - produced.get("seconds", 0.0)
    deadline_s = first_append_s + float(store_setting(plan.broker_config, "upload_interval_s")) - READ_MARGIN_S
    count = produced.get("committed", 0)
    if not count:
        return {"error": "nothing was committed"}
    bar.phase(f"{server.name}: consume {count:,} x {size:,} B of transactions from the tail, "
              f"{' and '.join(ISOLATION_LEVELS)}")
    out: dict[str, Any] = read_both_levels(server, topic, size, count, deadline_s, bar)
    out["from_log_cache"] = last_object_id(server) == mark
    out["within_upload_interval"] = within_upload_interval(first_append_s, plan)
    return out


def transactional_phases(server: Server, plan: KafkaBenchPlan, size: int, bar: Any) -> dict[str, Any]:
    """The transactional produce of ``size``, its tail reads and the idempotent reference, on a broker whose
    log cache is empty (the plain phases end with an upload); each produce run ends with an upload, so
    that the next starts as the plain one did."""
    if server.name in NOT_MEASURED:
        return {"not_applicable": NOT_MEASURED[server.name]}
    messages = plan.messages_for(server.name)
    tail_count = plan.tail_messages(size, server.name)
    shared = tail_count == messages
    tail_topic = f"{'txn' if shared else 'txn-tail'}-{size}"
    out: dict[str, Any] = {"commit_interval_ms": COMMIT_INTERVAL_S * 1000,
                           "tail_run": {"topic": tail_topic, "messages": tail_count, "is_produce_run": shared}}
    mark = last_object_id(server)
    if not shared:
        bar.phase(f"{server.name}: transactional tail run, produce {tail_count:,} x {size:,} B")
        out["tail_run"]["produce"] = produce_transactional(server, tail_topic, size, tail_count, plan, bar)
        out["consume_tail"] = _tail_reads(server, tail_topic, size, out["tail_run"]["produce"], mark, plan,
                                          bar)
    bar.phase(f"{server.name}: produce {messages:,} x {size:,} B in transactions, committed every "
              f"{COMMIT_INTERVAL_S * 1000:g} ms, {plan.producers} producers")
    out["produce"] = produce_transactional(server, f"txn-{size}", size, messages, plan, bar)
    if shared:
        out["consume_tail"] = _tail_reads(server, tail_topic, size, out["produce"], mark, plan, bar)
    bar.phase(f"{server.name}: waiting for the upload ({plan.upload_wait_s:g} s at most)")
    await_upload(server, plan.upload_wait_s)
    bar.phase(f"{server.name}: produce {messages:,} x {size:,} B, idempotent, no transactions")
    out["produce_idempotent"] = produce_idempotent(server, f"idempotent-{size}", size, messages, plan, bar)
    bar.phase(f"{server.name}: waiting for the upload ({plan.upload_wait_s:g} s at most)")
    await_upload(server, plan.upload_wait_s)  # the next size's tail runs start with an empty log cache
    return out
