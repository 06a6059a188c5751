"""The content-addressed build cache, on real compilers (workspace layout, CPU kernels).

Uses the judge's default cache (~/.cache/cuda-agent/judge-build or $CUDA_AGENT_JUDGE_CACHE), shared with
every other test and warm CI runs: the torch-heavy binding units compile once per machine, and each test
gives its own kernel a unique token so that what it asserts about misses and hits holds on a warm cache.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from cuda_agent.sandbox.judge import build
from cuda_agent.sandbox.judge.config import default_cache_dir

KERNEL = """#include <cstdint>
// token: {token}
void scale2(const float* in, float* out, int64_t n) {{
  for (int64_t i = 0; i < n; ++i) out[i] = 2.f * in[i];
}}
"""
BINDING = """#include "binding_registry.h"
void scale2(const float* in, float* out, int64_t n);
static torch::Tensor scale2_forward(torch::Tensor x) {
  auto out = torch::empty_like(x);
  scale2(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  return out;
}
REGISTER_BINDING(scale2, [](pybind11::module& m) { m.def("scale2", &scale2_forward); });
"""


def workspace(root: Path, token: str) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "scale.cpp").write_text(KERNEL.format(token=token))
    (root / "kernels" / "scale_binding.cpp").write_text(BINDING)
    return root


def deadline() -> float:
    return time.monotonic() + 900


@pytest.mark.slow
def test_second_build_hits_the_cache_and_a_changed_kernel_rebuilds_alone(tmp_path: Path) -> None:
    cache = build.BuildCache(default_cache_dir())
    toolchain = build.detect_toolchain("cpu")
    root = workspace(tmp_path / "ws", uuid.uuid4().hex)

    first = build.build_workspace(root, toolchain, cache, deadline())
    assert first.ok, first.log
    assert "kernels/scale.cpp: compiled" in first.log
    assert not first.cached

    second = build.build_workspace(root, toolchain, cache, deadline())
    assert second.ok and second.cached
    assert second.extensions[0].path == first.extensions[0].path
    assert second.extensions[0].sha256 == first.extensions[0].sha256

    (root / "kernels" / "scale.cpp").write_text(KERNEL.format(token=uuid.uuid4().hex))
    third = build.build_workspace(root, toolchain, cache, deadline())
    assert third.ok and not third.cached
    assert "kernels/scale.cpp: compiled" in third.log
    assert "kernels/scale_binding.cpp: cached" in third.log
    assert "frozen/binding.cpp: cached" in third.log
    assert third.extensions[0].path != first.extensions[0].path


@pytest.mark.slow
def test_a_header_change_rebuilds_the_units_that_include_it(tmp_path: Path) -> None:
    cache = build.BuildCache(default_cache_dir())
    toolchain = build.detect_toolchain("cpu")
    root = workspace(tmp_path / "ws", uuid.uuid4().hex)
    kernel = root / "kernels" / "scale.cpp"
    kernel.write_text('#include "factor.h"\n' + kernel.read_text().replace("2.f *", "FACTOR *"))
    (root / "kernels" / "factor.h").write_text("#define FACTOR 2.f\n")
    assert build.build_workspace(root, toolchain, cache, deadline()).ok
    (root / "kernels" / "factor.h").write_text("#define FACTOR 3.f\n")
    rebuilt = build.build_workspace(root, toolchain, cache, deadline())
    assert rebuilt.ok and "kernels/scale.cpp: compiled" in rebuilt.log


def test_compile_errors_come_first_in_the_build_log(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws", uuid.uuid4().hex)
    (root / "kernels" / "scale.cpp").write_text("void broken( {\n")
    cache = build.BuildCache(tmp_path / "cache")  # the plain kernel fails before any torch unit matters
    outcome = build._build_units(
        "cuda_extension",
        [build.Unit("kernels/scale.cpp", "cxx-plain", root / "kernels" / "scale.cpp", ["-O1"], [], "x")],
        [],
        build.detect_toolchain("cpu"),
        cache,
        deadline(),
        pch_user_flags=None,
    )
    so, cached, log = outcome
    assert so is None and not cached
    assert log.startswith("== kernels/scale.cpp: FAILED ==")
    assert "error" in log


def test_workspace_without_bindings_is_a_build_failure(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "scale.cpp").write_text(KERNEL.format(token="x"))
    outcome = build.build_workspace(
        root, build.detect_toolchain("cpu"), build.BuildCache(tmp_path / "c"), deadline()
    )
    assert not outcome.ok and outcome.error == "build failed: kernels/ has no *_binding.cpp"


def test_cache_keys_do_not_depend_on_where_the_venv_lives() -> None:
    """The same torch in a venv at another path (a fresh clone) must hit the same cache entries."""
    here = build.detect_toolchain("cpu")
    assert here.site_packages and all(here.site_packages in p for p in here.torch_includes[:1])

    def moved(toolchain: build.Toolchain, site: str) -> build.Toolchain:
        swap = lambda p: p.replace(toolchain.site_packages, site)  # noqa: E731
        return dataclasses.replace(
            toolchain,
            torch_includes=tuple(swap(p) for p in toolchain.torch_includes),
            torch_lib=swap(toolchain.torch_lib),
            site_packages=site,
        )

    elsewhere = moved(here, "/elsewhere/venv/lib/python3.11/site-packages")
    assert elsewhere.tag == here.tag
    flags = ["-isystem", f"{here.site_packages}/torch/include", "-O1"]
    flags_elsewhere = ["-isystem", f"{elsewhere.site_packages}/torch/include", "-O1"]
    assert here.key(flags) == elsewhere.key(flags_elsewhere)
    assert here.key(flags) != here.key(["-isystem", "/other/include", "-O1"])
    other_torch = dataclasses.replace(here, torch_version="0.0.0")
    assert other_torch.tag != here.tag


def test_vendor_libraries_are_found_where_torch_keeps_them(tmp_path: Path) -> None:
    """pip wheels ship only versioned libraries (libcudnn.so.9): the link names that file exactly."""
    site = tmp_path / "site"
    for sub, header, lib in (
        ("cudnn", "cudnn.h", "libcudnn.so.9"),
        ("cu13", "cublas_v2.h", "libcublas.so.13"),
    ):
        (site / "nvidia" / sub / "include").mkdir(parents=True)
        (site / "nvidia" / sub / "lib").mkdir(parents=True)
        (site / "nvidia" / sub / "include" / header).write_text("")
        (site / "nvidia" / sub / "lib" / lib).write_text("")
    toolkit = tmp_path / "cuda"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "lib64").mkdir()
    (toolkit / "include" / "cublasLt.h").write_text("")
    (toolkit / "lib64" / "libcublasLt.so").write_text("")
    found = {lib.name: lib for lib in build.find_vendor_libraries(str(site), str(toolkit))}
    assert found["cudnn"].link == "-l:libcudnn.so.9"
    assert found["cudnn"].include_dir == str(site / "nvidia" / "cudnn" / "include")
    assert found["cublas"].link == "-l:libcublas.so.13"
    assert found["cublasLt"].link == "-lcublasLt" and found["cublasLt"].lib_dir == str(toolkit / "lib64")
    toolchain = dataclasses.replace(build.detect_toolchain("cpu"), vendor=tuple(found.values()))
    assert toolchain.link_args(["cudnn"]) == [
        "-L",
        str(site / "nvidia" / "cudnn" / "lib"),
        "-l:libcudnn.so.9",
    ]
    # A workspace links what its sources include; a load_inline spec's -lcudnn points at torch's copy.
    texts = ["#include <cudnn.h>\n", '#include "cublasLt.h"\n']
    assert build.vendor_libraries_used(texts) == ["cudnn", "cublasLt", "cublas"]
    spec = {"extra_ldflags": ["-lcudnn", "-lm"], "units": [{"code": "#include <cublas_v2.h>\n"}]}
    assert build._spec_ldflags(spec, toolchain) == [
        "-lm",
        *toolchain.link_args(["cublas"]),
        *toolchain.link_args(["cudnn"]),
    ]
    # CPU toolchains carry no vendor libraries and keep their cache keys.
    cpu = build.detect_toolchain("cpu")
    assert cpu.vendor == () and dataclasses.replace(cpu, vendor=()).tag == cpu.tag != toolchain.tag


def test_published_entries_never_change(tmp_path: Path) -> None:
    """First writer wins: a second build of the same unit (nvcc output differs byte for byte) is dropped."""
    cache = build.BuildCache(tmp_path / "cache")
    final = cache.obj("ab" + "0" * 62)
    for content in (b"first", b"second"):
        produced = cache.scratch() / "unit.o"
        produced.write_bytes(content)
        cache.publish(produced, final)
        assert not produced.exists()
    assert final.read_bytes() == b"first"


@pytest.mark.parametrize(("umask", "mode"), [(0o007, 0o660), (0o077, 0o600)])
def test_collected_sources_get_what_the_umask_grants(tmp_path: Path, umask: int, mode: int) -> None:
    """A load_inline unit written into src/<digest>/ (atomically, through a temp file) is readable by the
    judges' group when the cache is shared (umask 007): another slot's judge compiles the same file. It
    was 0600 whatever the umask, and 8 sessions on one H200 failed with PermissionError."""
    old = os.umask(umask)
    try:
        build.write_source(tmp_path / "main.cpp", "int f() { return 1; }\n")
        build.write_source(tmp_path / "main.cpp", "int f() { return 2; }\n")  # replaced: the same mode
    finally:
        os.umask(old)
    assert (tmp_path / "main.cpp").stat().st_mode & 0o777 == mode
    assert (tmp_path / "main.cpp").read_text() == "int f() { return 2; }\n"


def test_cache_cap_evicts_least_recently_used_idle_entries(tmp_path: Path) -> None:
    cache = build.BuildCache(tmp_path / "cache")
    now = time.time()
    entries = []
    for i, age in enumerate((7200, 5400, 10)):  # seconds since last use
        path = cache.obj(f"{i:02d}" + "0" * 62)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1000)
        os.utime(path, (now - age, now - age))
        entries.append(path)
    removed, left = cache.evict(max_bytes=1500, min_idle_s=3600)
    # the oldest goes first; the one used 10 s ago stays even though the cap is not met yet
    assert (removed, left) == (2000, 1000)
    assert [p.exists() for p in entries] == [False, False, True]
    build.BuildCache.touch(entries[2])
    assert cache.size() == 1000


# -- lighter header variants (load_inline CUDA units on the GPU; the mechanism is generic, tried here
# with g++ on plain C++ units, where the "heavy" variant needs a header that the light one does not) -------

HEAVY_UNIT = (
    "#include <map>\n// {token}\nint pick(int x) {{ std::map<int, int> m{{{{x, 1}}}}; return m[x]; }}\n"
)


def _variant_unit(directory: Path, name: str, code: str, label: str) -> build.Unit:
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / name
    source.write_text(code)
    return build.Unit(label, "cxx-plain", source, ["-O1", "-fPIC"], [], "variants")


def _build_with_variants(
    tmp_path: Path, light_code: str, cache: build.BuildCache, token: str
) -> tuple[str, str]:
    exact = _variant_unit(tmp_path / "src", "unit.cpp", HEAVY_UNIT.format(token=token), "variants/unit.cpp")
    exact.lighter = [_variant_unit(tmp_path / "src", "unit.light.cpp", light_code + f"// {token}\n", "light")]
    so, _, log = build._build_units(
        "variants", [exact], [], build.detect_toolchain("cpu"), cache, deadline(), pch_user_flags=None
    )
    assert so is not None, log
    return log, exact.lighter[0].key


def test_the_lightest_variant_that_compiles_is_used(tmp_path: Path) -> None:
    cache = build.BuildCache(tmp_path / "cache")
    log, _ = _build_with_variants(tmp_path, "int pick(int x) { return x > -1; }\n", cache, uuid.uuid4().hex)
    assert "light: compiled" in log and "variants/unit.cpp" not in log


def test_a_lighter_variant_that_fails_falls_back_and_is_not_retried(tmp_path: Path) -> None:
    cache = build.BuildCache(tmp_path / "cache")
    broken = "int pick(int x) { std::map<int, int> m; return m[x]; }\n"  # needs <map>: does not compile
    token = uuid.uuid4().hex
    log, light_key = _build_with_variants(tmp_path, broken, cache, token)
    assert "variants/unit.cpp: compiled" in log and "FAILED" not in log
    marker = build._failure_marker(cache, light_key)
    assert marker.exists()
    os.utime(marker, (1.0, 1.0))
    again, _ = _build_with_variants(tmp_path, broken, cache, token)
    assert "variants/unit.cpp: cached" in again
    assert marker.stat().st_mtime == 1.0  # known to fail: not compiled (nor marked) again


def test_when_every_variant_fails_the_log_shows_the_exact_sources_error(tmp_path: Path) -> None:
    cache = build.BuildCache(tmp_path / "cache")
    exact = _variant_unit(tmp_path / "src", "unit.cpp", "int broken( {\n", "variants/unit.cpp")
    exact.lighter = [_variant_unit(tmp_path / "src", "unit.light.cpp", "also broken(\n", "light")]
    so, _, log = build._build_units(
        "variants", [exact], [], build.detect_toolchain("cpu"), cache, deadline(), pch_user_flags=None
    )
    assert so is None
    assert log.startswith("== variants/unit.cpp: FAILED ==") and "light" not in log


def test_a_cancelled_compile_is_killed_with_its_children(tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    marker = tmp_path / "child-ran"
    with pytest.raises(build._Cancelled):
        build._run_compiler(
            ["sh", "-c", f"(sleep 3; touch {marker}) & wait"], tmp_path, time.monotonic() + 30, cancel
        )
    assert time.monotonic() - started < 2.5
    time.sleep(3.5)
    assert not marker.exists()  # the grandchild died with the process group


def test_lighter_cuda_sources_drop_torch_headers_only_as_far_as_the_source_allows() -> None:
    raw = "#include <torch/types.h>\n#include <cuda.h>\n__global__ void k(float* x) { x[0] = 1.f; }\n"
    variants = build.lighter_cuda_sources(raw)
    assert [what for what, _ in variants] == ["without torch headers", "with the judge's light torch header"]
    assert "torch/" not in variants[0][1] and "<cuda.h>" in variants[0][1]
    assert variants[1][1].startswith(f'#include "{build.LIGHT_HEADER}"')
    uses_torch = raw + "#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x) { return x; }\n"
    assert [what for what, _ in build.lighter_cuda_sources(uses_torch)] == [
        "with the judge's light torch header"
    ]
    assert build.lighter_cuda_sources("__global__ void k() {}\n") == []
