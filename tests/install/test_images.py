"""The three images' Dockerfiles, checked without a container engine (none runs on these machines):
pinned bases, a non-root numeric USER equal to the uid the operator and the chart run that image as, the
image names the chart deploys, the same `pip install .[extra]` as pyproject's extras, and every copied
path present. The operator image's own RUN line is then executed for real in a temporary virtualenv
(opt-in, below), and its entry point started, proving it installs and loads without torch."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from install_helpers import CHART, REPO

from cuda_agent.operator import pool_children, run_children

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
# A version tag: digits somewhere (3.11.11-slim-bookworm, 13.0.1-devel-ubuntu24.04), never `latest`.
VERSION_TAG = re.compile(r"^[^:@]+:(?!latest$)[A-Za-z0-9_.-]*[0-9][A-Za-z0-9_.-]*(@sha256:[0-9a-f]{64})?$")
OPERATOR_UID = 65532  # charts/cuda-agent/templates/operator-deployment.yaml runAsUser
SKIP_INSTALL_TESTS = "CUDA_AGENT_SKIP_IMAGE_INSTALL_TESTS"


@dataclass(frozen=True)
class Image:
    name: str
    dockerfile: Path
    uid: int
    extras: str
    entrypoint: tuple[str, ...]


IMAGES = (
    Image(
        "operator", REPO / "images/operator/Dockerfile", OPERATOR_UID, "operator", ("cuda-agent", "operator")
    ),
    Image(
        "sandbox",
        REPO / "sandbox_image/Dockerfile",
        pool_children.SANDBOX_UID,
        "sandbox",
        ("cuda-agent", "sandbox", "serve"),
    ),
    Image(
        "trainer",
        REPO / "images/trainer/Dockerfile",
        run_children.TRAINER_UID,
        "trainer,vllm",
        ("cuda-agent", "train"),
    ),
)


def parsed(image: Image) -> DockerfileParser:
    return DockerfileParser(str(image.dockerfile))


def final_stage(parser: DockerfileParser) -> list[dict[str, str]]:
    instructions: list[dict[str, str]] = parser.structure
    last_from = max(i for i, step in enumerate(instructions) if step["instruction"] == "FROM")
    return instructions[last_from:]


def pip_installs(parser: DockerfileParser) -> list[str]:
    """What each `pip install` of the Dockerfile installs (its non-option arguments)."""
    targets = []
    for step in parser.structure:
        if step["instruction"] != "RUN":
            continue
        for command in step["value"].split("&&"):
            words = shlex.split(command)
            if len(words) > 2 and words[0].endswith("pip") and words[1] == "install":
                targets += [w for w in words[2:] if not w.startswith("-")]
    return targets


@pytest.mark.parametrize("image", IMAGES, ids=lambda image: image.name)
def test_bases_are_pinned(image: Image) -> None:
    bases = [base for base in parsed(image).parent_images if not base.startswith("$")]
    assert bases, f"{image.dockerfile}: no FROM with a resolvable image"
    for base in bases:
        if base in {"scratch"}:
            continue
        assert VERSION_TAG.match(base), f"{image.dockerfile}: base {base!r} is not pinned to a version"


@pytest.mark.parametrize("image", IMAGES, ids=lambda image: image.name)
def test_runs_as_the_uid_its_pods_get(image: Image) -> None:
    users = [step["value"] for step in final_stage(parsed(image)) if step["instruction"] == "USER"]
    assert users, f"{image.dockerfile}: the final stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, (
        f"{image.dockerfile}: USER {users[-1]!r} is not a numeric non-root uid"
    )
    assert int(uid) == image.uid, f"{image.dockerfile}: USER {uid}, but its pods run as uid {image.uid}"
    assert not gid or (gid.isdigit() and int(gid) != 0)


@pytest.mark.parametrize("image", IMAGES, ids=lambda image: image.name)
def test_installs_the_projects_extras_and_runs_its_entry_point(image: Image) -> None:
    parser = parsed(image)
    assert pip_installs(parser) == [f".[{image.extras}]"], f"{image.dockerfile}: {pip_installs(parser)}"
    for extra in image.extras.split(","):
        assert extra in PYPROJECT["project"]["optional-dependencies"], f"no extra {extra!r} in pyproject.toml"
    (entrypoint,) = [step["value"] for step in parser.structure if step["instruction"] == "ENTRYPOINT"]
    assert tuple(yaml.safe_load(entrypoint))[: len(image.entrypoint)] == image.entrypoint


@pytest.mark.parametrize("image", IMAGES, ids=lambda image: image.name)
def test_every_copied_path_exists_and_the_build_command_names_the_charts_image(image: Image) -> None:
    for source, _ in copied(image):
        assert (REPO / source).exists(), f"{image.dockerfile} copies {source}, which the repository lacks"
    values = VALUES["images"][image.name]
    build = (
        f"docker build -f {image.dockerfile.relative_to(REPO)} -t {values['repository']}:{values['tag']} ."
    )
    assert build in image.dockerfile.read_text(), (
        f"{image.dockerfile}: its build command should read {build!r}"
    )


def test_operator_image_holds_no_trainer_code_or_torch() -> None:
    operator = IMAGES[0]
    assert not [source for source, _ in copied(operator) if source.startswith("trainer")]
    requirements = (
        PYPROJECT["project"]["optional-dependencies"]["operator"] + PYPROJECT["project"]["dependencies"]
    )
    assert not [r for r in requirements if re.match(r"(torch|ray|deepspeed|vllm)\b", r)], requirements


def copied(image: Image) -> list[tuple[str, str]]:
    """(source, destination) of every COPY from the build context (not from another stage)."""
    pairs = []
    for step in parsed(image).structure:
        if step["instruction"] != "COPY":
            continue
        words = shlex.split(step["value"])
        if any(w.startswith("--from=") for w in words):
            continue
        *sources, destination = [w for w in words if not w.startswith("--")]
        pairs += [(source, destination) for source in sources]
    return pairs


def _build_context(image: Image, root: Path) -> Path:
    """The Dockerfile's WORKDIR with what its COPY lines put there."""
    workdir: str = next(s["value"] for s in parsed(image).structure if s["instruction"] == "WORKDIR")
    context = root / workdir.lstrip("/")
    for source, destination in copied(image):
        target = context / (Path(source).name if destination in ("./", ".") else destination)
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / source, target)
    return context


