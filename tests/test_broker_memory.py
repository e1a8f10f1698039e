"""Memory under abuse: request bytes and unread response bytes are bounded across all connections, and
the connections that hold them are the ones that pay."""

from __future__ import annotations

import socket
import struct
import warnings
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from brokerkit import BrokerProcess, metrics_address, running_broker, scrape_metrics
from stratalog.broker.memory import MemoryBudget
from test_broker_authorization import ROWS, World, call
from test_broker_bad_input import api_versions_request, read_frame
from test_broker_lifecycle import long_poll_fetch
from waiting import wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaProducer

#: How long the broker may take to act (it acts at once; this is the test's patience on a loaded CI machine).
ACT_S_MAX = 30.0


def test_a_budget_counts_each_owner_once_and_finds_the_largest() -> None:
    budget = MemoryBudget(100)
    budget.set("a", 60)
    budget.set("b", 30)
    budget.set("a", 50)
    assert (budget.held_bytes, budget.left_bytes(), budget.over) == (80, 20, False)
    budget.set("c", 25)
    assert budget.over and budget.largest() == ("a", 50)
    budget.set("a", 0)
    assert (budget.held_bytes, budget.over, budget.largest()) == (55, False, ("b", 30))


def closed(sock: socket.socket) -> bool:
    """Whether the broker closed the connection (without waiting if it did not)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def produce(broker: BrokerProcess, topic: str, count: int, size_bytes: int) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5, max_request_size=2 << 20)
    try:
        for _ in range(count):
            producer.send(topic, bytes(size_bytes), partition=0)
        producer.flush(timeout=60)
    finally:
        producer.close()


def test_slow_senders_past_the_request_budget_are_closed_largest_first_and_others_go_on(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f"request_bytes_max = {1 << 20}\nrequest_memory_bytes_max = {4 << 20}\n")
    with running_broker(tmp_path / "data", "--config", str(config), "--metrics-listen", "127.0.0.1:0") as broker:
        senders = []
        for i in range(8):
            sock = socket.create_connection((broker.host, broker.port), timeout=10)
            # Each claims a request of 1,000,000 bytes and sends 900,000 of them, then stalls: 7.2 MB held
            # against a 4 MiB budget.
            sock.sendall(struct.pack(">i", 1_000_000) + bytes(900_000 - 4 * i))
            senders.append(sock)
        wait_until(lambda: sum(closed(s) for s in senders) >= 4, "the broker closes enough slow senders",
                   ACT_S_MAX)
        # Logged before each close, read from the broker's output by another thread: it may come a little later.
        wait_until(lambda: sum("over request_memory_bytes_max" in line for line in broker.output) >= 4,
                   "the closes to be logged", ACT_S_MAX)
        # The largest go first: the last sender (the smallest) is among those kept.
        assert not closed(senders[-1])
        assert bound_reached(broker, "request_memory_bytes_max") >= 4, "each close counted"
        produce(broker, "after", 10, 1000)  # a well-behaved client is served throughout
        for sock in senders:
            sock.close()
        assert broker.stop() == 0, "".join(broker.output)


def test_fetches_answer_with_what_fits_the_response_budget_and_nothing_when_it_is_full(tmp_path: Path) -> None:
    world = World(tmp_path)
    try:
        memory = world.broker.response_memory
        for i in range(50):
            assert world.produce("admin", "t") == ErrorCode.none, i
        admin = world.session["admin"]

        def fetched_bytes() -> int:
            response = call(world.broker, admin, *ROWS["Fetch"][:3])
            return len(response.responses[0].partitions[0].records or b"")

        everything = fetched_bytes()
        assert everything > 2000
        memory.set("unread elsewhere", memory.bytes_max - 1000)
        assert 0 < fetched_bytes() <= 1000, "only what fits"
        memory.set("unread elsewhere", memory.bytes_max)
        assert fetched_bytes() == 0, "nothing while the budget is full"
        assert world.broker.metrics.registry.get_sample_value(
            "stratalog_memory_bound_reached_total", {"bound": "response_memory_bytes_max"}) == 2
        memory.set("unread elsewhere", 0)
        assert fetched_bytes() == everything
    finally:
        world.close()


def test_connections_that_read_none_of_their_responses_are_closed(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    # Responses of 8 MiB: more than the kernel's send buffer takes (4 MiB here), so the rest waits in the
    # broker until the peer reads, or the connection is closed for not reading.
    config.write_text(f"fetch_response_bytes_max = {8 << 20}\nresponse_memory_bytes_max = {16 << 20}\n"
                      "response_write_timeout_ms = 2000\n")
    with running_broker(tmp_path / "data", "--config", str(config)) as broker:
        produce(broker, "big", 90, 100_000)
        hoarders = []
        for _ in range(3):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((broker.host, broker.port))
            sock.sendall(long_poll_fetch("big", 0, 0, 8 << 20))  # 8 MiB asked for, and never read
            hoarders.append(sock)
        with socket.create_connection((broker.host, broker.port), timeout=30) as reader:
            wait_until(lambda: sum("took none of its responses" in line for line in broker.output) == 3,
                       "connections that read nothing are closed", ACT_S_MAX)
            reader.sendall(long_poll_fetch("big", 0, 100, 8 << 20))
            response = read_frame(reader)
            assert response is not None and len(response) > 8_000_000, "a reader is served in full"
        for sock in hoarders:
            sock.close()
        assert broker.stop() == 0, "".join(broker.output)


def test_queued_requests_are_bounded_across_connections_without_starving_anyone(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("requests_queued_max = 2\n")
    with running_broker(tmp_path / "data", "--config", str(config), "--metrics-listen", "127.0.0.1:0") as broker:
        produce(broker, "waits", 1, 10)
        # Two long polls, as many as the bound, wait 20 s for a record that does not come: waiting on data
        # is not queued work, so they hold none of it.
        pollers = [socket.create_connection((broker.host, broker.port), timeout=30) for _ in range(2)]
        for sock in pollers:
            sock.sendall(long_poll_fetch("waits", 1, 20_000))
        # A pipeliner beside them: it reads ahead only while fewer than two requests are queued, yet all
        # twenty are answered, in order.
        with socket.create_connection((broker.host, broker.port), timeout=30) as pipeliner, \
                socket.create_connection((broker.host, broker.port), timeout=30) as newcomer:
            pipeliner.sendall(b"".join(api_versions_request(3, i) for i in range(20)))
            # A client with nothing in flight is served at once, whatever the others hold.
            newcomer.sendall(api_versions_request(3, 99))
            answer = read_frame(newcomer)
            assert answer is not None and answer[:4] == struct.pack(">i", 99)
            for i in range(20):
                answer = read_frame(pipeliner)
                assert answer is not None and answer[:4] == struct.pack(">i", i)
        assert bound_reached(broker, "requests_queued_max") >= 1, "the pipeliner waited, and /metrics says so"
        for sock in pollers:
            sock.close()
        assert broker.stop() == 0, "".join(broker.output)


def test_refused_connections_are_logged_at_a_bounded_rate(caplog: pytest.LogCaptureFixture) -> None:
    from stratalog.broker.server import RateLimitedLog

    now_s = [100.2]
    limited = RateLimitedLog(per_s_max=3, clock=lambda: now_s[0])
    with caplog.at_level("WARNING", logger="stratalog.broker"):
        for i in range(1000):
            limited.warn("connection %d closed", i)
        now_s[0] = 100.9  # the same second: nothing more gets through
        limited.warn("connection %d closed", 1000)
        now_s[0] = 101.0  # the next: three more, the first with the count of those left out
        for i in range(1001, 1005):
            limited.warn("connection %d closed", i)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["connection 0 closed", "connection 1 closed", "connection 2 closed",
                     "connection 1001 closed (998 more like it not logged)", "connection 1002 closed",
                     "connection 1003 closed"]


def bound_reached(broker: BrokerProcess, bound: str) -> float:
    """stratalog_memory_bound_reached_total{bound} as the broker's /metrics says."""
    samples = scrape_metrics(metrics_address(broker.output))
    return samples.get(("stratalog_memory_bound_reached_total", (("bound", bound),)), 0.0)
