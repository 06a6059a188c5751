"""The three images' Dockerfiles, checked without a container engine (none runs on these machines):
pinned bases, a non-root numeric USER equal to the uid the operator and the chart run that image as, the
image names the chart deploys, the same `pip install .[extra]` as pyproject's extras, and every copied
path present. Each image's own install RUN line is then executed for real in a fresh temporary
virtualenv (paths moved, pip offline from a wheel cache) and its entry point started: the operator's,
loading without torch; the sandbox's, with a CPU torch wheel of the pinned version from pip's
find-links (the judge CLI loads, the server configured as the operator configures pool pods answers
/healthz, /v1/status and /metrics); the trainer's, with
the same torch wheel, less the `vllm` extra (a CUDA-only wheel), `cuda-agent train` starting and
DeepSpeed, Ray and transformers importing. Without that CPU torch wheel those two are skipped (PyPI's
torch is a multi-GB CUDA build; tests never download it). Last, the operator image is built for real
by images/build.py (buildah on a debootstrap'ed Debian base, no container engine) and its entry point
started as its own non-root USER with a read-only root. The sandbox image, built the same way with
NVIDIA's PyPI compiler wheels, is tested in test_sandbox_image_build.py, and the trainer image, built the
same way, in test_trainer_image_build.py (docs/install.md, "Building the images")."""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from fixtures.cluster import GPU_PRODUCT, KubeCluster
from install_helpers import CHART, REPO, answers, image_build, stop_group, wait_for

from cuda_agent.api import pool_server
from cuda_agent.api.sandbox import ServerStatus
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.localhost import free_port
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
        "sandbox,cuda",
        ("cuda-agent", "sandbox", "serve"),
    ),
    Image(
        "trainer",
        REPO / "images/trainer/Dockerfile",
        run_children.TRAINER_UID,
        "trainer,vllm,cuda",
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


def _install_line(image: Image) -> str:
    steps: list[dict[str, str]] = parsed(image).structure
    (run_line,) = [s["value"] for s in steps if s["instruction"] == "RUN" and "pip install" in s["value"]]
    return run_line


def _run_install_line(image: Image, root: Path, run_line: str, links: tuple[Path, ...] = ()) -> Path:
    """Execute `run_line` (the Dockerfile's install RUN line, or it less what cannot run here) with
    /opt/venv and the WORKDIR moved under `root`, in a copy of the build context, pip offline from the
    wheel cache (~/.cache/cuda-agent/wheels) plus `links` (a CPU torch wheel's directory). On a cache miss
    `pip wheel` fills the cache from PyPI once (it also builds sdists such as DeepSpeed's) and the line
    is run again. Returns the new virtualenv."""
    context = _build_context(image, root)
    workdir: str = next(s["value"] for s in parsed(image).structure if s["instruction"] == "WORKDIR")
    venv = root / "venv"
    script = re.sub(rf"{re.escape(workdir)}(?=[\s/]|$)", str(context), run_line).replace(
        "/opt/venv", str(venv)
    )
    cache = _wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": " ".join(str(link) for link in (cache, *links)),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_COMPILE": "1",  # the line compiles the cuda_agent package itself; the rest is not timed here
    }
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `python`, `python3.11`: this Python 3.11

    def install() -> subprocess.CompletedProcess[str]:
        shutil.rmtree(venv, ignore_errors=True)
        if not context.exists():  # a line that ends with `rm -rf <WORKDIR>` removed it
            _build_context(image, root)
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
        (target,) = [
            w for w in shlex.split(script.split("pip install", 1)[1].split("&&")[0]) if not w.startswith("-")
        ]
        build_requires = PYPROJECT["build-system"]["requires"]
        fetch = [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(cache), target, *build_requires]
        fetch_env = {k: v for k, v in env.items() if k != "PIP_NO_INDEX"}
        fetched = subprocess.run(
            fetch, cwd=context, env=fetch_env, capture_output=True, text=True, timeout=1800, check=False
        )
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        for built in cache.glob("cuda_agent-*.whl"):  # the project itself: the line builds it from source
            built.unlink()
        proc = install()
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return venv


