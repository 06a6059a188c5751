"""The judge's read-only seed of precompiled headers (build._ensure_pch, build.seed_pch).

The compiler here is a stand-in script that writes what it is asked to (`-o FILE`) and logs its command
line: the real precompiled header takes ~40 s on two cores, and what these tests check is which header a
build uses, which one it builds and what it writes where, not GCC. The real compiler builds and uses the
seed in the real-judge server tests (tests/sandbox/test_real_judge.py: its verdicts say the seed was used).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from cuda_agent.api.judge_files import JUDGE_SEED_ENV
from cuda_agent.sandbox.judge import build

FAKE_CXX = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls.log"
out=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out="$arg"; fi
  prev="$arg"
done
printf 'built by the stand-in compiler' > "$out"
"""
SEED_NOTE = "from the judge seed"


@pytest.fixture
def toolchain(tmp_path: Path) -> build.Toolchain:
    cxx = tmp_path / "bin" / "g++"
    cxx.parent.mkdir()
    cxx.write_text(FAKE_CXX)
    cxx.chmod(0o755)
    return build.Toolchain(
        device="cpu",
        cxx=str(cxx),
        cxx_version="g++ (test) 13",
        nvcc=None,
        nvcc_version="",
        torch_version="2.11.0+test",
        torch_includes=(str(tmp_path / "torch" / "include"),),
        torch_lib=str(tmp_path / "torch" / "lib"),
        cuda_lib=None,
        cuda_arch_flags=(),
        cpu_model="test cpu",
    )


def calls(toolchain: build.Toolchain) -> list[str]:
    log = Path(toolchain.cxx).parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def header_builds(toolchain: build.Toolchain) -> list[str]:
    return [c for c in calls(toolchain) if "c++-header" in c]


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """(mode, size, mtime) of every entry: a judge must leave the seed exactly as it found it."""
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def make_seed(toolchain: build.Toolchain, seed: Path, *flag_sets: tuple[str, ...]) -> None:
    """What `cuda-agent judge-seed` does, with the stand-in compiler (it holds the seed's lock)."""
    for sub in ("pch", "tmp"):
        (seed / sub).mkdir(parents=True, exist_ok=True)
    for flags in flag_sets:
        build.seed_pch(toolchain, seed, flags, time.monotonic() + 60)


def ensure(toolchain: build.Toolchain, cache: Path, flags: tuple[str, ...]) -> tuple[str, Path, str]:
    return build._ensure_pch(toolchain, build.BuildCache(cache), list(flags), time.monotonic() + 60)


