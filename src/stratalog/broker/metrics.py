"""The broker's Prometheus metrics, named after Kafka's JMX metrics where Kafka has one.

Kafka's ``kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec,topic=T`` becomes
``kafka_server_brokertopicmetrics_messagesin_total{topic="T"}`` (a counter: Prometheus takes the rate), as
the JMX exporter's usual rules name it; the store's own figures are ``stratalog_*`` gauges read from the
stores at each scrape. docs/operations.md lists them all.

Counting costs a dict lookup and an increment per produced batch, fetched partition and request (the
labelled children are kept per topic and per API), on the event loop; the endpoint that serves them
(metrics_http.py) runs in a thread of its own, so a scrape never waits for the loop.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stratalog.errors import StratalogError

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker")

#: Request latency buckets, seconds: a synced produce takes a millisecond or two; a long-polled fetch up to
#: fetch_wait_ms_max (Kafka's consumers ask for 500 ms).
REQUEST_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: One group's lag on one partition: (group, topic, partition, the partition's end offset minus the offset
#: the group committed; 0 at least).
GroupLag = tuple[str, str, int, int]
#: Group-partitions published per scrape at most: a scrape must stay small for Prometheus (each is a
#: series); past it the rest are left out, and stratalog_group_lag_series_left_out says how many.
LAG_SERIES_MAX = 10_000


def group_lags(broker: Broker) -> Iterator[GroupLag]:
    """Every committed offset's lag on the partitions this broker serves (in a cluster, those it leads:
    each broker publishes its own). Runs in the endpoint's thread: the committed offsets are read under
    their store's lock, the partitions' ends from the stream store, and nothing of the broker is changed."""
    for group in broker.offsets.groups():
        for (topic, partition), entry in sorted(broker.offsets.fetch(group).items()):
            end = broker.end_offset_of(topic, partition)
            if end is not None:
                yield group, topic, partition, max(0, end - entry.offset)


class BrokerMetrics:
    """What the broker counts as it serves, and the stores' figures at each scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._messages_in = Counter("kafka_server_brokertopicmetrics_messagesin", "Records produced, by topic "
                                    "(Kafka: BrokerTopicMetrics MessagesInPerSec)", ["topic"], registry=r)
        self._bytes_in = Counter("kafka_server_brokertopicmetrics_bytesin", "Record batch bytes produced, by "
                                 "topic (Kafka: BrokerTopicMetrics BytesInPerSec)", ["topic"], registry=r)
        self._bytes_out = Counter("kafka_server_brokertopicmetrics_bytesout", "Record batch bytes fetched, by "
                                  "topic (Kafka: BrokerTopicMetrics BytesOutPerSec)", ["topic"], registry=r)
        self._messages_out = Counter("stratalog_messagesout", "Records sent to fetches, by topic (the records of "
                                     "each whole batch sent; Kafka counts none)", ["topic"], registry=r)
        self._requests = Counter("kafka_network_requestmetrics_requests", "Requests answered, by API and "
                                 "version (Kafka: RequestMetrics RequestsPerSec)", ["request", "version"], registry=r)
        self._request_seconds = Histogram(
            "kafka_network_requestmetrics_totaltime_seconds", "From a request's start to its answer, by API "
            "(Kafka: RequestMetrics TotalTimeMs; a fetch's long poll included)", ["request"],
            buckets=REQUEST_SECONDS_BUCKETS, registry=r)
        self._failed = Counter("kafka_server_brokertopicmetrics_failedproducerequests", "Produced batches "
                               "refused, by Kafka error (Kafka: FailedProduceRequestsPerSec)", ["error"], registry=r)
        self._throttle_seconds = Counter("stratalog_quota_throttle_seconds", "Delay given to clients by quotas "
                                         "(Kafka: produce/fetch/request throttle-time per user and client-id)",
                                         ["user", "client_id"], registry=r)
        self._throttled_children: dict[tuple[str, str], Any] = {}
        bounds = Counter("stratalog_memory_bound_reached", "Times a memory or queue bound held work back, by "
                         "bound (see BOUNDS)", ["bound"], registry=r)
        self._bounds = {name: bounds.labels(name) for name in BOUNDS}
        self._topic_in: dict[str, tuple[Any, Any]] = {}
        self._topic_out: dict[str, tuple[Any, Any]] = {}
        self._request_children: dict[tuple[str, int], tuple[Any, Any]] = {}

    def watch(self, stats: Callable[[], dict[str, int]], lags: Callable[[], Iterable[GroupLag]],
              connections: Callable[[], dict[str, int]], collectors: Iterable[Collector] = ()) -> None:
        """Publish ``stats()`` (the store's figures and the server's) as gauges and counters, ``lags()``
        as each group's lag per partition and ``connections()`` per listener, read at each scrape (in the
        endpoint's thread); and the store's own ``collectors`` (object store calls, WAL timings)."""
        self.registry.register(_AtScrape(functools.partial(_store_metrics, stats)))
        self.registry.register(_AtScrape(functools.partial(_lag_metrics, lags)))
        self.registry.register(_AtScrape(functools.partial(_connection_metrics, connections)))
        for collector in collectors:
            self.registry.register(collector)

    def watch_fetch_sessions(self, stats: Callable[[], dict[str, int]]) -> None:
        """Publish the fetch sessions' figures (``FetchSessions.stats``), read at each scrape."""
        self.registry.register(_AtScrape(functools.partial(_fetch_session_metrics, stats)))

    def bound_reached(self, bound: str) -> None:
        """A memory or queue bound held something back: ``bound`` is one of BOUNDS."""
        self._bounds[bound].inc()

    def throttled(self, user: str, client_id: str, throttle_ms: int) -> None:
        """A request throttled by a quota: its delay, counted per (user, client id), the first
        THROTTLED_ENTITIES_MAX of them by name and the rest together."""
        key = (user, client_id)
        child = self._throttled_children.get(key)
        if child is None:
            if len(self._throttled_children) >= THROTTLED_ENTITIES_MAX:
                key = (OTHER_ENTITIES, OTHER_ENTITIES)
                child = self._throttled_children.get(key)
            if child is None:
                child = self._throttled_children[key] = self._throttle_seconds.labels(*key)
        child.inc(throttle_ms / 1000)

    def produced(self, topic: str, records: int, size_bytes: int) -> None:
        children = self._topic_in.get(topic)
        if children is None:
            children = self._topic_in[topic] = (self._messages_in.labels(topic), self._bytes_in.labels(topic))
        children[0].inc(records)
        children[1].inc(size_bytes)

    def produce_failed(self, error: str) -> None:
        self._failed.labels(error).inc()

    def fetched(self, topic: str, size_bytes: int, records: int) -> None:
        children = self._topic_out.get(topic)
        if children is None:
            children = self._topic_out[topic] = (self._bytes_out.labels(topic), self._messages_out.labels(topic))
        children[0].inc(size_bytes)
        children[1].inc(records)

    def answered(self, request: str, version: int, seconds: float) -> None:
        children = self._request_children.get((request, version))
        if children is None:
            children = self._request_children[(request, version)] = (
                self._requests.labels(request, str(version)), self._request_seconds.labels(request))
        children[0].inc()
        children[1].observe(seconds)


