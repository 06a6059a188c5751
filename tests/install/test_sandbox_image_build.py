"""The sandbox image built for real by images/build.py (buildah on a debootstrap'ed Debian base, the CUDA
13.0 toolkit from NVIDIA's PyPI wheels), run as a restricted pod runs it: uid 65532, read-only root,
no_new_privs, no capabilities. Inside it: torch is the pinned CUDA 13.0 build, nvcc compiles and links a
kernel that uses CUB, the judge finds cuBLAS, cuBLASLt and cuDNN, the judge's files and its seed are
root-owned and read-only and the seed holds the headers the judge looks up, the server's entry point
starts.

A build takes ~7 min on the two-core development machine (base cached) and ~31 GB of disk at its peak,
so these tests never build the image on their own: they use the one `make images` (or
CUDA_AGENT_BUILD_SANDBOX_IMAGE=1) built from the current inputs (Dockerfile, base, every copied file),
and skip naming the key and the command when there is none (docs/install.md, "Building the images")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from install_helpers import CHART, REPO, answers, cached_image, run_inside, stop_group, wait_for

from cuda_agent.api import pool_server
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.localhost import free_port
from cuda_agent.operator import pool_children
from cuda_agent.sandbox.client import SyncSandboxClient
from cuda_agent.sandbox.server.models import JudgeOptions

SANDBOX_UID = pool_children.SANDBOX_UID
BUILD_SANDBOX = "CUDA_AGENT_BUILD_SANDBOX_IMAGE"
# Test the cached image of this key, built from other inputs than the checkout's (say, before a commit that
# touched only platform/); for trying an image by hand, never in CI.
SANDBOX_KEY = "CUDA_AGENT_SANDBOX_IMAGE_KEY"
SEED = "/opt/cuda-agent/judge-seed"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sandbox_image() -> tuple[ModuleType, Any]:
    """The sandbox image of the current inputs, from ~/.cache/cuda-agent/images (`make images`); built
    here only when CUDA_AGENT_BUILD_SANDBOX_IMAGE=1."""
    return cached_image("sandbox", SANDBOX_KEY, BUILD_SANDBOX)


def test_sandbox_image_config_and_archive_name_the_charts_image_and_its_user(
    sandbox_image: tuple[ModuleType, Any],
) -> None:
    _, image = sandbox_image
    assert image.user == f"{SANDBOX_UID}:{SANDBOX_UID}"
    assert image.entrypoint[:3] == ["cuda-agent", "sandbox", "serve"]
    assert image.env["CUDA_HOME"] == "/usr/local/cuda" and "/usr/local/cuda/bin" in image.env["PATH"]
    sandbox = yaml.safe_load((CHART / "values.yaml").read_text())["images"]["sandbox"]
    with tarfile.open(image.archive) as archive:
        index = archive.extractfile("index.json")
        assert index is not None
        (manifest,) = json.load(index)["manifests"]
    assert manifest["annotations"]["org.opencontainers.image.ref.name"] == (
        f"{sandbox['repository']}:{sandbox['tag']}"
    )


# Run inside the image: who the server runs as, torch's CUDA, the judge's vendor libraries (the Dockerfile's
# build-time check, again at run time as uid 65532), the judge's files and seed, and the seed's headers under
# the keys this image's judge computes (as where it runs: a GPU's capability does not enter them).
PROBE = r"""
import json, os, pathlib, subprocess
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
import torch, torch.utils.cpp_extension as c
from cuda_agent.sandbox.judge import build
site = os.path.dirname(os.path.dirname(torch.__file__))
def loose(root):
    # Paths 65532 could change: not root's, group/other-writable, or writable by us.
    bad = []
    for path in [pathlib.Path(root), *pathlib.Path(root).rglob("*")]:
        st = path.lstat()
        if st.st_uid != 0 or (st.st_mode & 0o022 and not path.is_symlink()) or os.access(path, os.W_OK):
            bad.append(str(path))
    return bad
toolchain = build.detect_toolchain("cuda", (9, 0))
seeded = {}
for label, flags in build.SEED_FLAG_SETS.items():
    key, _, source = build._pch_entry(toolchain, flags)
    seeded[label] = build.seeded_pch(pathlib.Path(SEED_DIR), key, source) is not None
