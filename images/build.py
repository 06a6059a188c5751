"""Builds the operator, sandbox and trainer images for real on a machine with no container engine and
no registry: Debian's `debootstrap` makes a Debian bookworm base, `buildah` (vfs storage, chroot
isolation, both from Debian) imports it from scratch and builds images/operator/Dockerfile,
sandbox_image/Dockerfile and images/trainer/Dockerfile on it (their CUDA compiler comes from NVIDIA's PyPI
wheels), and exports each result as an OCI archive. `python images/build.py` (or `make images`) builds,
or reuses the build cached for the same inputs, then starts each image's entry point as its own non-root
USER (docs/install.md).

Everything lives under ~/.cache/cuda-agent/images (CUDA_AGENT_IMAGE_CACHE): the debootstrap rootfs,
buildah's storage and the archives, so nothing touches /var/lib/containers or other system paths.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[1]
OPERATOR_DOCKERFILE = REPO / "images" / "operator" / "Dockerfile"
SANDBOX_DOCKERFILE = REPO / "sandbox_image" / "Dockerfile"
TRAINER_DOCKERFILE = REPO / "images" / "trainer" / "Dockerfile"
# The chart's image names (charts/cuda-agent/values.yaml images.*), also the archives' ref names.
OPERATOR_NAME = "ghcr.io/cuda-agent/operator:0.1.0"
SANDBOX_NAME = "ghcr.io/cuda-agent/sandbox:0.1.0"
TRAINER_NAME = "ghcr.io/cuda-agent/trainer:0.1.0"


@dataclass(frozen=True)
class ImageSpec:
    """One image this script builds: local tags localhost/cuda-agent/<kind>:<key>, archives
    <kind>-<key>.oci.tar whose ref name is the chart's image."""

    kind: str
    dockerfile: Path
    ref: str


OPERATOR = ImageSpec("operator", OPERATOR_DOCKERFILE, OPERATOR_NAME)
SANDBOX = ImageSpec("sandbox", SANDBOX_DOCKERFILE, SANDBOX_NAME)
TRAINER = ImageSpec("trainer", TRAINER_DOCKERFILE, TRAINER_NAME)
IMAGES = {spec.kind: spec for spec in (OPERATOR, SANDBOX, TRAINER)}

# The Dockerfile's default base is python:3.11.11-slim-bookworm; ours is the same Debian release with
# Debian's own Python 3.11 (`python` from python-is-python3, the venv module, CA certificates for pip)
# and the tools the chart's seccomp DaemonSet runs from this image (sh, cp, cmp: essential packages).
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "netbase", "tzdata")
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
HOST_TOOLS = {"buildah": "buildah", "debootstrap": "debootstrap"}  # command -> Debian package


class MissingTool(RuntimeError):
    """A tool the build needs is absent and cannot be installed here; the message names it."""


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "cuda-agent" / "images"
    return Path(os.environ.get("CUDA_AGENT_IMAGE_CACHE", default))


