"""One Kafka connection's byte stream, sans I/O: bytes in, frames out; every length bounded first.

``FrameReader`` takes whatever the socket gave (``receive_data``) and hands back whole request frames
(``next_frame``). A frame is a 4-byte big-endian size and that many bytes. The size is checked against
``frame_bytes_max`` before a byte of the frame is kept, so a peer claiming 2 GiB costs nothing; what
is buffered never exceeds one frame plus one read. The server shell owns the socket and the order of
responses; this module owns the parsing.
"""

from __future__ import annotations

from stratalog.kafka.codec import FRAME_SIZE, HEADER_PREFIX, KafkaProtocolError

#: Frames read from the front of the buffer are dropped once they pass this many bytes (and whenever the
#: buffer empties): a copy of what is left then, rather than a buffer that grows with every frame.
READ_BYTES_COMPACT_MIN = 1 << 20


class FrameTooLargeError(KafkaProtocolError):
    """A frame claims more bytes than the broker accepts (socket.request.max.bytes in Kafka)."""


class FrameReader:
    """Splits a connection's bytes into request frames."""

    def __init__(self, frame_bytes_max: int) -> None:
        self._frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._pos = 0
        self._eof = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    @property
    def at_eof(self) -> bool:
        """The peer closed its side and every whole frame before that was taken."""
        return self._eof and self.buffered_bytes == 0

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes read from the peer; ``b""`` means it closed its side."""
        if not data:
            self._eof = True
            return
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The next whole frame (without its size), or None until more bytes come. Raises
        FrameTooLargeError or KafkaProtocolError when the peer's bytes cannot be a request."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < FRAME_SIZE.size:
            if self._eof and len(buf) > pos:
                raise KafkaProtocolError(f"the peer closed the connection inside a frame's size "
                                         f"({len(buf) - pos} of 4 bytes)")
            return None
        (size,) = FRAME_SIZE.unpack_from(buf, pos)
        if size > self._frame_bytes_max:
            raise FrameTooLargeError(f"a request of {size} bytes exceeds the limit of {self._frame_bytes_max}")
        if size < HEADER_PREFIX.size:
            raise KafkaProtocolError(f"a request of {size} bytes is shorter than a request header")
        end = pos + FRAME_SIZE.size + size
        if len(buf) < end:
            if self._eof:
                raise KafkaProtocolError(f"the peer closed the connection inside a request "
                                         f"({len(buf) - pos - FRAME_SIZE.size} of {size} bytes)")
            return None
        with memoryview(buf) as whole:   # one copy (a slice of the bytearray would be a second)
            frame = bytes(whole[pos + FRAME_SIZE.size:end])
        self._pos = end
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > READ_BYTES_COMPACT_MIN:
            del buf[:end]  # keep the buffer from growing with many frames read in one go
            self._pos = 0
        return frame

    def wanted_bytes(self) -> int:
        """How many more bytes complete the frame being read (at least 1): what to read next."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < FRAME_SIZE.size:
            return FRAME_SIZE.size - (len(buf) - pos)
        size: int = FRAME_SIZE.unpack_from(buf, pos)[0]
        return max(1, pos + FRAME_SIZE.size + size - len(buf))
