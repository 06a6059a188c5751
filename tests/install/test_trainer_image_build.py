"""The trainer image built for real by images/build.py (buildah on a debootstrap'ed Debian base, the CUDA
13.0 compiler from NVIDIA's PyPI wheels, torch, DeepSpeed, Ray and vLLM in one resolve), run as the
operator runs Ray and driver pods: uid 1000, read-only root, no_new_privs, no capabilities. Inside it:
the pinned versions import, nvcc's release is torch's CUDA, the installed code is root-owned and read-only,
the driver's entry point starts, and a Ray cluster starts and runs a task as the pod's user.

Like the sandbox image (test_sandbox_image_build.py) it takes minutes and ~31 GB of disk at its peak to
build, so these tests only use the image `make images` (or CUDA_AGENT_BUILD_TRAINER_IMAGE=1) built from
the current inputs and skip otherwise, naming the key and the command (docs/install.md)."""

from __future__ import annotations

import json
import tarfile
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from install_helpers import REPO, cached_image, run_inside

from cuda_agent.operator import run_children
from cuda_agent.operator.config import OperatorConfig

BUILD_TRAINER = "CUDA_AGENT_BUILD_TRAINER_IMAGE"
TRAINER_KEY = "CUDA_AGENT_TRAINER_IMAGE_KEY"  # a cached image of other inputs, by hand only
PINS = {
    requirement.split("==")[0].split("[")[0]: requirement.split("==")[1]
    for extra in ("trainer", "vllm")
    for requirement in tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ][extra]
}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trainer_image() -> tuple[ModuleType, Any]:
    return cached_image("trainer", TRAINER_KEY, BUILD_TRAINER)


def test_trainer_image_config_and_archive_name_the_operators_image_and_user(
    trainer_image: tuple[ModuleType, Any],
) -> None:
    _, image = trainer_image
    uid = run_children.TRAINER_UID
    assert image.user == f"{uid}:{uid}"
    assert image.entrypoint == ["cuda-agent", "train"]
    assert image.env["CUDA_HOME"] == "/usr/local/cuda" and image.env["HOME"] == "/tmp"
    assert image.env["PATH"].split(":")[:2] == ["/opt/venv/bin", "/usr/local/cuda/bin"]
    with tarfile.open(image.archive) as archive:
        index = archive.extractfile("index.json")
        assert index is not None
        (manifest,) = json.load(index)["manifests"]
    # The name driver and Ray pods pull: the operator's default --trainer-image (the chart's, by test_chart).
    ref = manifest["annotations"]["org.opencontainers.image.ref.name"]
    assert ref == OperatorConfig().trainer_image


PROBE = r"""
import json, os, pathlib, re, subprocess
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
import torch, deepspeed, ray, transformers, vllm
import cuda_agent.trainer.engine, cuda_agent.trainer.ray.workers
from deepspeed.ops.op_builder import FusedAdamBuilder
nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
package = pathlib.Path(cuda_agent.trainer.engine.__file__).parents[2]
writable = [str(p) for p in (package, *package.rglob("*")) if os.access(p, os.W_OK) or p.lstat().st_uid != 0]
print(json.dumps({
    "uid": status["Uid"].split(), "cap_eff": status["CapEff"], "no_new_privs": status["NoNewPrivs"],
    "versions": {m.__name__: m.__version__ for m in (torch, deepspeed, ray, transformers, vllm)},
    "torch_cuda": torch.version.cuda, "nvcc": re.search(r"release (\d+\.\d+)", nvcc).group(1),
    "fused_adam_compatible": FusedAdamBuilder().is_compatible(verbose=False),
    "package": str(package), "writable": writable, "venv_writable": os.access("/opt/venv/bin", os.W_OK),
}))
"""


