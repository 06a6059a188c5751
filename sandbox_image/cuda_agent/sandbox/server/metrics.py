"""Counters and histograms rendered in the Prometheus text format (no client library needed)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable

Labels = tuple[tuple[str, str], ...]

# Tool calls are milliseconds; judge runs and lock waits are seconds to minutes.
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def _labels(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _fmt_labels(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts: dict[Labels, list[int]] = defaultdict(lambda: [0] * len(buckets))
        self.sums: dict[Labels, float] = defaultdict(float)
        self.totals: dict[Labels, int] = defaultdict(int)

    def observe(self, value: float, **labels: str) -> None:
        key = _labels(labels)
        counts = self.counts[key]
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
        self.sums[key] += value
        self.totals[key] += 1


class Metrics:
    """Metric families by name; gauges are read from callbacks at scrape time."""

    PREFIX = "cuda_agent_sandbox_"

    def __init__(self) -> None:
        self.counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self.histograms: dict[str, Histogram] = {}
        self.help: dict[str, str] = {}
        self.gauges: dict[str, Callable[[], Iterable[tuple[dict[str, str], float]]]] = {}

    def inc(self, name: str, help_text: str, amount: float = 1.0, **labels: str) -> None:
        self.help.setdefault(name, help_text)
        self.counters[name][_labels(labels)] += amount

    def counter_value(self, name: str, **labels: str) -> float:
        return self.counters.get(name, {}).get(_labels(labels), 0.0)

    def observe(self, name: str, help_text: str, value: float, **labels: str) -> None:
        self.help.setdefault(name, help_text)
        self.histograms.setdefault(name, Histogram()).observe(value, **labels)

    def gauge(
        self, name: str, help_text: str, read: Callable[[], Iterable[tuple[dict[str, str], float]]]
    ) -> None:
        self.help[name] = help_text
        self.gauges[name] = read

    def render(self) -> str:
        lines: list[str] = []
        for name, read in sorted(self.gauges.items()):
            full = self.PREFIX + name
            lines += [f"# HELP {full} {self.help[name]}", f"# TYPE {full} gauge"]
            lines += [f"{full}{_fmt_labels(_labels(lbl))} {_num(v)}" for lbl, v in read()]
        for name, series in sorted(self.counters.items()):
            full = self.PREFIX + name
            lines += [f"# HELP {full} {self.help[name]}", f"# TYPE {full} counter"]
            lines += [f"{full}{_fmt_labels(lbl)} {_num(v)}" for lbl, v in sorted(series.items())]
        for name, hist in sorted(self.histograms.items()):
            full = self.PREFIX + name
            lines += [f"# HELP {full} {self.help[name]}", f"# TYPE {full} histogram"]
            for lbl in sorted(hist.totals):
                for bound, count in zip(hist.buckets, hist.counts[lbl], strict=True):
                    lines.append(f"{full}_bucket{_fmt_labels(lbl, (('le', _num(bound)),))} {count}")
                lines.append(f"{full}_bucket{_fmt_labels(lbl, (('le', '+Inf'),))} {hist.totals[lbl]}")
                lines.append(f"{full}_sum{_fmt_labels(lbl)} {_num(hist.sums[lbl])}")
                lines.append(f"{full}_count{_fmt_labels(lbl)} {hist.totals[lbl]}")
        return "\n".join(lines) + "\n"
