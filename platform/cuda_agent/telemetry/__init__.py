"""Telemetry: OpenTelemetry traces (run > step > episode > turn > tool_call > build/verify/profile)
and structured JSON logs that carry the trace context.

    configure_telemetry()                      # once, at process start (reads OTEL_* variables)
    with span(Stage.EPISODE, task="relu"):     # anywhere below
        log.info("episode started", extra={"turns": 0})
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from cuda_agent.telemetry.config import TelemetryConfig
from cuda_agent.telemetry.logs import JsonLogFormatter, configure_logging
from cuda_agent.telemetry.tracing import (
    ATTRIBUTE_PREFIX,
    Stage,
    build_exporter,
    configure_tracing,
    span,
    span_attributes,
    tracer,
)

__all__ = [
    "ATTRIBUTE_PREFIX",
    "JsonLogFormatter",
    "Stage",
    "TelemetryConfig",
    "build_exporter",
    "configure_logging",
    "configure_telemetry",
    "configure_tracing",
    "span",
    "span_attributes",
    "tracer",
]


def configure_telemetry(config: TelemetryConfig | None = None) -> TracerProvider:
    """Logging and tracing for a process entry point (operator, trainer, sandbox server)."""
    config = TelemetryConfig.from_env() if config is None else config
    configure_logging(config.log_level, config.log_format)
    return configure_tracing(config)