def _installed(venv: Path) -> list[str]:
    """`name==version` of every distribution in `venv`, lower case."""
    listing = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listing.stdout.lower().splitlines()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get(SKIP_INSTALL_TESTS) == "1",
    reason=f"{SKIP_INSTALL_TESTS}=1: skips installing the operator image's packages into a fresh virtualenv "
    "(~15 s from the wheel cache, ~40 s and PyPI the first time); docs/install.md",
)
def test_operator_image_run_line_installs_and_starts_without_torch(tmp_path: Path) -> None:
    """The operator Dockerfile's own install RUN line, executed with /opt/venv moved to a temp dir, from
    wheels cached under ~/.cache/cuda-agent/wheels (filled from PyPI by `pip wheel` on first use)."""
    operator = IMAGES[0]
    venv = _run_install_line(operator, tmp_path, _install_line(operator))
    help_text = subprocess.run(
        [str(venv / "bin" / "cuda-agent"), "operator", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--liveness-endpoint" in help_text and "--metrics-port" in help_text
    heavy = [line for line in _installed(venv) if re.match(r"(torch|ray|deepspeed|vllm|numpy)==", line)]
    assert not heavy, heavy


# The sandbox and trainer images' install lines, run for real with a CPU build of the pinned torch.
TORCH_PIN = next(
    r for r in PYPROJECT["project"]["optional-dependencies"]["sandbox"] if r.startswith("torch==")
)
# The sandbox Dockerfile's checks that need torch's CUDA wheels (nvcc's release is torch's CUDA; the judge
# links cuBLAS, cuBLASLt and cuDNN) live in their own RUN line, never the install line run here.
CUDA_ONLY_CHECK = "find_vendor_libraries"


@functools.cache
def _pip_find_links() -> list[Path]:
    """pip's own configured find-links (PIP_FIND_LINKS or pip.conf, as `pip config list` shows them)."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    return [Path(link) for m in re.finditer(r"find-links='([^']*)'", listing) for link in m.group(1).split()]


def _cpu_torch_links() -> tuple[Path, ...]:
    """The directory holding a CPU wheel of the pinned torch, or skip: PyPI's torch of that version is a
    CUDA build that pulls gigabytes of nvidia-* wheels, which tests never download."""
    version = TORCH_PIN.removeprefix("torch==")
    pattern = f"torch-{version}+cpu-cp311-*.whl"
    places = [_wheel_cache(), *_pip_find_links()]
    found = [place for place in places if any(place.glob(pattern))]
    if not found:
        pytest.skip(
            f"no CPU torch wheel {pattern} in {', '.join(map(str, places))} (pip's find-links or the wheel "
            "cache): PyPI's torch is a multi-GB CUDA build, not downloaded by tests (docs/install.md)"
        )
    return (found[0],)


def _example_pool_spec() -> SandboxPoolSpec:
    pool = yaml.safe_load((REPO / "examples" / "sandboxpool.yaml").read_text())
    return SandboxPoolSpec.model_validate(pool["spec"])


def _start_sandbox_server(cuda_agent: Path, state_root: Path) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """`cuda-agent sandbox serve --config` with the config the operator renders for examples/sandboxpool.yaml
    (pool_server.server_config), except what names the pod: 127.0.0.1 and free ports, a temporary state
    directory; no judge ConfigMap is mounted here, so no judge_dir."""
    settings = pool_server.server_config(_example_pool_spec())
    settings.pop("judge_dir")
    settings.update(host="127.0.0.1", port=free_port(), metrics_port=free_port(), state_dir=str(state_root))
    config = state_root.parent / "sandbox.yaml"
    config.write_text(yaml.safe_dump(settings))
    proc = subprocess.Popen(
        [str(cuda_agent), "sandbox", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the server prints one JSON line once it serves (or exits)
        lines.append(line)
        if line.startswith("{") and '"serving"' in line:
            return proc, json.loads(line)
    proc.wait()
    raise AssertionError("the sandbox server did not start:\n" + "".join(lines)[-3000:])


def _check_sandbox_entry_points(cuda_agent: Path, root: Path) -> None:
    """The judge CLI loads with torch; the server answers /healthz and /v1/status as the operator runs it."""
    judge_help = subprocess.run(
        [str(cuda_agent), "judge", "--help"], capture_output=True, text=True, check=True
    )
    assert "CANDIDATE" in judge_help.stdout and "--device" in judge_help.stdout
    python = cuda_agent.parent / "python"
    subprocess.run(
        [str(python), "-c", "import torch, torch.utils.cpp_extension, cuda_agent.sandbox.judge.build"],
        check=True,
    )
    state = Path(tempfile.mkdtemp(prefix="image-sandbox-", dir=root))
    state.chmod(0o711)  # root mode: the session uids must reach their workspaces
    proc, ready = _start_sandbox_server(cuda_agent, state / "state")
    try:
        assert answers(f"{ready['url']}/healthz")
        with urllib.request.urlopen(f"{ready['url']}/v1/status", timeout=5) as response:
            status = ServerStatus.model_validate_json(response.read())
        assert status.max_sessions == pool_server.max_sessions(_example_pool_spec()) and status.judge_intact
        with urllib.request.urlopen(
            f"http://127.0.0.1:{ready['metrics_port']}/metrics", timeout=5
        ) as response:
            assert response.status == 200
    finally:
        stop_group(proc)


TRAINER_IMPORTS = (
    "import torch, deepspeed, ray, transformers, cuda_agent.trainer.engine, cuda_agent.trainer.ray.workers"
)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(SKIP_INSTALL_TESTS) == "1", reason=f"{SKIP_INSTALL_TESTS}=1")
def test_sandbox_image_run_line_installs_and_its_server_and_judge_start(tmp_path: Path) -> None:
    """The sandbox Dockerfile's install RUN line, whole, run as the operator image's is, with a CPU torch
    wheel of the pinned version from pip's find-links (the `cuda` extra's compiler wheels install beside
    it, unused). Not run: the RUN lines after it that link the wheels' toolkit into /usr/local/cuda and
    check it against torch's CUDA (a CPU torch has none), and the judge seed's (nvcc); the image built
    for real runs them (test_sandbox_image_build.py). Then the judge CLI loads with torch and the server,
    configured as the operator configures pool pods, answers /healthz, /v1/status, /metrics."""
    sandbox = IMAGES[1]
    links = _cpu_torch_links()
    run_line = _install_line(sandbox)
    assert CUDA_ONLY_CHECK not in run_line and "/usr/local/cuda" not in run_line
    venv = _run_install_line(sandbox, tmp_path, run_line, links)
    installed = _installed(venv)
    assert [line for line in installed if line.startswith("torch==")] == [f"{TORCH_PIN}+cpu"], installed
    assert not [line for line in installed if re.match(r"(kopf|ray|deepspeed|vllm|transformers)==", line)]
    _check_sandbox_entry_points(venv / "bin" / "cuda-agent", tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(SKIP_INSTALL_TESTS) == "1", reason=f"{SKIP_INSTALL_TESTS}=1")
def test_trainer_image_run_line_installs_and_its_driver_starts(tmp_path: Path) -> None:
    """The trainer Dockerfile's install RUN line with a CPU torch wheel of the pinned version, less the
    `vllm` and `cuda` extras: vLLM 0.26.0's PyPI wheel is built for CUDA and pulls CUDA-only wheels (GBs)
    that a CPU machine neither has nor can use (tests/rollout/test_vllm_cpu.py runs vLLM's CPU build in
    its own virtualenv instead), and the compiler wheels serve only DeepSpeed's and FlashInfer's JIT on a
    GPU; the whole line is built for real into the trainer image (test_trainer_image_build.py).
    Then the driver's entry point (`cuda-agent train`, the image's ENTRYPOINT) starts and DeepSpeed, Ray,
    transformers and the trainer's engine and Ray workers import."""
    trainer = IMAGES[2]
    links = _cpu_torch_links()
    assert pip_installs(parsed(trainer)) == [".[trainer,vllm,cuda]"]
    run_line = _install_line(trainer).replace(".[trainer,vllm,cuda]", ".[trainer]")
    venv = _run_install_line(trainer, tmp_path, run_line, links)
    installed = _installed(venv)
    assert [line for line in installed if line.startswith("torch==")] == [f"{TORCH_PIN}+cpu"], installed
    assert not [line for line in installed if line.startswith(("vllm==", "kopf=="))]
    _check_trainer_entry_points(venv / "bin" / "cuda-agent")


