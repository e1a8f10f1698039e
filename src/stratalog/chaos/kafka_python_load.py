"""An idempotent kafka-python producer (acks=all) as a child process of the cluster load: it writes
``k:<partition>:<seq>`` to every partition of a topic in rounds, prints ``ack P SEQ`` or ``fail P SEQ
WHY`` per record as the broker answers, and on a ``stop`` line on stdin flushes, closes and prints
``done``.

A process of its own because kafka-python 3.0 drops the sockets of refused connection attempts (to a
killed broker) inside coroutines it never finishes: they are freed only when the process ends (in a test process they
would be reported against the whole session).

Usage: python -m stratalog.chaos.kafka_python_load BOOTSTRAP TOPIC PARTITIONS ROUND_S
"""

from __future__ import annotations

import itertools
import sys
import threading
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # kafka-python 3.0's importlib.resources.read_text
    import kafka  # type: ignore[import-untyped]  # kafka-python ships no type information

#: How long the last records may take once asked to stop (retries across a failover included).
FLUSH_S = 150.0


def main() -> None:
    bootstrap, topic, partitions, round_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            print(line, flush=True)

    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=5,
                                   delivery_timeout_ms=120_000, request_timeout_ms=30_000)
    for seq in itertools.count():
        if stop.wait(round_s):
            break
        for p in range(partitions):
            future = producer.send(topic, value=f"k:{p}:{seq}".encode(), partition=p)
            future.add_callback(lambda _m, p=p, s=seq: say(f"ack {p} {s}"))
            future.add_errback(lambda e, p=p, s=seq: say(f"fail {p} {s} {e!r}"))
    producer.flush(timeout=FLUSH_S)
    producer.close(timeout=30)
    say("done")


if __name__ == "__main__":
    main()
