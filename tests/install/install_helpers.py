"""Helpers of the install tests: `helm` bound to a kubeconfig, the chart's paths, polling."""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "cuda-agent"
GPU_EXAMPLE = CHART / "examples" / "gpu-cluster.yaml"
# The example leaves the S3 keys to --set; any non-empty value satisfies the schema.
EXAMPLE_KEYS = ("--set", "artifacts.external.accessKey=key", "--set", "artifacts.external.secretKey=secret")

T = TypeVar("T")
HOMES = ("cache", "config", "data")


class Helm:
    """`helm` bound to one kubeconfig (or none, for lint and template)."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.home = home  # helm's config, cache and data directories, kept out of the user's own
        self.kubeconfig = kubeconfig

    def bound_to(self, kubeconfig: Path) -> Helm:
        return Helm(self.binary, self.home, kubeconfig)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **{f"HELM_{part.upper()}_HOME": str(self.home / part) for part in HOMES}}
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        proc = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=env, timeout=300, check=False
        )
        # Helm notes at INFO level that it follows the chart's links to crds/ and the seccomp profile.
        proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if "symbolic link" not in line)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def template(self, *args: str, namespace: str = "cuda-agent") -> list[dict[str, Any]]:
        """The chart rendered by `helm template`, as a list of objects."""
        out = self("template", "rel", str(CHART), "--namespace", namespace, *args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


def find(objects: Sequence[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The one rendered object of `kind` whose name ends with `name_suffix`."""
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    names = [o["metadata"]["name"] for o in found]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {names}"
    return found[0]


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 120.0) -> T:
    """Poll until `probe` returns something truthy; the timeout is a failure bound, not a measurement."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")


def answers(url: str) -> bool:
    """Whether `url` answers 200 now (a liveness endpoint polled by wait_for)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@functools.cache
def image_build() -> ModuleType:
    """images/build.py (a script rather than a package module), loaded once from its path."""
    spec = importlib.util.spec_from_file_location("cuda_agent_image_build", REPO / "images" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SKIP_IMAGE_BUILD = "CUDA_AGENT_SKIP_IMAGE_BUILD_TESTS"


def cached_image(kind: str, key_env: str, build_env: str) -> tuple[ModuleType, Any]:
    """The multi-GB image `kind` (sandbox, trainer) built from the current inputs, from the cache `make
    images` fills; never built unless `build_env`=1, otherwise the test skips naming the key and the
    command. `key_env`=<key> tests a cached image of other inputs (by hand, never in CI)."""
    if os.environ.get(SKIP_IMAGE_BUILD) == "1":
        pytest.skip(f"{SKIP_IMAGE_BUILD}=1")
    if os.geteuid() != 0:
        pytest.skip("buildah (vfs storage) and the restricted run need root")
    build = image_build()
    spec = build.IMAGES[kind]
    pinned = os.environ.get(key_env)
    image = build.find_image(spec, key=pinned)
    if pinned and image is None:
        pytest.fail(f"{key_env}={pinned}: no cached {kind} image of that key")
    if image is None and os.environ.get(build_env) == "1":
        try:
            image = build.build_image(spec)
        except build.MissingTool as missing:
            pytest.skip(str(missing))
    if image is None:
        copied = ", ".join(build.copied_sources(spec.dockerfile))
        pytest.skip(
            f"no {kind} image built from the current inputs (key {build.current_key(spec)}: "
            f"{spec.dockerfile.relative_to(REPO)}, the Debian base, {copied}): `make images` builds it "
            f"(~31 GB of disk at its peak), or {build_env}=1 builds it here; docs/install.md"
        )
    return build, image


def run_inside(
    image_fixture: tuple[ModuleType, Any], argv: list[str], writable: dict[Path, str] | None = None
) -> str:
    """`argv` in the image as its pod runs: its USER, read-only root, /tmp a tmpfs (or `writable`'s host
    directories, as emptyDirs), no_new_privs, no capabilities; the image's vfs layer used in place."""
    build, image = image_fixture
    rootfs = build.layer_rootfs(build.Buildah(build.cache_dir()), image)
    proc = subprocess.run(
        build.restricted(rootfs, image, argv, writable=writable),
        env=image.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return str(proc.stdout)


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the process group (started with start_new_session), SIGKILL after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
