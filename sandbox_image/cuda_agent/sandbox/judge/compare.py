"""Correctness of candidate outputs against the orchestrator's own references (orchestrator side only).

An output is correct when allclose(atol, rtol) holds AND the relative-norm error ||out-ref||/||ref|| is
within its bound AND no NaN/Inf appears where the reference has none. The relative-norm bound is what
makes zeros fail on tiny-magnitude tasks, where an absolute tolerance alone would accept them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from cuda_agent.api.judge import Tolerances

TINY_MAX_ABS = 1e-3
TINY_RMS = 1e-4
# std/mean|ref| below this: the output is nearly constant, so constants must not pass by closeness.
NEAR_CONSTANT_SPREAD = 1e-3
# ...but a spread below this is rounding noise no fp32 kernel can reproduce: "constant-output".
RESOLVABLE_SPREAD = 1e-5


@dataclass
class OutputVerdict:
    """What one call's outputs earned: violations (codes per the contract) and a wrong-value message."""

    violations: list[str] = field(default_factory=list)
    wrong: str | None = None
    rel_errors: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and self.wrong is None


def rel_norm_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 over the positions where the reference is finite."""
    o, r = out.to(torch.float64), ref.to(torch.float64)
    finite = torch.isfinite(r)
    o, r = o[finite], r[finite]
    ref_norm = float(torch.linalg.vector_norm(r))
    err_norm = float(torch.linalg.vector_norm(o - r))
    if ref_norm == 0.0:
        return 0.0 if err_norm == 0.0 else math.inf
    return err_norm / ref_norm


def _centered_rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.to(torch.float64).flatten(), ref.to(torch.float64).flatten()
    return rel_norm_error(o - o.mean(), r - r.mean())


def _index_text(flat_index: int, shape: torch.Size) -> str:
    coords = []
    for size in reversed(shape):
        coords.append(flat_index % size)
        flat_index //= size
    return ",".join(str(c) for c in reversed(coords))


def task_flags(references: list[list[torch.Tensor]]) -> list[str]:
    """Degenerate-output flags of a task, from its reference outputs over all trials."""
    flags: set[str] = set()
    for outputs in references:
        for ref in outputs:
            if not ref.is_floating_point() or ref.numel() == 0:
                continue
            r = ref.to(torch.float64)
            r = r[torch.isfinite(r)]
            if r.numel() == 0:
                continue
            max_abs = float(r.abs().max())
            rms = float(r.pow(2).mean().sqrt())
            if max_abs == 0.0:
                flags.add("zero-output")
                continue
            if max_abs < TINY_MAX_ABS or rms < TINY_RMS:
                flags.add("tiny-output")
            spread = float(r.std()) if r.numel() > 1 else 0.0
            magnitude = float(r.abs().mean())
            if spread <= RESOLVABLE_SPREAD * max_abs:
                flags.add("constant-output")
            elif spread < NEAR_CONSTANT_SPREAD * magnitude:
                flags.add("near-constant-output")
    if len(references) > 1 and all(
        len(outs) == len(references[0])
        and all(o.shape == r.shape and torch.equal(o, r) for o, r in zip(outs, references[0], strict=True))
        for outs in references[1:]
    ):
        flags.add("input-independent-output")
    return sorted(flags)


def check_outputs(
    outputs: list[torch.Tensor],
    references: list[torch.Tensor],
    tol: Tolerances,
    *,
    flags: list[str],
) -> OutputVerdict:
    """Compare one call's outputs (already decoded to CPU) with the references of the same call."""
    verdict = OutputVerdict()
    if len(outputs) != len(references):
        verdict.violations.append(f"output-structure: {len(outputs)} outputs, expected {len(references)}")
        return verdict
    for i, (out, ref) in enumerate(zip(outputs, references, strict=True)):
        if out.dtype != ref.dtype:
            verdict.violations.append(f"output-dtype: output[{i}] is {out.dtype}, expected {ref.dtype}")
            continue
        if out.shape != ref.shape:
            verdict.violations.append(
                f"output-shape: output[{i}] is {list(out.shape)}, expected {list(ref.shape)}"
            )
            continue
        if out.numel() == 0:
            verdict.rel_errors.append(0.0)
            continue
        if not (ref.is_floating_point() or ref.is_complex()):
            if not torch.equal(out, ref):
                bad = int((out != ref).flatten().nonzero()[0])
                verdict.wrong = verdict.wrong or (
                    f"output[{i}][{_index_text(bad, ref.shape)}] is {out.flatten()[bad].item()}, "
                    f"expected {ref.flatten()[bad].item()}"
                )
            verdict.rel_errors.append(0.0)
            continue
        o, r = out.to(torch.float64), ref.to(torch.float64)
        if ref.is_complex():
            o, r = torch.view_as_real(out.to(torch.complex128)), torch.view_as_real(ref.to(torch.complex128))
        ref_finite = torch.isfinite(r)
        bad_nonfinite = ref_finite & ~torch.isfinite(o)
        if bool(bad_nonfinite.any()):
            count = int(bad_nonfinite.sum())
            verdict.violations.append(
                f"nonfinite: output[{i}] has {count} NaN/Inf where the reference is finite"
            )
            continue
        # Non-finite reference positions must be reproduced exactly (same NaN/Inf pattern).
        if not torch.equal(o[~ref_finite].isnan(), r[~ref_finite].isnan()) or not torch.equal(
            o[~ref_finite].nan_to_num(0.0), r[~ref_finite].nan_to_num(0.0)
        ):
            verdict.wrong = verdict.wrong or f"output[{i}] does not reproduce the reference's NaN/Inf values"
            continue
        diff = (o - r).abs().where(ref_finite, torch.zeros((), dtype=o.dtype))
        allowed = tol.atol + tol.rtol * r.abs().where(ref_finite, torch.zeros((), dtype=r.dtype))
        rel = rel_norm_error(o, r)
        verdict.rel_errors.append(rel)
        worst = int(diff.flatten().argmax())
        close = bool((diff <= allowed).all())
        centered_ok = True
        if "near-constant-output" in flags:
            centered_ok = _centered_rel_error(o, r) <= tol.rel_norm
        if not close or rel > tol.rel_norm or not centered_ok:
            where = _index_text(worst, diff.shape)
            worst_err = float(diff.flatten()[worst])
            message = f"max abs err {worst_err:.3g} at output[{i}][{where}]; rel-norm err {rel:.3g}"
            if not centered_ok:
                message += " (near-constant output: its variation around the mean is not reproduced)"
            verdict.wrong = verdict.wrong or message
    return verdict


def precision_violation(
    out: torch.Tensor, ref32: torch.Tensor, ref64: torch.Tensor, tol: Tolerances, index: int
) -> str | None:
    """strict-fp32 audit: the candidate's error vs float64 must stay near eager fp32's own error.

    TF32 or FP16 math lands near 3e-4 relative error while fp32 with any summation order stays near
    1e-6, so max(factor * eager error, floor) separates them with a wide margin (docs/judge.md).
    """
    if out.dtype != torch.float32 or ref64.dtype != torch.float64 or out.numel() == 0:
        return None
    eager_err = rel_norm_error(ref32, ref64)
    cand_err = rel_norm_error(out, ref64)
    bound = max(tol.precision_factor * eager_err, tol.precision_floor)
    if cand_err > bound:
        return (
            f"precision: output[{index}] error vs float64 is {cand_err:.2e}, eager fp32's is {eager_err:.2e} "
            f"(bound {bound:.1e}); reduced-precision math (TF32/FP16) under strict-fp32"
        )
    return None
