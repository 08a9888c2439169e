"""Logging to stderr, as plain lines or one JSON object per line (for log pipelines).

Messages carry names from requests (pods, functions, event types); in plain lines their
control characters are escaped, so a pod named "x\nERROR forged" cannot forge a line. JSON
escapes them by construction."""

from __future__ import annotations

import json
import logging
import sys


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


# C0 controls and DEL, each as a visible escape; a tab stays a tab.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F] if c != 0x09} | {0x0A: "\\n", 0x0D: "\\r"}


class PlainFormatter(logging.Formatter):
    """`time LEVEL logger: message`, one line per record (tracebacks follow on their own lines)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_CONTROLS)
        return super().formatMessage(record)


def setup(*, level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per scheduler call is noise
