"""Device-aware sizing of composed tasks (calibrate.py): the step rule, the memory cap, the choice of the
size kept, the composer's replay at another batch (every operator still valid), the whole search against
a device model, and the wiring through `synth.run` with real CPU measurements."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from cuda_agent.data import synth
from cuda_agent.data.calibrate import (
    Measurement,
    Window,
    calibrate,
    choose,
    memory_headroom,
    next_shift,
    steps_towards,
    target_ms,
)
from cuda_agent.data.catalogue import Catalogue
from cuda_agent.data.compose import ProgrammaticComposer, scaled_batch
from cuda_agent.data.execution import run_filters
from cuda_agent.data.records import CalibrationConfig, ComposerConfig, FilterConfig

CUDA = Window(1.0, 100.0)
GIB = 1 << 30
CONFIG = CalibrationConfig(enabled=True)


def _m(ms: float | None, peak: int | None = None, device: int | None = None) -> Measurement:
    return Measurement(ms=ms, peak_bytes=peak, device_bytes=device)


def test_next_shift_moves_towards_the_window_middle() -> None:
    assert target_ms(CUDA, CONFIG) == pytest.approx(10.0)
    assert next_shift(0, _m(5.0), CUDA, CONFIG) == "in_window"
    assert next_shift(0, _m(1.2), CUDA, CONFIG) == 3  # inside [1, 100] but not by the 1.5 margin: 10/1.2
    assert next_shift(0, _m(0.68), CUDA, CONFIG) == 4  # log2(10 / 0.68) = 3.9
    assert next_shift(2, _m(0.01), CUDA, CONFIG) == 6  # at most max_step (16x) per round
    assert next_shift(0, _m(400.0), CUDA, CONFIG) == -4  # log2(10 / 400) = -5.3, at most 16x down
    assert next_shift(3, _m(80.0), CUDA, CONFIG) == 0  # log2(10 / 80) = -3
    assert next_shift(0, _m(None), CUDA, CONFIG) == "failed"
    aim = CalibrationConfig(enabled=True, target_ms=2.0)
    assert next_shift(0, _m(0.5), CUDA, aim) == 2


def test_memory_caps_growth_and_forces_shrinking() -> None:
    cap = CalibrationConfig(enabled=True, memory_fraction=0.1)
    device = 100 * GIB  # budget 10 GiB
    assert memory_headroom(_m(1.0, 1 * GIB, device), cap) == 3  # 1 -> 8 GiB fits, 16 does not
    assert memory_headroom(_m(1.0, 10 * GIB, device), cap) == 0
    assert memory_headroom(_m(1.0, 30 * GIB, device), cap) == -2
    assert memory_headroom(_m(1.0), cap) is None
    # 0.1 ms wants 2**7 more, memory allows 2**3; at the cap the search stops; over it, it shrinks.
    assert next_shift(0, _m(0.1, 1 * GIB, device), CUDA, cap) == 3
    assert next_shift(3, _m(0.8, 8 * GIB, device), CUDA, cap) == "memory"
    assert next_shift(0, _m(5.0, 30 * GIB, device), CUDA, cap) == -2


def test_choose_keeps_the_size_inside_the_window_nearest_the_target() -> None:
    history = {0: _m(0.3), 2: _m(1.1), 4: _m(4.8), 5: _m(9.0, 50 * GIB, 100 * GIB)}  # 5: over the cap
    assert choose(history, CUDA, CONFIG) == 4
    assert choose({0: _m(0.3), 3: _m(0.9)}, CUDA, CONFIG) == 3  # none inside: the nearest
    assert choose({0: _m(None)}, CUDA, CONFIG) == 0
    assert list(steps_towards(0, 4, {0, 4})) == [3, 2, 1]
    assert list(steps_towards(4, 0, {0, 4})) == [1, 2, 3]
    assert [scaled_batch(16, s) for s in (2, -2, -5)] == [64, 4, None]


def _input_shapes(code: str) -> list[tuple[int, ...]]:
    line = next(line for line in code.splitlines() if line.strip().startswith("return [torch.randn"))
    return [tuple(int(d) for d in m.split(",")) for m in re.findall(r"torch\.randn\(([^)]*)\)", line)]


def test_replay_at_another_batch_keeps_every_operator_valid(catalogue: Catalogue) -> None:
    """Shift 0 is the composer's own task; scaled tasks have their batch scaled and still run."""
    composer = ProgrammaticComposer(catalogue, ComposerConfig(scale="small"), seed=21)
    settings = FilterConfig.for_device("cpu").model_dump(mode="json")
    scaled = 0
    for index in range(10):
        base = composer.compose(index)
        assert composer.compose_scaled(index, 0, 1 << 31) == base
        for shift in (2, -1):
            sample = composer.compose_scaled(index, shift, 1 << 22)
            if sample is None:
                continue
            first, base_first = _input_shapes(sample.code)[0], _input_shapes(base.code)[0]
            assert first[0] == base_first[0] * 2**shift and first[1:] == base_first[1:]
            verdicts = run_filters(sample.code, settings, ["runs_eager"])
            assert verdicts[0]["passed"], (sample.code, verdicts)
            scaled += 1
    assert scaled >= 15