def test_trainer_image_holds_the_pinned_stack_with_torchs_nvcc_and_read_only_code(
    trainer_image: tuple[ModuleType, Any],
) -> None:
    """What a Ray worker imports, as uid 1000: torch, DeepSpeed, Ray, transformers and vLLM at
    pyproject's pins (one resolve: a vLLM that replaced torch would show here), nvcc's release equal to
    torch's CUDA (DeepSpeed's fused ops compile against it), the installed cuda_agent not writable."""
    seen = json.loads(run_inside(trainer_image, ["python", "-c", PROBE]).splitlines()[-1])
    uid = str(run_children.TRAINER_UID)
    assert seen["uid"] == [uid] * 4
    assert seen["cap_eff"] == "0000000000000000" and seen["no_new_privs"] == "1"
    versions = seen["versions"]
    assert versions["torch"].startswith(PINS["torch"] + "+") or versions["torch"] == PINS["torch"]
    for name in ("deepspeed", "ray", "transformers", "vllm"):
        assert versions[name] == PINS[name], (name, versions[name], PINS[name])
    assert seen["torch_cuda"] == seen["nvcc"] == "13.0"
    assert seen["fused_adam_compatible"] is True
    assert seen["package"].startswith("/opt/venv/lib/python3.11/site-packages")
    assert seen["writable"] == [] and seen["venv_writable"] is False


def test_trainer_image_entry_point_starts(trainer_image: tuple[ModuleType, Any]) -> None:
    _, image = trainer_image
    out = run_inside(trainer_image, [*image.entrypoint, "--help"])
    assert "--file" in out


RAY_TASK = r"""
import json, os, ray
@ray.remote
def uid():
    return os.getuid()
ray.init(num_cpus=1, include_dashboard=False, object_store_memory=80 * 2**20)
print(json.dumps({"task_uid": ray.get(uid.remote()), "nodes": len(ray.nodes())}))
ray.shutdown()
"""


def test_trainer_image_starts_ray_and_runs_a_task_as_the_pods_user(
    trainer_image: tuple[ModuleType, Any], tmp_path: Path
) -> None:
    """A one-node Ray cluster in the image as a Ray pod runs it (its /tmp an emptyDir), a task on it, and
    the task's process runs as uid 1000. Ray's ports on 127.0.0.1 (test traffic stays on loopback)."""
    emptydir = tmp_path / "tmp"
    emptydir.mkdir(mode=0o1777)
    emptydir.chmod(0o1777)
    script = (
        "export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0; "
        f"exec python -c '{RAY_TASK}'"
    )
    out = run_inside(trainer_image, ["sh", "-c", script], writable={emptydir: "/tmp"})
    seen = json.loads(out.splitlines()[-1])
    assert seen == {"task_uid": run_children.TRAINER_UID, "nodes": 1}


FUSED_ADAM = r"""
import torch
from deepspeed.ops.op_builder import FusedAdamBuilder
module = FusedAdamBuilder().load(verbose=False)
print(module.__file__, torch.version.cuda)
"""


def test_deepspeed_compiles_its_cuda_fused_adam_with_the_images_nvcc_as_the_pods_user(
    trainer_image: tuple[ModuleType, Any], tmp_path: Path
) -> None:
    """DeepSpeed's first-use JIT build of its CUDA FusedAdam (what the actor's optimizer loads on a GPU
    node): nvcc from /usr/local/cuda for sm_90 with g++ as host compiler, linked against torch's CUDA
    libraries and cudart, loaded, as uid 1000 into its HOME (/tmp, an emptyDir). No GPU here, so the CUDA
    accelerator is named (DS_ACCELERATOR) rather than detected. About 30 s on two cores."""
    emptydir = tmp_path / "tmp"
    emptydir.mkdir()
    emptydir.chmod(0o1777)
    script = f"export DS_ACCELERATOR=cuda TORCH_CUDA_ARCH_LIST=9.0; exec python -c '{FUSED_ADAM}'"
    out = run_inside(trainer_image, ["sh", "-c", script], writable={emptydir: "/tmp"})
    built = emptydir / ".cache" / "torch_extensions" / "py311_cu130" / "fused_adam"
    assert out.split()[-2:] == [str(Path("/tmp") / built.relative_to(emptydir) / "fused_adam.so"), "13.0"]
    assert (built / "multi_tensor_adam.cuda.o").stat().st_uid == run_children.TRAINER_UID
