"""Structured logs: one JSON object per line, carrying the current trace and span ids so a log line
can be found from its trace in the collector and the other way round."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import TextIO

from opentelemetry import trace

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_STANDARD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_OWN_HANDLER = "_cuda_agent_handler"


def log_fields(values: Mapping[str, object]) -> dict[str, object]:
    """`values` as a logging `extra=` mapping, so each becomes a field of the JSON line (a step's metrics,
    an object's changes) instead of text in the message. A key that a LogRecord already has (`name`,
    `message`, ...) would make logging raise; it gets a trailing underscore."""
    return {f"{key}_" if key in _STANDARD_FIELDS else key: value for key, value in values.items()}


def record_fields(record: logging.LogRecord, hidden: Collection[str] = ()) -> dict[str, object]:
    """The fields a record carries beyond the standard ones (what `extra=` added), less `hidden`."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD_FIELDS and key not in hidden and not key.startswith("_")
    }


class TextLogFormatter(logging.Formatter):
    """One plain line, `time level logger: message`, with the record's fields appended as key=value (the
    same fields the JSON lines carry, so nothing is lost with CUDA_AGENT_LOG_FORMAT=text)."""

    def __init__(self, hidden: Collection[str] = ()) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.hidden = frozenset(hidden)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = record_fields(record, self.hidden)
        if not fields:
            return line
        head, newline, rest = line.partition("\n")  # fields go on the message's line, before a traceback
        pairs = " ".join(f"{key}={_text(value)}" for key, value in fields.items())
        return f"{head} {pairs}{newline}{rest}"


def _text(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class JsonLogFormatter(logging.Formatter):
    """Formats a record as JSON: time, level, logger, message, trace_id/span_id, extras (less `hidden`:
    a library's bookkeeping attributes), exception."""

    def __init__(self, hidden: Collection[str] = ()) -> None:
        super().__init__()
        self.hidden = frozenset(hidden)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = trace.format_trace_id(context.trace_id)
            entry["span_id"] = trace.format_span_id(context.span_id)
        entry.update(record_fields(record, self.hidden))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def configure_logging(
    level: str = "INFO", fmt: str = "json", stream: TextIO | None = None, hidden: Collection[str] = ()
) -> logging.Handler:
    """Install one handler on the root logger (replacing one this function installed before). `hidden`:
    record attributes a library adds for itself, which are not fields of the line."""
    if fmt not in ("json", "text"):
        raise ValueError(f"log format {fmt!r}: expected 'json' or 'text'")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _OWN_HANDLER, False):
            root.removeHandler(handler)
    new_handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    new_handler.setFormatter(JsonLogFormatter(hidden) if fmt == "json" else TextLogFormatter(hidden))
    setattr(new_handler, _OWN_HANDLER, True)
    root.addHandler(new_handler)
    root.setLevel(level.upper())
    return new_handler
