"""The sandbox server's Prometheus metrics, on prometheus_client.

Each server has its own registry (tests start several in one process). Counters and histograms are
created on first use under `cuda_agent_sandbox_<name>`, with the label names of that first use; gauges
are read from callbacks at scrape time, so /metrics shows the server's state at that moment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

# Tool calls are milliseconds; judge runs and lock waits are seconds to minutes.
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

Samples = Iterable[tuple[dict[str, str], float]]
CallbackKind = Literal["gauge", "counter"]


class _Callbacks(Collector):
    """Families whose samples come from functions called at scrape time."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.reads: dict[str, tuple[CallbackKind, str, Callable[[], Samples]]] = {}

    def collect(self) -> Iterator[Metric]:
        for name, (kind, help_text, read) in sorted(self.reads.items()):
            samples = list(read())
            labels = sorted({key for lbl, _ in samples for key in lbl})
            family: GaugeMetricFamily | CounterMetricFamily
            if kind == "gauge":
                family = GaugeMetricFamily(self.prefix + name, help_text, labels=labels)
            else:
                family = CounterMetricFamily(self.prefix + name, help_text, labels=labels)
            for lbl, value in samples:
                family.add_metric([lbl.get(key, "") for key in labels], value)
            yield family


class Metrics:
    """The server's metric families by short name (without the prefix or a counter's `_total`)."""

    PREFIX = "cuda_agent_sandbox_"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counters: dict[str, Counter] = {}
        self.histograms: dict[str, Histogram] = {}
        self._callbacks = _Callbacks(self.PREFIX)
        self.registry.register(self._callbacks)

    def _counter(self, name: str, help_text: str, labels: Iterable[str]) -> Counter:
        name = name.removesuffix("_total")
        if name not in self.counters:
            self.counters[name] = Counter(
                self.PREFIX + name, help_text, sorted(labels), registry=self.registry
            )
        return self.counters[name]

    def inc(self, name: str, help_text: str, amount: float = 1.0, **labels: str) -> None:
        counter = self._counter(name, help_text, labels)
        (counter.labels(**labels) if labels else counter).inc(amount)

    def counter_value(self, name: str, **labels: str) -> float:
        """The counter's value for these labels (0 when it never counted); read from the counter, not
        the registry, whose collection would call the gauges' callbacks."""
        return sum(value for lbl, value in self._counter_samples(name) if lbl == labels)

    def counter_sum(self, name: str) -> float:
        """The counter's total over all its label values."""
        return sum(value for _, value in self._counter_samples(name))

    def _counter_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        short = name.removesuffix("_total")
        counter = self.counters.get(short)
        if counter is None:
            return []
        total = f"{self.PREFIX}{short}_total"
        return [(s.labels, s.value) for m in counter.collect() for s in m.samples if s.name == total]

    def observe(self, name: str, help_text: str, value: float, **labels: str) -> None:
        if name not in self.histograms:
            self.histograms[name] = Histogram(
                self.PREFIX + name, help_text, sorted(labels), registry=self.registry, buckets=LATENCY_BUCKETS
            )
        histogram = self.histograms[name]
        (histogram.labels(**labels) if labels else histogram).observe(value)

    def gauge(self, name: str, help_text: str, read: Callable[[], Samples]) -> None:
        self._callbacks.reads[name] = ("gauge", help_text, read)

    def counter_callback(self, name: str, help_text: str, read: Callable[[], Samples]) -> None:
        """A counter kept elsewhere (a GPU lock's wait total), read at scrape time."""
        self._callbacks.reads[name.removesuffix("_total")] = ("counter", help_text, read)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """Every family in the format the scraper's Accept header asks for (OpenMetrics or the Prometheus
        text format), and that format's content type."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
