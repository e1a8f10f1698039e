"""``stratalog serve``: the Kafka-compatible broker on the stream engine."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import tomllib
from pathlib import Path
from typing import Any

import click

from stratalog.broker.acls import AuthorizerConfig
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig, ClusterConfig
from stratalog.broker.groups import GroupConfig
from stratalog.broker.listeners import ClientAuth, Listener, ListenerConfigError, TLSConfig, tls_config_from
from stratalog.broker.metrics_http import MetricsEndpoint
from stratalog.broker.quotas import QuotaConfig
from stratalog.broker.server import BrokerServer
from stratalog.broker.stack_dump import dump_stacks
from stratalog.commands.log_format import TEXT_FORMAT, use_format
from stratalog.commands.serve_http import Console, check_addresses, start_console, start_metrics
from stratalog.engine.config import CleanerBounds, StoreConfig
from stratalog.engine.metadata_backends import MetadataUnavailableError, wait_until_reachable, without_password
from stratalog.io.device import Device, FileDevice
from stratalog.native import core as native_core
from stratalog.wal.config import FsyncPolicy, WALConfig

log = logging.getLogger("stratalog.broker")


def parse_listeners(listen: tuple[str, ...], advertise: tuple[str, ...]) -> tuple[Listener, ...] | None:
    """The listeners of ``--listen`` (None: none given), with ``--advertise`` matched to them by protocol."""
    try:
        listeners = [Listener.parse(v) for v in listen]
        for value in advertise:
            adv = Listener.parse(value)
            explicit = "://" in value
            matches = [i for i, lis in enumerate(listeners) if lis.protocol is adv.protocol or not explicit]
            if len(matches) != 1:
                raise click.BadParameter(f"{value!r} must name the protocol of exactly one --listen "
                                         f"(e.g. SASL_SSL://broker.example:9093)", param_hint="--advertise")
            i = matches[0]
            listeners[i] = dataclasses.replace(listeners[i], advertised_host=adv.host, advertised_port=adv.port)
    except ListenerConfigError as e:
        raise click.BadParameter(str(e)) from None
    return tuple(listeners) or None


def load_config(path: Path | None, **overrides: Any) -> BrokerConfig:
    """A BrokerConfig from a TOML file, then the command line's options. Top-level keys are BrokerConfig's
    field names (``listeners`` a list of ``PROTOCOL://HOST:PORT``, ``metadata`` a PostgreSQL URI); the
    tables ``[groups]``, ``[cluster]``, ``[store]``, ``[store.wal]``, ``[tls]``, ``[authorizer]`` and
    ``[quotas]`` set GroupConfig's, ClusterConfig's, StoreConfig's, WALConfig's, TLSConfig's,
    AuthorizerConfig's and QuotaConfig's. An unknown name is refused with the known ones."""
    values: dict[str, Any] = {}
    if path is not None:
        with path.open("rb") as f:
            values = tomllib.load(f)
        values = _settings(BrokerConfig, values, "")
        if "groups" in values:
            values["groups"] = GroupConfig(**_settings(GroupConfig, values["groups"], "[groups] "))
        if "cluster" in values:
            values["cluster"] = ClusterConfig(**_settings(ClusterConfig, values["cluster"], "[cluster] "))
        _security_settings(values)
        if "store" in values:
            store = _settings(StoreConfig, values["store"], "[store] ")
            if "wal" in store:
                wal = _settings(WALConfig, store["wal"], "[store.wal] ")
                if "fsync" in wal:
                    try:
                        wal["fsync"] = FsyncPolicy(wal["fsync"])
                    except ValueError:
                        raise click.BadParameter(f"[store.wal] fsync: {wal['fsync']!r} is not one of "
                                                 f"{', '.join(p.value for p in FsyncPolicy)}",
                                                 param_hint="--config") from None
                store["wal"] = dataclasses.replace(StoreConfig().wal, **wal)   # the store's defaults, not the WAL's
            if "cleaner" in store:
                store["cleaner"] = CleanerBounds(**_settings(CleanerBounds, store["cleaner"], "[store.cleaner] "))
            values["store"] = StoreConfig(**store)
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = BrokerConfig(**values)
    try:
        config.validate()
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return config


def _security_settings(values: dict[str, Any]) -> None:
    try:
        if "listeners" in values:
            values["listeners"] = tuple(Listener.parse(str(v)) for v in values["listeners"])
        if "tls" in values:
            tls = _settings(TLSConfig, values["tls"], "[tls] ")
            if "client_auth" in tls:
                tls["client_auth"] = ClientAuth(tls["client_auth"])
            values["tls"] = TLSConfig(**tls)
        if "authorizer" in values:
            authorizer = _settings(AuthorizerConfig, values["authorizer"], "[authorizer] ")
            if "super_users" in authorizer:
                authorizer["super_users"] = tuple(authorizer["super_users"])
            values["authorizer"] = AuthorizerConfig(**authorizer)
        if "quotas" in values:
            values["quotas"] = QuotaConfig(**_settings(QuotaConfig, values["quotas"], "[quotas] "))
        if "sasl_mechanisms" in values:
            values["sasl_mechanisms"] = tuple(values["sasl_mechanisms"])
    except (ListenerConfigError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint="--config") from None


def _settings(cls: type[Any], values: Any, where: str) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(values, dict):
        raise click.BadParameter(f"{where or 'the file'} must be a table of settings", param_hint="--config")
    unknown = sorted(set(values) - known)
    if unknown:
        raise click.BadParameter(f"unknown {where}settings {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                                 param_hint="--config")
    return dict(values)


async def run_broker(data_dir: Path, config: BrokerConfig, object_store: str | None,
                     ready: asyncio.Event | None = None, wal_device: Device | None = None,
                     stop: asyncio.Event | None = None) -> None:
    """Serve until SIGINT or SIGTERM (a second signal exits at once), or until ``stop`` is set by a caller
    that runs the broker in its own process."""
    if config.metadata is not None and config.metadata_connect_wait_ms:
        # Before the signal handlers: Ctrl-C ends this wait as it would any command's.
        _wait_for_metadata(config.metadata, config.metadata_connect_wait_ms / 1000)
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            click.echo("second signal: exiting now", err=True)
            os._exit(1)
        click.echo("stopping: finishing requests in flight (send the signal again to exit at once)", err=True)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGUSR1, dump_stacks)
    broker = Broker.open(data_dir, config, object_store=object_store, wal_device=wal_device)
    server = BrokerServer(broker)
    endpoint: MetricsEndpoint | None = None
    console: Console | None = None
    try:
        try:
            listeners = await server.start()
        except OSError as e:   # its message names the address: "... bind on address (...): address already in use"
            raise click.ClickException(f"cannot listen: {e.strerror}") from None
        click.echo(f"stratalog core: {native_core()}")  # before the listeners: who waits for those sees it
        if config.metrics_listen is not None:
            endpoint, url = start_metrics(broker, server, config, loop)
            click.echo(f"  metrics on {url} (probes: /healthz, /readyz)")
        if config.console_listen is not None:
            console = start_console(broker, server, config, loop)
            click.echo(f"  console on {console.url}/")
        for listener in listeners:
            click.echo(f"stratalog broker listening on {listener.host}:{listener.port} ({listener.protocol.value}; "
                       f"data in {data_dir})")
        first = listeners[0]
        click.echo(f"  connect any Kafka client with bootstrap servers {first.host}:{first.port}, e.g.")
        click.echo(f"  kafka-python: KafkaProducer(bootstrap_servers='{first.host}:{first.port}')")
        if config.metadata is not None:
            click.echo(f"  topics, offsets, users, ACLs, quotas and stream metadata in "
                       f"{without_password(config.metadata)}")
        if (summary := broker.ownership.summary()) is not None:
            click.echo(f"  {summary}")
        if config.authorizer.enabled:
            supers = ", ".join(config.authorizer.super_users) or "none"
            click.echo(f"  ACLs are checked on every request (super users: {supers})")
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        if endpoint is not None:
            endpoint.close()
        if console is not None:
            console.close()
        await server.stop()
        await broker.close()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    click.echo("stopped: everything acknowledged is durable")


def _wait_for_metadata(uri: str, wait_s: float) -> None:
    """Wait (up to ``wait_s``) for the metadata database to answer, saying so once if it does not at first."""
    told: list[str] = []

    def on_retry(why: str) -> None:
        if not told:
            told.append(why)
            click.echo(f"the metadata database does not answer ({why.strip()}); trying again for up to "
                       f"{wait_s:g} s", err=True)

    wait_until_reachable(uri, wait_s, on_retry)
    if told:
        click.echo("the metadata database answers", err=True)


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data"),
              show_default=True, help="Where the WAL, metadata and (by default) objects live.")
@click.option("--listen", multiple=True, metavar="[PROTOCOL://]HOST:PORT",
              help="Where to listen (repeat for several listeners); PROTOCOL is PLAINTEXT (the default), SSL, "
                   "SASL_PLAINTEXT or SASL_SSL. Default: PLAINTEXT://127.0.0.1:9092. A listener that is not "
                   "loopback must authenticate clients (SASL, or SSL with --tls-client-auth required).")
@click.option("--advertise", multiple=True, metavar="[PROTOCOL://]HOST:PORT",
              help="What clients of the listener with this PROTOCOL are told to connect to (default: where "
                   "it listens).")
@click.option("--object-store", default=None,
              help="Object storage URI, e.g. s3://bucket/prefix?endpoint=http://127.0.0.1:8333 "
                   "(default: a directory under --data-dir).")
@click.option("--wal-device", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Put the WAL on this raw block device or preallocated file (default: DATA_DIR/wal). "
                   "Everything on it is the broker's.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="A TOML file of settings: BrokerConfig's field names, and tables [groups], "
                                 "[store], [store.wal], [tls], [authorizer] and [quotas] (docs/broker.md).")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The broker's certificate chain (PEM) for SSL and SASL_SSL listeners.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The private key of --tls-cert (PEM), if not in the same file.")
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The CA certificates that sign client certificates (PEM).")
@click.option("--tls-client-auth", type=click.Choice([a.value for a in ClientAuth]), default=None,
              help="Ask TLS clients for a certificate; its subject becomes the principal (User:CN=...).")
@click.option("--acls", is_flag=True, default=False,
              help="Check ACLs on every request: a principal may do only what an ACL allows "
                   "(manage them with any Kafka admin client, e.g. kafka-acls).")
@click.option("--super-user", multiple=True, metavar="User:NAME",
              help="A principal that may do everything when --acls is on (repeat for several).")
@click.option("--allow-plaintext-anywhere", is_flag=True, default=False,
              help="Allow a non-loopback listener that does not authenticate clients.")
@click.option("--metadata", metavar="postgresql://USER:PASSWORD@HOST:PORT/DATABASE", envvar="STRATALOG_METADATA",
              default=None, show_envvar=True,
              help="Keep topics, committed offsets, users, ACLs, quotas, producer snapshots and the stream "
                   "store's metadata in this PostgreSQL database instead of SQLite files in --data-dir (the "
                   "WAL and, by default, objects stay there). The password is never logged; give the URI "
                   "in the environment variable to keep it off the command line.")
@click.option("--cluster", "cluster", is_flag=True, default=False,
              help="Serve as one broker of several over --metadata and a shared --object-store: each partition "
                   "is led, and each group coordinated, by one live broker; the WAL is in the object store "
                   "(docs/cluster.md). Exits with status 75 if its lease is lost: restart it.")
@click.option("--metrics-listen", metavar="[https://]HOST:PORT", default=None,
              help="Serve Prometheus metrics at /metrics, with /healthz (the process serves) and /readyz (it "
                   "takes writes: the store runs and has room, the cluster lease holds). HOST:PORT: plain HTTP "
                   "on a loopback address (any with --allow-plaintext-anywhere); https://HOST:PORT: HTTPS with "
                   "the broker's --tls-cert, /metrics for a user who may describe the cluster (HTTP Basic). "
                   "Port 0 picks a free one; the banner says which.")
@click.option("--console", "console_listen", metavar="[https://]HOST:PORT", default=None,
              help="Serve the web console (read-only: the broker, topics and their messages, groups and their "
                   "lag, the store): plain HTTP on a loopback address, or https://HOST:PORT with --tls-cert. "
                   "With --acls, a SASL listener or HTTPS, users log in and see what their ACLs allow.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON object a line (time, level, logger, message, and a request's connection, "
                   "principal and API), for log shippers.")
@click.option("--log-requests", is_flag=True, default=False,
              help="Log every request answered: API and version, connection, principal, client id, time taken "
                   "(a line per request: for finding who sends what, not for a busy broker's normal run).")
@click.option("--broker-id", type=click.IntRange(min=0), default=None,
              help="This broker's id in the cluster (unique among the brokers).")
def serve(data_dir: Path, listen: tuple[str, ...], advertise: tuple[str, ...], object_store: str | None,
          wal_device: Path | None, config_path: Path | None, tls_cert: Path | None, tls_key: Path | None,
          tls_ca: Path | None, tls_client_auth: str | None, acls: bool, super_user: tuple[str, ...],
          allow_plaintext_anywhere: bool, metadata: str | None, cluster: bool, metrics_listen: str | None,
          console_listen: str | None, log_format: str, log_requests: bool, broker_id: int | None) -> None:
    """Run the Kafka-compatible broker: every Kafka client and tool can produce and consume.

    Records are durable in the write-ahead log before a produce with acks=1 or acks=all is answered;
    kill -9 at any time loses nothing acknowledged. SIGINT or SIGTERM stops it cleanly; SIGUSR1 prints
    what every thread and task is doing to stderr (for a broker that seems stuck).

    \b
    Security: listeners with TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), users from
    `stratalog users add`, ACLs with --acls. For example:
      stratalog users add alice --data-dir data
      stratalog serve --listen SASL_SSL://0.0.0.0:9093 --tls-cert broker.pem --tls-key broker.key \\
        --acls --super-user User:alice
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format=TEXT_FORMAT)
    use_format(log_format)
    if log_requests:    # its lines reach the root's handlers whatever the root's own level
        logging.getLogger("stratalog.broker.requests").setLevel(logging.DEBUG)
    base = load_config(config_path) if config_path else BrokerConfig()
    authorizer = base.authorizer
    if acls or super_user:
        authorizer = dataclasses.replace(authorizer, enabled=authorizer.enabled or acls,
                                         super_users=authorizer.super_users + super_user)
    cluster_config = base.cluster
    if cluster or broker_id is not None:
        if broker_id is None and config_path is None:
            raise click.UsageError("--cluster needs --broker-id (or broker_id in the config's [cluster] table)")
        cluster_config = dataclasses.replace(cluster_config, enabled=True,
                                             broker_id=cluster_config.broker_id if broker_id is None else broker_id)
    if cluster_config.enabled and wal_device is not None:
        raise click.UsageError("a broker of a cluster keeps its WAL in the object store: --wal-device does not apply")
    if cluster_config.enabled and object_store is None:
        raise click.UsageError("a broker of a cluster needs --object-store: an S3 bucket (or prefix) every broker "
                               "reaches")
    config = load_config(
        config_path, listeners=parse_listeners(listen, advertise),
        tls=tls_config_from(tls_cert, tls_key, tls_ca, tls_client_auth, base.tls), authorizer=authorizer,
        allow_plaintext_anywhere=allow_plaintext_anywhere or None, metadata=metadata, cluster=cluster_config)
    if cluster_config.enabled:
        config = dataclasses.replace(config, node_id=cluster_config.broker_id)
    if metrics_listen is not None:
        config = dataclasses.replace(config, metrics_listen=metrics_listen)
    if console_listen is not None:
        config = dataclasses.replace(config, console_listen=console_listen)
    check_addresses(config)
    device = FileDevice.open(wal_device) if wal_device is not None else None
    if device is not None:
        # The WAL ring takes the whole device.
        config = dataclasses.replace(config, store=dataclasses.replace(config.store,
                                                                        wal_capacity_bytes=device.size_bytes))
        try:
            config.validate()
        except ValueError as e:
            device.close()
            raise click.UsageError(f"--wal-device {wal_device}: {e}") from None
    try:
        asyncio.run(run_broker(data_dir, config, object_store, wal_device=device))
    except MetadataUnavailableError as e:   # its message names the database without the password
        raise click.ClickException(str(e)) from None
    finally:
        if device is not None:
            device.close()
