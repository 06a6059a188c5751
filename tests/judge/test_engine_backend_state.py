"""No process-wide switch can move a baseline (issue 30, part 1).

`backend_walk.py` (run as a subprocess: its flips never touch this process) walks every process-wide
setter torch has, found at run time: torch._C's setters, every writable torch.backends setting, the public
setter functions of torch, torch.backends.*, torch.cuda and torch.cuda.tunable, and every `set*` member of
ATen's `at::Context` (parsed from the installed ATen/Context.h, each called from C++ through an alias of
`at::globalContext()`). Each flip must show in the judge's snapshot (`backend_state.Snapshot`, the one the
worker takes before loading candidate code and checks before every baseline call), unless it is listed
below with the reason it cannot change a baseline. A setter that a new torch adds fails this test until
it is detected or listed.
"""

# ruff: noqa: E501  (the reasons below are one line each)
from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cuda_agent.sandbox.judge import backend_state, tamper, worker

REPO = Path(__file__).resolve().parents[2]
WALK = Path(__file__).with_name("backend_walk.py")

JIT = "TorchScript only: no baseline runs through TorchScript (eager and inductor do not), and torch.jit is refused by the static screen"
# Accepted, and no setting the judge reads moved (or not called at all): why none can change a baseline.
UNOBSERVED: dict[str, str] = {
    "torch._C._jit_*": JIT,
    "torch._C._debug_set_autodiff_subgraph_inlining": JIT,
    "torch._C._debug_set_fusion_group_inlining": JIT,
    "torch._C._cuda_cudaCachingAllocator_enable": "no CUDA allocator exists on a CPU host (the GPU walk reports it there)",
    "torch._C._cuda_tunableop_set_*": "TunableOp parameters: they act only while TunableOp is enabled, and that switch is in the snapshot",
    "torch.cuda.tunable.set_*": "TunableOp parameters: they act only while TunableOp is enabled, and that switch is in the snapshot",
    "torch._C._set_cached_tensors_enabled": "marks tensors cached by inductor's CUDA-graph trees; no kernel choice",
    "*_check_sparse_tensor_invariants": "validation of sparse tensors only; task tensors are dense",
    "at::Context::setCheckSparseTensorInvariants": "validation of sparse tensors only; task tensors are dense",
    "torch._C._set_only_lift_cpu_tensors": "constant lifting in torch.export / functionalization; not eager or inductor's kernels",
    "torch._C._set_print_stack_traces_on_fatal_signal": "diagnostics on a crash",
    "torch._C._set_should_use_format_with_string_table": "profiler trace formatting",
    "*warn_on_accumulate_grad_stream_mismatch": "a warning in backward; the judge runs no backward",
    "at::Context::setWarnOnAccumulateGradStreamMismatch": "a warning in backward; the judge runs no backward",
    "torch._C.set_flush_denormal": "flushing denormals only makes arithmetic faster (a faster baseline can only lower a reward), and it is per thread",
    "torch.set_flush_denormal": "flushing denormals only makes arithmetic faster (a faster baseline can only lower a reward), and it is per thread",
    "torch.set_printoptions": "printing only",
    "torch.set_vital": "telemetry strings",
    "torch._C.set_vital": "telemetry strings (not called: a wrong-typed call aborts the process)",
    "torch._C._set_meta_in_tls_dispatch_include": "thread-local dispatch keys: not reachable from candidate Python (torch._C is refused) and refused in C++ by the screen's dispatcher-bypass rule (tls_set_dispatch_key_included); the dispatch-mode stacks are fingerprinted (not called: it would turn this walk's own tensors into meta tensors)",
    "torch.cuda.use_mem_pool": "a context manager: calling it enters nothing",
    "torch.backends.opt_einsum.set_flags": "opt_einsum is not installed here, so its `enabled` stays False; `enabled` and `strategy` are in the snapshot",
    "*onednn_allow_tf32": "deprecated in favour of fp32_precision (in the snapshot); the reader answers None on this build and the setter changes no oneDNN choice",
    "attribute torch.backends.mkldnn.allow_tf32": "deprecated in favour of fp32_precision (in the snapshot); answers None on this build",
    "at::Context::setAllowTF32OneDNN": "deprecated in favour of fp32_precision (in the snapshot); answers None on this build",
    "at::Context::setAllowFP16ReductionCPU": "a no-op on a CPU without FP16 reduction support (AMX-FP16); where it acts, its reader _get_cpu_allow_fp16_reduced_precision_reduction is in the snapshot",
    "at::Context::setReleaseWeightsWhenPrepacking": "frees weights of prepacked mobile/XNNPACK operators after packing; changes no kernel the baselines run",
}
# Every value tried raised: not a process-wide switch on this build, or a setter of per-object state.
REFUSED: dict[str, str] = {
    "torch._C._jit_*": JIT,
    "torch._C._accelerator_*": "device / stream / allocator of an accelerator: none on a CPU host",
    "torch._C._cuda_set*": "CUDA device, stream, memory fraction, checkpoint pool: no CUDA on a CPU host",
    "torch._C._mps_*": "Apple GPUs only",
    "torch._C._mtia_*": "MTIA accelerators only",
    "torch.cuda.set_*": "needs a CUDA device (the GPU walk reports them)",
    "torch._C._dispatch_*": "dispatcher internals taking a dispatch key or callback; reachable from C++ only through the screened dispatcher-bypass names",
    "torch._C._dump_local_tls_set": "a reader of thread-local dispatch keys that takes no value",
    "torch._C._enable_mobile_interface_call_export": "mobile export; takes no value",
    "torch._C._is_default_mobile_cpu_allocator_set": "a reader (its name contains `_set`)",
    "torch._C._logging_set_logger": "takes a logger object",
    "torch._C._tracer_*": "TorchScript tracer (refused by the screen), takes objects",
    "torch._C._set_conj": "per-tensor flag (a tensor argument)",
    "torch._C._set_neg": "per-tensor flag (a tensor argument)",
    "torch._C._set_tensor_metadata": "per-tensor metadata",
    "torch._C._set_storage_*": "per-storage error message",
    "torch._C._set_throw_on_mutable_data_ptr": "per-tensor flag",
    "torch._C._set_warn_deprecated_on_mutable_data_ptr": "per-tensor flag",
    "torch._C._set_default_mobile_cpu_allocator": "takes no value (the C++ walk calls it and it is detected)",
    "torch._C._set_default_tensor_type": "takes a tensor type; its effect (default dtype) is in the snapshot",
    "torch.set_default_tensor_type": "takes a tensor type; its effect (default dtype) is in the snapshot",
    "torch._C._set_dispatch_mode": "takes a mode object; the mode stacks are fingerprinted separately",
    "torch._C._set_tracing_state": "TorchScript tracer state object",
    "attribute torch._C._get_tracing_state": "TorchScript tracer state object",
    "torch._C._set_value_trace": "TorchScript tracer, takes a value and a tensor",
    "torch._C._set_worker_*": "DataLoader worker bookkeeping, takes pids / no value",
    "*cpu_allow_fp16_reduced_precision_reduction": "refused on a CPU without FP16 reduction support; the reader is in the snapshot",
    "*set_autocast_dtype": "takes a device type and a dtype; autocast itself is in the snapshot",
    "torch.set_num_interop_threads": "can be set only once, before any inter-op work (refused here)",
    "torch.set_rng_state": "takes a generator state tensor (random numbers, not a kernel choice)",
    "attribute torch.backends.cuda.cufft_plan_cache.caches": "read-only list of plan caches",
    "attribute torch.backends.quantized.supported_engines": "read-only",
    "attribute torch.backends.xnnpack.enabled": "read-only property",
}
# Switches that moved a baseline in practice or are the obvious ones: each must be detected.
MUST_DETECT = [
    "torch.backends.cuda.enable_flash_sdp",
    "torch.backends.cuda.enable_mem_efficient_sdp",
    "torch.backends.cuda.preferred_blas_library",
    "torch.backends.cuda.preferred_linalg_library",
    "torch.backends.mkldnn.set_flags",
    "torch.backends.cudnn.set_flags",
    "torch.backends.mha.set_fastpath_enabled",
    "torch.use_deterministic_algorithms",
    "torch.set_float32_matmul_precision",
    "torch.set_num_threads",
    "torch.set_default_dtype",
    "torch.cuda.tunable.enable",
    "at::Context::setUserEnabledCuDNN",
    "at::Context::setUserEnabledMkldnn",
    "at::Context::setBenchmarkCuDNN",
    "at::Context::setDeterministicCuDNN",
    "at::Context::setAllowTF32CuBLAS",
    "at::Context::setBlasPreferredBackend",
    "at::Context::setLinalgPreferredBackend",
    "at::Context::setSDPUseFlash",
    "at::Context::setSDPUseMemEfficient",
    "at::Context::setFloat32MatmulPrecision",
    "at::Context::setFloat32Precision",
    "at::Context::setDeterministicAlgorithms",
]


