"""A quixstreams application that counts the events of each key: the count lives in a state store, whose
changelog topic quixstreams creates itself (cleanup.policy=compact), and each key's running count goes to
the output topic. tests/test_app_quixstreams.py runs it as a child process, kills it with SIGKILL and
starts it again with its state directory deleted, so the store is rebuilt from the changelog.

    python quixstreams_counter.py BOOTSTRAP STATE_DIR [GUARANTEE]

GUARANTEE is quixstreams' processing_guarantee: "at-least-once" (its default, and this script's) or
"exactly-once". At least once, a checkpoint every COMMIT_INTERVAL_S produces the store's changes to the
changelog, flushes the producer (changelog and output), then commits the input offsets; exactly once, a
checkpoint is one Kafka transaction of the changelog's and output's records and the input offsets.
"""

from __future__ import annotations

import sys

from quixstreams import Application, State

INPUT_TOPIC = "events"
OUTPUT_TOPIC = "counts"
GROUP = "quix-counter"
#: Short, so a test waits little for the checkpoint after its last event.
COMMIT_INTERVAL_S = 0.25
#: A killed member holds its partitions until its session times out: short, so the restarted app gets them
#: soon (the test's broker lowers its minimum session timeout to allow it).
SESSION_TIMEOUT_MS = 4000
#: Exactly once, quixstreams gives each run a transactional.id of its own (a random one), so the transaction a
#: killed run left open is not fenced by the next run: only its timeout ends it (the broker aborts it), and
#: until then it holds back every read_committed reader of its partitions, as in Kafka. Short, so the
#: test's reader waits little (librdkafka's default is 60 s).
TRANSACTION_TIMEOUT_MS = 5000


def count(_value: object, state: State) -> int:
    seen = int(state.get("count", 0)) + 1
    state.set("count", seen)
    return seen


def main(bootstrap: str, state_dir: str, guarantee: str = "at-least-once") -> None:
    app = Application(broker_address=bootstrap, consumer_group=GROUP, auto_offset_reset="earliest",
                      state_dir=state_dir, commit_interval=COMMIT_INTERVAL_S, processing_guarantee=guarantee,
                      consumer_extra_config={"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 500},
                      producer_extra_config={"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS})
    events = app.topic(INPUT_TOPIC, key_deserializer="str", value_deserializer="json")
    counts = app.topic(OUTPUT_TOPIC, key_serializer="str", value_serializer="json")
    app.dataframe(events).apply(count, stateful=True).to_topic(counts)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:4])
