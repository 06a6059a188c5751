"""Turns what the worker observed into contract violations (orchestrator side, pure functions).

Kept apart from the recorders so the rules can be read and tested on their own: which aten ops count as
compute, what counts as evidence of the candidate's own kernel, when a stream is a side stream, and
when host time disagrees with device time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from cuda_agent.sandbox.judge import protocol
from cuda_agent.sandbox.judge.config import OpPolicy, ProfileSettings

# Kernels of PyTorch's own implementation (as opposed to cuBLAS/cuDNN/CUTLASS library kernels).
TORCH_KERNEL = re.compile(r"\bat::native::|\bat::cuda::|\bat_cuda_detail::|\bc10::cuda::|\bat::detail::")


def _base(op: str) -> tuple[str, str]:
    namespace, _, name = op.partition("::")
    return namespace, name.split(".")[0]


def op_violations(
    ops: Iterable[tuple[str, bool] | tuple[str, bool, int] | list[Any]],
    policy: OpPolicy,
    custom_ops: set[str],
) -> list[str]:
    """`torch-compute` for every op outside the allowlist (GEMM/conv only inside the extension)."""
    found: list[str] = []
    for entry in ops:
        name, in_ext = str(entry[0]), bool(entry[1])
        if name in custom_ops:
            continue
        namespace, base = _base(name)
        if namespace == "aten":
            if base in policy.anywhere or (in_ext and base in policy.in_extension):
                continue
            where = " outside the candidate's extension" if base in policy.in_extension else ""
            found.append(f"torch-compute: aten::{base}{where}")
        else:
            found.append(f"torch-compute: {name}")
    return sorted(set(found))


def kernel_matches(kernel_name: str, global_names: Iterable[str]) -> bool:
    """A launched kernel is one of the candidate's `__global__` functions (demangled, maybe templated)."""
    return any(
        re.search(rf"(?<![\w]){re.escape(g)}\s*[<(]", kernel_name) or kernel_name == g for g in global_names
    )


# Device memory operations (kineto names them "Memset (Device)", "Memcpy DtoD (Device -> Device)"...).
MEMORY_OP = re.compile(r"^Mem(?:set|cpy)\b")


def library_of(kernel_name: str, policy: OpPolicy) -> str | None:
    """The allowed library (`OpPolicy.libraries`) whose kernel names match, if any."""
    for library, patterns in policy.libraries.items():
        if any(re.search(p, kernel_name) for p in patterns):
            return library
    return None


def library_work(kernel: dict[str, Any], policy: OpPolicy, global_kernels: Iterable[str]) -> str | None:
    """What an allowed library launched on the candidate's behalf: a library kernel, or a memset/memcpy,
    launched directly by extension code (inside an extension call, on the forward's thread, no aten op
    around the launch) that is neither one of the candidate's own kernels nor a PyTorch kernel. Returns
    the library's name ("memory" for a memset/memcpy), or None."""
    name = str(kernel["name"])
    if (
        kernel.get("origin") != "extension"
        or kernel_matches(name, global_kernels)
        or TORCH_KERNEL.search(name)
    ):
        return None
    if MEMORY_OP.match(name):
        return "memory"
    return library_of(name, policy)


def call_violations(
    report: protocol.CallReport,
    *,
    device: str,
    policy: OpPolicy,
    custom_ops: set[str],
    global_kernels: list[str],
) -> list[str]:
    """Violations from one observed forward call (ops, extension calls, kernels, streams)."""
    found = op_violations(report.get("ops", []), policy, custom_ops)
    found += op_violations(report.get("profiler_ops", []), policy, custom_ops)
    if not report.get("ext_calls"):
        found.append("no-custom-kernel: forward called no function of the candidate's extension")
    if device == "cuda" and report.get("profiler_error") is None:
        kernels = report.get("kernels", [])
        current = report.get("current_stream")
        own = [k for k in kernels if kernel_matches(k["name"], global_kernels)]
        # A library kernel (cuBLAS, cuDNN: `OpPolicy.libraries`) launched by the extension is device
        # work the candidate chose, like its own kernel; a memset/memcpy alone is not.
        library = [k for k in kernels if library_work(k, policy, global_kernels) not in (None, "memory")]
        if not own and not library:
            names = ", ".join(global_kernels) or "none found in the sources"
            allowed = ", ".join(sorted(policy.libraries)) or "none"
            found.append(
                f"no-custom-kernel: no launch of the candidate's own __global__ kernels ({names}) "
                f"nor of an allowed library's kernels ({allowed}) from its extension"
            )
        for k in kernels:
            short = k["name"][:120]
            if k["origin"] == "unattributed":
                found.append(f"side-stream: kernel {short} was launched outside the forward's thread")
            elif (
                current is not None
                and k["stream"] != current
                and library_work(k, policy, global_kernels) is None
            ):
                # Work a library launched on a stream of its own (cuDNN's workspace memset) is not the
                # candidate hiding work: it is timed on every stream all the same, outputs are compared
                # again after a full device sync, and the host cross-check still bounds the call.
                found.append(
                    f"side-stream: kernel {short} ran on stream {k['stream']}, "
                    f"not the current stream {current}"
                )
            if kernel_matches(k["name"], global_kernels):
                continue
            if k["origin"] == "python":
                found.append(f"torch-compute: kernel {short} launched from Python, outside the extension")
            elif k["origin"] == "extension" and TORCH_KERNEL.search(k["name"]):
                found.append(f"torch-compute: PyTorch kernel {short} called directly from the extension")
    return sorted(set(found))


