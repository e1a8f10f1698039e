"""Spark writes into a running broker: tasks stage objects in its object storage, the broker commits them.

Tasks stage exactly as a write to a store at rest does (spark/write.py), in the object storage the
broker names (or option ``path``). The driver's commit is a StratalogCommitStaged request
(kafka/staged_commit.py) to each broker that leads partitions written, over a Kafka connection with the
``kafka.*`` settings: the broker checks the writer may write each topic, places the objects at the
partitions' ends after whatever producers appended, and commits them (a broker alone: the whole write in
one metadata transaction; a broker of a cluster: each partition in one). A streaming write's request
names its sink and micro-batch, and the broker commits each micro-batch once per partition, so a replayed
one writes nothing. Partitions whose leader moved, or could not be reached, are sent to the leader fresh
metadata names (:func:`commit_through_broker` says when that is safe).

Where each row goes, in this order:

- a ``stream`` column: ``topic/partition``;
- else the topic from a ``topic`` column or option ``topic``, and the partition from a ``partition``
  column, or for keyed rows Kafka's default partitioner (murmur2 of the key: the partition a Kafka
  producer would choose), or for rows without a key the Spark task's number modulo the partition count.
  The topic must exist then (its partition count decides); with a ``stream`` or ``partition`` column
  a missing topic is created if the broker creates topics on first use.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from stratalog.engine.staging import CommitResult, StagedObject
from stratalog.errors import StratalogError
from stratalog.kafka import staged_commit
from stratalog.kafka.client import BrokerConnectionError, KafkaConnection, LoginRefusedError
from stratalog.kafka.partitioner import partition_for_key
from stratalog.spark.kafka_client import BrokerReadError, BrokerView


class BrokerWriteError(StratalogError):
    """The broker refused the commit of a write (its error code and message are in the text)."""


class Destinations:
    """How a task's rows get their ``topic/partition`` stream (picklable: settings and counts only)."""

    def __init__(self, columns: Sequence[str], topic: str | None, partition_counts: dict[str, int]) -> None:
        self.has_stream = "stream" in columns
        self.has_topic = "topic" in columns
        self.has_partition = "partition" in columns
        self.topic = topic
        self.partition_counts = partition_counts
        if not self.has_stream and not self.has_topic and topic is None:
            raise ValueError("writing to a broker needs a 'stream' column (topic/partition), a 'topic' column, or "
                             "option 'topic'")
        if topic is not None and not self.has_topic and not self.has_partition and not self.has_stream \
                and topic not in partition_counts:
            raise ValueError(f"topic {topic!r} does not exist: create it first (its partition count decides where "
                             "keyed rows go), or give a 'partition' column")

    def streams(self, batch: pa.RecordBatch, task: int) -> pa.RecordBatch:
        """``batch`` with its ``stream`` column (added, or as given)."""
        if self.has_stream:
            return batch
        topics = batch.column("topic") if self.has_topic else pa.array([self.topic] * batch.num_rows, pa.string())
        if topics.null_count:
            raise ValueError("a row has no topic: the topic column must not be null")
        if self.has_partition:
            partitions = pc.cast(batch.column("partition"), pa.int64())
            if partitions.null_count:
                raise ValueError("a row has no partition: the partition column must not be null")
        else:
            partitions = pa.array(self._choose(topics.to_pylist(), batch, task), pa.int64())
        stream = pc.binary_join_element_wise(topics, pc.cast(partitions, pa.string()), "/")
        return batch.append_column("stream", stream)

    def _choose(self, topics: list[str], batch: pa.RecordBatch, task: int) -> list[int]:
        keyed = "key" in batch.schema.names
        keys = batch.column("key").cast(pa.binary()).to_pylist() if keyed else [None] * len(topics)
        out = []
        for topic, key in zip(topics, keys, strict=True):
            count = self.partition_counts.get(topic)
            if count is None:
                raise ValueError(f"topic {topic!r} does not exist: create it first, or give a 'partition' column")
            out.append(task % count if key is None else partition_for_key(key, count))
        return out


def choose_partitions(destinations: Destinations, batches: Iterator[pa.RecordBatch],
                      task: int) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield destinations.streams(batch, task)


