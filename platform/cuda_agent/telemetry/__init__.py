"""Telemetry: OpenTelemetry traces (run > step > episode > turn > generate | tool_call | judge >
judge_run > build | verify | profile), Prometheus metrics and structured JSON logs that carry the trace
context. Every process (operator, sandbox server, trainer, its Ray workers) sets it up the same way:

    configure_telemetry(service_name="cuda-agent-trainer")   # once, at process start (reads OTEL_*)
    with span(Stage.EPISODE, task="relu"):                    # anywhere below
        log.info("episode started", extra={"turns": 0})

docs/telemetry.md lists the spans, attributes, metrics and environment variables.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from cuda_agent.telemetry.config import TelemetryConfig
from cuda_agent.telemetry.logs import JsonLogFormatter, TextLogFormatter, configure_logging, log_fields
from cuda_agent.telemetry.metrics import record_episode, record_step, serve_metrics
from cuda_agent.telemetry.tracing import (
    ATTRIBUTE_PREFIX,
    Stage,
    attached,
    build_exporter,
    configure_tracing,
    current_ids,
    inject_context,
    link_to,
    linked_root_span,
    past_span,
    span,
    span_attributes,
    tracer,
)

__all__ = [
    "ATTRIBUTE_PREFIX",
    "JsonLogFormatter",
    "Stage",
    "TelemetryConfig",
    "TextLogFormatter",
    "attached",
    "build_exporter",
    "configure_logging",
    "configure_telemetry",
    "configure_tracing",
    "current_ids",
    "inject_context",
    "link_to",
    "linked_root_span",
    "log_fields",
    "past_span",
    "record_episode",
    "record_step",
    "serve_metrics",
    "span",
    "span_attributes",
    "tracer",
]


def configure_telemetry(
    config: TelemetryConfig | None = None, *, service_name: str | None = None, logs: bool = True
) -> TracerProvider:
    """Logging (unless `logs` is False: a process that formats its own), tracing, and /metrics when
    `config.metrics_port` is set, for a process entry point. `service_name` is the process's default
    service name; OTEL_SERVICE_NAME overrides it."""
    config = TelemetryConfig.from_env(service_name=service_name) if config is None else config
    if logs:
        configure_logging(config.log_level, config.log_format)
    provider = configure_tracing(config)
    if config.metrics_port:
        serve_metrics(config.metrics_port)
    return provider