def log(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def ensure_host_tools() -> None:
    """Installs buildah and debootstrap from Debian when missing (root and apt-get needed)."""
    missing = [package for command, package in HOST_TOOLS.items() if shutil.which(command) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise MissingTool(
            f"{', '.join(missing)} missing, and apt-get as root is not available to install them "
            f"(apt-get install {' '.join(missing)})"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", *missing]
    log(f"installing {' '.join(missing)} from Debian")
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        # Stale package lists are the usual cause; one update, then the install must succeed.
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        proc = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise MissingTool(f"apt-get install {' '.join(missing)} failed: {proc.stderr[-2000:]}")


class Buildah:
    """buildah with the project's own storage (vfs: no overlay or fuse needed) and chroot isolation."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.base = [
            "buildah",
            "--root",
            str(root / "storage"),
            "--runroot",
            str(root / "run"),
            "--storage-driver",
            "vfs",
        ]

    def __call__(self, *args: str, quiet: bool = True) -> str:
        proc = subprocess.run(
            [*self.base, *args],
            env={**os.environ, "BUILDAH_ISOLATION": "chroot"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if quiet else None,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"buildah {shlex.join(args)} failed:\n{(proc.stderr or '')[-4000:]}")
        return proc.stdout.strip()

    def exists(self, kind: str, name: str) -> bool:
        proc = subprocess.run([*self.base, "inspect", "--type", kind, name], capture_output=True, check=False)
        return proc.returncode == 0

    def inspect(self, kind: str, name: str) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(self("inspect", "--type", kind, name))
        return info


def digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """One build at a time per cache (make images and the test may overlap)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def base_key() -> str:
    return digest(SUITE.encode(), MIRROR.encode(), " ".join(BASE_PACKAGES).encode())[:16]


def base_name() -> str:
    return f"localhost/cuda-agent/debian:{SUITE}-{base_key()}"


def base_rootfs(cache: Path) -> Path:
    """The debootstrap'ed Debian rootfs, made once per base key (~40 s, ~270 MB)."""
    rootfs = cache / "base" / base_key() / "rootfs"
    if (rootfs / "usr" / "bin" / "python3").exists():
        return rootfs
    staging = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache))
    command = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
        SUITE,
        str(staging),
        MIRROR,
    ]
    log(f"debootstrap {SUITE} into {rootfs}")
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"{shlex.join(command)} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    # As in Debian's own slim images: no package lists or downloaded .debs in the image.
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (staging / junk).glob("*"):
            if entry.is_file():
                entry.unlink()
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(rootfs, ignore_errors=True)
    staging.rename(rootfs)
    # The suite is pinned, not its point release: record what this base holds, package by package.
    versions = subprocess.run(
        ["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W"], capture_output=True, text=True, check=True
    )
    (rootfs.parent / "packages.txt").write_text(versions.stdout)
    return rootfs


def base_image(buildah: Buildah, cache: Path) -> str:
    """The rootfs as a local image, committed from `buildah from scratch`."""
    name = base_name()
    if buildah.exists("image", name):
        return name
    rootfs = base_rootfs(cache)
    container = buildah("from", "scratch")
    try:
        buildah("copy", container, f"{rootfs}/", "/")
        env = [arg for key, value in BASE_ENV.items() for arg in ("--env", f"{key}={value}")]
        buildah("config", *env, "--cmd", "python3", container)
        buildah("commit", "--quiet", container, name)
    finally:
        buildah("rm", container)
    return name


def copied_sources(dockerfile: Path) -> list[str]:
    """Every build-context path the Dockerfile COPYs (not the stage-to-stage ones)."""
    sources: list[str] = []
    for step in DockerfileParser(str(dockerfile)).structure:
        if step["instruction"] != "COPY":
            continue
        words = shlex.split(step["value"])
        if any(word.startswith("--from=") for word in words):
            continue
        sources += [word for word in words if not word.startswith("--")][:-1]
    return sources


def stage_context(dockerfile: Path, context: Path) -> list[Path]:
    """Copies just what the Dockerfile COPYs into `context` (buildah would walk the whole repository,
    .venv included) and returns the copied files, sorted: the inputs the image's key hashes."""
    for source in copied_sources(dockerfile):
        target = context / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / source).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / source, target, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(REPO / source, target)
    return sorted(path for path in context.rglob("*") if path.is_file())


@dataclass(frozen=True)
class BuiltImage:
    name: str  # local tag, keyed by the inputs
    key: str
    archive: Path  # OCI archive, ref name the chart's image
    user: str
    entrypoint: list[str]
    env: dict[str, str]
    workdir: str
    built: bool  # False: reused from the cache
    seconds: dict[str, float]
    kind: str = OPERATOR.kind


def image_config(buildah: Buildah, name: str) -> tuple[str, list[str], dict[str, str], str]:
    config = buildah.inspect("image", name)["OCIv1"]["config"]
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    return config.get("User", ""), config.get("Entrypoint", []), env, config.get("WorkingDir", "") or "/"