def _check_trainer_entry_points(cuda_agent: Path) -> None:
    """`cuda-agent train --help` (the driver pod's command) and the imports a Ray worker pod makes."""
    help_text = subprocess.run(
        [str(cuda_agent), "train", "--help"], capture_output=True, text=True, check=True
    )
    assert "--file" in help_text.stdout
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    imported = subprocess.run(
        [str(cuda_agent.parent / "python"), "-c", TRAINER_IMPORTS], capture_output=True, text=True, env=env
    )
    assert imported.returncode == 0, imported.stderr[-3000:]


@pytest.mark.parametrize("example", ["sandboxpool.yaml", "sandboxpool-hardened.yaml"])
def test_cluster_examples_name_the_charts_sandbox_image(example: str) -> None:
    # The README's quick start applies these after `helm install`: they must pull the image it names.
    pool = yaml.safe_load((REPO / "examples" / example).read_text())
    sandbox = VALUES["images"]["sandbox"]
    assert pool["spec"]["image"] == f"{sandbox['repository']}:{sandbox['tag']}"


# The operator image built for real (images/build.py): debootstrap'ed Debian base, buildah bud, OCI archive.
SKIP_IMAGE_BUILD = "CUDA_AGENT_SKIP_IMAGE_BUILD_TESTS"
# Run inside the image as the chart's pod runs it: who we are, what we may do, what is installed.
PROBE = r"""
import importlib.util, json, os, shutil
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
def writable(path):
    try:
        open(path, "w").close()
        return "ok"
    except OSError as error:
        return error.strerror
print(json.dumps({
    "uid": status["Uid"].split(), "gid": status["Gid"].split(), "cap_eff": status["CapEff"],
    "cap_prm": status["CapPrm"], "no_new_privs": status["NoNewPrivs"],
    "root": writable("/probe"), "tmp": writable("/tmp/probe"),
    "heavy": [m for m in ("torch", "ray", "deepspeed", "vllm", "numpy") if importlib.util.find_spec(m)],
    "daemonset_tools": {tool: shutil.which(tool) for tool in ("sh", "cp", "cmp")},
}))
"""


