"""Output comparison: tolerances, the relative-norm guard, degenerate-output flags, NaN and precision."""

from __future__ import annotations

import torch

from cuda_agent.api.judge import Tolerances
from cuda_agent.sandbox.judge import compare

TOL = Tolerances()


def ref_tensor(seed: int = 0, shape: tuple[int, ...] = (64, 32), scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_identical_and_rounding_level_outputs_pass() -> None:
    ref = ref_tensor()
    assert compare.check_outputs([ref.clone()], [ref], TOL, flags=[]).ok
    noisy = ref + 1e-6 * ref_tensor(1)
    assert compare.check_outputs([noisy], [ref], TOL, flags=[]).ok


def test_wrong_values_name_the_worst_element_and_rel_norm() -> None:
    ref = ref_tensor()
    out = ref.clone()
    out[17, 4] += 0.5
    verdict = compare.check_outputs([out], [ref], TOL, flags=[])
    assert verdict.violations == []
    assert verdict.wrong is not None
    assert verdict.wrong.startswith("max abs err 0.5 at output[0][17,4]; rel-norm err")


def test_zeros_fail_on_a_tiny_magnitude_task_where_atol_alone_passes() -> None:
    ref = ref_tensor(scale=1e-4)
    assert "tiny-output" in compare.task_flags([[ref]])
    zeros = torch.zeros_like(ref)
    assert bool(torch.allclose(zeros, ref, atol=TOL.atol, rtol=TOL.rtol))
    verdict = compare.check_outputs([zeros], [ref], TOL, flags=["tiny-output"])
    assert verdict.wrong is not None and "rel-norm err 1" in verdict.wrong


def test_constant_output_fails_on_a_near_constant_task() -> None:
    ref = 0.5 + 1e-4 * ref_tensor()
    flags = compare.task_flags([[ref]])
    assert "near-constant-output" in flags
    constant = torch.full_like(ref, 0.5)
    verdict = compare.check_outputs([constant], [ref], TOL, flags=flags)
    assert verdict.wrong is not None and "near-constant" in verdict.wrong
    # a real computation of the same values still passes
    assert compare.check_outputs([ref + 1e-9], [ref], TOL, flags=flags).ok


def test_constant_and_input_independent_flags() -> None:
    ones = torch.ones(8, 8)
    assert compare.task_flags([[ones], [ones.clone()]]) == ["constant-output", "input-independent-output"]
    assert compare.task_flags([[torch.zeros(4)]]) == ["zero-output"]


def test_nan_where_reference_is_finite_is_a_violation() -> None:
    ref = ref_tensor()
    out = ref.clone()
    out[0, 0] = float("nan")
    verdict = compare.check_outputs([out], [ref], TOL, flags=[])
    assert [v.split(":")[0] for v in verdict.violations] == ["nonfinite"]


def test_reference_nan_must_be_reproduced() -> None:
    ref = ref_tensor()
    ref[1, 1] = float("nan")
    assert compare.check_outputs([ref.clone()], [ref], TOL, flags=[]).ok
    out = ref.clone()
    out[1, 1] = 0.0
    assert compare.check_outputs([out], [ref], TOL, flags=[]).wrong is not None


def test_shape_dtype_and_count_mismatches_are_violations() -> None:
    ref = ref_tensor()
    assert compare.check_outputs([ref.t()], [ref], TOL, flags=[]).violations[0].startswith("output-shape")
    assert (
        compare.check_outputs([ref.double()], [ref], TOL, flags=[]).violations[0].startswith("output-dtype")
    )
    assert (
        compare.check_outputs([ref, ref], [ref], TOL, flags=[]).violations[0].startswith("output-structure")
    )


def test_integer_outputs_must_match_exactly() -> None:
    ref = torch.arange(10)
    out = ref.clone()
    out[3] = 4
    assert compare.check_outputs([out], [ref], TOL, flags=[]).wrong == "output[0][3] is 4, expected 3"


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """Round float32 to TF32's 10-bit mantissa, as a tensor core would before multiplying."""
    bits = t.float().view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def test_precision_audit_separates_fp32_from_tf32_and_fp16() -> None:
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(128, 64, generator=gen, dtype=torch.float64)
    b = torch.randn(64, 128, generator=gen, dtype=torch.float64)
    ref64 = a @ b
    ref32 = a.float() @ b.float()
    # fp32 with another summation order (split-K) is fine
    split = (a[:, :32].float() @ b[:32].float()) + (a[:, 32:].float() @ b[32:].float())
    assert compare.precision_violation(split, ref32, ref64, TOL, 0) is None
    tf32 = _tf32(a) @ _tf32(b)
    fp16 = a.half().float() @ b.half().float()
    for cheat in (tf32, fp16):
        assert compare.check_outputs([cheat], [ref32], TOL, flags=[]).ok  # passes the 1e-2 tolerance...
        problem = compare.precision_violation(cheat, ref32, ref64, TOL, 0)  # ...but not the audit
        assert problem is not None and problem.startswith("precision: output[0]")