def image_key(spec: ImageSpec, context: Path) -> str:
    """The image's key: a hash of its Dockerfile, the base and every file it copies (staged in `context`),
    so an unchanged key means an image built from exactly these inputs."""
    files = stage_context(spec.dockerfile, context)
    parts = [spec.dockerfile.read_bytes(), base_name().encode()]
    parts += [str(f.relative_to(context)).encode() + b"\0" + f.read_bytes() for f in files]
    return digest(*parts)[:16]


def local_name(spec: ImageSpec, key: str) -> str:
    return f"localhost/cuda-agent/{spec.kind}:{key}"


def archive_path(cache: Path, spec: ImageSpec, key: str) -> Path:
    return cache / "oci" / f"{spec.kind}-{key}.oci.tar"


def current_key(spec: ImageSpec, cache: Path | None = None) -> str:
    """The key `build_image(spec)` would build now (stages the context in a temp dir, builds nothing)."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="context-", dir=cache) as tmp:
        return image_key(spec, Path(tmp))


def find_image(spec: ImageSpec, cache: Path | None = None, key: str | None = None) -> BuiltImage | None:
    """The image built from the current inputs (or the cached one of `key`), if `build_image` (or `make
    images`) made it; never builds. Tests of the multi-GB sandbox image use this: no rebuild when no one
    asked for one."""
    cache = cache or cache_dir()
    if shutil.which("buildah") is None:
        return None
    key = key or current_key(spec, cache)
    name, archive = local_name(spec, key), archive_path(cache, spec, key)
    buildah = Buildah(cache)
    if not (archive.exists() and buildah.exists("image", name)):
        return None
    user, entrypoint, env, workdir = image_config(buildah, name)
    return BuiltImage(name, key, archive, user, entrypoint, env, workdir, False, {}, spec.kind)


def build_image(spec: ImageSpec, cache: Path | None = None) -> BuiltImage:
    """Builds `spec`'s Dockerfile on the Debian base, or reuses the image built from the same Dockerfile,
    copied files and base; exports it as an OCI archive."""
    cache = cache or cache_dir()
    ensure_host_tools()
    with locked(cache / "build.lock"):
        buildah = Buildah(cache)
        seconds: dict[str, float] = {}
        started = time.monotonic()
        base = base_image(buildah, cache)
        seconds["base"] = time.monotonic() - started
        with tempfile.TemporaryDirectory(prefix="context-", dir=cache) as tmp:
            context = Path(tmp)
            key = image_key(spec, context)
            name, archive = local_name(spec, key), archive_path(cache, spec, key)
            built = not (buildah.exists("image", name) and archive.exists())
            if built:
                # Older builds go first: vfs stores every layer as a full copy (the sandbox's ~6 GB).
                prune(buildah, cache, spec, keep=name)
                started = time.monotonic()
                log(f"buildah bud {spec.dockerfile.relative_to(REPO)} on {base} -> {name}")
                shutil.copy2(spec.dockerfile, context / "Dockerfile")
                # No --layers: every step of a stage runs in one container, committed once as one layer
                # (with vfs, each committed layer would be another full copy of the root filesystem).
                buildah(
                    "bud",
                    "--isolation",
                    "chroot",
                    "--network",
                    "host",
                    "--pull=never",
                    "--layers=false",
                    "--format",
                    "oci",
                    "--build-arg",
                    f"PYTHON_IMAGE={base}",
                    *trust_host_ca(cache),
                    "--file",
                    str(context / "Dockerfile"),
                    "--tag",
                    name,
                    str(context),
                    quiet=False,
                )
                seconds["bud"] = time.monotonic() - started
                started = time.monotonic()
                archive.parent.mkdir(parents=True, exist_ok=True)
                partial = archive.with_suffix(".partial")
                partial.unlink(missing_ok=True)
                buildah("push", "--quiet", name, f"oci-archive:{partial}:{spec.ref}")
                partial.rename(archive)
                seconds["archive"] = time.monotonic() - started
                prune(buildah, cache, spec, keep=name)
        user, entrypoint, env, workdir = image_config(buildah, name)
        return BuiltImage(name, key, archive, user, entrypoint, env, workdir, built, seconds, spec.kind)


def build_operator(cache: Path | None = None) -> BuiltImage:
    return build_image(OPERATOR, cache)


def build_sandbox(cache: Path | None = None) -> BuiltImage:
    return build_image(SANDBOX, cache)


def build_trainer(cache: Path | None = None) -> BuiltImage:
    return build_image(TRAINER, cache)


def trust_host_ca(cache: Path) -> list[str]:
    """Volumes that let the RUN steps' pip trust the CAs this host trusts (a TLS-inspecting egress proxy
    here signs PyPI's certificate with its own CA). Mounted during RUN only, so nothing reaches a layer."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.exists():
        return []
    pip_conf = cache / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {bundle}\n")
    return ["--volume", f"{bundle}:{bundle}:ro", "--volume", f"{pip_conf}:/etc/pip.conf:ro"]