def library_notes(report: protocol.CallReport, policy: OpPolicy, global_kernels: list[str]) -> list[str]:
    """Which allowed libraries' work the call launched, and what of it ran on a stream of its own."""
    notes: list[str] = []
    current = report.get("current_stream")
    for k in report.get("kernels", []):
        library = library_work(k, policy, global_kernels)
        if library is None:
            continue
        where = f" on its own stream {k['stream']}" if current is not None and k["stream"] != current else ""
        notes.append(f"library work ({library}){where}: {str(k['name'])[:100]}")
    return sorted(set(notes))


def timing_violations(
    result: protocol.ProfileResult, settings: ProfileSettings
) -> tuple[list[str], list[str]]:
    """(violations, notes) of the host-side cross-check: K calls between full device synchronisations
    may take longer than their device time only by a launch allowance derived from eager's own gap."""
    notes: list[str] = []
    host = result.get("host") or {}
    device = result.get("device") or {}
    if "candidate" not in host or "eager" not in host:
        return [], notes
    cand_dev = device.get("candidate", {}).get("median")
    eager_dev = device.get("eager", {}).get("median")
    if cand_dev is None or eager_dev is None:
        return [], notes
    eager_gap = max(host["eager"] - eager_dev, 0.0)
    kernels = max(1.0, float(device.get("candidate", {}).get("kernels_per_call") or 1))
    allowed = 2.0 * eager_gap + settings.host_gap_ms + settings.host_gap_per_kernel_ms * kernels
    gap = host["candidate"] - cand_dev
    notes.append(
        f"host cross-check: candidate {host['candidate']:.4f} ms/call on the host vs "
        f"{cand_dev:.4f} ms device "
        f"(gap {gap:.4f}, allowed {allowed:.4f}; eager gap {eager_gap:.4f})"
    )
    unattributed = float(device.get("unattributed_ms") or 0.0)
    if unattributed > 0:
        notes.append(
            f"{unattributed:.4f} ms of device work during profiling was not attributed to a timed call"
        )
    if gap > allowed:
        return [
            f"timing-mismatch: {host['candidate']:.4f} ms/call measured around full device syncs but only "
            f"{cand_dev:.4f} ms of device time (allowed gap {allowed:.4f} ms): "
            "work hidden from the device timer"
        ], notes
    return [], notes


def static_compute_ops(policy: OpPolicy) -> frozenset[str]:
    """aten ops (base names) that `torch::op(...)` / `at::op(...)` in extension code would run as
    forbidden compute: every aten op outside both allowlists that has kernels of its own. Composite ops
    (einsum, which decomposes into allowed GEMMs) are left to the run-time recording, which sees what
    they decompose into."""
    import torch  # the orchestrator has torch loaded already; this module stays importable without it

    has_kernel: Any = torch._C._dispatch_has_kernel_for_dispatch_key
    composite: set[str] = set()
    names: set[str] = set()
    for full in torch._C._dispatch_get_all_op_names():
        namespace, base = _base(full)
        if namespace != "aten" or base in policy.anywhere or base in policy.in_extension:
            continue
        names.add(base)
        if has_kernel(full, "CompositeImplicitAutograd"):
            composite.add(base)
    return frozenset(names - composite)