#: The stores' figures (StreamStore.stats(), with the broker's), each a gauge: name, help.
STORE_GAUGES: dict[str, str] = {
    "streams": "Streams (partitions) in the store",
    "log_cache_bytes": "Appended bytes not yet in objects, held in memory for tail reads",
    "block_cache_bytes": "Cold data blocks cached in memory",
    "commit_seq": "Metadata commits so far (each upload, trim or topic change is one)",
    "space_free_bytes": "Free bytes under the store's tightest directory at the last look",
    "space_kept_free_bytes": "Bytes the store keeps free there: below it, produce is refused",
    "space_refusing": "1 while produce is refused for want of space (disk low or object storage full)",
    "connections": "Client connections open",
    "wal_used_bytes": "WAL bytes not yet trimmed (written since the last upload covered them): what a restart "
                      "replays",
    "upload_lag_ms": "How long the oldest appended bytes not yet in object storage have waited (0: none wait)",
    "cluster_lease_confirmed": "1 while this broker's lease is confirmed (it may acknowledge writes)",
    "cluster_live_brokers": "Brokers of the cluster with a live lease, as this broker last read them",
    "cluster_partitions_led": "Partitions this broker leads",
    "cluster_partitions_without_leader": "Partitions with no live leader (Kafka: OfflinePartitionsCount)",
}
#: The stores' running counts, each a counter: name, help.
STORE_COUNTERS: dict[str, str] = {
    "block_cache_hits": "Reads of cold data served from the block cache",
    "block_cache_misses": "Reads of cold data that went to object storage",
    "compactions": "Compactions committed (the Spark compaction job's swaps of objects for fewer, larger ones)",
    "objects_compacted": "Objects replaced by compactions (deleted after the grace period)",
    "cleaner_passes": "Passes of log compaction (cleanup.policy=compact: the latest record of each key kept)",
    "cleaner_bytes_read": "Bytes of blocks that passes of log compaction read and rewrote",
    "cluster_partitions_gained": "Partitions this broker came to lead (at its start, and on failovers)",
    "cluster_logs_replayed": "Logs of dead brokers this broker replayed (failovers it carried out)",
}
#: The bounds counted by stratalog_memory_bound_reached, with what reaching each does.
BOUNDS = {
    "requests_queued_max": "a connection waits to read its next request: the broker's request queue is full",
    "request_memory_bytes_max": "a connection holding the most unanswered request bytes is closed",
    "response_memory_bytes_max": "a fetch answers with less (or nothing) while unsent responses fill the budget",
    "log_cache_bytes_max": "a produce waits for uploads to make room in the log cache",
}
#: What a fetch is to the fetch sessions (fetch_sessions.Kind's values), counted by stratalog_fetch_requests.
FETCH_KINDS = ("sessionless", "full", "incremental", "refused")
#: Quota entities counted by name in stratalog_quota_throttle_seconds; past it, together as OTHER_ENTITIES.
THROTTLED_ENTITIES_MAX = 1000
OTHER_ENTITIES = "(others)"