def prune(buildah: Buildah, cache: Path, spec: ImageSpec, keep: str) -> None:
    """Drops `spec`'s images and archives of older inputs and the build stage's leftovers: vfs stores
    every layer as a full copy (~0.5 GB per operator build, ~6 GB per sandbox build)."""
    repository = keep.rsplit(":", 1)[0]
    for line in buildah("images", "--format", "{{.Name}}:{{.Tag}}").splitlines():
        if line.startswith(f"{repository}:") and line != keep:
            for container in buildah("containers", "--quiet", "--filter", f"ancestor={line}").split():
                buildah("rm", container)
            buildah("rmi", line)
    for archive in (cache / "oci").glob(f"{spec.kind}-*.oci.tar"):
        if archive.name != f"{spec.kind}-{keep.rsplit(':', 1)[1]}.oci.tar":
            archive.unlink()
    # Containers a killed build left behind (buildah bud names them <kind>-working-container).
    for line in buildah("containers", "--format", "{{.ContainerName}}").splitlines():
        if "working-container" in line:
            buildah("rm", line)
    buildah("rmi", "--prune")


def image_rootfs(buildah: Buildah, image: BuiltImage) -> tuple[str, Path]:
    """A working container of the image, kept across runs (vfs copies the layers once, 5-15 s), and its
    mounted root filesystem."""
    container = f"cuda-agent-{image.kind}-{image.key}"
    with locked(buildah.root / "build.lock"):
        if not buildah.exists("container", container):
            buildah("from", "--pull=never", "--name", container, image.name)
        return container, Path(buildah("mount", container))


def layer_rootfs(buildah: Buildah, image: BuiltImage) -> Path:
    """The image's top layer directory in vfs storage: with vfs every layer is a complete root filesystem,
    so a read-only run needs no working container (which would copy the sandbox's ~6 GB once more).
    containers/storage keeps each image's top layer id in vfs-images/images.json; callers must only bind
    it read-only (`restricted` does) and never write into it."""
    image_id = buildah.inspect("image", image.name)["FromImageID"]
    images = json.loads((buildah.root / "storage" / "vfs-images" / "images.json").read_text())
    (layer,) = [str(entry["layer"]) for entry in images if entry["id"] == image_id]
    rootfs = buildah.root / "storage" / "vfs" / "dir" / layer
    if not (rootfs / "usr").is_dir():
        raise RuntimeError(f"{image.name}: no root filesystem at {rootfs}")
    return rootfs


