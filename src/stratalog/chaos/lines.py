"""The line protocol every chaos child speaks to its parent on stdout.

A line is a tag and then whole numbers, separated by single spaces, ended by a newline. The child writes
each line with one ``write`` once the fact it states holds; the kill can cut the last line, so a reader
drops a last line without its newline. Each child module defines its own tags and what their numbers
mean; this module only writes and splits lines. It imports nothing heavy: children load it at start.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import NamedTuple


class LineWriter:
    """Writes whole lines to a file descriptor, one thread at a time, without user-space buffering."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            view = memoryview(line.encode())
            while view:
                view = view[os.write(self._fd, view):]


class Line(NamedTuple):
    """One complete line a child wrote, split into its tag and its numbers."""

    text: str
    tag: str
    values: list[int]


def complete_lines(output: bytes) -> Iterator[Line]:
    """Each complete line of a child's stdout; a last line without its newline was cut by the kill."""
    complete = output[:output.rfind(b"\n") + 1]
    for text in complete.decode("ascii").splitlines():
        tag, *fields = text.split()
        yield Line(text, tag, [int(v) for v in fields])


def line_tag(line: bytes) -> bytes:
    """The tag of one line (without its newline), for a reader that watches for some tags only."""
    return line.partition(b" ")[0]
