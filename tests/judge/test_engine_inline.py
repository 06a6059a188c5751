"""The judge's load_inline replacement: source assembly like torch's, stable digests, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.sandbox.judge import inline


def test_inline_spec_matches_torch_assembly_and_is_stable() -> None:
    spec = inline.inline_spec("ext_a", "int f();", "__global__ void k() {}", ["f"], ["-O3"])
    main, cuda = spec["units"]
    assert main["file"] == "main.cpp" and main["code"].startswith("#include <torch/extension.h>\nint f();")
    assert 'm.def("f", torch::wrap_pybind_function(f), "f");' in main["code"]
    assert cuda["code"].startswith("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>")
    assert spec["with_cuda"] is True
    again = inline.inline_spec("ext_a", ["int f();"], ["__global__ void k() {}"], {"f": "f"}, ["-O3"])
    assert again["digest"] == spec["digest"]
    changed = inline.inline_spec("ext_a", "int f();", "__global__ void k() {}", ["f"], ["-O2"])
    assert changed["digest"] != spec["digest"]


@pytest.mark.parametrize("name", ["torch", "os", "bad-name", "x" * 70, "cuda_extension", 3])
def test_extension_names_that_shadow_modules_are_refused(name: object) -> None:
    with pytest.raises(inline.ExtensionError):
        inline.inline_spec(name, "int f();")


def test_function_names_and_docstrings_cannot_inject_code() -> None:
    with pytest.raises(inline.ExtensionError):
        inline.inline_spec("ext_b", "", functions=['f"); system("x'])
    with pytest.raises(inline.ExtensionError):
        inline.inline_spec("ext_b", "", functions={"f": 'doc"); system("x'})


def test_file_spec_reads_sources_inside_the_candidate_only(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    spec = inline.file_spec("ext_c", ["k.cu"], root=tmp_path)
    assert spec["units"] == [{"file": "k.cu", "lang": "cuda", "code": "__global__ void k() {}\n"}]
    with pytest.raises(inline.ExtensionError, match="inside the candidate"):
        inline.file_spec("ext_c", ["../outside.cpp"], root=tmp_path)


def test_collector_records_specs_and_returns_a_placeholder() -> None:
    import torch.utils.cpp_extension as cpp_extension

    original = (cpp_extension.load_inline, cpp_extension.load)
    records: list[dict[str, object]] = []
    try:
        inline.install_collector(records)
        module = cpp_extension.load_inline(
            name="ext_d", cpp_sources="int f();", functions=["f"], verbose=True
        )
        assert module.f(1, 2) is None
    finally:
        cpp_extension.load_inline, cpp_extension.load = original
    assert [r["name"] for r in records] == ["ext_d"]


def test_loader_refuses_unbuilt_sources(tmp_path: Path) -> None:
    import torch.utils.cpp_extension as cpp_extension

    original = (cpp_extension.load_inline, cpp_extension.load)
    try:
        inline.install_loader({}, tmp_path, lambda module: None)
        with pytest.raises(inline.ExtensionError, match="not built in the build phase"):
            cpp_extension.load_inline(name="ext_e", cpp_sources="int f();")
    finally:
        cpp_extension.load_inline, cpp_extension.load = original