@pytest.fixture(scope="module")
def operator_image() -> Iterator[tuple[ModuleType, Any]]:
    """The operator image, built by images/build.py or reused from ~/.cache/cuda-agent/images when its
    inputs (Dockerfile, copied files, Debian base) are unchanged: ~2 min cold (debootstrap ~40 s,
    buildah bud with pip from PyPI ~55 s, archive ~10 s), ~1 min when only the code changed, ~1 s warm."""
    if os.environ.get(SKIP_IMAGE_BUILD) == "1":
        pytest.skip(f"{SKIP_IMAGE_BUILD}=1")
    if os.geteuid() != 0:
        pytest.skip("building with buildah (vfs storage, chroot isolation) and the restricted run need root")
    build = image_build()
    try:
        image = build.build_operator()
    except build.MissingTool as missing:
        pytest.skip(str(missing))
    yield build, image


@pytest.mark.slow
def test_operator_image_built_for_real_starts_its_entry_point_as_its_non_root_user(
    operator_image: tuple[ModuleType, Any],
) -> None:
    build, image = operator_image
    assert image.user == f"{OPERATOR_UID}:{OPERATOR_UID}"
    assert tuple(image.entrypoint) == IMAGES[0].entrypoint
    buildah = build.Buildah(build.cache_dir())
    container, rootfs = build.image_rootfs(buildah, image)
    # buildah run uses the image's own USER: the Dockerfile's, not one the test picks.
    assert buildah("run", container, "--", "python", "-c", "import os; print(os.getuid())") == str(
        OPERATOR_UID
    )
    proc = build.run_restricted(rootfs, image, [*image.entrypoint, "--help"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--liveness-endpoint" in proc.stdout and "--metrics-port" in proc.stdout


@pytest.mark.slow
def test_operator_image_runs_with_a_read_only_root_no_privileges_and_no_torch(
    operator_image: tuple[ModuleType, Any],
) -> None:
    """As the chart's pod: read-only root, a /tmp tmpfs, no_new_privs, uid 65532 (chroot drops every
    capability with root), so nothing in the image needs setuid, capabilities or a writable root."""
    build, image = operator_image
    _, rootfs = build.image_rootfs(build.Buildah(build.cache_dir()), image)
    proc = build.run_restricted(rootfs, image, ["python", "-c", PROBE])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["uid"] == [str(OPERATOR_UID)] * 4 and seen["gid"] == [str(OPERATOR_UID)] * 4
    assert seen["cap_eff"] == seen["cap_prm"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert seen["root"] == "Read-only file system" and seen["tmp"] == "ok"
    assert seen["heavy"] == []
    # charts/cuda-agent's seccomp DaemonSet runs its script from this image.
    assert all(seen["daemonset_tools"].values()), seen["daemonset_tools"]


@pytest.mark.slow
def test_operator_image_archive_is_an_oci_image_named_as_the_chart_deploys_it(
    operator_image: tuple[ModuleType, Any],
) -> None:
    _, image = operator_image
    operator = VALUES["images"]["operator"]
    with tarfile.open(image.archive) as archive:

        def read_json(name: str) -> Any:
            member = archive.extractfile(name)
            assert member is not None, f"{image.archive} has no {name}"
            return json.load(member)

        def blob(digest: str) -> Any:
            return read_json(f"blobs/sha256/{digest.removeprefix('sha256:')}")

        (manifest,) = read_json("index.json")["manifests"]
        ref = manifest["annotations"]["org.opencontainers.image.ref.name"]
        assert ref == f"{operator['repository']}:{operator['tag']}"
        config = blob(blob(manifest["digest"])["config"]["digest"])
    assert config["config"]["User"] == f"{OPERATOR_UID}:{OPERATOR_UID}"
    assert config["config"]["Entrypoint"] == list(IMAGES[0].entrypoint)
    assert config["os"] == "linux" and config["architecture"] == "amd64"


@pytest.mark.slow
def test_operator_image_reconciles_a_sandbox_pool_on_the_real_apiserver(
    operator_image: tuple[ModuleType, Any], kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    """The image's entry point, run restricted as above, does its job: against the session's real
    kube-apiserver (kubeconfig mounted read-only, as a pod's Secret) it brings a SandboxPool to Ready
    and serves /healthz and /metrics. The chart's RBAC is test_install.py's concern; this is the image."""
    build, image = operator_image
    _, rootfs = build.image_rootfs(build.Buildah(build.cache_dir()), image)
    namespace = f"image-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", namespace)
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o755)
    flat = kube_cluster.kubectl("config", "view", "--flatten", "--raw").stdout
    (secret / "kubeconfig").write_text(flat)
    (secret / "kubeconfig").chmod(0o644)  # uid 65532 reads it, as a pod's Secret volume
    liveness, metrics = free_port(), free_port()
    args = [f"--namespace={namespace}", f"--liveness-endpoint=http://127.0.0.1:{liveness}/healthz"]
    args += [f"--metrics-port={metrics}"]
    command = build.restricted(rootfs, image, [*image.entrypoint, *args], {secret: "/mnt"})
    log_path = tmp_path / "operator.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            command,
            env={**image.env, "KUBECONFIG": "/mnt/kubeconfig"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the pid namespace's processes stop with it
        )
    try:
        wait_for(
            lambda: proc.poll() is not None or answers(f"http://127.0.0.1:{liveness}/healthz"),
            "the operator's liveness endpoint",
        )
        assert proc.poll() is None, log_path.read_text()[-3000:]
        pool = {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "SandboxPool",
            "metadata": {"name": "pool", "namespace": namespace},
            "spec": {"replicas": 1, "gpu": {"count": 1, "product": GPU_PRODUCT}, "image": "sandbox:test"},
        }
        kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(pool))

        def ready() -> dict[str, Any] | None:
            found = kube_cluster.kubectl("-n", namespace, "get", "sandboxpool", "pool", "-o", "json")
            status: dict[str, Any] = json.loads(found.stdout).get("status") or {}
            return status if status.get("readyReplicas") == 1 else None

        status = wait_for(ready, "the SandboxPool's pod to be ready")
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as response:
            assert 'controller_runtime_reconcile_total{controller="sandboxpool"' in response.read().decode()
    except AssertionError as failure:
        raise AssertionError(f"{failure}\noperator log:\n{log_path.read_text()[-4000:]}") from failure
    finally:
        stop_group(proc)
        kube_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