#: How long a commit keeps sending partitions whose leader refused them or could not be reached to the
#: leader that fresh metadata names: a broker's failover took 3.9 to 12.6 s under load (docs/cluster.md),
#: so this outlasts several; a leader gone for longer fails the write.
COMMIT_RETRY_S_MAX = 120.0
#: The first wait before such a retry, doubled at each until COMMIT_BACKOFF_S_MAX: a handoff is over in
#: well under a second, a failover takes seconds.
COMMIT_BACKOFF_S = 0.1
COMMIT_BACKOFF_S_MAX = 2.0
#: A partition refused with these was not committed and its staged objects were left as they were: its
#: leader moved (or, in a failover, has not been chosen yet). Sent again to the leader metadata names.
RETRIABLE_ERRORS = frozenset({5, 6})   # LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER

#: Leaders one commit sends to at once (one thread each); a cluster has a few brokers, a larger one waits.
LEADERS_AT_ONCE_MAX = 16

#: (Spark task, staged object) pairs.
Staged = tuple[int, StagedObject]
StagedExists = Callable[[Sequence[str]], bool]


def commit_through_broker(bootstrap: str, settings: dict[str, str],
                          messages: Sequence[tuple[int, Sequence[StagedObject]]],
                          sink: tuple[str, int] | None, *, staged_exist: StagedExists | None = None,
                          retry_s_max: float = COMMIT_RETRY_S_MAX) -> CommitResult:
    """Have the staged objects of ``messages`` ((task, objects) pairs) committed by the brokers that lead
    their partitions; ``sink`` (sink id, batch id) for a micro-batch. Each leader gets one request for the
    partitions it leads (a broker alone: the whole write, one transaction; a broker of a cluster: one
    transaction per partition). Partitions refused because their leader moved, or whose leader could not
    be reached, go again to the leader fresh metadata names, for up to ``retry_s_max``.

    Never twice: a broker answers each partition, and a partition committed is not sent again. A request
    whose answer was lost (the connection broke after it was sent) is sent again only when that cannot
    write twice: a micro-batch (each partition's marker makes a second commit write nothing), or a batch
    write whose staged objects ``staged_exist`` finds all still there (a broker moves them away as it
    commits). BrokerWriteError otherwise, and when a broker refuses for good."""
    pending: dict[str, list[Staged]] = {}
    for task, objects in messages:
        for o in objects:
            names = {s.name for s in o.streams}
            pending.setdefault(min(names) if len(names) == 1 else "\n".join(sorted(names)), []).append((task, o))
    if not pending:   # an empty micro-batch (no rows, no object staged): nothing to commit anywhere
        return CommitResult(True, 0, 0)
    commit = _ClusterCommit(bootstrap, settings, sink, staged_exist)
    deadline = time.monotonic() + retry_s_max
    backoff_s = COMMIT_BACKOFF_S
    while True:
        pending = commit.round(pending)
        if not pending:
            return commit.result()
        if time.monotonic() + backoff_s > deadline:
            raise BrokerWriteError(f"partitions {', '.join(sorted(pending))[:300]} were not committed within "
                                   f"{retry_s_max:.0f} s ({commit.last_refusal}); committed before that: "
                                   f"{commit.done_records} records")
        time.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, COMMIT_BACKOFF_S_MAX)


