"""The asyncio shell around the broker: sockets in, frames to handlers, responses out in request order.

Per connection, a reader splits bytes into frames (``FrameReader``: every length bounded before a byte
is kept), decodes each request and starts its handler at once; a writer sends the responses in the
order the requests came, as Kafka requires. At most ``in_flight_requests_max`` requests wait for their
responses; the reader stops reading beyond that. Anything a peer does wrong costs only its own
connection, with one log line that says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from stratalog.broker.broker import Broker
from stratalog.kafka.build import build
from stratalog.kafka.codec import (
    API_VERSIONS_KEY,
    EncodedResponse,
    KafkaProtocolError,
    Prebuilt,
    Request,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    response_schema,
)
from stratalog.kafka.connection import FrameReader

log = logging.getLogger("stratalog.broker")

#: Bytes asked of the socket per read when no frame is in progress.
READ_BYTES = 256 << 10


class NonLoopbackRefusedError(ValueError):
    """Binding a non-loopback address without --allow-plaintext-anywhere."""


def check_listen_host(host: str, allow_plaintext_anywhere: bool) -> None:
    if allow_plaintext_anywhere:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise NonLoopbackRefusedError(
            f"refusing to listen on {host}: the broker has no authentication yet, so it listens on loopback "
            "only unless you pass --allow-plaintext-anywhere")


class BrokerServer:
    """Listens, accepts, serves; ``stop`` drains and closes."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._live: set[_Connection] = set()
        self._stopping = False

    async def start(self) -> tuple[str, int]:
        c = self.broker.config
        check_listen_host(c.host, c.allow_plaintext_anywhere)
        self._server = await asyncio.start_server(self._on_connection, c.host, c.port, limit=READ_BYTES,
                                                  reuse_address=True)
        sock = self._server.sockets[0].getsockname()
        if c.port == 0 and c.advertised_port is None:
            # Listening on an ephemeral port: Metadata must name the port bound, not 0, or every client
            # that follows Metadata (librdkafka, aiokafka) reconnects to port 0 and is refused.
            self.broker.config = dataclasses.replace(c, advertised_port=int(sock[1]))
        return str(sock[0]), int(sock[1])

    async def stop(self, drain_s: float = 10.0) -> None:
        """Stop accepting, let the requests in flight finish (up to ``drain_s``), close connections."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        # Fetches waiting for data answer now with what they have: a long poll would hold the stop.
        self.broker.stop_waiting()
        # Clients keep their connections open while idle: without this, each idle one held the stop for
        # the whole drain until its read was cancelled.
        for connection in self._live:
            connection.stop_reading()
        if self._connections:
            _, late = await asyncio.wait(self._connections, timeout=drain_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if len(self._connections) >= self.broker.config.connections_max:
            log.warning("connection from %s refused: %d connections are open (connections_max)",
                        peer, len(self._connections))
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        connection = _Connection(self.broker, reader, writer, peer, lambda: self._stopping)
        self._live.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(task)
            self._live.discard(connection)


class _Connection:
    def __init__(self, broker: Broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Any,
                 stopping: Any) -> None:
        self.broker = broker
        self.reader = reader
        self.writer = writer
        self.peer = peer
        self.stopping = stopping
        self.frames = FrameReader(broker.config.request_bytes_max)
        self.sender: asyncio.Task[None]
        self.responses: asyncio.Queue[tuple[int, asyncio.Future[EncodedResponse | None]] | None] = asyncio.Queue(
            broker.config.in_flight_requests_max)

    async def run(self) -> None:
        self.sender = asyncio.create_task(self._send_loop())
        try:
            await self._read_loop()
            await self._queue(None)
            await asyncio.gather(self.sender, return_exceptions=True)
        except KafkaProtocolError as e:
            log.warning("connection from %s closed: %s", self.peer, e)
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            log.info("connection from %s lost: %s", self.peer, e)
        except TimeoutError as e:
            log.info("connection from %s closed: %s", self.peer, e)
        finally:
            if not self.sender.done():
                # Answer what is in flight (bounded: the handlers have their own timeouts), then close.
                try:
                    await self._queue(None)
                    await asyncio.gather(self.sender, return_exceptions=True)
                except asyncio.CancelledError:
                    self.sender.cancel()
                    raise
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    def stop_reading(self) -> None:
        """The broker is stopping: read no more requests; those read already are answered, then the
        connection closes."""
        transport = self.writer.transport
        if isinstance(transport, asyncio.ReadTransport):  # a socket's transport reads too
            transport.pause_reading()  # no data after the end fed below
        self.reader.feed_eof()

    async def _queue(self, item: tuple[int, asyncio.Future[EncodedResponse | None]] | None) -> None:
        """Queue a response (None: the end) unless the sender stopped (its socket failed)."""
        put = asyncio.ensure_future(self.responses.put(item))
        await asyncio.wait({put, self.sender}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            raise ConnectionError("the connection failed while sending")

    async def _read_loop(self) -> None:
        config = self.broker.config
        loop = asyncio.get_running_loop()
        while not self.stopping():
            timeout_s = config.request_read_timeout_s if self.frames.buffered_bytes else config.idle_timeout_s
            try:
                data = await asyncio.wait_for(self.reader.read(max(READ_BYTES, self.frames.wanted_bytes())),
                                              timeout_s)
            except TimeoutError:
                what = "in the middle of a request" if self.frames.buffered_bytes else "idle"
                raise TimeoutError(f"{what} for {timeout_s:.0f} s") from None
            self.frames.receive_data(data)
            while (frame := self.frames.next_frame()) is not None:
                future: asyncio.Future[EncodedResponse | None] = loop.create_future()
                correlation_id = await self._start(frame, future)
                await self._queue((correlation_id, future))
            if self.frames.at_eof:
                return

    async def _start(self, frame: bytes, future: asyncio.Future[EncodedResponse | None]) -> int:
        try:
            request = decode_request(frame, self.broker.supported_versions)
        except UnsupportedVersionError as e:
            if e.api_key == API_VERSIONS_KEY:
                # Kafka's rule: answer ApiVersions of an unknown version at v0 with the versions served.
                future.set_result(self._api_versions_error(e.correlation_id))
                return e.correlation_id
            api = self.broker.apis.get(e.api_key)
            served = f"{api.name} versions {api.min_version}-{api.max_version}" if api else "no such API"
            raise KafkaProtocolError(f"{e} (this broker serves {served})") from None
        task = asyncio.create_task(self._handle(request))
        task.add_done_callback(lambda t: _settle(t, future))
        return request.correlation_id

    def _api_versions_error(self, correlation_id: int) -> bytes:
        body = {"error_code": ErrorCode.unsupported_version, "api_keys": [
            {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
            for a in sorted(self.broker.apis.values(), key=lambda a: a.key)]}
        return encode_response(correlation_id, build(response_schema(API_VERSIONS_KEY, 0), body))

    async def _handle(self, request: Request) -> EncodedResponse | None:
        api = self.broker.apis[request.api_key]
        values = await api.handler(self.broker, request)
        if values is None:
            return None
        if isinstance(values, Prebuilt):
            return values.pieces
        return encode_response(request.correlation_id, build(response_schema(request.api_key, request.api_version),
                                                             values))

    async def _send_loop(self) -> None:
        while True:
            item = await self.responses.get()
            if item is None:
                return
            correlation_id, future = item
            try:
                frame = await future
            except Exception:
                log.exception("connection from %s closed: request %d failed in the broker", self.peer,
                              correlation_id)
                self.writer.transport.abort()
                return
            if frame is not None:
                _write(self.writer, frame)
                await self.writer.drain()


def _write(writer: asyncio.StreamWriter, frame: EncodedResponse) -> None:
    if isinstance(frame, bytes):
        writer.write(frame)
    elif type(writer.transport).writelines is asyncio.WriteTransport.writelines:
        # This transport's writelines joins the pieces into one copy (Python 3.11's selector transport):
        # written one by one, they go to the socket as they are and only what it does not take at once
        # is copied into the transport's buffer.
        for piece in frame:
            writer.write(piece)
    else:
        writer.writelines(frame)  # a gather write of the views (sendmsg), from Python 3.12


def _settle(task: asyncio.Task[EncodedResponse | None], future: asyncio.Future[EncodedResponse | None]) -> None:
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif (error := task.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(task.result())