def _reason(table: dict[str, str], label: str) -> str | None:
    return next((why for pattern, why in table.items() if fnmatch.fnmatchcase(label, pattern)), None)


@pytest.fixture(scope="module")
def walk() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "sandbox_image"), str(REPO / "platform")])}
    proc = subprocess.run(
        [sys.executable, str(WALK)], capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_every_setter_is_detected_or_explained(walk: dict[str, Any]) -> None:
    results: dict[str, dict[str, Any]] = walk["results"]
    unexplained = []
    for label, result in results.items():
        outcome = result["outcome"]
        if outcome == "detected":
            continue
        table = REFUSED if outcome == "refused" else UNOBSERVED
        if _reason(table, label) is None:
            unexplained.append(f"{label}: {outcome}")
    assert not unexplained, "setters neither detected nor explained:\n" + "\n".join(unexplained)


def test_the_walk_reaches_every_route(walk: dict[str, Any]) -> None:
    results: dict[str, dict[str, Any]] = walk["results"]
    detected = {label for label, r in results.items() if r["outcome"] == "detected"}
    missing = [name for name in MUST_DETECT if name not in detected]
    assert not missing, f"not detected: {missing}"
    context = [label for label in results if label.startswith("at::Context::")]
    assert len(context) >= 30, context  # every set* member of at::Context, called through an alias
    assert sum(label in detected for label in context) >= 25
    assert walk["settings"] >= 150  # the snapshot enumerated from torch, not a hand list


def test_detected_flips_are_restored_where_torch_offers_a_setter(walk: dict[str, Any]) -> None:
    """The baseline guard writes the snapshot back before each baseline call: that must work for the
    switches a candidate reaches through public Python and at::Context."""
    results: dict[str, dict[str, Any]] = walk["results"]
    for name in MUST_DETECT:
        assert results[name].get("restored"), (name, results[name])


def test_baseline_guard_reports_restores_and_skips_clean_calls() -> None:
    """Flip inside a 'candidate call', as forward code would: the next baseline call sees a violation
    and runs with the snapshot's values; with no candidate call in between, nothing is read."""
    snapshot = backend_state.Snapshot()
    guard = worker.BaselineGuard(snapshot)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    flash = torch.backends.cuda.flash_sdp_enabled()
    with torch.no_grad():
        try:
            guard.before("candidate", "device", 0)
            torch.backends.mha.set_fastpath_enabled(not fastpath)
            torch.backends.cuda.enable_flash_sdp(not flash)
            torch._C._set_grad_enabled(True)
            guard.before("eager", "device", 0)
            assert torch.backends.mha.get_fastpath_enabled() is fastpath
            assert torch.backends.cuda.flash_sdp_enabled() is flash
            assert not torch.is_grad_enabled()
            text = "\n".join(guard.violations)
            assert "torch.backends.mha.get_fastpath_enabled()" in text
            assert "flash_sdp_enabled" in text
            assert "before the eager call of trial 0 of the device loop" in text
            assert "autograd was switched back on" in text
            assert all(v.startswith("judge-tampered") for v in guard.violations)
            count = len(guard.violations)
            guard.before("compile", "device", 0)  # no candidate code since: clean, not re-read
            assert len(guard.violations) == count
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
            torch.backends.cuda.enable_flash_sdp(flash)


def test_numerics_switches_are_precision_violations() -> None:
    moved = [("torch._C._get_cublas_allow_tf32", False, True), ("torch.backends.mkldnn.enabled", True, False)]
    assert [v.split(":")[0] for v in tamper.backend_violations(moved)] == ["precision", "judge-tampered"]