class _ClusterCommit:
    """The state of one write's commit across the brokers: what was committed, and the last refusal."""

    def __init__(self, bootstrap: str, settings: dict[str, str], sink: tuple[str, int] | None,
                 staged_exist: StagedExists | None) -> None:
        self.bootstrap = bootstrap
        self.settings = settings
        self.sink = sink
        self.staged_exist = staged_exist
        self.committed = False
        self.done_records = 0
        self.done_objects = 0
        self.last_refusal = "none"
        #: Guards the counts above: the requests to the leaders run in threads of their own.
        self._lock = threading.Lock()

    def result(self) -> CommitResult:
        return CommitResult(self.committed, self.done_records, self.done_objects)

    def round(self, pending: dict[str, list[Staged]]) -> dict[str, list[Staged]]:
        """Send every pending partition to its leader once; the partitions to send again."""
        leaders = self._leaders(pending)
        if leaders is None:
            return pending
        by_leader: dict[str, dict[str, list[Staged]]] = {}
        for key, staged in pending.items():
            by_leader.setdefault(leaders[key], {})[key] = staged
        # The leaders commit at once: the time a reader can see the write in some partitions and not in
        # others is one commit, not one per leader. Every request is answered before any error is raised.
        threads = min(len(by_leader), LEADERS_AT_ONCE_MAX)
        with ThreadPoolExecutor(threads, thread_name_prefix="stratalog-commit") as pool:
            sent = [pool.submit(self._send, leader, partitions) for leader, partitions in sorted(by_leader.items())]
        again: dict[str, list[Staged]] = {}
        refusals = []
        for future in sent:
            try:
                again.update(future.result())
            except BrokerWriteError as e:
                refusals.append(e)
        if refusals:
            raise refusals[0]
        return again

    def _leaders(self, pending: dict[str, list[Staged]]) -> dict[str, str] | None:
        """Where to send each pending group: its partitions' leader, or for partitions that do not exist
        any broker (which refuses them, or creates the topic as a produce would). None while a partition
        has no leader (a failover under way). A group is one partition, or the partitions one object holds
        (staged for a broker alone): those must share a leader."""
        wanted = sorted({_topic_partition(name) for key in pending for name in key.split("\n")})
        view = BrokerView(self.bootstrap, self.settings)
        try:
            leaders = view.leaders_known(wanted)
        except BrokerReadError as e:
            self.last_refusal = str(e)
            _check_login(self.bootstrap, self.settings)   # refused credentials are not tried again
            return None
        finally:
            view.close()
        leaderless = [tp for tp, leader in leaders.items() if leader is None]
        if leaderless:
            self.last_refusal = f"no leader of {leaderless[0][0]}/{leaderless[0][1]} yet"
            return None
        out = {}
        for key in pending:
            hosts = {leaders.get(_topic_partition(name)) or self.bootstrap for name in key.split("\n")}
            if len(hosts) != 1:
                raise BrokerWriteError(f"a staged object holds partitions {key.replace(chr(10), ', ')}, led by "
                                       f"brokers {', '.join(sorted(hosts))}: a write to a cluster stages an object "
                                       "per partition (StagingWriter's split)")
            out[key] = hosts.pop()
        return out

    def _send(self, leader: str, partitions: dict[str, list[Staged]]) -> dict[str, list[Staged]]:
        """One request to ``leader``; the partitions to send again."""
        staged = [item for items in partitions.values() for item in items]
        request = staged_commit.CommitStagedRequest(
            None if self.sink is None else self.sink[0], -1 if self.sink is None else self.sink[1],
            tuple(staged_commit.StagedObjectEntry(task, o.key, o.size_bytes, tuple(
                staged_commit.StagedStreamEntry(s.name, s.start, s.count) for s in o.streams)) for task, o in staged))
        try:
            connection = KafkaConnection(leader, self.settings)
        except LoginRefusedError:
            raise   # the same credentials get the same answer: not tried again
        except BrokerConnectionError as e:   # nothing was sent
            with self._lock:
                self.last_refusal = str(e)
            return partitions
        with connection:
            try:
                version = commit_version(connection)
            except BrokerConnectionError as e:   # the commit not sent yet
                with self._lock:
                    self.last_refusal = str(e)
                return partitions
            try:
                correlation_id = connection.next_correlation_id()
                answer = connection.exchange(staged_commit.encode_request(correlation_id, connection.client_id,
                                                                          request, version))
            except BrokerConnectionError as e:
                with self._lock:
                    return self._answer_lost(leader, partitions, e)
        answered, response = staged_commit.decode_response(answer, version)
        if version == 0 and response.error_code == 0:
            # A broker of v0 commits a request whole, in one transaction: every partition shares its outcome.
            response = dataclasses.replace(response, partitions=tuple(
                staged_commit.PartitionResult(name, 0, None, response.committed,
                                              _records_of(staged, name) if response.committed else 0)
                for name in sorted({name for key in partitions for name in key.split("\n")})))
        if answered != correlation_id:
            raise BrokerWriteError(f"broker {leader} answered request {answered}, not {correlation_id}")
        if response.error_code != 0:
            raise BrokerWriteError(f"broker {leader} refused (error {response.error_code}): {response.error_message}")
        with self._lock:
            return self._take(leader, partitions, response)

    def _take(self, leader: str, partitions: dict[str, list[Staged]],
              response: staged_commit.CommitStagedResponse) -> dict[str, list[Staged]]:
        """What ``leader`` answered, counted (the lock held); the partitions to send again."""
        results = {p.name: p for p in response.partitions}
        again: dict[str, list[Staged]] = {}
        counted: set[str] = set()
        for key, staged in partitions.items():
            names = key.split("\n")
            missing = [name for name in names if name not in results]
            if missing:
                raise BrokerWriteError(f"broker {leader} did not answer for partitions {', '.join(missing)}")
            refused = [results[name] for name in names if results[name].error_code]
            if refused and all(r.error_code in RETRIABLE_ERRORS for r in refused):
                self.last_refusal = f"{leader}: {refused[0].error_message}"
                again[key] = staged
                continue
            if refused:
                r = refused[0]
                raise BrokerWriteError(f"broker {leader} refused {r.name} (error {r.error_code}): {r.error_message}; "
                                       f"committed before that: {self.done_records} records")
            if any(results[name].committed for name in names):
                self.committed = True
                self.done_objects += len(staged)
            for name in set(names) - counted:   # an object of several partitions shares them with others
                self.done_records += results[name].records
                counted.add(name)
        return again

    def _answer_lost(self, leader: str, partitions: dict[str, list[Staged]],
                     error: BrokerConnectionError) -> dict[str, list[Staged]]:
        """The request was sent and its answer lost (the broker died, or the connection broke)."""
        self.last_refusal = f"{leader}: {error}"
        if self.sink is not None:
            return partitions   # each partition's marker makes a second commit of the batch write nothing
        keys = [o.key for items in partitions.values() for _, o in items]
        if self.staged_exist is not None and self.staged_exist(keys):
            return partitions   # nothing was moved, so nothing was committed
        raise BrokerWriteError(f"the connection to broker {leader} broke during the commit of partitions "
                               f"{', '.join(sorted(partitions))[:300]} ({error}): whether they were committed is "
                               f"unknown (their staged objects are gone); committed before that: "
                               f"{self.done_records} records")


