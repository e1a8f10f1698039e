"""kill -9 of the broker under a transactional producer (librdkafka): every transaction ends whole, on
every partition it wrote, committed or aborted; each one the producer saw commit is read by read_committed
consumers, none it saw abort is, and no record is read twice. The broker is killed at whatever point of a
transaction it is at (a produce, AddPartitionsToTxn, EndTxn before or after its markers), ROUNDS times."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import BrokerProcess, start_broker
from txnkit import read_to_end
from waiting import wait_until

pytestmark = pytest.mark.slow

ROUNDS = 10
PARTITIONS = 3
#: Records of each transaction, spread over every partition.
RECORDS_PER_TXN = 6
#: Transactions the producer ends between two kills (so each kill meets a different point of one).
ENDED_BETWEEN_KILLS = 4
CALL_S = 60.0


class TransactionalLoad(threading.Thread):
    """Transactions one after another, every fourth aborted; remembers how each ended as the producer saw
    it: "committed", "aborted", or "unknown" (the broker died while it ended)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.txn_id = f"tx-{uuid.uuid4().hex[:6]}"
        self.outcomes: dict[int, str] = {}
        self.stopping = threading.Event()
        self.failure: BaseException | None = None

    def ended(self) -> int:
        return len(self.outcomes)

    def _producer(self) -> Producer:
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.txn_id,
                             "transaction.timeout.ms": 30_000, "reconnect.backoff.max.ms": 200})
        producer.init_transactions(CALL_S)
        return producer

    def run(self) -> None:
        try:
            producer: Producer | None = None
            n = 0
            while not self.stopping.is_set():
                if producer is None:
                    producer = self._producer()
                try:
                    producer.begin_transaction()
                    for i in range(RECORDS_PER_TXN):
                        producer.produce(self.topic, f"{n}:{i}".encode(), partition=i % PARTITIONS)
                    if n % 4 == 3:
                        producer.abort_transaction(CALL_S)
                        self.outcomes[n] = "aborted"
                    else:
                        producer.commit_transaction(CALL_S)
                        self.outcomes[n] = "committed"
                except KafkaException as e:
                    self.outcomes[n] = "unknown"
                    if e.args[0].txn_requires_abort():
                        try:
                            producer.abort_transaction(CALL_S)
                        except KafkaException:
                            producer = None   # a new producer fences the old one and ends what it left
                    else:
                        producer = None
                n += 1
        except BaseException as e:   # reported by the test
            self.failure = e


def test_every_transaction_ends_whole_across_kill9(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker: BrokerProcess = start_broker(data_dir)
    port = broker.port
    topic = "transactions"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(CALL_S)
    load = TransactionalLoad(broker.bootstrap, topic)
    load.start()
    try:
        for _ in range(ROUNDS):
            target = load.ended() + ENDED_BETWEEN_KILLS
            wait_until(lambda: load.ended() >= target or load.failure is not None,   # noqa: B023
                       "transactions ending between kills", timeout_s=300)
            assert load.failure is None, load.failure
            broker.kill9()
            broker.close_output()
            broker = start_broker(data_dir, port=port)
        target = load.ended() + ENDED_BETWEEN_KILLS
        wait_until(lambda: load.ended() >= target, "transactions after the last restart", timeout_s=300)
    finally:
        load.stopping.set()
        load.join(CALL_S * 3)
    try:
        assert load.failure is None, load.failure
        values = read_to_end(broker.bootstrap, topic)
    finally:
        assert broker.stop() == 0, "".join(broker.output)
        broker.close_output()
    counts = Counter(values)
    assert not [v for v, c in counts.items() if c > 1], "a record read twice"
    per_txn = Counter(int(v.split(b":")[0]) for v in values)
    outcomes = load.outcomes
    assert all(c == RECORDS_PER_TXN for c in per_txn.values()), {n: c for n, c in per_txn.items()
                                                                  if c != RECORDS_PER_TXN}
    committed = {n for n, o in outcomes.items() if o == "committed"}
    aborted = {n for n, o in outcomes.items() if o == "aborted"}
    assert committed <= set(per_txn), f"committed and not read: {sorted(committed - set(per_txn))}"
    assert not aborted & set(per_txn), f"aborted and read: {sorted(aborted & set(per_txn))}"
    assert len(committed) >= ROUNDS, outcomes
    print(f"{len(outcomes)} transactions over {ROUNDS} kills: {len(committed)} committed, {len(aborted)} aborted, "
          f"{len(outcomes) - len(committed) - len(aborted)} ended by a kill ({len(per_txn)} of those read)")