# The pod the chart runs an image in, reproduced with util-linux and coreutils: a private mount and
# pid namespace, the image's root bind-mounted read-only, /tmp a small tmpfs (the chart's emptyDir), a
# minimal /dev with the /dev/shm container runtimes give, volumes (read-only as a pod's Secret, or
# writable as an emptyDir), no_new_privs, then chroot switches to the image's USER, and every capability
# goes with root.
RESTRICTED = r"""
set -e
root=$1 user=$2 workdir=$3 volumes=$4; shift 4
mount --make-rprivate /
mount --bind "$root" "$root"
mount -o remount,bind,ro,nosuid,nodev "$root"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o size=64m,mode=1777,nosuid,nodev tmpfs "$root/tmp"
mount -t tmpfs -o size=1m,mode=0755,nosuid tmpfs "$root/dev"
for node in null zero full random urandom; do
  : > "$root/dev/$node"; mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir "$root/dev/shm"; mount -t tmpfs -o size=64m,mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
while [ "$volumes" -gt 0 ]; do
  mount --bind "$1" "$root$2"; mount -o "remount,bind,$3,nosuid,nodev" "$root$2"
  shift 3; volumes=$((volumes - 1))
done
exec setpriv --no-new-privs chroot --userspec="$user" --groups="${user#*:}" "$root" \
  /bin/sh -c 'cd "$0" && exec "$@"' "$workdir" "$@"
"""


def restricted(
    rootfs: Path,
    image: BuiltImage,
    argv: Sequence[str],
    volumes: Mapping[Path, str] | None = None,
    writable: Mapping[Path, str] | None = None,
) -> list[str]:
    """The command that runs `argv` in the image as a restricted pod runs it: the image's USER, a
    read-only root, no privilege escalation, no capabilities; `volumes` maps host directories to
    directories of the image, mounted read-only, `writable` likewise but writable (an emptyDir). Run it
    as root with `env=image.env` (and more)."""
    user = image.user if ":" in image.user else f"{image.user}:{image.user}"
    mounts = [(host, target, "ro") for host, target in (volumes or {}).items()]
    mounts += [(host, target, "rw") for host, target in (writable or {}).items()]
    words = [str(word) for mount in mounts for word in mount]
    command = ["unshare", "--mount", "--pid", "--fork", "/bin/sh", "-c", RESTRICTED, "restricted"]
    return [*command, str(rootfs), user, image.workdir, str(len(mounts)), *words, *argv]


def run_restricted(rootfs: Path, image: BuiltImage, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        restricted(rootfs, image, argv),
        env=image.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def check(image: BuiltImage) -> None:
    """The image's entry point starts as its non-root USER: restricted, and for the operator also under
    `buildah run` (the sandbox's read-only run uses its layer directly, sparing a ~6 GB copy)."""
    buildah = Buildah(cache_dir())
    if image.kind == OPERATOR.kind:
        container, rootfs = image_rootfs(buildah, image)
        uid = buildah("run", container, "--", "python", "-c", "import os; print(os.getuid())")
        log(f"buildah run: uid {uid}")
    else:
        rootfs = layer_rootfs(buildah, image)
        uid = run_restricted(rootfs, image, ["python", "-c", "import os; print(os.getuid())"]).stdout.strip()
    if uid in ("0", ""):
        raise RuntimeError(f"{image.name} runs as root (uid {uid!r})")
    proc = run_restricted(rootfs, image, [*image.entrypoint, "--help"])
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(image.entrypoint)} --help failed:\n{proc.stdout}{proc.stderr}")
    log(f"read-only root, no_new_privs, user {image.user}: {shlex.join(image.entrypoint)} --help starts")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--no-check", action="store_true", help="build only; do not start the entry point")
    parser.add_argument(
        "--image",
        choices=sorted(IMAGES),
        action="append",
        help="build only this image (repeatable; default: all). The sandbox's and the trainer's builds take "
        "~6-7 min on two cores and ~31 GB of disk at their peak each (docs/install.md)",
    )
    args = parser.parse_args(argv)
    for kind in args.image or IMAGES:
        spec = IMAGES[kind]
        try:
            image = build_image(spec)
        except MissingTool as error:
            print(f"images: {error}", file=sys.stderr)
            return 2
        log(
            f"{image.name} ({'built' if image.built else 'cached'}; "
            + ", ".join(f"{step} {s:.0f} s" for step, s in image.seconds.items())
            + f") -> {image.archive} ({image.archive.stat().st_size / 2**20:.0f} MiB, ref {spec.ref})"
        )
        if not args.no_check:
            check(image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
