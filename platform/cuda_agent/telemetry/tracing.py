"""OpenTelemetry tracing for the platform's unit of work, nested as
run > step > episode > turn > generate | tool_call | judge > judge_run > build | verify | profile.

`span(Stage.EPISODE, task="relu_fused")` opens a child of whatever span is current, so the trainer,
the agent loop and the sandbox server only name their own level. Between processes the context travels
as W3C `traceparent` (HTTP headers, or a dict in Ray call arguments): `inject_context()` on the caller's
side, `attached(carrier)` on the callee's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import PROCESS_PID, SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.util.types import AttributeValue

from cuda_agent.telemetry.config import TelemetryConfig

if TYPE_CHECKING:
    import aiohttp

ATTRIBUTE_PREFIX = "cuda_agent."
# OpenTelemetry GenAI semantic conventions (github.com/open-telemetry/semantic-conventions-genai), which
# LLM-aware backends read off a generation span. Spelled here: opentelemetry-semantic-conventions marks
# its copies deprecated since the conventions moved to their own repository.
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
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


def package_version() -> str:
    """The installed cuda-agent distribution's version ("unknown" when run from an uninstalled tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cuda-agent")
    except PackageNotFoundError:
        return "unknown"


def build_exporter(config: TelemetryConfig) -> SpanExporter | None:
    """The exporter `config` asks for: OTLP over HTTP, console (stderr, stdout stays for results), a file
    of JSON lines (one finished span per line), or none."""
    if config.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # endpoint=None lets the exporter apply OTEL_EXPORTER_OTLP_* itself (headers, certificates).
        return OTLPSpanExporter(endpoint=config.traces_url)
    if config.exporter == "console":
        return ConsoleSpanExporter(out=sys.stderr)
    if config.exporter == "file":
        if not config.traces_file:
            raise ValueError("traces exporter 'file' needs CUDA_AGENT_TRACES_FILE (traces_file)")
        out = open(config.traces_file, "a", encoding="utf-8")  # noqa: SIM115 -- the exporter owns it
        return ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\n")
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
    # process.pid tells apart the processes of one service (Ray actors, restarted servers).
    # service.version: which release produced a span (backends group and compare by it).
    resource = Resource.create(
        {
            SERVICE_NAME: config.service_name,
            SERVICE_VERSION: package_version(),
            PROCESS_PID: os.getpid(),
            **config.resource_attributes,
        }
    )
    provider = TracerProvider(resource=resource)
    exporter = build_exporter(config)
    if exporter is not None:
        # Batching keeps network and disk off the hot path; the console is for humans, so print at once.
        batch = config.exporter in ("otlp", "file")
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def tracer_provider() -> TracerProvider | None:
    """The provider configure_tracing made (None: the global one), for instrumentations that take one."""
    return _provider


def http_client_trace_configs() -> list[aiohttp.TraceConfig]:
    """Trace configs for an aiohttp client session: OpenTelemetry's aiohttp client instrumentation
    (opentelemetry-instrumentation-aiohttp-client), a CLIENT span per request under the current span,
    with the stable HTTP semantic conventions (`url.full`, `http.request.method`,
    `http.response.status_code`, `server.address`, `server.port`, `error.type`); the request's
    `traceparent` names that span. [] where the instrumentation is not installed."""
    try:
        from opentelemetry.instrumentation._semconv import _StabilityMode
        from opentelemetry.instrumentation.aiohttp_client import create_trace_config
    except ImportError:
        return []
    # The stable names: the instrumentation's default still emits the old ones (http.url, http.method)
    # unless OTEL_SEMCONV_STABILITY_OPT_IN says http; `_StabilityMode` is private, the parameter is not.
    return [create_trace_config(tracer_provider=_provider, sem_conv_opt_in_mode=_StabilityMode.HTTP)]


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
def span(
    name: str, /, *, kind: trace.SpanKind = trace.SpanKind.INTERNAL, **attributes: object
) -> Iterator[trace.Span]:
    """A child span of the current one. An exception leaving the block is recorded on the span and
    sets its status to ERROR, then propagates."""
    with tracer().start_as_current_span(name, kind=kind, attributes=span_attributes(attributes)) as current:
        yield current


@contextmanager
def linked_root_span(
    name: str, /, *, kind: trace.SpanKind = trace.SpanKind.INTERNAL, **attributes: object
) -> Iterator[trace.Span]:
    """A span that starts a trace of its own, with an OpenTelemetry Link to the current span (when there
    is one, local or from a caller's `traceparent`). An episode is one: a run's trace would otherwise grow
    with every episode of every step, and backends show a link from either side. Baggage is kept."""
    current = trace.get_current_span().get_span_context()
    links = [trace.Link(current)] if current.is_valid else []
    root = trace.set_span_in_context(trace.INVALID_SPAN)  # no parent: a new trace id
    with tracer().start_as_current_span(
        name, context=root, kind=kind, links=links, attributes=span_attributes(attributes)
    ) as started:
        yield started


def link_to(span_: trace.Span, trace_id: str, span_id: str) -> None:
    """Add a Link from `span_` to the span `trace_id`/`span_id` (hex, as `format_trace_id` writes them):
    the step span's link to each episode's trace, whose ids come back with the episode's record."""
    linked = trace.SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    if linked.is_valid:
        span_.add_link(linked)


def current_ids() -> tuple[str, str] | None:
    """The current span's (trace_id, span_id) in hex, or None outside any recorded span."""
    context_ = trace.get_current_span().get_span_context()
    if not context_.is_valid:
        return None
    return trace.format_trace_id(context_.trace_id), trace.format_span_id(context_.span_id)


def past_span(name: str, start_ns: int, end_ns: int, **attributes: object) -> None:
    """A child of the current span for an interval that already ended elsewhere: the judge process
    reports how long it built, verified and profiled, and the server records those phases as spans."""
    done = tracer().start_span(name, start_time=start_ns, attributes=span_attributes(attributes))
    done.end(end_time=max(start_ns, end_ns))


def inject_context(carrier: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The current trace context as W3C headers (`traceparent`, `tracestate`, `baggage`), added to
    `carrier` (HTTP headers) or to a new dict (the argument of a Ray call); empty outside any span."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    if carrier is not None:
        carrier.update(headers)
    return headers


@contextmanager
def attached(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make the trace context a caller sent (inject_context's headers) current for the block, so spans
    opened inside are its children; no carrier, or one without a context, leaves the current one."""
    if not carrier:
        yield
        return
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)