def _device_model(codes: list[str]) -> list[Measurement]:
    """A stand-in device: time and memory linear in the input elements (0.25 ms and 3 GiB per 2**26)."""
    out = []
    for code in codes:
        elements = sum(math.prod(shape) for shape in _input_shapes(code))
        out.append(_m(0.25 * elements / 2**26, 3 * GIB * elements // 2**26, 80 * GIB))
    return out


def test_calibration_lands_tasks_in_the_window_within_memory(catalogue: Catalogue) -> None:
    composer = ProgrammaticComposer(catalogue, ComposerConfig(scale="full"), seed=4)
    indices = list(range(12))
    samples = [composer.compose(i) for i in indices]
    before = [m.ms for m in _device_model([s.code for s in samples])]
    assert sum(1 for ms in before if ms is not None and ms < 1.0) >= 6  # most start under the floor
    for budget in (0.5, 0.1):
        config = CalibrationConfig(enabled=True, memory_fraction=budget)
        result = calibrate(composer, indices, samples, _device_model, CUDA, config)
        for sample in result:
            record = sample.calibration
            assert record is not None and record.ms is not None
            measured = _device_model([sample.code])[0]
            assert measured.ms == pytest.approx(record.ms)  # the record describes the code kept
            assert measured.peak_bytes is not None and measured.peak_bytes <= budget * 80 * GIB
            if record.outcome == "in_window":
                assert 1.0 <= record.ms <= 100.0
            else:
                assert record.outcome in ("memory", "shape", "rounds", "no_progress"), record
        if budget == 0.5:
            assert sum(1 for s in result if s.calibration and s.calibration.outcome == "in_window") >= 9
        else:  # 8 GiB: about 0.7 ms of this device's time at most, so the cap stops most searches
            assert sum(1 for s in result if s.calibration and s.calibration.outcome == "memory") >= 6


def test_synth_run_calibrates_with_real_cpu_measurements(tmp_path: Path, catalogue: Catalogue) -> None:
    """On CPU the window [0.001, 1000] ms holds these tasks as composed: measured once, kept unscaled."""
    filters = FilterConfig.for_device("cpu", enabled=("composed", "runs_eager", "runtime"))
    config = synth.SynthConfig(
        n=2, out=str(tmp_path), batch_size=2, filters=filters, calibration=CalibrationConfig(enabled=True)
    )
    composer = ProgrammaticComposer(catalogue, config.composing, seed=2)
    summary = synth.run(config, composer)
    assert summary.accepted == 2
    assert summary.calibration == {"in_window": 2, "unscaled": 2}
    written = synth.load_existing(str(tmp_path))
    for sample in written.values():
        assert sample.calibration is not None and sample.calibration.rounds == 1
        assert sample.calibration.peak_bytes and sample.calibration.peak_bytes > 0
