"""Structured logs: one JSON object per line, carrying the current trace and span ids so a log line
can be found from its trace in the collector and the other way round."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from opentelemetry import trace

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_STANDARD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_OWN_HANDLER = "_cuda_agent_handler"


class JsonLogFormatter(logging.Formatter):
    """Formats a record as JSON: time, level, logger, message, trace_id/span_id, extras, exception."""

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
        for key, value in vars(record).items():
            if key not in _STANDARD_FIELDS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def configure_logging(
    level: str = "INFO", fmt: str = "json", stream: TextIO | None = None
) -> logging.Handler:
    """Install one handler on the root logger (replacing one this function installed before)."""
    if fmt not in ("json", "text"):
        raise ValueError(f"log format {fmt!r}: expected 'json' or 'text'")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _OWN_HANDLER, False):
            root.removeHandler(handler)
    new_handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    text_format = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    new_handler.setFormatter(JsonLogFormatter() if fmt == "json" else text_format)
    setattr(new_handler, _OWN_HANDLER, True)
    root.addHandler(new_handler)
    root.setLevel(level.upper())
    return new_handler
