"""Device-aware sizing of programmatic tasks: the runtime filter keeps tasks whose eager forward takes
[1, 100] ms on the target GPU, and shapes picked without looking at the device mostly miss that window
(on an H200, 26 of 40 full-scale candidates ran under 1 ms). Calibration measures each composed task on
the target device and re-composes it with its batch dimension scaled by a power of two until its time
lies inside the window, then hands it to the filters, which time it again: the window is not changed.

The rule, per task (pure functions below, the measuring is `measure`, a fan-out of execution.measure):
1. Compose at shift 0 (the composer's own size); measure median eager ms and peak memory.
2. Settled when the time is within [min*margin, max/margin] (margin 1.5: slack for timing noise when
   the filter re-times it). Otherwise the next shift moves log2(target / ms) powers of two (rounded,
   at least one, at most `max_step`), as eager time grows about linearly with the batch.
3. Growth is capped by memory: peak bytes scale with the batch, so the batch may double at most
   floor(log2(memory_fraction * device_bytes / peak)) more times; at zero the search stops (`memory`).
4. The composer replays its walk at the new batch: each family rule re-derives its arguments from the
   new shape (`in_features` after a transpose, group counts...), so every operator stays valid; a batch
   that breaks a rule or makes a tensor exceed `max_tensor_elements` is skipped for a smaller step
   (none left: `shape`).
5. At most `max_rounds` measurements; a shift already measured is not measured again (the search takes
   an untried one between, and stops when there is none: `no_progress`). The
   task kept is the measured size inside the window closest to the target (log distance), else the
   measured size nearest the window; a task that never ran keeps shift 0 and meets runs_eager.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from cuda_agent.data.records import Calibration, CalibrationConfig, CalibrationOutcome, Sample


class Measurement(BaseModel):
    """execution.measure's result for one task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ms: float | None
    peak_bytes: int | None = None
    device_bytes: int | None = None
    error: str = ""


class Rescalable(Protocol):
    """A composer that can re-compose a task with its batch scaled by 2**shift (ProgrammaticComposer)."""

    def compose_scaled(self, index: int, shift: int, max_elements: int) -> Sample | None: ...


Measure = Callable[[list[str]], list[Measurement]]


@dataclass(frozen=True)
class Window:
    """The runtime filter's bounds in ms."""

    low: float
    high: float


def target_ms(window: Window, config: CalibrationConfig) -> float:
    """Where the search aims: the configured target, else the window's geometric middle."""
    if config.target_ms is not None:
        return config.target_ms
    return math.sqrt(window.low * window.high)


def settled(ms: float, window: Window, config: CalibrationConfig) -> bool:
    return window.low * config.margin <= ms <= window.high / config.margin


def memory_headroom(measurement: Measurement, config: CalibrationConfig) -> int | None:
    """How many more times the batch may double before the peak passes memory_fraction of the device
    (peak memory taken as linear in the batch); negative: halvings needed to get under it; None when
    the measurement has no memory numbers."""
    if not measurement.peak_bytes or not measurement.device_bytes:
        return None
    budget = config.memory_fraction * measurement.device_bytes
    if measurement.peak_bytes > budget:
        return -math.ceil(math.log2(measurement.peak_bytes / budget))
    return math.floor(math.log2(budget / measurement.peak_bytes))


def next_shift(
    shift: int, measurement: Measurement, window: Window, config: CalibrationConfig
) -> int | CalibrationOutcome:
    """The batch shift to try next after measuring `shift` (maybe one measured already: the caller
    then takes an untried one between), or why the search stops."""
    if measurement.ms is None:
        return "failed"
    headroom = memory_headroom(measurement, config)
    if headroom is not None and headroom < 0:
        step = max(headroom, -config.max_step)  # over the memory cap: shrink first, whatever the time
    else:
        if settled(measurement.ms, window, config):
            return "in_window"
        wanted = math.log2(target_ms(window, config) / max(measurement.ms, 1e-6))
        step = max(-config.max_step, min(config.max_step, round(wanted)))
        if step == 0:  # outside the settled band but rounding says stay: move one power of two
            step = 1 if measurement.ms < window.low * config.margin else -1
        if headroom is not None and step > headroom:
            step = headroom
            if step == 0:
                return "memory"
    return shift + step


