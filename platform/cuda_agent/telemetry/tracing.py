"""OpenTelemetry tracing for the platform's unit of work, nested as
run > step > episode > turn > tool_call > build | verify | profile.

`span(Stage.EPISODE, task="relu_fused")` opens a child of whatever span is current, so the trainer,
the agent loop and the judge client only name their own level.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import StrEnum

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.util.types import AttributeValue

from cuda_agent.telemetry.config import TelemetryConfig

ATTRIBUTE_PREFIX = "cuda_agent."
_SCALARS = (str, bool, int, float)

# The provider configured by configure_tracing; None means "whatever the global one is" (a no-op
# until someone configures OpenTelemetry), so library code can open spans unconditionally.
_provider: TracerProvider | None = None


class Stage(StrEnum):
    """Span names of the trace hierarchy, outermost first."""

    RUN = "run"
    STEP = "step"
    EPISODE = "episode"
    TURN = "turn"
    GENERATE = "generate"
    TOOL_CALL = "tool_call"
    JUDGE = "judge"
    JUDGE_RUN = "judge_run"
    BUILD = "build"
    VERIFY = "verify"
    PROFILE = "profile"
    WEIGHT_SYNC = "weight_sync"
    RECONCILE = "reconcile"


def build_exporter(config: TelemetryConfig) -> SpanExporter | None:
    """The exporter `config` asks for: OTLP over HTTP, console (stderr, stdout stays for results) or none."""
    if config.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # endpoint=None lets the exporter apply OTEL_EXPORTER_OTLP_* itself (headers, certificates).
        return OTLPSpanExporter(endpoint=config.traces_url)
    if config.exporter == "console":
        return ConsoleSpanExporter(out=sys.stderr)
    return None


def configure_tracing(
    config: TelemetryConfig | None = None,
    *,
    processors: Sequence[SpanProcessor] = (),
    set_global: bool = True,
) -> TracerProvider:
    """Create the TracerProvider for this process and make `tracer()` / `span()` use it. Extra
    `processors` (e.g. one over an in-memory exporter) receive every span too. OpenTelemetry allows
    the global provider to be set once per process; `set_global=False` leaves it alone."""
    global _provider
    config = TelemetryConfig.from_env() if config is None else config
    resource = Resource.create({SERVICE_NAME: config.service_name, **config.resource_attributes})
    provider = TracerProvider(resource=resource)
    exporter = build_exporter(config)
    if exporter is not None:
        # Batching keeps network export off the hot path; the console is for humans, so print at once.
        batch = config.exporter == "otlp"
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def tracer(name: str = "cuda_agent") -> trace.Tracer:
    return trace.get_tracer(name, tracer_provider=_provider)


def span_attributes(values: Mapping[str, object]) -> dict[str, AttributeValue]:
    """Keyword arguments as OpenTelemetry attributes under the `cuda_agent.` prefix: None is dropped,
    scalars and homogeneous scalar sequences pass, anything else (paths, URIs, enums) becomes str."""
    attributes: dict[str, AttributeValue] = {}
    for key, value in values.items():
        if value is None:
            continue
        converted: AttributeValue
        if isinstance(value, _SCALARS):
            converted = value
        elif isinstance(value, list | tuple) and value and len({type(item) for item in value}) == 1:
            first = value[0]
            converted = tuple(value) if isinstance(first, _SCALARS) else tuple(str(item) for item in value)
        elif isinstance(value, list | tuple):
            converted = tuple(str(item) for item in value)
        else:
            converted = str(value)
        attributes[ATTRIBUTE_PREFIX + key] = converted
    return attributes


@contextmanager
def span(name: str, **attributes: object) -> Iterator[trace.Span]:
    """A child span of the current one. An exception leaving the block is recorded on the span and
    sets its status to ERROR, then propagates."""
    with tracer().start_as_current_span(name, attributes=span_attributes(attributes)) as current:
        yield current