def commit_version(connection: KafkaConnection) -> int:
    """The StratalogCommitStaged version to send on ``connection``: the highest the broker serves (ApiVersions)
    and this driver knows. An older broker serves v0 only (one answer for the whole request); BrokerWriteError
    for a broker that serves none (not a stratalog broker, or one too old for Spark writes)."""
    from kio.schema.api_versions.v0.request import ApiVersionsRequest

    from stratalog.kafka.api_keys import ApiKey

    served = connection.call(ApiKey.API_VERSIONS, 0, ApiVersionsRequest())
    versions = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in served.api_keys}
    return negotiated_commit_version(versions)


def negotiated_commit_version(served: dict[int, tuple[int, int]]) -> int:
    """The version of StratalogCommitStaged both sides know, from the broker's ``{api key: (min, max)}``."""
    if staged_commit.API_KEY not in served:
        raise BrokerWriteError(f"the broker does not serve {staged_commit.API_NAME} (api key "
                               f"{staged_commit.API_KEY}): Spark writes need a stratalog broker")
    low, high = served[staged_commit.API_KEY]
    version = min(high, staged_commit.COMMIT_VERSION_MAX)
    if version < low:
        raise BrokerWriteError(f"the broker serves {staged_commit.API_NAME} versions {low} to {high}, this driver "
                               f"0 to {staged_commit.COMMIT_VERSION_MAX}: upgrade stratalog where Spark runs")
    return version


def _records_of(staged: list[Staged], name: str) -> int:
    return sum(s.count for _, o in staged for s in o.streams if s.name == name)


def _check_login(bootstrap: str, settings: dict[str, str]) -> None:
    """Raise LoginRefusedError when ``bootstrap`` refuses ``settings``' credentials (the metadata client
    reports a refused login as a transport failure, like a broker that is down); nothing otherwise."""
    try:
        KafkaConnection(bootstrap, settings).close()
    except LoginRefusedError:
        raise
    except BrokerConnectionError:
        pass   # not reachable: the next round tries again


def _topic_partition(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)


def replace_through_broker(bootstrap: str, settings: dict[str, str], replaced: Sequence[str],
                           staged: Sequence[tuple[str, int]]) -> CommitResult:
    """Ask the broker to swap the objects at ``replaced`` for the staged ``(key, size)`` objects (a
    compaction). BrokerWriteError when the broker refuses (not authorized, or the objects changed since)."""
    request = staged_commit.ReplaceObjectsRequest(tuple(replaced), tuple(staged))
    return _ask(bootstrap, settings, lambda cid, client: staged_commit.encode_replace_request(cid, client, request))


def _ask(bootstrap: str, settings: dict[str, str], frame: Callable[[int, str | None], bytes]) -> CommitResult:
    with KafkaConnection(bootstrap, settings) as connection:
        correlation_id = connection.next_correlation_id()
        answer = connection.exchange(frame(correlation_id, connection.client_id))
    answered, response = staged_commit.decode_response(answer, 0)
    if answered != correlation_id:
        raise BrokerWriteError(f"the broker answered request {answered}, not {correlation_id}")
    if response.error_code != 0:
        raise BrokerWriteError(f"the broker refused (error {response.error_code}): {response.error_message}")
    return CommitResult(response.committed, response.records, response.objects)
