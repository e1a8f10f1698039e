"""The asyncio shell around the broker: sockets in, frames to handlers, responses out in request order.

Each connection is an ``asyncio.Protocol``: bytes the socket gives are split into frames (``FrameReader``:
every length bounded before a byte is kept), each request is decoded and its handler started as a task
at once, and responses leave in the order the requests came, as Kafka requires, as soon as the oldest
is ready. At most ``in_flight_requests_max`` requests wait for their responses; reading pauses beyond
that, and while the socket's send buffer is full. Anything a peer does wrong costs only its own
connection, with one log line that says why. No stream reader, queue or sender task sits between the
socket and a handler: each of those cost an event-loop round per request (0.1-0.2 ms of a produce's
round trip here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections import deque
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from stratalog.broker.broker import Broker
from stratalog.broker.listeners import Listener, certificate_principal, check_listeners, server_ssl_context
from stratalog.broker.memory import MemoryBudget
from stratalog.broker.quotas import PRODUCER_BYTE_RATE, REQUEST_RATE
from stratalog.broker.read_gate import Hold, ReadGate
from stratalog.broker.session import ANONYMOUS, Session
from stratalog.kafka.api_keys import ApiKey, api_label
from stratalog.kafka.build import build
from stratalog.kafka.codec import (
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
#: One debug line per request answered (``serve --log-requests``): who asked what, and how long it took.
requests_log = logging.getLogger("stratalog.broker.requests")

#: What a client on a SASL listener may ask before its login succeeds (Kafka closes the connection on
#: anything else): ApiVersions, SaslHandshake, SaslAuthenticate.
BEFORE_LOGIN_API_KEYS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


#: Connections closed for bad input logged per second at most; the rest are counted in the next line.
REFUSALS_LOGGED_PER_S_MAX = 10


class RateLimitedLog:
    """Warnings of one kind, at most ``per_s_max`` a second; those left out are counted, and the count
    logged with the next line that gets through: a flood of bad clients cannot flood the log (nor spend
    the event loop on writing it)."""

    def __init__(self, per_s_max: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s_max = per_s_max
        #: Seconds, from any origin: a test gives its own to say which second each warning falls in.
        self._clock = clock
        self._second = -1
        self._logged = 0
        self._dropped = 0

    def warn(self, message: str, *args: object) -> None:
        second = int(self._clock())
        if second != self._second:
            self._second, self._logged = second, 0
        if self._logged >= self.per_s_max:
            self._dropped += 1
            return
        self._logged += 1
        if self._dropped:
            message += f" ({self._dropped} more like it not logged)"
            self._dropped = 0
        log.warning(message, *args)


class BrokerServer:
    """Listens on every listener, accepts, serves; ``stop`` drains and closes."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._servers: list[asyncio.Server] = []
        self._live: set[_KafkaProtocol] = set()
        self._per_address: dict[str, int] = {}
        self._stopping = False
        #: Request bytes every connection holds (partial frames, requests not yet answered).
        self.request_memory = MemoryBudget(broker.config.request_memory_bytes_max)
        #: Requests read whose handlers have not started yet, across connections (the event loop's queue
        #: of work); and the connections that stopped reading because of it, to wake in turn when it falls.
        self.requests_queued = 0
        self._waiting_room: dict[_KafkaProtocol, None] = {}
        #: Connections closed for what they sent: logged, but not a line each under a flood of them.
        self.refusals = RateLimitedLog(REFUSALS_LOGGED_PER_S_MAX)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def connections(self) -> int:
        return len(self._live)

    def connections_by_listener(self) -> dict[str, int]:
        """Open connections per listener (its name, PROTOCOL://HOST:PORT), every listener included."""
        listeners = self.broker.config.listeners
        counts = dict.fromkeys((listener.name for listener in listeners), 0)
        for connection in list(self._live):
            counts[listeners[connection.listener_index].name] += 1
        return counts

    async def start(self) -> list[Listener]:
        """Listen on every listener; returns them with the ports bound (an ephemeral port 0 resolved)."""
        c = self.broker.config
        check_listeners(c.listeners, c.tls, c.allow_plaintext_anywhere)
        context = server_ssl_context(c.tls) if any(lis.protocol.tls for lis in c.listeners) else None
        loop = asyncio.get_running_loop()
        bound: list[Listener] = []
        for listener in c.listeners:
            server = await loop.create_server(
                functools.partial(_KafkaProtocol, self, len(bound)), listener.host, listener.port,
                reuse_address=True, ssl=context if listener.protocol.tls else None)
            self._servers.append(server)
            port = int(server.sockets[0].getsockname()[1])
            # Listening on an ephemeral port: Metadata must name the port bound, not 0, or every client
            # that follows Metadata (librdkafka, aiokafka) reconnects to port 0 and is refused.
            bound.append(dataclasses.replace(listener, port=port, advertised_port=listener.advertised_port
                                             or (port if listener.port == 0 else None)))
        self.broker.config = dataclasses.replace(c, listeners=tuple(bound))
        return bound

    async def stop(self, drain_s: float = 10.0) -> None:
        """Stop accepting, answer the requests in flight (up to ``drain_s``), close every connection."""
        self._stopping = True
        for server in self._servers:
            server.close()
        # Fetches waiting for data answer now with what they have: a long poll would hold the stop.
        self.broker.stop_waiting()
        live = list(self._live)
        for connection in live:
            connection.stop_reading()  # idle ones close at once; the others once answered
        closed = [c.closed for c in live if not c.closed.done()]
        if closed:
            _, late = await asyncio.wait(closed, timeout=drain_s)
            if late:
                log.warning("%d connection(s) still had requests in flight after %.0f s: closed", len(late), drain_s)
                for connection in live:
                    connection.abort()
        for server in self._servers:
            await server.wait_closed()

    def add(self, connection: _KafkaProtocol, address: str) -> str | None:
        """Take a new connection; or say why not (``connections_max`` or the per-address bound reached)."""
        c = self.broker.config
        if len(self._live) >= c.connections_max:
            return f"{len(self._live)} connections are open (connections_max)"
        count = self._per_address.get(address, 0)
        if c.connections_per_address_max is not None and count >= c.connections_per_address_max:
            return f"{count} connections are open from {address} (connections_per_address_max)"
        self._live.add(connection)
        self._per_address[address] = count + 1
        return None

    def may_read_request(self, connection: _KafkaProtocol) -> bool:
        """Whether a connection may read another request now (see requests_queued_max): while the queue is
        full, only a connection that waits on nothing and sent one request, not a pipeline of them."""
        if connection.gate.take_admission():  # woken from the waiting room: its turn, whoever came in meanwhile
            return True
        if self.requests_queued < self.broker.config.requests_queued_max or not connection.responses:
            return True
        self._waiting_room[connection] = None
        self.broker.metrics.bound_reached("requests_queued_max")
        return False

    def request_started(self) -> None:
        self.requests_queued -= 1
        # As many as there is room for, first come first woken (a woken connection reads one request
        # whatever the queue holds then, so its turn is not taken by one that came later).
        room = self._waiting_room
        for _ in range(min(len(room), self.broker.config.requests_queued_max - self.requests_queued)):
            connection = next(iter(room))
            del room[connection]
            # Soon, not now: this runs while a connection is sending its responses, maybe this one.
            asyncio.get_running_loop().call_soon(connection.resume_after_wait)

    def leave_waiting_room(self, connection: _KafkaProtocol) -> None:
        self._waiting_room.pop(connection, None)

    def relieve_request_memory(self) -> None:
        """Close the connections holding the most request bytes until all of them hold less than the
        budget: under a flood of slow or stalled senders, those that hold the most go first."""
        while self.request_memory.over:
            largest = self.request_memory.largest()
            if largest is None:
                return
            connection, held_bytes = largest
            assert isinstance(connection, _KafkaProtocol)
            log.warning("connection from %s closed: it holds %d bytes of unanswered requests and all connections "
                        "%d, over request_memory_bytes_max (%d)", connection.peer, held_bytes,
                        self.request_memory.held_bytes, self.request_memory.bytes_max)
            self.broker.metrics.bound_reached("request_memory_bytes_max")
            connection.evict()

    def discard(self, connection: _KafkaProtocol, address: str) -> None:
        self.leave_waiting_room(connection)
        if connection in self._live:
            self._live.discard(connection)
            left = self._per_address.get(address, 1) - 1
            if left > 0:
                self._per_address[address] = left
            else:
                self._per_address.pop(address, None)


