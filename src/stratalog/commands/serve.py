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

from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.groups import GroupConfig
from stratalog.broker.server import BrokerServer, NonLoopbackRefusedError, check_listen_host
from stratalog.engine.config import StoreConfig
from stratalog.io.device import Device, FileDevice
from stratalog.wal.config import FsyncPolicy, WALConfig

log = logging.getLogger("stratalog.broker")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise click.BadParameter(f"{value!r}: expected HOST:PORT, such as 127.0.0.1:9092")
    return host.strip("[]"), int(port)


def load_config(path: Path | None, **overrides: Any) -> BrokerConfig:
    """A BrokerConfig from a TOML file, then the command line's options. Top-level keys are BrokerConfig's
    field names; the tables ``[groups]``, ``[store]`` and ``[store.wal]`` set GroupConfig's, StoreConfig's
    and WALConfig's. An unknown name is refused with the known ones."""
    values: dict[str, Any] = {}
    if path is not None:
        with path.open("rb") as f:
            values = tomllib.load(f)
        values = _settings(BrokerConfig, values, "")
        if "groups" in values:
            values["groups"] = GroupConfig(**_settings(GroupConfig, values["groups"], "[groups] "))
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
                store["wal"] = WALConfig(**wal)
            values["store"] = StoreConfig(**store)
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = BrokerConfig(**values)
    try:
        config.validate()
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--config") from None
    return config


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
                     ready: asyncio.Event | None = None, wal_device: Device | None = None) -> None:
    """Serve until SIGINT or SIGTERM; a second signal exits at once."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
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
    broker = Broker.open(data_dir, config, object_store=object_store, wal_device=wal_device)
    server = BrokerServer(broker)
    try:
        host, port = await server.start()
        click.echo(f"stratalog broker listening on {host}:{port} (data in {data_dir})")
        click.echo(f"  connect any Kafka client with bootstrap servers {host}:{port}, e.g.")
        click.echo(f"  kafka-python: KafkaProducer(bootstrap_servers='{host}:{port}')")
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        await server.stop()
        await broker.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    click.echo("stopped: everything acknowledged is durable")


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data"),
              show_default=True, help="Where the WAL, metadata and (by default) objects live.")
@click.option("--listen", default="127.0.0.1:9092", show_default=True,
              help="HOST:PORT to listen on. Anything but loopback needs --allow-plaintext-anywhere.")
@click.option("--advertise", default=None, help="HOST:PORT clients are told to connect to (default: --listen).")
@click.option("--object-store", default=None,
              help="Object storage URI, e.g. s3://bucket/prefix?endpoint=http://127.0.0.1:8333 "
                   "(default: a directory under --data-dir).")
@click.option("--wal-device", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Put the WAL on this raw block device or preallocated file (default: DATA_DIR/wal). "
                   "Everything on it is the broker's.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="A TOML file of settings: BrokerConfig's field names, and tables [groups], "
                                 "[store] and [store.wal] (docs/broker.md).")
@click.option("--allow-plaintext-anywhere", is_flag=True, default=False,
              help="Allow a non-loopback listener without authentication (there is none yet).")
def serve(data_dir: Path, listen: str, advertise: str | None, object_store: str | None, wal_device: Path | None,
          config_path: Path | None, allow_plaintext_anywhere: bool) -> None:
    """Run the Kafka-compatible broker: every Kafka client and tool can produce and consume.

    Records are durable in the write-ahead log before a produce with acks=1 or acks=all is answered;
    kill -9 at any time loses nothing acknowledged. SIGINT or SIGTERM stops it cleanly.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    host, port = parse_listen(listen)
    adv_host, adv_port = parse_listen(advertise) if advertise else (None, None)
    config = load_config(config_path, host=host, port=port, advertised_host=adv_host, advertised_port=adv_port,
                         allow_plaintext_anywhere=allow_plaintext_anywhere or None)
    try:
        check_listen_host(config.host, config.allow_plaintext_anywhere)
    except NonLoopbackRefusedError as e:
        raise click.UsageError(str(e)) from None
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
    finally:
        if device is not None:
            device.close()