print(json.dumps({
    "uid": status["Uid"].split(), "cap_eff": status["CapEff"], "no_new_privs": status["NoNewPrivs"],
    "torch": torch.__version__, "cuda": torch.version.cuda, "cuda_home": c.CUDA_HOME,
    "nvcc": toolchain.nvcc, "nvcc_version": toolchain.nvcc_version,
    "vendor": sorted(lib.name for lib in build.find_vendor_libraries(site, c.CUDA_HOME)),
    "judge_loose": loose(os.path.dirname(build.__file__)), "venv_loose": os.access("/opt/venv/bin", os.W_OK),
    "seed_loose": loose(SEED_DIR), "seeded": seeded,
}))
""".replace("SEED_DIR", repr(SEED))


def test_sandbox_image_has_torch_cuda_13_vendor_libraries_and_a_read_only_judge_and_seed(
    sandbox_image: tuple[ModuleType, Any],
) -> None:
    seen = json.loads(run_inside(sandbox_image, ["python", "-c", PROBE]).splitlines()[-1])
    assert seen["uid"] == [str(SANDBOX_UID)] * 4
    assert seen["cap_eff"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert seen["torch"].startswith("2.11.0") and seen["cuda"] == "13.0"
    assert seen["cuda_home"] == "/usr/local/cuda" and seen["nvcc"] == "/usr/local/cuda/bin/nvcc"
    assert "release 13.0" in seen["nvcc_version"] or "cuda_13.0" in seen["nvcc_version"]
    assert seen["vendor"] == ["cublas", "cublasLt", "cudnn"]
    assert seen["judge_loose"] == [] and seen["venv_loose"] is False
    assert seen["seed_loose"] == []
    assert all(seen["seeded"].values()), seen["seeded"]


KERNEL = r"""
#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>
__global__ void block_sum(const float* x, float* out) {
  using Reduce = cub::BlockReduce<float, 128>;
  __shared__ typename Reduce::TempStorage storage;
  float total = Reduce(storage).Sum(x[threadIdx.x]);
  if (threadIdx.x == 0) *out = total;
}
int main() { return cudaGetLastError() == cudaSuccess ? 0 : 1; }
"""


def test_sandbox_image_nvcc_compiles_and_links_a_cub_kernel_as_the_pods_user(
    sandbox_image: tuple[ModuleType, Any],
) -> None:
    """An agent's compile in the pod: nvcc (the wheels' toolkit under /usr/local/cuda, on the image's PATH)
    with g++ as host compiler, CCCL's CUB headers, cudart linked; sm_90 SASS for the H200 (no GPU here)."""
    script = (
        f"cat > /tmp/k.cu <<'EOF'\n{KERNEL}\nEOF\n"
        "nvcc -arch=sm_90 -o /tmp/k /tmp/k.cu && ls -l /tmp/k && nvcc --version | tail -2"
    )
    out = run_inside(sandbox_image, ["sh", "-c", script])
    assert re.search(r"\s/tmp/k\n", out), out
    assert "release 13.0" in out, out


def test_sandbox_image_entry_point_starts(sandbox_image: tuple[ModuleType, Any]) -> None:
    _, image = sandbox_image
    out = run_inside(sandbox_image, [*image.entrypoint, "--help"])
    assert "--state-dir" in out and "--config" in out


EXAMPLES = REPO / "examples"
TASK = (EXAMPLES / "tasks" / "relu_mul_add.py").read_text()
SOLUTION = (EXAMPLES / "solutions" / "relu_mul_add" / "cpu" / "model_new.py").read_text()
QUICK = JudgeOptions(trials=2, profile_trials=5, compile_mode="none")


def test_sandbox_image_serves_a_session_whose_agent_has_nvcc_and_whose_judge_rewards_a_cpu_kernel(
    sandbox_image: tuple[ModuleType, Any], tmp_path: Path
) -> None:
    """The image's entry point as a pool pod runs it: restricted as above, the operator's config for
    examples/sandboxpool.yaml mounted read-only (as its ConfigMap), a writable state directory (its
    emptyDir). Changed from the pod's, and only that: 127.0.0.1 and free ports, no GPU (gpus 0, so the
    judge runs on CPU), no judge ConfigMap (the image's own judge files). Through the HTTP API an agent's
    bash finds nvcc and g++ on its PATH, and the judge builds, checks and profiles a C++ kernel: reward
    at least 1. About a minute: the judge compiles torch's headers for CPU (the seed holds CUDA's)."""
    build, image = sandbox_image
    rootfs = build.layer_rootfs(build.Buildah(build.cache_dir()), image)
    pool = yaml.safe_load((EXAMPLES / "sandboxpool.yaml").read_text())
    settings = pool_server.server_config(SandboxPoolSpec.model_validate(pool["spec"]))
    assert settings["judge_seed_dir"] == SEED and settings["state_dir"] == image.workdir
    settings.pop("judge_dir")
    port, metrics_port = free_port(), free_port()
    settings.update(host="127.0.0.1", port=port, metrics_port=metrics_port, gpus=0)
    config, state = tmp_path / "config", tmp_path / "state"
    config.mkdir(mode=0o755)
    state.mkdir(mode=0o700)
    os.chown(state, SANDBOX_UID, SANDBOX_UID)
    (config / "sandbox.yaml").write_text(yaml.safe_dump(settings))
    (config / "sandbox.yaml").chmod(0o644)
    # The ENTRYPOINT's flags (--host 0.0.0.0 --port 8470) override a config's, as in the pod, where the
    # two agree; here the last of each repeated flag wins.
    argv = [*image.entrypoint, "--config", "/mnt/sandbox.yaml", "--host", "127.0.0.1", "--port", str(port)]
    command = build.restricted(rootfs, image, argv, {config: "/mnt"}, {state: image.workdir})
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            command, env=image.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(
            lambda: proc.poll() is not None or answers(f"http://127.0.0.1:{port}/healthz"),
            "the image's sandbox server",
        )
        assert proc.poll() is None, log_path.read_text()[-3000:]
        client = SyncSandboxClient(f"http://127.0.0.1:{port}", timeout_s=600)
        status = client.status()
        assert status.isolation == "restricted" and status.judge_intact
        sid = client.create_session(TASK, name="relu_mul_add", judge=QUICK).session_id
        tools = client.tool(sid, "bash", {"command": "id -u; command -v nvcc g++; nvcc --version | tail -1"})
        lines = tools.output.splitlines()
        assert lines[:3] == [str(SANDBOX_UID), "/usr/local/cuda/bin/nvcc", "/usr/bin/g++"], tools.output
        assert "cuda_13.0" in lines[3], tools.output
        client.tool(sid, "write", {"file_path": "model_new.py", "content": SOLUTION})
        run = client.judge(sid, "profile")
        assert run.result is not None, run.error
        result = run.result
        assert result.compiled and result.correct and result.reward >= 1, (
            f"{result.error}\n{(result.build_log or '')[-3000:]}"
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            assert response.status == 200
    except AssertionError as failure:
        raise AssertionError(f"{failure}\nserver log:\n{log_path.read_text()[-4000:]}") from failure
    finally:
        stop_group(proc)
