"""Observation -> violation rules: op allowlist, kernel evidence, streams, the host-side cross-check."""

from __future__ import annotations

from cuda_agent.sandbox.judge import policy
from cuda_agent.sandbox.judge.config import OpPolicy, ProfileSettings

OPS = OpPolicy()


def kernel(name: str, origin: str = "extension", stream: int = 7) -> dict[str, object]:
    return {"name": name, "stream": stream, "ns": 1000, "origin": origin, "in_ext": origin == "extension"}


def call(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "ops": [["aten::empty_like", False, 1]],
        "profiler_ops": [],
        "ext_calls": {"ext.relu": 1},
        "kernels": [kernel("void relu_kernel<float>(float const*, float*, int)")],
        "current_stream": 7,
        "profiler_error": None,
    }
    base.update(fields)
    return base


def violations(report: dict[str, object], device: str = "cuda") -> list[str]:
    return policy.call_violations(
        report, device=device, policy=OPS, custom_ops=set(), global_kernels=["relu_kernel"]
    )


def test_clean_call_has_no_violations() -> None:
    assert violations(call()) == []


def test_compute_ops_are_torch_compute_and_gemm_only_inside_the_extension() -> None:
    report = call(ops=[["aten::relu", False, 1], ["aten::mm", True, 1], ["aten::addmm", False, 1]])
    assert violations(report) == [
        "torch-compute: aten::addmm outside the candidate's extension",
        "torch-compute: aten::relu",
    ]
    assert policy.op_violations([("myns::fused", False)], OPS, {"myns::fused"}) == []
    assert policy.op_violations([("torchvision::nms", False)], OPS, set()) == [
        "torch-compute: torchvision::nms"
    ]


def test_no_extension_call_or_no_own_kernel_is_no_custom_kernel() -> None:
    assert violations(call(ext_calls={})) == [
        "no-custom-kernel: forward called no function of the candidate's extension"
    ]
    # A GEMM reached through an aten op (at::mm in the extension) is not the candidate's own device work,
    # nor is a memset alone.
    through_aten = call(kernels=[kernel(CUBLAS, origin="aten::mm")], ops=[["aten::mm", True, 1]])
    assert [v.split(":")[0] for v in violations(through_aten)] == ["no-custom-kernel"]
    assert [v.split(":")[0] for v in violations(call(kernels=[kernel("Memset (Device)")]))] == [
        "no-custom-kernel"
    ]
    # on the CPU there are no kernels to see: the extension call is the evidence
    assert violations(call(kernels=[]), device="cpu") == []


# Kernel names seen on the H200 (tests/gpu/judge_gpu.py, cuBLAS / cuBLASLt / cuDNN fixtures).
CUBLAS = (
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4"
    "_execute_kernel__5x_cublas"
)
CUDNN = (
    "sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize256x64x8_stage3_warpsize2x2x1_g1"
    "_ffma_aligna4_alignc4_execute_kernel__5x_cudnn"
)


def test_library_kernels_launched_by_the_extension_count_as_its_device_work() -> None:
    assert violations(call(kernels=[kernel(CUBLAS)])) == []
    assert violations(call(kernels=[kernel("Memset (Device)"), kernel(CUDNN)])) == []
    assert violations(call(kernels=[kernel(CUBLAS), kernel("bias_relu_kernel(float*)")])) == []
    assert policy.library_of(CUDNN, OPS) == "cudnn" and policy.library_of(CUBLAS, OPS) == "cublas"
    # The allowed libraries are configuration: without cuDNN, a cuDNN-only candidate has no device work.
    no_cudnn = OpPolicy(libraries={"cublas": ("_cublas$",)})
    found = policy.call_violations(
        call(kernels=[kernel(CUDNN)]), device="cuda", policy=no_cudnn, custom_ops=set(), global_kernels=[]
    )
    assert [v.split(":")[0] for v in found] == ["no-custom-kernel"]
    # A library kernel launched from Python (outside the extension) is still PyTorch-side compute.
    from_python = call(kernels=[kernel("relu_kernel(float*)"), kernel(CUBLAS, origin="python")])
    assert any(v.startswith("torch-compute: kernel sm80_xmma") for v in violations(from_python))


def test_library_work_on_its_own_stream_is_not_a_side_stream() -> None:
    """cuDNN issued two memsets on a stream of its own (stream 29 vs current 7, seen on the H200)."""
    report = call(kernels=[kernel("Memset (Device)", stream=29), kernel(CUDNN, stream=7)])
    assert violations(report) == []
    assert policy.library_notes(report, OPS, ["relu_kernel"]) == [
        "library work (cudnn): " + CUDNN[:100],
        "library work (memory) on its own stream 29: Memset (Device)",
    ]
    # The candidate's own kernel on another stream stays a side stream, library kernels beside it or not.
    own_side = call(kernels=[kernel(CUDNN), kernel("relu_kernel(float*)", stream=13)])
    assert [v.split(":")[0] for v in violations(own_side)] == ["side-stream"]
    # Library work not launched by the extension's own call (another thread) is not tolerated.
    other_thread = call(
        kernels=[kernel(CUBLAS, origin="other-thread", stream=29), kernel("relu_kernel(float*)")]
    )
    assert [v.split(":")[0] for v in violations(other_thread)] == ["side-stream"]


def test_static_compute_ops_follow_the_op_policy() -> None:
    ops = policy.static_compute_ops(OPS)
    assert {"relu", "sigmoid", "add", "_softmax"} <= ops
    # allowed anywhere, allowed in the extension, or composite (decided by what it decomposes into)
    assert not {"empty", "empty_like", "mm", "matmul", "convolution", "einsum", "flatten"} & ops


def test_side_streams_threads_and_python_launches() -> None:
    assert violations(call(kernels=[kernel("relu_kernel(float*)", stream=13)]))[0].startswith("side-stream")
    hidden = call(
        kernels=[kernel("relu_kernel(float*)"), kernel("relu_kernel(float*)", origin="unattributed")]
    )
    assert any(v.startswith("side-stream") for v in violations(hidden))
    triton = call(kernels=[kernel("relu_kernel(float*)"), kernel("triton_poi_fused_relu_0", origin="python")])
    assert any(v.startswith("torch-compute: kernel triton_poi") for v in violations(triton))
    native = call(
        kernels=[kernel("relu_kernel(float*)"), kernel("void at::native::vectorized_elementwise_kernel<4>")]
    )
    assert any(v.startswith("torch-compute: PyTorch kernel") for v in violations(native))


def test_kernel_name_matching() -> None:
    assert policy.kernel_matches("void ns::relu_kernel<float, 4>(float const*, float*, int)", ["relu_kernel"])
    assert policy.kernel_matches("relu_kernel", ["relu_kernel"])
    assert not policy.kernel_matches("void my_relu_kernel2(float*)", ["relu_kernel"])


def timing(
    host_cand: float, dev_cand: float, host_eager: float = 0.11, dev_eager: float = 0.1
) -> dict[str, object]:
    return {
        "host": {"candidate": host_cand, "eager": host_eager},
        "device": {
            "candidate": {"median": dev_cand, "kernels_per_call": 1},
            "eager": {"median": dev_eager},
            "unattributed_ms": 0.0,
        },
    }


def test_host_cross_check_allows_launch_overhead_and_catches_hidden_work() -> None:
    settings = ProfileSettings()
    assert policy.timing_violations(timing(0.06, 0.05), settings)[0] == []
    found, notes = policy.timing_violations(timing(0.50, 0.05), settings)
    assert [v.split(":")[0] for v in found] == ["timing-mismatch"]
    assert notes and notes[0].startswith("host cross-check")
