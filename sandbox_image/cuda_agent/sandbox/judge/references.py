"""The orchestrator's own references (trusted: no candidate code runs in this process): per-trial seeds and
the outputs they must produce, float64 copies for the strict-fp32 audit, the task's roofline bounds, and
the plan of timed calls whose outputs are checked (secret sample, the last call of each loop among them).
"""

from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from cuda_agent.sandbox.judge import compare, plausibility, protocol, tensors, timing
from cuda_agent.sandbox.judge import task as task_lib
from cuda_agent.sandbox.judge.config import JudgeConfig
from cuda_agent.sandbox.judge.errors import TaskFailure


@dataclass
class TrialReference:
    """What the orchestrator alone knows about one trial: seeds, and the outputs they must produce."""

    index: int
    order: str
    seed: int
    variant: str
    refill_seed: int
    refill_variant: str
    outputs: list[torch.Tensor] = field(default_factory=list)
    refill_outputs: list[torch.Tensor] = field(default_factory=list)
    outputs64: list[torch.Tensor] | None = None
    input_digest: str = ""

    def message(self, structure: Any, meta: list[dict[str, Any]], mutates: bool) -> protocol.TrialCommand:
        return {
            "type": "trial",
            "index": self.index,
            "order": self.order,
            "seed": self.seed,
            "variant": self.variant,
            "refill_seed": self.refill_seed,
            "refill_variant": self.refill_variant,
            "structure": structure,
            "meta": meta,
            "output_bytes": [t.nbytes for t in self.outputs],
            "task_mutates_inputs": mutates,
        }


@dataclass
class TimedCall:
    """One timed call whose outputs are checked: the seed of its values and the outputs they must give."""

    loop: str
    index: int
    draw: timing.Draw
    outputs: list[torch.Tensor]
    outputs64: list[torch.Tensor] | None


@dataclass
class TimedPlan:
    """Fresh values for every timed call and the secret sample of calls checked (docs/judge.md, "Timed
    calls are checked"). `loops` is the worker's part: per loop the seeds and the checked indices."""

    warmup_seed: int
    loops: dict[str, dict[str, Any]]
    calls: dict[tuple[str, int], TimedCall]


@dataclass
class References:
    weight_seed: int
    trials: list[TrialReference]
    timed: TimedPlan
    bounds: plausibility.TaskBounds
    structure: Any
    meta: list[dict[str, Any]]
    flags: list[str]
    mutates_inputs: bool


