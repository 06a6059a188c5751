"""The sandbox image's inputs, checked without a container engine (none runs on these machines, so the
image itself is not built here): every file the Dockerfile copies exists, and the wheel built from
exactly those files, the way the Dockerfile's `pip install .` builds it, holds the whole sandbox
package, its data files and the `cuda-agent` entry point the image's ENTRYPOINT runs."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "sandbox_image" / "Dockerfile"


def _instructions() -> list[tuple[str, list[str]]]:
    """(instruction, words) per Dockerfile instruction, continuation lines joined."""
    logical, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += " " + stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            logical.append(pending.strip())
            pending = ""
    return [(words[0].upper(), words[1:]) for words in (shlex.split(line) for line in logical)]


def _copied_paths() -> list[tuple[str, str]]:
    """(source, destination) of every COPY from the build context (not from another stage)."""
    pairs = []
    for instruction, words in _instructions():
        if instruction != "COPY" or any(w.startswith("--from=") for w in words):
            continue
        *sources, destination = [w for w in words if not w.startswith("--")]
        pairs += [(source, destination) for source in sources]
    return pairs


def test_every_copied_path_exists_in_the_repository() -> None:
    pairs = _copied_paths()
    assert pairs, "the Dockerfile copies nothing from the build context"
    missing = [source for source, _ in pairs if not (REPO / source).exists()]
    assert not missing, f"{DOCKERFILE.name} copies paths the repository does not have: {missing}"


@pytest.mark.slow
def test_wheel_from_the_copied_files_holds_the_sandbox_package(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for source, destination in _copied_paths():
        # Destinations are relative to the WORKDIR (the wheel's source root); "./" keeps the name.
        target = context / (Path(source).name if destination in ("./", ".") else destination)
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / source, target)
    dist = tmp_path / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(context), "-w", str(dist)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = dist.glob("cuda_agent-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sandbox = REPO / "sandbox_image"
    expected = {
        str(path.relative_to(sandbox))
        for path in (sandbox / "cuda_agent").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert expected - names == set(), f"missing from the wheel: {sorted(expected - names)[:10]}"
    assert "cuda_agent/cli.py" in names  # the platform part: the console script's module
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "cuda-agent = cuda_agent.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