class _AtScrape(Collector):
    """Metrics ``collect`` makes at each scrape. It describes nothing, so registering it reads nothing."""

    def __init__(self, make: Callable[[], Iterator[Metric]]) -> None:
        self._make = make

    def collect(self) -> Iterator[Metric]:
        return self._make()

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _lag_metrics(lags: Callable[[], Iterable[GroupLag]]) -> Iterator[Metric]:
    lag = GaugeMetricFamily("kafka_consumergroup_lag", "A consumer group's lag on a partition: its end "
                            "offset minus the group's committed offset (as kafka-exporter names it)",
                            labels=["consumergroup", "topic", "partition"])
    left_out = 0
    try:
        for count, (group, topic, partition, behind) in enumerate(lags()):
            if count >= LAG_SERIES_MAX:
                left_out += 1
                continue
            lag.add_metric([group, topic, str(partition)], behind)
    except StratalogError as e:   # the offsets' database out of reach, or closing: the rest still scrapes
        log.warning("consumer group lag not published: %s", e)
    yield lag
    yield GaugeMetricFamily("stratalog_group_lag_series_left_out", "Group-partitions left out of "
                            "kafka_consumergroup_lag at the last scrape (past LAG_SERIES_MAX)", value=left_out)


def _store_metrics(stats: Callable[[], dict[str, int]]) -> Iterator[Metric]:
    figures = stats()
    for name, help_text in STORE_GAUGES.items():
        if name in figures:
            yield GaugeMetricFamily(f"stratalog_{name}", help_text, value=figures[name])
    for name, help_text in STORE_COUNTERS.items():
        if name in figures:
            yield CounterMetricFamily(f"stratalog_{name}", help_text, value=figures[name])


def _fetch_session_metrics(stats: Callable[[], dict[str, int]]) -> Iterator[Metric]:
    figures = stats()
    yield GaugeMetricFamily("stratalog_fetch_sessions", "Fetch sessions in the cache (Kafka: "
                            "NumIncrementalFetchSessions)", value=figures["fetch_sessions"])
    yield GaugeMetricFamily("stratalog_fetch_session_partitions", "Partitions kept by the fetch sessions (Kafka: "
                            "NumIncrementalFetchPartitionsCached)", value=figures["fetch_session_partitions"])
    yield CounterMetricFamily("stratalog_fetch_session_evictions", "Fetch sessions evicted to make room for new "
                              "ones (Kafka: IncrementalFetchSessionEvictionsPerSec)",
                              value=figures["fetch_session_evictions"])
    requests = CounterMetricFamily("stratalog_fetch_requests", "Fetch requests by what they were to the fetch "
                                   "sessions: sessionless, full, incremental or refused (a session error)",
                                   labels=["session"])
    for kind in FETCH_KINDS:
        requests.add_metric([kind], figures[f"fetch_requests_{kind}"])
    yield requests


def _connection_metrics(connections: Callable[[], dict[str, int]]) -> Iterator[Metric]:
    family = GaugeMetricFamily("stratalog_listener_connections", "Client connections open, by listener",
                               labels=["listener"])
    for listener, count in sorted(connections().items()):
        family.add_metric([listener], count)
    yield family
