"""Timed calls are checked (fresh values per trial, a secret sample of calls compared, near repeats) and a
candidate's time is bounded by the device's physics (judge/plausibility.py). CPU only, in-process: the
judge's own functions on real tensors; the end-to-end attacks are in test_attacks.py (timed_*)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cuda_agent.sandbox.judge import plausibility, references, timing
from cuda_agent.sandbox.judge import task as task_lib
from cuda_agent.sandbox.judge.config import JudgeConfig, ProfileSettings

REPO = Path(__file__).resolve().parents[2]


def _make(seed: int) -> list[Any]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 32, generator=gen), torch.randn(64, 32, generator=gen), 3]


def test_near_repeat_changes_few_positions_reproducibly() -> None:
    base = _make(1)
    a = timing.draw_values(_make, [1, 99])
    b = timing.draw_values(_make, [1, 99])
    assert all(torch.equal(x, y) for x, y in zip(a[:2], b[:2], strict=True)) and a[2] == 3
    for x, y in zip(a[:2], base[:2], strict=True):
        changed = int((x != y).sum())
        assert 0 < changed <= timing.NEAR_REPEAT_POSITIONS
    assert torch.equal(base[0], _make(1)[0]), "the earlier draw itself is not modified"


def test_feed_refills_the_same_buffers_with_fresh_values() -> None:
    feed = timing.Feed(_make, 0, per_call=False)
    buffers = [x.data_ptr() for x in feed.inputs[:2]]
    seen = []
    for draw in (5, 6, [6, 7]):
        feed.load(draw)
        assert [x.data_ptr() for x in feed.inputs[:2]] == buffers
        assert torch.equal(feed.inputs[0], timing.draw_values(_make, draw)[0])
        seen.append(feed.inputs[0].clone())
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])


def _stale(calls_honest: int) -> Any:
    """A candidate that is right for its first calls and then returns its previous output."""
    state: dict[str, Any] = {"calls": 0, "last": None}

    def fn(a: torch.Tensor, b: torch.Tensor, k: int) -> Any:
        state["calls"] += 1
        if state["last"] is None or state["calls"] <= calls_honest:
            state["last"] = a * b + k
        return state["last"]

    return fn


def test_cpu_loop_shows_every_checked_call_its_own_values() -> None:
    """The wall-clock loop calls `after` with each output right after its call; a candidate that stops
    computing is caught on whichever checked call follows its switch, the last one included."""
    seeds: list[timing.Draw] = [10 + k for k in range(12)]
    seeds[7] = [seeds[6], 1234]  # type: ignore[list-item]

    def honest(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
        return a * b + k

    for candidate, wrong_expected in ((honest, False), (_stale(4), True)):
        feed = timing.Feed(_make, 0, per_call=False)
        wrong: list[int] = []

        def after(name: str, k: int, out: Any, feed: timing.Feed = feed, wrong: list[int] = wrong) -> None:
            if name == "candidate":
                want = honest(*timing.draw_values(_make, seeds[k]))
                assert torch.equal(feed.inputs[0], feed.values[0])
                if not torch.equal(out, want):
                    wrong.append(k)

        timing.cpu_wall_times({"candidate": candidate, "eager": honest}, feed, seeds, 1 << 16, 0, after)
        assert bool(wrong) == wrong_expected
        if wrong_expected:
            assert wrong[-1] == len(seeds) - 1


def _task() -> Any:
    path = REPO / "examples" / "tasks" / "relu_mul_add.py"
    return task_lib.load_task(path.read_text(), str(path))


def test_plan_checks_a_secret_sample_with_the_last_call_and_near_repeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_AGENT_TASK_SCALE", "small")
    task = _task()
    model = task_lib.build_model(task, task.Model, 1, "cpu")
    cfg = JudgeConfig(
        task=Path("t.py"), candidate=Path("c"), profile=ProfileSettings(trials=30, checked_calls=6)
    )

    def make(seed: int) -> list[Any]:
        return task_lib.make_inputs(task, seed, "task", "cpu")

    plans = [references.plan_timed(task, model, None, bytes([i]) * 32, cfg) for i in range(2)]
    for plan in plans:
        wall = plan.loops["wall"]
        assert len(wall["seeds"]) == 30 and 29 in wall["checked"] and len(wall["checked"]) == 6
        assert len(set(map(str, wall["seeds"]))) == 30, "every trial draws other values"
        near = [k for k in wall["checked"] if isinstance(wall["seeds"][k], list)]
        assert near and all(wall["seeds"][k][0] == wall["seeds"][k - 1] for k in near)
        for (loop, _), call in plan.calls.items():
            want = model(*timing.draw_values(make, call.draw))
            assert loop == "wall" and torch.equal(call.outputs[0], want)
    assert plans[0].loops["wall"]["checked"] != plans[1].loops["wall"]["checked"], "the sample is secret"


# --- plausibility ----------------------------------------------------------------------------------------


class _IgnoresB(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a) * 2


class _TimesZero(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 0 + b


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_task_bounds_count_only_inputs_the_output_depends_on_and_matmul_flops() -> None:
    a, b = torch.randn(64, 32), torch.randn(64, 32)
    bounds = plausibility.task_bounds(_IgnoresB(), [a, b], "cpu")
    assert bounds.input_bytes == a.nbytes and bounds.output_bytes == a.nbytes and bounds.matmul_flops == 0
    assert any("input 1" in n for n in bounds.notes)
    times_zero = plausibility.task_bounds(_TimesZero(), [a, b], "cpu")
    assert times_zero.input_bytes == b.nbytes, "a kernel may skip an input that only matters as NaN"
    linear = plausibility.task_bounds(_Linear(), [torch.randn(8, 32)], "cpu")
    assert linear.matmul_flops == 2 * 8 * 32 * 16 and linear.input_bytes == 8 * 32 * 4
    conv = nn.Conv2d(3, 4, 3)
    assert plausibility.task_bounds(conv, [torch.randn(1, 3, 8, 8)], "cpu").matmul_flops == 0


def _limits(device: str) -> plausibility.DeviceLimits:
    return plausibility.DeviceLimits(
        key="k", device=device, name="test device", copy_gbs=4000.0, read_gbs=4200.0, spec_gbs=4800.0,
        cache_bytes=50 << 20, tflops=700.0, spec_tflops=1000.0,
    )  # fmt: skip


def test_a_time_faster_than_the_device_allows_is_implausible_on_gpu_and_reported_on_cpu() -> None:
    """Forged timings: 1 GB read + 64 MB written in 0.1 ms is ~10 TB/s, over 4.8 TB/s x 1.05."""
    bounds = plausibility.TaskBounds(input_bytes=1 << 30, output_bytes=64 << 20, matmul_flops=0.0)
    fast = {"candidate": 0.1, "eager": 0.6, "compile": 0.5}
    cfg = JudgeConfig(task=Path("t.py"), candidate=Path("c"), device="cuda")
    outcome = plausibility.judge_speed(bounds, _limits("cuda"), fast, cfg)
    assert [v.split(":")[0] for v in outcome.violations] == ["implausible-speed"]
    assert outcome.roofline.min_bytes == (1 << 30) + (14 << 20)
    assert outcome.roofline.bandwidth_fraction is not None and outcome.roofline.bandwidth_fraction > 2
    honest = plausibility.judge_speed(bounds, _limits("cuda"), {**fast, "candidate": 0.3}, cfg)
    assert not honest.violations and honest.roofline.enforced
    assert honest.roofline.bandwidth_fraction == pytest.approx(
        ((1 << 30) + (14 << 20)) / 0.3e-3 / 1e9 / 4000, 1e-3
    )
    cpu = plausibility.judge_speed(bounds, _limits("cpu"), fast, cfg.model_copy(update={"device": "cpu"}))
    assert not cpu.violations and not cpu.roofline.enforced
    assert any(n.startswith("plausibility (reported only on cpu)") for n in cpu.notes)


def test_flop_bound_and_a_bound_the_baselines_break_is_not_applied() -> None:
    cfg = JudgeConfig(task=Path("t.py"), candidate=Path("c"), device="cuda")
    gemm = plausibility.TaskBounds(input_bytes=1 << 20, output_bytes=1 << 20, matmul_flops=2e12)
    too_fast = plausibility.judge_speed(gemm, _limits("cuda"), {"candidate": 1.0, "eager": 5.0}, cfg)
    assert too_fast.violations and "TFLOP/s" in too_fast.violations[0]
    wrong_bound = plausibility.judge_speed(gemm, _limits("cuda"), {"candidate": 1.0, "eager": 1.2}, cfg)
    assert not wrong_bound.violations and not wrong_bound.roofline.enforced
    assert any("not applied" in n for n in wrong_bound.notes)


def test_device_limits_are_measured_once_and_a_tampered_cache_is_ignored(tmp_path: Path) -> None:
    first = plausibility.device_limits(tmp_path, "cpu")
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and first.copy_gbs > 0 and first.cache_bytes > 0
    assert plausibility.device_limits(tmp_path, "cpu") == first
    data = json.loads(files[0].read_text())
    files[0].write_text(json.dumps({**data, "copy_gbs": -1.0}))
    assert plausibility._load(files[0], first.key) is None


def test_host_cross_check_checks_its_sampled_calls_on_their_own_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host loop's logic on CPU tensors. Its full device synchronisation is replaced by a no-op here
    (no GPU on this machine; the loop itself runs on the H200 in tests/gpu/judge_gpu.py). A candidate
    that reuses one output buffer is checked on what each checked call returned, not on the buffer's
    final state; a stale candidate is caught on the sampled calls."""
    monkeypatch.setattr(timing, "_cuda_synchronize", lambda: None)
    seeds: list[list[timing.Draw]] = [[100 * r + j for j in range(5)] for r in range(3)]
    checked = {3, 9, 14}

    def honest(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
        return a * b + k

    reused = torch.empty(64, 32)

    def into_one_buffer(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
        return torch.mul(a, b, out=reused).add_(k)

    flat = [s for round_seeds in seeds for s in round_seeds]
    for candidate, stale in ((into_one_buffer, False), (_stale(2), True)):
        feed = timing.Feed(_make, 0, per_call=False)
        seen: dict[int, bool] = {}

        def after(name: str, k: int, out: Any, seen: dict[int, bool] = seen) -> None:
            assert name == "candidate" and k in checked, "only checked candidate outputs are kept"
            seen[k] = torch.equal(out, honest(*timing.draw_values(_make, flat[k])))

        host = timing.host_per_call_ms({"candidate": candidate, "eager": honest}, feed, seeds, after, checked)
        assert set(host) == {"candidate", "eager", "refill"}
        assert set(seen) == checked
        assert all(seen.values()) != stale


def test_range_lookup_matches_a_plain_scan_also_when_ranges_nest() -> None:
    """Device work is attributed to the first range containing its launch; the binary search used for
    the judge's back-to-back ranges must agree with a scan, and fall back to it when ranges overlap."""
    from cuda_agent.sandbox.judge.kineto import Span

    flat = [Span(f"r{i}", 10 * i, 10 * i + 8, 1) for i in range(50)]
    nested = [*flat, Span("inner", 101, 104, 1)]
    launches = [Span("cudaLaunchKernel", t, t + 1, thread) for t in range(0, 510, 3) for thread in (1, 2)]
    for spans in (flat, nested, list(reversed(nested))):
        lookup = timing._Ranges(spans)
        assert lookup.nested == (len(spans) > len(flat))
        for launch in launches:
            assert lookup.first_containing(launch) == next((r for r in spans if r.contains(launch)), None)
    assert timing._Ranges(flat).first_containing(None) is None
