"""Every bound of the broker, named, with the reason for its default (Kafka's name in brackets)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stratalog.broker.acls import AuthorizerConfig
from stratalog.broker.groups import GroupConfig
from stratalog.broker.listeners import Listener, TLSConfig, check_listeners, default_listeners
from stratalog.broker.quotas import QuotaConfig
from stratalog.broker.sasl import MECHANISMS
from stratalog.engine.config import StoreConfig
from stratalog.engine.metadata_backends import is_postgres_uri

#: A lease shorter than this would be spent renewing it (a renewal is a database round trip).
LEASE_MS_MIN = 100
#: The smallest request bound that still takes every client's first requests (ApiVersions, Metadata).
REQUEST_BYTES_MIN = 1024
#: Longest wait for the metadata database at start (10 minutes): past it, say so and stop.
METADATA_CONNECT_WAIT_MS_LIMIT = 600_000
#: Longest backstop for the WAL's completions (1 minute; it is meant to be milliseconds).
WAL_COMPLETION_BACKSTOP_MS_LIMIT = 60_000


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """One broker of several over shared object storage and one PostgreSQL (``stratalog serve --cluster``;
    docs/cluster.md). Off by default: a broker alone leads everything."""

    enabled: bool = False
    #: This broker's id, unique in the cluster; each start is a new incarnation of it.
    broker_id: int = 0
    #: How long a lease lasts without renewal: a broker that stops renewing (killed, paused, cut off from
    #: the database) has its partitions taken over this long after its last renewal. 3 s: failover waits
    #: about this long, and a renewal is a one-row update, so even a loaded database renews in time.
    lease_ms: int = 3000
    #: Between renewals: four chances per lease, so one slow round trip or a short database hiccup does
    #: not cost the lease.
    renew_interval_ms: int = 750
    #: How long before its lease could have run out on the database's clock a broker stops acknowledging
    #: writes (cluster/lease_clock.py): covers a difference in rate between its clock and the
    #: database's, and the moment between the check and the answer leaving. A tenth of the lease.
    lease_margin_ms: int = 300
    #: Between reconciles (dead logs replayed, orphaned partitions taken over, loads evened out, handoffs
    #: carried out): the other part of failover time, and of how soon a new topic's partitions are served.
    #: A reconcile is a few queries in one transaction.
    reconcile_interval_ms: int = 500
    #: The longest a handoff waits for the appends queued for room before it stopped taking the partition's
    #: (one may be among them); past it the handoff is put off to a later reconcile (the partition is
    #: served meanwhile).
    handoff_wait_ms_max: int = 10_000
    #: Between sweeps of the objects left under logs nobody needs (brokers that left clean or were
    #: replayed): each lists the whole ``wal/`` prefix, and what it deletes only costs storage meanwhile.
    log_sweep_interval_ms: int = 60_000

    def validate(self) -> None:
        if not self.enabled:
            return
        if self.broker_id < 0:
            raise ValueError("cluster broker_id must be >= 0")
        if self.lease_ms < LEASE_MS_MIN:
            raise ValueError(f"cluster lease_ms must be at least {LEASE_MS_MIN}")
        if not 0 < self.renew_interval_ms * 2 <= self.lease_ms:
            raise ValueError("cluster renew_interval_ms must be positive and at most half of lease_ms, so a "
                             "renewal that is late once does not lose the lease")
        if not 0 <= self.lease_margin_ms < self.lease_ms - self.renew_interval_ms:
            raise ValueError("cluster lease_margin_ms must be at least 0 and below lease_ms - renew_interval_ms, "
                             "or a broker would stop acknowledging between two timely renewals")
        if self.reconcile_interval_ms <= 0 or self.handoff_wait_ms_max <= 0 or self.log_sweep_interval_ms <= 0:
            raise ValueError("cluster reconcile_interval_ms, handoff_wait_ms_max and log_sweep_interval_ms must be "
                             "positive")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    #: Where clients connect, each with its security protocol (listeners.py); PLAINTEXT on loopback by
    #: default.
    listeners: tuple[Listener, ...] = field(default_factory=default_listeners)
    #: A listener on an address other than loopback that does not authenticate clients is refused
    #: unless this is set.
    allow_plaintext_anywhere: bool = False
    #: Certificates of the SSL and SASL_SSL listeners.
    tls: TLSConfig = field(default_factory=TLSConfig)
    #: The SASL mechanisms SASL listeners offer (sasl.enabled.mechanisms).
    sasl_mechanisms: tuple[str, ...] = MECHANISMS
    #: A failed login is answered after this long, then its connection closes: a password guesser gets
    #: at most one try per connection and per delay (connection.failed.authentication.delay.ms: 100 ms).
    authentication_failure_delay_ms: int = 100
    authorizer: AuthorizerConfig = field(default_factory=AuthorizerConfig)
    #: Default byte and request rates per user and client id; quota entities set through the admin API
    #: (AlterClientQuotas) override them.
    quotas: QuotaConfig = field(default_factory=QuotaConfig)
    node_id: int = 0
    cluster_id: str = "stratalog"
    #: A request larger than this closes its connection before a byte of it is kept
    #: (socket.request.max.bytes: 100 MiB).
    request_bytes_max: int = 100 << 20
    #: Requests read ahead of their responses on one connection; the reader waits beyond it, so a
    #: client that pipelines without reading holds at most this many (and their responses) in memory.
    in_flight_requests_max: int = 64
    #: Requests read whose handlers have not started, across all connections: the event loop's queue of
    #: work (Kafka's queued.max.requests, for its handler threads). Beyond it a connection reads another
    #: request only if it has none in flight: a thousand clients pipelining cannot queue thousands of
    #: requests ahead of everyone else's (each pipeliner gets a request read in turn), and a client with
    #: nothing in flight is never held back. Requests waiting on data or the disk (long polls, produces)
    #: are not queued work.
    requests_queued_max: int = 64
    #: Open connections; more are accepted and closed at once with a log line (max.connections).
    connections_max: int = 4096
    #: Open connections from one address (max.connections.per.ip); None: only connections_max bounds them.
    connections_per_address_max: int | None = None
    #: Request bytes held across all connections (read, not yet answered) (queued.max.request.bytes).
    #: Beyond it the connection holding the most is closed: a thousand slow senders cannot fill memory.
    request_memory_bytes_max: int = 512 << 20
    #: Response bytes written and not yet taken by peers, across all connections. While it is reached,
    #: fetches answer with no records (after their wait): clients that do not read cannot fill memory.
    response_memory_bytes_max: int = 512 << 20
    #: A connection whose peer takes none of the responses written to it for this long is closed: the
    #: responses it leaves unread hold broker memory (response_memory_bytes_max).
    response_write_timeout_ms: int = 30_000
    #: A connection idle this long is closed (connections.max.idle.ms: 10 minutes).
    idle_timeout_ms: int = 600_000
    #: A connection whose frame has been arriving for this long is closed: a slow sender cannot hold
    #: its buffer forever.
    request_read_timeout_ms: int = 60_000
    #: The longest a fetch waits for data, whatever it asks (replica.fetch.wait.max.ms is 500 ms; a
    #: consumer's fetch.max.wait.ms is bounded here so a fetch never outlives a client's timeout).
    fetch_wait_ms_max: int = 30_000
    #: The largest fetch response, whatever the request asks (fetch.max.bytes: 55 MiB).
    fetch_response_bytes_max: int = 55 << 20
    #: Fetch sessions kept (KIP-227; max.incremental.fetch.session.cache.slots: 1000): a consumer in one
    #: names only the partitions that changed, and is answered only those with news. When it is full a new
    #: session takes the place of one unused for fetch_session_eviction_ms, or of a smaller one older than
    #: that; else the consumer fetches without one (full fetches), which works as well and costs more.
    fetch_sessions_max: int = 1000
    #: Partitions one fetch session keeps: a fetch naming more gets no session (Kafka has no such bound; a
    #: consumer rarely fetches more than a few thousand partitions from one broker).
    fetch_session_partitions_max: int = 10_000
    #: Partitions all fetch sessions keep together, each about 300 bytes: 100,000 bound the cache near
    #: 30 MiB whatever clients ask (1000 sessions of 10,000 partitions would take 3 GiB).
    fetch_session_cache_partitions_max: int = 100_000
    #: A fetch session unused this long may be evicted by any new one, and one created longer ago than
    #: this by a new one of more partitions (min.incremental.fetch.session.eviction.ms: 120 s).
    fetch_session_eviction_ms: int = 120_000
    #: A produce waits this long for durability before it answers REQUEST_TIMED_OUT.
    produce_wait_ms_max: int = 30_000
    #: The event loop completes the WAL's appends itself, as soon as their block is written (no thread
    #: woken, no GIL handed over between the write and the answer); the WAL's own reaper thread takes
    #: only results left this long, for when the loop is blocked, even waiting for one of them. 0: the
    #: reaper thread completes every append, as without a loop.
    wal_completion_backstop_ms: int = 5
    #: Topics a produce or metadata request names are created when missing (auto.create.topics.enable).
    auto_create_topics: bool = True
    #: Partitions of a topic created without a count (num.partitions).
    default_partitions: int = 1
    #: Partitions of one topic: each is a stream, and a topic's metadata lists them all.
    partitions_per_topic_max: int = 10_000
    #: The largest record batch a producer may send (message.max.bytes: 1 MiB + overhead in Kafka;
    #: here the WAL record bound, less the engine's batch header).
    message_bytes_max: int = (8 << 20) - 64
    #: Check every record of a produced batch before storing it, as Kafka does (a batch whose CRC is right
    #: but whose records lie would stop every consumer at it). Costs about 0.8 us a record on the event
    #: loop; off only where every producer is trusted.
    validate_records: bool = True
    #: Where ``/metrics``, ``/healthz`` and ``/readyz`` are served (``HOST:PORT``, plain HTTP on a loopback
    #: address; ``https://HOST:PORT``, with a login: broker/http_address.py); None: not served.
    metrics_listen: str | None = None
    #: Where the web console is served (as metrics_listen: plain HTTP on loopback, or https://); None: not.
    console_listen: str | None = None
    #: Idempotent producers remembered; the oldest idle one is forgotten beyond it.
    producers_max: int = 100_000
    #: How often idempotent producers' state is snapshotted; a restart reads the batches written since
    #: the last snapshot to rebuild it, so this bounds the work at start.
    producer_snapshot_interval_ms: int = 2_000
    #: How often the log cleaner looks for compacted partitions due a pass (Kafka's log.cleaner.backoff.ms):
    #: a pass runs only once a partition's uncleaned share reaches its min.cleanable.dirty.ratio, so a
    #: short interval costs a few metadata reads per compacted partition.
    log_cleaner_interval_ms: int = 15_000
    #: The longest transaction.timeout.ms a transactional producer may ask for (Kafka's
    #: transaction.max.timeout.ms, 15 minutes): an open transaction holds back every read_committed
    #: consumer of its partitions until it ends, so one abandoned must be aborted in bounded time.
    transaction_timeout_ms_max: int = 900_000
    #: How often the coordinator aborts transactions past their timeout and completes those whose markers
    #: could not all be written (Kafka's transaction.abort.timed.out.transaction.cleanup.interval.ms).
    transaction_abort_interval_ms: int = 10_000
    #: A broker of a cluster: how often it looks for markers queued for the partitions it leads, and a
    #: coordinator whether its queued markers were written (broker/txn_marker_queue.py). A notification
    #: wakes both sooner; this covers one lost with a connection.
    transaction_marker_poll_interval_ms: int = 500
    #: How long EndTxn waits for other brokers to write its markers before it answers a retriable error (the
    #: transaction stays prepared and its coordinator completes it later): past the lease and a reconcile,
    #: a partition whose leader died has a new one.
    transaction_marker_wait_ms_max: int = 10_000
    #: Partitions one transaction may hold: each is a marker to write at its end and a bound on a
    #: partition's last stable offset kept in memory and in its durable state.
    transaction_partitions_max: int = 10_000
    #: A transactional id whose last transaction ended this long ago, untouched since, is forgotten (Kafka's
    #: transactional.id.expiration.ms, 7 days): what the coordinator keeps grows with the ids in use, not
    #: with every id ever used.
    transactional_id_expiration_ms: int = 604_800_000
    store: StoreConfig = field(default_factory=StoreConfig)
    groups: GroupConfig = field(default_factory=GroupConfig)
    #: Where topics, committed offsets, users, ACLs, quotas, producer snapshots and the stream store's
    #: metadata live: None for SQLite files in the data directory, or a PostgreSQL URI
    #: (postgresql://USER:PASSWORD@HOST:PORT/DATABASE), the database several brokers will share. Left
    #: out of the config's repr: it may hold a password.
    metadata: str | None = field(default=None, repr=False)
    #: At start, how long to keep trying to reach a PostgreSQL ``metadata`` database that does not answer
    #: (restarting, or a network coming back) before giving up with an error: a broker started by a
    #: supervisor while the database is away would otherwise fail at once, again and again.
    metadata_connect_wait_ms: int = 30_000
    #: One broker of several (``--cluster``): needs ``metadata`` and a shared object store.
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def validate(self) -> None:
        self.cluster.validate()
        if self.cluster.enabled and self.metadata is None:
            raise ValueError("a broker of a cluster needs its metadata in PostgreSQL (--metadata)")
        if self.cluster.enabled and self.listeners[0].endpoint[1] == 0:
            raise ValueError("a broker of a cluster registers where clients reach it: listen on a fixed port, or "
                             "give it with --advertise")
        if self.metadata is not None and not is_postgres_uri(self.metadata):
            # Not echoed: a mistyped scheme may still hold a password.
            raise ValueError("metadata must be a PostgreSQL URI (postgresql://USER:PASSWORD@HOST:PORT/DATABASE), "
                             "or unset for SQLite files in the data directory")
        check_listeners(self.listeners, self.tls, self.allow_plaintext_anywhere)
        unknown = sorted(set(self.sasl_mechanisms) - set(MECHANISMS))
        if unknown or not self.sasl_mechanisms:
            raise ValueError(f"sasl_mechanisms: {', '.join(unknown) or 'none given'}; offered: {', '.join(MECHANISMS)}")
        if self.connections_per_address_max is not None and self.connections_per_address_max < 1:
            raise ValueError("connections_per_address_max must be at least 1 (or unset)")
        if self.message_bytes_max + 64 > self.store.wal.record_bytes_max:
            raise ValueError("message_bytes_max must fit a WAL record (store.wal.record_bytes_max - 64)")
        if not 0 < self.default_partitions <= self.partitions_per_topic_max:
            raise ValueError("default_partitions must be in [1, partitions_per_topic_max]")
        if self.request_bytes_max < REQUEST_BYTES_MIN:
            raise ValueError(f"request_bytes_max must be at least {REQUEST_BYTES_MIN} bytes")
        if self.request_memory_bytes_max < self.request_bytes_max:
            raise ValueError("request_memory_bytes_max must hold at least one request (request_bytes_max)")
        if self.response_memory_bytes_max < self.fetch_response_bytes_max:
            raise ValueError("response_memory_bytes_max must hold at least one fetch response "
                             "(fetch_response_bytes_max)")
        if not (self.fetch_sessions_max >= 0 and 0 <= self.fetch_session_partitions_max
                <= self.fetch_session_cache_partitions_max and self.fetch_session_eviction_ms >= 0):
            raise ValueError("fetch_sessions_max, fetch_session_partitions_max and fetch_session_eviction_ms must be "
                             "at least 0, and fetch_session_partitions_max at most fetch_session_cache_partitions_max")
        if not 0 <= self.metadata_connect_wait_ms <= METADATA_CONNECT_WAIT_MS_LIMIT:
            raise ValueError(f"metadata_connect_wait_ms must be in [0, {METADATA_CONNECT_WAIT_MS_LIMIT}] (0: give up "
                             "at the first failure)")
        if not 0 <= self.wal_completion_backstop_ms <= WAL_COMPLETION_BACKSTOP_MS_LIMIT:
            raise ValueError(f"wal_completion_backstop_ms must be in [0, {WAL_COMPLETION_BACKSTOP_MS_LIMIT}] (0: the "
                             "WAL's thread completes appends)")
        self.store.validate()