class _Response:
    """One request's place in its connection's order: its frame once ready (None: no response)."""

    __slots__ = ("correlation_id", "frame", "queued", "ready", "request_bytes", "task", "throttle_ms")

    def __init__(self, correlation_id: int, request_bytes: int) -> None:
        self.correlation_id = correlation_id
        #: The request's frame: memory held until the response is sent.
        self.request_bytes = request_bytes
        self.ready = False
        self.frame: EncodedResponse | None = None
        self.task: asyncio.Task[EncodedResponse | None] | None = None
        #: The throttle time the response carries: reading stops for as long once it is sent.
        self.throttle_ms = 0
        #: Counted in the server's requests_queued (until its handler starts).
        self.queued = False


class _KafkaProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: BrokerServer, listener_index: int) -> None:
        self.server = server
        self.listener_index = listener_index
        self.broker = server.broker
        self.config = server.broker.config
        self.loop = asyncio.get_running_loop()
        self.frames = FrameReader(self.config.request_bytes_max)
        self.responses: deque[_Response] = deque()
        self.transport: asyncio.Transport | None = None
        self.peer: object = None
        self.session: Session | None = None
        #: Whether requests are read now, and why not (read_gate.py).
        self.gate = ReadGate()
        #: Bytes of the requests read and not yet answered.
        self.in_flight_bytes = 0
        #: The newest ordered request's handler (``Api.ordered``) while it runs: later requests start after it.
        self.ordered_task: asyncio.Task[EncodedResponse | None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        #: When the request being read began to arrive (None: no partial request): its whole frame must
        #: arrive within request_read_timeout_ms of that, however it trickles.
        self.partial_since: float | None = None
        #: Armed while the socket takes nothing: a peer that stops reading is closed when it fires.
        self.write_timer: asyncio.TimerHandle | None = None
        self.closed: asyncio.Future[None] = self.loop.create_future()

    # Transport events ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        host = str(self.peer[0]) if isinstance(self.peer, tuple) else str(self.peer)
        listener = self.broker.config.listeners[self.listener_index]
        principal = certificate_principal(transport.get_extra_info("peercert")) if listener.protocol.tls else None
        self.session = Session(listener, host, self.broker.authorizer, principal=principal or ANONYMOUS,
                               authenticated=not listener.protocol.sasl)
        refused = self.server.add(self, host)
        if refused is not None:
            self.server.refusals.warn("connection from %s refused: %s", self.peer, refused)
            transport.abort()
            return
        if self.server.stopping:
            self.stop_reading()
            return
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        if self.gate.done:
            return
        self.frames.receive_data(data)
        self._read_frames()
        self._count_request_memory()

    def eof_received(self) -> bool:
        self.frames.receive_data(b"")
        self._read_frames()  # a frame cut short by the peer's close is reported here
        self._end_reading()
        # Over TCP, keep the transport open: responses in flight still go out to a half-closed peer. A TLS
        # transport cannot stay half open (asyncio closes it whatever this returns, and warns on every
        # connection when told otherwise): a TLS client that closed gets nothing more.
        return not self.config.listeners[self.listener_index].protocol.tls

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.info("connection from %s lost: %s", self.peer, exc, extra={"connection": _address(self.peer)})
        self.gate.end()
        if self.timer is not None:
            self.timer.cancel()
        if self.write_timer is not None:
            self.write_timer.cancel()
        for response in self.responses:
            if response.task is not None:
                response.task.cancel()
            if response.queued:  # cancelled before its handler started
                self.server.request_started()
        self.responses.clear()
        self.server.request_memory.set(self, 0)
        self.broker.response_memory.set(self, 0)
        if self.session is not None:
            self.server.discard(self, self.session.host)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        # The socket takes less than is written: read no more requests until it catches up, so responses
        # do not pile up in the transport's buffer.
        self._pause(Hold.WRITE_BLOCKED)
        self._arm_write_timer()

    def resume_writing(self) -> None:
        self.gate.release(Hold.WRITE_BLOCKED)
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        self._count_response_memory()
        self._resume()

    # Requests ------------------------------------------------------------------------------------------

    def _read_frames(self) -> None:
        limit = self.config.in_flight_requests_max
        server = self.server
        try:
            while not self.gate.done and len(self.responses) < limit:
                if not server.may_read_request(self):
                    self._pause(Hold.WAITING_FOR_ROOM)
                    break
                frame = self.frames.next_frame()
                if frame is None:
                    break
                self.partial_since = None  # the next request's clock starts with its first byte
                self._start(frame)
        except KafkaProtocolError as e:
            self.server.refusals.warn("connection from %s closed: %s", self.peer, e)
            self._end_reading()
            return
        if len(self.responses) >= limit:
            self._pause()
        self._arm_timer()

    def _start(self, frame: bytes) -> None:
        try:
            request = decode_request(frame, self.broker.supported_versions)
        except UnsupportedVersionError as e:
            if e.api_key != ApiKey.API_VERSIONS:
                api = self.broker.apis.get(e.api_key)
                served = f"versions {api.min_version}-{api.max_version}" if api else "no version of it"
                raise KafkaProtocolError(f"{api_label(e.api_key)} v{e.api_version} is not served (this broker "
                                         f"serves {served})") from None
            # Kafka's rule: answer ApiVersions of an unknown version at v0 with the versions served.
            response = _Response(e.correlation_id, 0)
            response.frame, response.ready = self._api_versions_error(e.correlation_id), True
            self.responses.append(response)
            self._send_ready()
            return
        session = self.session
        assert session is not None
        if not session.authenticated and request.api_key not in BEFORE_LOGIN_API_KEYS:
            api = self.broker.apis[request.api_key]
            raise KafkaProtocolError(f"{api.name} before authenticating on {session.listener.name} "
                                     "(a SASL listener serves only ApiVersions, SaslHandshake and SaslAuthenticate "
                                     "until the login succeeds)")
        throttle_ms = self._charge(request, session)
        if throttle_ms:
            request = dataclasses.replace(request, throttle_ms=throttle_ms)
        response = _Response(request.correlation_id, len(frame))
        self.in_flight_bytes += len(frame)
        self.server.requests_queued += 1
        response.queued = True
        self.responses.append(response)
        before = self.ordered_task
        if before is not None and before.done():
            before = self.ordered_task = None
        response.task = self.loop.create_task(self._handle(request, session, response, before))
        response.task.add_done_callback(functools.partial(self._answered, response))
        if self.broker.apis[request.api_key].ordered:
            self.ordered_task = response.task  # it waited for the one before: a chain in arrival order

    def _api_versions_error(self, correlation_id: int) -> bytes:
        body = {"error_code": ErrorCode.unsupported_version, "api_keys": [
            {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
            for a in sorted(self.broker.apis.values(), key=lambda a: a.key)]}
        return encode_response(correlation_id, build(response_schema(ApiKey.API_VERSIONS, 0), body))

    def _charge(self, request: Request, session: Session) -> int:
        """Count the request against its quotas (requests/s; bytes/s for Produce): the throttle it earns."""
        quotas, user, client = self.broker.quotas, session.user, request.client_id or ""
        throttle_ms = quotas.record(user, client, REQUEST_RATE, 1)
        if request.api_key == ApiKey.PRODUCE:
            throttle_ms = max(throttle_ms, quotas.record(user, client, PRODUCER_BYTE_RATE, request.frame_bytes))
        if throttle_ms:
            self.broker.metrics.throttled(user, client, throttle_ms)
        return throttle_ms

    async def _handle(self, request: Request, session: Session, response: _Response,
                      before: asyncio.Task[EncodedResponse | None] | None) -> EncodedResponse | None:
        if before is not None:
            await asyncio.wait((before,))  # an ordered request read earlier: its effect first
        response.queued = False
        self.server.request_started()
        api = self.broker.apis[request.api_key]
        started = time.perf_counter()
        values = await api.handler(self.broker, request, session)
        took_s = time.perf_counter() - started
        self.broker.metrics.answered(api.name, request.api_version, took_s)
        if requests_log.isEnabledFor(logging.DEBUG):
            self._log_request(api.name, request, session, took_s)
        if values is None:
            return None
        if isinstance(values, Prebuilt):
            response.throttle_ms = values.throttle_ms
            return values.pieces
        if request.throttle_ms and "throttle_time" in values:
            values["throttle_time"] = response.throttle_ms = request.throttle_ms
        return encode_response(request.correlation_id, build(response_schema(request.api_key, request.api_version),
                                                             values))

    def _log_request(self, api: str, request: Request, session: Session, took_s: float) -> None:
        took_ms = round(took_s * 1000, 3)
        requests_log.debug("%s v%d from %s as %s (client %s, request %d): %.3f ms", api, request.api_version,
                           self.peer, session.principal, request.client_id, request.correlation_id, took_ms,
                           extra={"connection": _address(self.peer), "listener": session.listener.name,
                                  "principal": session.principal, "client_id": request.client_id, "api": api,
                                  "api_version": request.api_version, "correlation_id": request.correlation_id,
                                  "duration_ms": took_ms})

    def _answered(self, response: _Response, task: asyncio.Task[EncodedResponse | None]) -> None:
        if task.cancelled():
            return  # the connection is gone
        error = task.exception()
        if error is not None:
            log.error("connection from %s closed: request %d failed in the broker: %r", self.peer,
                      response.correlation_id, error, exc_info=error, extra={"connection": _address(self.peer)})
            self.abort()
            return
        response.frame, response.ready = task.result(), True
        self._send_ready()

    # Responses -----------------------------------------------------------------------------------------

    def _send_ready(self) -> None:
        """Write the oldest responses that are ready, in request order."""
        transport = self.transport
        responses = self.responses
        throttle_ms = 0
        while responses and responses[0].ready:
            done = responses.popleft()
            self.in_flight_bytes -= done.request_bytes
            if done.frame is not None and transport is not None and not transport.is_closing():
                write_response(transport, done.frame)
                throttle_ms = max(throttle_ms, done.throttle_ms)
        self._count_request_memory()
        self._count_response_memory()
        if Hold.WAITING_FOR_ROOM in self.gate.holds and not responses:
            self.server.leave_waiting_room(self)  # nothing in flight: it may read whatever the others hold
            self.gate.release(Hold.WAITING_FOR_ROOM)
        if throttle_ms:
            self._mute(throttle_ms)
        if self.session is not None and self.session.close_after_response and not self.gate.done:
            log.info("connection from %s closed after a failed or out-of-order login", self.peer)
            self._end_reading()
            return
        if not responses and self.gate.done:
            self._close()
            return
        self._resume()
        self._arm_timer()

    # Flow control, timeouts, closing -------------------------------------------------------------------

    def _pause(self, reason: Hold = Hold.NONE) -> None:
        """Read nothing for ``reason`` (NONE: in_flight_requests_max responses are pending)."""
        if self.gate.hold(reason) and self.transport is not None:
            self.transport.pause_reading()

    def _mute(self, throttle_ms: int) -> None:
        """Read nothing more from this client until its throttle time has passed (Kafka's muting)."""
        self._pause(Hold.MUTED)
        self.loop.call_later(throttle_ms / 1000, self._unmute)

    def _unmute(self) -> None:
        self.gate.release(Hold.MUTED)
        self._resume()

    def resume_after_wait(self) -> None:
        self.gate.admit()
        self._resume()

    def _resume(self) -> None:
        if self.transport is not None and self.gate.go_on(len(self.responses) < self.config.in_flight_requests_max):
            self.transport.resume_reading()
            self._read_frames()  # frames read before the pause may wait in the buffer

    def _arm_timer(self) -> None:
        """Close a connection whose request stalls half-sent, or that stays idle (nothing in flight)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.gate.done:
            return
        if self.gate.held:
            return  # reading waits on the broker (requests in flight, a full socket, a throttle): not the peer
        if self.frames.buffered_bytes:
            # From the first byte of the request, not the last: a peer that trickles a byte now and then
            # is closed all the same.
            timeout_s = self.config.request_read_timeout_ms / 1000
            now = self.loop.time()
            if self.partial_since is None:
                self.partial_since = now
            delay_s, why = max(0.0, self.partial_since + timeout_s - now), \
                f"a request still incomplete after {timeout_s:.0f} s"
        elif not self.responses:
            delay_s = self.config.idle_timeout_ms / 1000
            why = f"idle for {delay_s:.0f} s"
        else:
            return  # handlers are at work; each has its own bound
        self.timer = self.loop.call_later(delay_s, self._timed_out, why)

    def _arm_write_timer(self) -> None:
        assert self.transport is not None
        delay_s = self.config.response_write_timeout_ms / 1000
        self.write_timer = self.loop.call_later(delay_s, self._write_timed_out, delay_s,
                                                self.transport.get_write_buffer_size())

    def _write_timed_out(self, delay_s: float, unsent_bytes: int) -> None:
        """The socket took nothing for a while: close, unless the peer reads, if slowly."""
        self._count_response_memory()
        if self.transport is not None and self.transport.get_write_buffer_size() < unsent_bytes:
            self._arm_write_timer()  # it reads, slowly: let it go on
            return
        log.warning("connection from %s closed: it took none of its responses for %.0f s", self.peer, delay_s)
        self.evict()

    def _timed_out(self, why: str) -> None:
        log.info("connection from %s closed: %s", self.peer, why, extra={"connection": _address(self.peer)})
        self._end_reading()

    def stop_reading(self) -> None:
        """The broker is stopping: read no more requests; those read already are answered, then the
        connection closes."""
        self._end_reading()

    def _end_reading(self) -> None:
        self.gate.end()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        if not self.responses:
            self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # after what is buffered has been sent

    def _count_request_memory(self) -> None:
        memory = self.server.request_memory
        memory.set(self, self.frames.buffered_bytes + self.in_flight_bytes)
        if memory.over:
            self.server.relieve_request_memory()

    def _count_response_memory(self) -> None:
        # What the transport holds unsent: an upper bound between writes (it drains without telling us
        # until it falls below its low-water mark, when resume_writing counts again).
        if self.transport is not None:
            self.broker.response_memory.set(self, self.transport.get_write_buffer_size())

    def evict(self) -> None:
        """Close at once, dropping what is in flight (memory pressure)."""
        self.gate.end()
        self.server.request_memory.set(self, 0)
        self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def write_response(transport: asyncio.Transport, frame: EncodedResponse) -> None:
    """Write a response frame (bytes, or pieces: views of stored batches) to the socket."""
    if isinstance(frame, bytes):
        transport.write(frame)
    elif type(transport).writelines is asyncio.WriteTransport.writelines:
        # This transport's writelines joins the pieces into one copy (Python 3.11's selector transport):
        # written one by one, they go to the socket as they are and only what it does not take at once
        # is copied into the transport's buffer.
        for piece in frame:
            if transport.is_closing():
                # The peer went while the pieces were written (a write failed): asyncio logs a warning
                # for each write after the fifth to a lost connection, dozens per response otherwise.
                return
            transport.write(piece)
    else:
        transport.writelines(frame)  # a gather write of the views (sendmsg), from Python 3.12


def _address(peer: object) -> str:
    """A peer as HOST:PORT (an IPv6 host in brackets): the JSON log's connection field."""
    if isinstance(peer, tuple) and len(peer) > 1:   # (host, port), or (host, port, flow, scope) for IPv6
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer)