def _wheel_cache() -> Path:
    default = Path.home() / ".cache" / "cuda-agent" / "wheels"
    return Path(os.environ.get("CUDA_AGENT_WHEEL_CACHE", default))


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get(SKIP_INSTALL_TESTS) == "1",
    reason=f"{SKIP_INSTALL_TESTS}=1: skips installing the operator image's packages into a fresh virtualenv "
    "(~15 s from the wheel cache, ~40 s and PyPI the first time); docs/install.md",
)
def test_operator_image_run_line_installs_and_starts_without_torch(tmp_path: Path) -> None:
    """The operator Dockerfile's own install RUN line, executed with /opt/venv moved to a temp dir, from
    wheels cached under ~/.cache/cuda-agent/wheels (filled from PyPI by `pip download` on first use)."""
    operator = IMAGES[0]
    context = _build_context(operator, tmp_path)
    (run_line,) = [step["value"] for step in parsed(operator).structure if "pip install" in step["value"]]
    venv = tmp_path / "venv"
    script = run_line.replace("/opt/venv", str(venv))
    cache = _wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(cache),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `python` is this Python 3.11

    def install() -> subprocess.CompletedProcess[str]:
        shutil.rmtree(venv, ignore_errors=True)
        return subprocess.run(
            ["sh", "-c", script],
            cwd=context,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )

    proc = install()
    if proc.returncode != 0 and "No matching distribution" in proc.stdout + proc.stderr:
        build_requires = PYPROJECT["build-system"]["requires"]
        download = [sys.executable, "-m", "pip", "download", "-q", "-d", str(cache), f".[{operator.extras}]"]
        fetched = subprocess.run(
            [*download, *build_requires],
            cwd=context,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        proc = install()
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    help_text = subprocess.run(
        [str(venv / "bin" / "cuda-agent"), "operator", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--liveness-endpoint" in help_text and "--metrics-port" in help_text
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    heavy = [line for line in installed.splitlines() if re.match(r"(torch|ray|deepspeed|vllm|numpy)==", line)]
    assert not heavy, heavy


@pytest.mark.parametrize("example", ["sandboxpool.yaml", "sandboxpool-hardened.yaml"])
def test_cluster_examples_name_the_charts_sandbox_image(example: str) -> None:
    # The README's quick start applies these after `helm install`: they must pull the image it names.
    pool = yaml.safe_load((REPO / "examples" / example).read_text())
    sandbox = VALUES["images"]["sandbox"]
    assert pool["spec"]["image"] == f"{sandbox['repository']}:{sandbox['tag']}"