def _clone_inputs(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _run_reference(model: torch.nn.Module, inputs: list[Any]) -> tuple[Any, list[torch.Tensor], list[str]]:
    """(structure, outputs copied where they were produced, the device type of each). References stay on
    the device: comparing 100M-element outputs there takes milliseconds, on the host seconds."""
    with torch.no_grad():
        out = model(*inputs)
    try:
        structure, leaves = tensors.flatten(out)
    except tensors.OutputTypeError as exc:
        raise TaskFailure(f"Model.forward returns a non-tensor output ({exc})") from None
    return structure, [t.detach().clone() for t in leaves], [t.device.type for t in leaves]


@dataclass
class ReferenceCall:
    variant: str
    structure: Any
    outputs: list[torch.Tensor]
    devices: list[str]
    mutated_inputs: bool
    input_digest: str


def _reference_for(task: Any, model: torch.nn.Module, seed: int, variant: str, device: str) -> ReferenceCall:
    """The reference outputs for one seed, on the variant actually used. A redraw that makes the reference
    itself fail or go non-finite is not valid for this task: fall back to the task's own distribution."""
    for attempt in dict.fromkeys((variant, "task")):
        inputs = task_lib.make_inputs(task, seed, attempt, device)
        digest = task_lib.values_digest(inputs)
        before = _clone_inputs(inputs)
        try:
            structure, outputs, devices = _run_reference(model, inputs)
        except TaskFailure:
            raise
        except Exception as exc:
            if attempt == "task":
                raise TaskFailure(f"Model.forward raised {type(exc).__name__}: {exc}") from exc
            continue
        finite = all(torch.isfinite(t).all() for t in outputs if t.is_floating_point())
        if attempt != "task" and not finite:
            continue
        mutated = any(
            isinstance(a, torch.Tensor) and not tensors.bitwise_equal(a, b)
            for a, b in zip(inputs, before, strict=True)
        )
        return ReferenceCall(attempt, structure, outputs, devices, mutated, digest)
    raise TaskFailure("no valid inputs")


def baseline_seeds(master: bytes) -> protocol.BaselineCommand:
    """The model's weight seed and the compile warm-up's input seed (both not secret from the worker)."""
    return {
        "type": "baseline",
        "weight_seed": task_lib.derive_seed(master, "weights"),
        "warmup_seed": task_lib.derive_seed(master, "compile-warmup"),
    }


def compute_references(task: Any, master: bytes, cfg: JudgeConfig) -> References:
    device = cfg.device
    task_lib.apply_precision(cfg.precision)
    weight_seed = baseline_seeds(master)["weight_seed"]
    try:
        model = task_lib.build_model(task, task.Model, weight_seed, device)
    except task_lib.TaskError:
        raise
    except Exception as exc:
        raise TaskFailure(f"Model construction raised {type(exc).__name__}: {exc}") from exc
    model64: torch.nn.Module | None = None
    if cfg.precision == "strict-fp32":
        with contextlib.suppress(Exception):
            model64 = copy.deepcopy(model).double()
    offset = task_lib.derive_seed(master, "variant-offset") % len(task_lib.VARIANTS)
    trials: list[TrialReference] = []
    structure: Any = None
    devices: list[str] = []
    mutates = False
    for i in range(1, cfg.trials + 1):
        variant = task_lib.VARIANTS[(i - 1 + offset) % len(task_lib.VARIANTS)]
        refill_variant = task_lib.VARIANTS[(i + offset) % len(task_lib.VARIANTS)]
        ref = TrialReference(
            index=i,
            order="model-first" if i % 2 else "candidate-first",
            seed=task_lib.derive_seed(master, f"trial/{i}"),
            variant=variant,
            refill_seed=task_lib.derive_seed(master, f"refill/{i}"),
            refill_variant=refill_variant,
        )
        call = _reference_for(task, model, ref.seed, variant, device)
        ref.variant, ref.outputs, ref.input_digest = call.variant, call.outputs, call.input_digest
        structure, devices = call.structure, call.devices
        refill = _reference_for(task, model, ref.refill_seed, refill_variant, device)
        ref.refill_variant, ref.refill_outputs = refill.variant, refill.outputs
        mutates = mutates or call.mutated_inputs
        if model64 is not None and any(t.dtype == torch.float32 for t in ref.outputs):
            inputs = task_lib.make_inputs(task, ref.seed, ref.variant, device)
            inputs64 = [
                x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
            ]
            try:
                _, ref.outputs64, _ = _run_reference(model64, inputs64)
            except Exception:  # some ops have no float64 kernel: no precision audit for this task
                model64 = None
        trials.append(ref)
    timed = plan_timed(task, model, model64, master, cfg)
    bounds = plausibility.task_bounds(
        model, task_lib.make_inputs(task, timed.warmup_seed, "task", device), device
    )
    meta = [tensors.tensor_meta(t) | {"device": d} for t, d in zip(trials[0].outputs, devices, strict=True)]
    flags = compare.task_flags([t.outputs for t in trials])
    if model64 is None and cfg.precision == "strict-fp32":
        flags.append("no-fp64-reference")
    if mutates:
        flags.append("mutates-inputs")
    del model, model64
    if device == "cuda":
        torch.cuda.empty_cache()
    return References(
        weight_seed,
        trials,
        timed,
        bounds,
        structure,
        meta,
        sorted(flags),
        mutates,
    )


def _sample(rng: random.Random, count: int, checked: int) -> list[int]:
    """`checked` indices of `count` calls: the last one always, the rest drawn without replacement."""
    if count <= 0:
        return []
    rest = rng.sample(range(count - 1), min(max(checked - 1, 0), count - 1))
    return sorted({count - 1, *rest})


def _nbytes(values: list[Any]) -> int:
    return sum(x.nbytes for x in values if isinstance(x, torch.Tensor))


# Device memory the judge may spend on the timed checks: the host loop's pre-drawn value sets, and the
# checked outputs (held by the worker and by this process). Beyond it fewer sets / checks are used.
HOST_POOL_BUDGET = 2 << 30
CHECKED_BUDGET = 4 << 30
# Checked trials per loop whose values are a near repeat of the trial before (caches keyed on a sample).
NEAR_REPEATS = 2


def plan_timed(
    task: Any,
    model: torch.nn.Module,
    model64: torch.nn.Module | None,
    master: bytes,
    cfg: JudgeConfig,
) -> TimedPlan:
    """Seeds for every timed call and the secret sample of calls whose outputs are checked, with their
    references (and float64 references for the precision audit). The worker learns the sample only as
    "copy these calls' outputs after the call": the candidate's code cannot tell them from the others."""
    settings, device = cfg.profile, cfg.device
    warmup_seed = task_lib.derive_seed(master, "timed/warmup")
    sample_inputs = task_lib.make_inputs(task, warmup_seed, "task", device)
    in_bytes = max(_nbytes(sample_inputs), 1)
    _, sample_out, _ = _run_reference(model, sample_inputs)
    out_bytes = max(sum(t.nbytes for t in sample_out), 1)
    rng = random.Random(task_lib.derive_seed(master, "timed/sample"))
    checked = max(1, min(settings.checked_calls, CHECKED_BUDGET // out_bytes - 3))
    trials = settings.trials
    if device == "cuda":
        calls = max(2, min(settings.host_calls, HOST_POOL_BUDGET // (in_bytes + out_bytes)))
        shapes = {
            "device": (trials, checked),
            "latency": (trials, 2),
            "host": (settings.host_rounds * calls, 2),
        }
    else:
        calls = 0
        shapes = {"wall": (trials, checked)}
    loops: dict[str, dict[str, Any]] = {}
    plan = TimedPlan(warmup_seed, loops, {})

    def make(seed: int) -> list[Any]:
        return task_lib.make_inputs(task, seed, "task", device)

    for loop, (count, n_checked) in shapes.items():
        seeds: list[timing.Draw] = [task_lib.derive_seed(master, f"timed/{loop}/{k}") for k in range(count)]
        sample = _sample(rng, count, n_checked)
        if loop != "host":
            # Some checked trials are near repeats of the trial just before them (timing.near_repeat).
            baits = [k for k in sample if k > 0]
            for k in rng.sample(baits, min(NEAR_REPEATS, len(baits))):
                base = seeds[k - 1]
                if isinstance(base, int):
                    seeds[k] = [base, task_lib.derive_seed(master, f"timed/{loop}/{k}/near")]
        loops[loop] = {
            "seeds": [seeds[r * calls : (r + 1) * calls] for r in range(settings.host_rounds)]
            if loop == "host"
            else seeds,
            "checked": sample,
        }
        for k in sample:
            _, outputs, _ = _run_reference(model, timing.draw_values(make, seeds[k]))
            outputs64 = None
            if model64 is not None and any(t.dtype == torch.float32 for t in outputs):
                inputs64 = [
                    x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                    for x in timing.draw_values(make, seeds[k])
                ]
                with contextlib.suppress(Exception):
                    _, outputs64, _ = _run_reference(model64, inputs64)
            plan.calls[(loop, k)] = TimedCall(loop, k, seeds[k], outputs, outputs64)
    return plan