def steps_towards(shift: int, wanted: int, tried: set[int]) -> Iterator[int]:
    """Shifts from `wanted` back towards `shift` (exclusive), skipping those already measured: when the
    composer cannot build the wanted batch, a smaller change may still be buildable."""
    direction = 1 if wanted > shift else -1
    for candidate in range(wanted, shift, -direction):
        if candidate not in tried:
            yield candidate


def choose(history: dict[int, Measurement], window: Window, config: CalibrationConfig) -> int:
    """The shift to keep: inside the window (and memory cap) and closest to the target in log distance,
    else the measured one nearest the window; 0 when nothing was measured."""
    measured = {
        s: m for s, m in history.items() if m.ms is not None and (memory_headroom(m, config) or 0) >= 0
    }
    if not measured:
        return 0
    aim = math.log(target_ms(window, config))

    def distance_to_window(ms: float) -> float:
        return max(0.0, math.log(window.low / ms), math.log(ms / window.high))

    def key(shift: int) -> tuple[float, float]:
        ms = measured[shift].ms
        assert ms is not None
        return (distance_to_window(ms), abs(math.log(ms) - aim))

    return min(measured, key=key)


@dataclass
class _Search:
    index: int
    shift: int
    sample: Sample
    history: dict[int, Measurement] = field(default_factory=dict)
    samples: dict[int, Sample] = field(default_factory=dict)
    outcome: CalibrationOutcome | None = None


def calibrate(
    composer: Rescalable,
    indices: Sequence[int],
    samples: Sequence[Sample],
    measure: Measure,
    window: Window,
    config: CalibrationConfig,
) -> list[Sample]:
    """The samples (composed at shift 0 for `indices`) re-composed at the batch the rule above picks,
    each with its `calibration` record. All open searches are measured together each round, so the
    measurements fan out like the filters do. Samples the composer rejected pass through unchanged."""
    searches = [_Search(i, 0, s) for i, s in zip(indices, samples, strict=True)]
    pending = [s for s in searches if s.sample.rejected_by is None]
    for _ in range(config.max_rounds):
        if not pending:
            break
        results = measure([s.sample.code for s in pending])
        still: list[_Search] = []
        for search, measurement in zip(pending, results, strict=True):
            search.history[search.shift] = measurement
            search.samples[search.shift] = search.sample
            if _advance(search, composer, measurement, window, config):
                still.append(search)
        pending = still
    for search in pending:
        search.outcome = "rounds"
    return [_finish(s, window, config) for s in searches]


def _advance(
    search: _Search, composer: Rescalable, measurement: Measurement, window: Window, config: CalibrationConfig
) -> bool:
    """Move the search to its next size; False when it stops (outcome set)."""
    step = next_shift(search.shift, measurement, window, config)
    if isinstance(step, str):
        search.outcome = step
        return False
    untried = list(steps_towards(search.shift, step, set(search.history)))
    for shift in untried:
        sample = composer.compose_scaled(search.index, shift, config.max_tensor_elements)
        if sample is not None:
            search.shift, search.sample = shift, sample
            return True
    search.outcome = "shape" if untried else "no_progress"
    return False


def _finish(search: _Search, window: Window, config: CalibrationConfig) -> Sample:
    if search.sample.rejected_by is not None and not search.history:
        return search.sample
    shift = choose(search.history, window, config)
    measurement = search.history.get(shift)
    sample = search.samples.get(shift, search.sample)
    record = Calibration(
        batch_scale=2.0**shift,
        outcome=search.outcome or "rounds",
        rounds=len(search.history),
        ms=measurement.ms if measurement else None,
        peak_bytes=measurement.peak_bytes if measurement else None,
    )
    return sample.model_copy(update={"calibration": record})


def outcome_counts(samples: Sequence[Sample]) -> dict[str, int]:
    """Calibrated samples per outcome plus how many were scaled up, down or kept (for the summary)."""
    counts: dict[str, int] = {}
    for sample in samples:
        record = sample.calibration
        if record is None:
            continue
        direction = (
            "scaled_up" if record.batch_scale > 1 else "scaled_down" if record.batch_scale < 1 else "unscaled"
        )
        for key in (record.outcome, direction):
            counts[key] = counts.get(key, 0) + 1
    return counts