def test_a_seed_entry_is_used_in_place_and_never_written(
    toolchain: build.Toolchain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = tmp_path / "seed"
    make_seed(toolchain, seed, (build.BINDING_OPT,))
    assert len(header_builds(toolchain)) == 1
    before = snapshot(seed)
    monkeypatch.setenv(JUDGE_SEED_ENV, str(seed))
    key, header, note = ensure(toolchain, tmp_path / "cache", (build.BINDING_OPT,))
    assert header == seed / "pch" / key / build.PCH_HEADER and SEED_NOTE in note
    assert len(header_builds(toolchain)) == 1  # nothing built
    assert not any((tmp_path / "cache" / "pch").iterdir())  # nor copied into the writable cache
    assert snapshot(seed) == before


def test_the_writable_cache_comes_first(
    toolchain: build.Toolchain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, built, note = ensure(toolchain, tmp_path / "cache", ("-O3",))
    assert "built once" in note and built.is_relative_to(tmp_path / "cache")
    make_seed(toolchain, tmp_path / "seed", ("-O3",))
    monkeypatch.setenv(JUDGE_SEED_ENV, str(tmp_path / "seed"))
    assert ensure(toolchain, tmp_path / "cache", ("-O3",))[1:] == (built, "")


@pytest.mark.parametrize("damage", ["missing", "other-flags", "no-gch", "wrong-header", "unreadable-root"])
def test_without_a_complete_entry_the_header_is_built_into_the_cache(
    toolchain: build.Toolchain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    seed = tmp_path / "seed"
    make_seed(toolchain, seed, ("-O3",))
    key = build._pch_entry(toolchain, ["-O3"])[0]
    entry = seed / "pch" / key
    if damage == "missing":
        shutil.rmtree(entry)
    elif damage == "no-gch":  # a build stopped between its two files
        (entry / f"{build.PCH_HEADER}.gch").unlink()
    elif damage == "wrong-header":
        (entry / build.PCH_HEADER).write_text("#pragma once\n#include <other.h>\n")
    before = snapshot(seed)
    seed_env = tmp_path / "nowhere" if damage == "unreadable-root" else seed
    monkeypatch.setenv(JUDGE_SEED_ENV, str(seed_env))
    flags = ("-O2",) if damage == "other-flags" else ("-O3",)
    _, header, note = ensure(toolchain, tmp_path / "cache", flags)
    assert header.is_relative_to(tmp_path / "cache") and "built once" in note
    assert len(header_builds(toolchain)) == 2  # the seed's one, and this
    assert snapshot(seed) == before


def test_seeding_is_idempotent_readable_by_all_and_replaces_a_partial_entry(
    toolchain: build.Toolchain, tmp_path: Path
) -> None:
    seed = tmp_path / "seed"
    flag_sets = list(build.SEED_FLAG_SETS.values())
    make_seed(toolchain, seed, *flag_sets)
    entries = sorted((seed / "pch").iterdir())
    assert len(entries) == len(flag_sets) == len(header_builds(toolchain))
    for entry in entries:
        assert entry.stat().st_mode & 0o777 == 0o755
        assert {p.name: p.stat().st_mode & 0o777 for p in entry.iterdir()} == {
            build.PCH_HEADER: 0o644,
            f"{build.PCH_HEADER}.gch": 0o644,
        }
    make_seed(toolchain, seed, *flag_sets)  # present: nothing compiled again
    assert len(header_builds(toolchain)) == len(flag_sets)
    (entries[0] / f"{build.PCH_HEADER}.gch").unlink()
    make_seed(toolchain, seed, *flag_sets)
    assert len(header_builds(toolchain)) == len(flag_sets) + 1
    assert (entries[0] / f"{build.PCH_HEADER}.gch").is_file()
    assert not any((seed / "tmp").iterdir())


def test_candidates_built_with_default_flags_hit_the_seed(
    toolchain: build.Toolchain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys match: a workspace's bindings and load_inline specs (no extra_cflags, and -O3), built through
    the judge's own build functions, compile against the seed's headers and build none."""
    from cuda_agent.sandbox.judge.inline import inline_spec

    seed = tmp_path / "seed"
    make_seed(toolchain, seed, *build.SEED_FLAG_SETS.values())
    before = snapshot(seed)
    monkeypatch.setenv(JUDGE_SEED_ENV, str(seed))
    cache = build.BuildCache(tmp_path / "cache")
    deadline = time.monotonic() + 120
    workspace = tmp_path / "workspace"
    (workspace / "kernels").mkdir(parents=True)
    (workspace / "kernels" / "relu_binding.cpp").write_text("#include <torch/extension.h>\n")
    outcomes = [build.build_workspace(workspace, toolchain, cache, deadline)]
    source = "torch::Tensor twice(torch::Tensor x) { return x; }"
    for extra_cflags in (None, ["-O3"]):
        spec = inline_spec(f"ext_{len(outcomes)}", [source], functions=["twice"], extra_cflags=extra_cflags)
        outcomes.append(build.build_specs([spec], workspace, toolchain, cache, deadline))
    for outcome in outcomes:
        assert outcome.ok, outcome.log
        assert SEED_NOTE in outcome.log
    torch_compiles = [c for c in calls(toolchain) if " -include " in c]
    assert torch_compiles and all(f"-include {seed}/pch/" in c for c in torch_compiles)
    assert len(header_builds(toolchain)) == len(build.SEED_FLAG_SETS)  # only the seed's own
    assert not any((tmp_path / "cache" / "pch").iterdir())
    assert snapshot(seed) == before


def test_the_header_key_ignores_the_gpu_and_cpu_but_not_the_compiler(toolchain: build.Toolchain) -> None:
    """A seed built where no GPU exists (an image build) or on another CPU keys as the judge does where
    it runs; another compiler or torch does not."""
    import dataclasses

    key = build._pch_entry(toolchain, ["-O3"])[0]
    elsewhere = dataclasses.replace(toolchain, cpu_model="other cpu", cuda_arch_flags=("-gencode=x",))
    assert build._pch_entry(elsewhere, ["-O3"])[0] == key
    for changed in (
        dataclasses.replace(toolchain, cxx_version="g++ 14"),
        dataclasses.replace(toolchain, torch_version="2.12.0"),
    ):
        assert build._pch_entry(changed, ["-O3"])[0] != key
    native = ["-O3", "-march=native"]
    assert build._pch_entry(elsewhere, native)[0] != build._pch_entry(toolchain, native)[0]
