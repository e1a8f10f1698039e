"""Log lines as JSON objects, one a line, for log shippers (``stratalog serve --log-format json``).

Each line has ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and ``message`` (the
formatted message, as the text format shows it), the traceback as ``exception`` when there is one, and the
context a line was logged with: the request log's ``connection``, ``listener``, ``principal``,
``client_id``, ``api``, ``api_version``, ``correlation_id`` and ``duration_ms``, and ``connection`` on a
connection's own lines.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

#: The context fields a line may carry (``extra=`` of a logging call), in the order they are written.
CONTEXT_FIELDS = ("connection", "listener", "principal", "client_id", "api", "api_version", "correlation_id",
                  "duration_ms")
TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; values JSON cannot hold are written as their ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for name in CONTEXT_FIELDS:
            if name in record.__dict__:
                line[name] = record.__dict__[name]
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def use_format(log_format: str) -> None:
    """Format every handler of the root logger as ``log_format`` says: ``text`` or ``json``."""
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
