"""Go-built binaries of the local control plane, pinned and cached once per machine.

Every binary comes from a Go module at a pinned version, compiled here: this machine reaches the Go module
proxy but no download site, so no prebuilt release can be fetched. Builds land in `bin_dir()`
(`~/.cache/cuda-agent/bin`, or `$CUDA_AGENT_BIN_DIR`) with a stamp per binary naming what was built, so a
version bump rebuilds exactly the binaries it touches and everything else is reused.

    python -m cuda_agent.localcluster.binaries build              # what `make binaries` runs
    python -m cuda_agent.localcluster.binaries build --for demo   # only what `make demo` needs

The module uses the standard library only: `make demo` runs it with the machine's Python (PYTHONPATH=platform)
while pip fills the virtualenv, so the CPU-bound Go builds overlap the network-bound install.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v4.3.1"
# MinIO tags releases as RELEASE.<date>, which Go cannot order, so its module version is a pseudo-version.
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"

GOMOD_DIR = Path(__file__).parent / "gomod"


def _kube_version_ldflags(version: str) -> tuple[str, ...]:
    # kwokctl and kubectl read the component version from `--version`; an untagged build reports
    # v0.0.0-master, which kwokctl cannot map to the flags that release takes.
    major, minor = version.lstrip("v").split(".")[:2]
    flags: list[str] = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return tuple(flags)


@dataclass(frozen=True)
class GoBinary:
    """One executable: which Go package builds it, from which module version, with which link flags.

    `gomod` names a directory under `gomod/` holding a go.mod of ours; it is needed where the upstream
    module carries `replace` directives (k8s.io/kubernetes, etcd's server), which `go install pkg@version`
    refuses. Without it the binary is built with `go install package@version`.
    """

    name: str
    package: str
    version: str
    gomod: str | None = None
    ldflags: tuple[str, ...] = ()

    def build_key(self) -> str:
        """What the stamp records: a change to any of these must rebuild the binary."""
        parts = [self.package, self.version, *self.ldflags]
        if self.gomod is not None:
            module_dir = GOMOD_DIR / self.gomod
            for file_name in ("go.mod", "go.sum"):
                parts.append(hashlib.sha256((module_dir / file_name).read_bytes()).hexdigest())
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def group(self) -> tuple[str | None, str, tuple[str, ...]]:
        """Binaries sharing a group compile in one `go` invocation and share their common packages."""
        return (self.gomod, self.version, self.ldflags)


_KUBE_LDFLAGS = _kube_version_ldflags(KUBERNETES_VERSION)

BINARIES: dict[str, GoBinary] = {
    b.name: b
    for b in [
        GoBinary(name="etcd", package="go.etcd.io/etcd/server/v3", version=ETCD_VERSION, gomod="etcd"),
        *[
            GoBinary(
                name=cmd,
                package=f"k8s.io/kubernetes/cmd/{cmd}",
                version=KUBERNETES_VERSION,
                gomod="kubernetes",
                ldflags=_KUBE_LDFLAGS,
            )
            for cmd in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
        ],
        GoBinary(name="kwok", package="sigs.k8s.io/kwok/cmd/kwok", version=KWOK_VERSION),
        GoBinary(name="kwokctl", package="sigs.k8s.io/kwok/cmd/kwokctl", version=KWOK_VERSION),
        GoBinary(
            name="helm",
            package="helm.sh/helm/v4/cmd/helm",
            version=HELM_VERSION,
            ldflags=(f"-X helm.sh/helm/v4/internal/version.version={HELM_VERSION}",),
        ),
        GoBinary(name="minio", package="github.com/minio/minio", version=MINIO_VERSION),
    ]
}

# What kwokctl's binary runtime starts for a local cluster (cluster.LocalCluster.up).
CONTROL_PLANE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
# Named sets for `build --for`: the demo drives kwokctl and MinIO besides the control plane and never helm
# (the chart's tests are the only helm user), which saves helm's ~5 min cold build on a first `make demo`.
BINARY_SETS: dict[str, tuple[str, ...]] = {
    "demo": (*CONTROL_PLANE_BINARIES, "kwokctl", "minio"),
    "all": tuple(BINARIES),
}
# Go builds at once. Each `go` invocation already compiles packages in parallel, but it also spends long
# stretches on one core (module download, the dependency walk, the link of a ~100 MB binary): two
# invocations side by side keep both cores of a small machine busy through those stretches.
PARALLEL_BUILDS = 2


class GoMissingError(RuntimeError):
    """Raised when a binary must be built and no `go` toolchain is on PATH."""


class BuildError(RuntimeError):
    """Raised when `go build` / `go install` fails; carries the command and go's own output."""


@dataclass(frozen=True)
class BuildRecord:
    """The stamp beside each binary: what produced it and how long the build took.

    A dataclass, not a pydantic model like the other records that cross a process boundary: this module
    runs before the virtualenv (and pydantic) exists, and the stamp is read back only by this module."""

    name: str
    package: str
    version: str
    build_key: str
    seconds: float
    built_at: str

    @classmethod
    def from_json(cls, text: str) -> BuildRecord:
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != set(cls.__dataclass_fields__):
            raise ValueError("not a build record")
        record = cls(**data)
        if not all(isinstance(getattr(record, f), str) for f in ("name", "package", "version", "build_key")):
            raise ValueError("not a build record")
        return record


def bin_dir() -> Path:
    return Path(os.environ.get("CUDA_AGENT_BIN_DIR", Path.home() / ".cache" / "cuda-agent" / "bin"))


def _stamp_path(name: str) -> Path:
    return bin_dir() / ".stamps" / f"{name}.json"


def read_record(name: str) -> BuildRecord | None:
    stamp = _stamp_path(name)
    if not stamp.is_file():
        return None
    try:
        return BuildRecord.from_json(stamp.read_text())
    except (ValueError, TypeError):
        return None  # a stamp from an older layout or a torn write: rebuild


def is_current(binary: GoBinary) -> bool:
    record = read_record(binary.name)
    executable = bin_dir() / binary.name
    return record is not None and record.build_key == binary.build_key() and os.access(executable, os.X_OK)


def go_executable() -> str:
    go = shutil.which("go")
    if go is None:
        raise GoMissingError(
            "`go` is not on PATH: the local control plane (etcd, kube-apiserver, kwok, helm, minio) is "
            "built from pinned Go modules. Install Go >= 1.26 and put its bin/ on PATH."
        )
    return go


@contextmanager
def _build_lock() -> Iterator[None]:
    # pytest sessions and `make binaries` may run at once; one builder at a time, the others then find
    # fresh stamps and reuse the result instead of compiling kube-apiserver twice on two cores.
    bin_dir().mkdir(parents=True, exist_ok=True)
    with open(bin_dir() / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Holding the lock, any scratch dir left here belongs to a builder that was killed mid-build.
        for scratch in bin_dir().glob(".build-*"):
            shutil.rmtree(scratch, ignore_errors=True)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _go_command(go: str, group: Sequence[GoBinary], out_dir: Path) -> tuple[list[str], Path | None]:
    """The go invocation for one group, and the directory it must run in (None: anywhere)."""
    first = group[0]
    # -buildvcs=false: our gomod/ dirs sit inside this repo's git checkout, and VCS stamping would make
    # the build depend on git being installed and on the checkout's state.
    # -gcflags=all=-dwarf=false: the compiler skips the debug info that `-ldflags=-w` strips at link time
    # anyway (same code, same binary size): 13 % less CPU for a cold etcd build here (/usr/bin/time, two
    # rounds each: 165 and 149 CPU-s with it, 147 and 125 without). Not part of build_key: the binaries it
    # gives run the same code, so a machine's existing builds stay current.
    flags = [
        "-trimpath",
        "-buildvcs=false",
        "-gcflags=all=-dwarf=false",
        f"-ldflags=-s -w {' '.join(first.ldflags)}".strip(),
    ]
    if first.gomod is not None:
        packages = [b.package for b in group]
        return [go, "build", *flags, "-o", f"{out_dir}/", *packages], GOMOD_DIR / first.gomod
    return [go, "install", *flags, *[f"{b.package}@{b.version}" for b in group]], None


def _go_output_name(package: str) -> str:
    # go names a binary after the package path's last element, skipping a major-version suffix:
    # go.etcd.io/etcd/server/v3 builds "server".
    elements = package.split("/")
    return elements[-2] if re.fullmatch(r"v[0-9]+", elements[-1]) else elements[-1]


def _lower_priority() -> None:
    os.nice(10)


def _build_group(group: Sequence[GoBinary]) -> float:
    """Compiles one group into a scratch dir, then moves each binary into place atomically."""
    go = go_executable()
    target = bin_dir()
    with tempfile.TemporaryDirectory(dir=target, prefix=".build-") as scratch:
        out_dir = Path(scratch)
        command, cwd = _go_command(go, group, out_dir)
        env = {**os.environ, "CGO_ENABLED": "0", "GOBIN": str(out_dir)}
        started = time.monotonic()
        proc = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, preexec_fn=_lower_priority
        )
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise BuildError(
                f"building {', '.join(b.name for b in group)} failed (exit {proc.returncode}):\n"
                f"$ {' '.join(command)}\n{proc.stderr.strip()[-6000:]}"
            )
        for binary in group:
            built = out_dir / _go_output_name(binary.package)
            if not built.is_file():
                raise BuildError(f"go finished but left no {built.name} for {binary.name} in {out_dir}")
            os.replace(built, target / binary.name)
            _write_record(binary, seconds)
    return seconds


def _write_record(binary: GoBinary, seconds: float) -> None:
    record = BuildRecord(
        name=binary.name,
        package=binary.package,
        version=binary.version,
        build_key=binary.build_key(),
        seconds=round(seconds, 1),
        built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    stamp = _stamp_path(binary.name)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
    os.replace(tmp, stamp)


def _lookup(name: str) -> GoBinary:
    if name not in BINARIES:
        raise LookupError(f"unknown binary {name!r}; known: {', '.join(BINARIES)}")
    return BINARIES[name]


def _groups(binaries: Sequence[GoBinary]) -> list[list[GoBinary]]:
    grouped: dict[tuple[str | None, str, tuple[str, ...]], list[GoBinary]] = {}
    for binary in binaries:
        grouped.setdefault(binary.group(), []).append(binary)
    return list(grouped.values())


def build(names: Sequence[str], log: bool = False) -> list[Path]:
    """Builds those of `names` whose stamp is missing or stale; returns every binary's path."""
    wanted = [_lookup(name) for name in names]
    if log:
        for binary in wanted:
            record = read_record(binary.name)
            if record is not None and is_current(binary):
                print(
                    f"reused  {binary.name:<24} {binary.version:<36} (last build took {record.seconds:.0f} s)"
                )
    # Current binaries are used without the lock, so a cluster can start while another process builds.
    if all(is_current(b) for b in wanted):
        return [bin_dir() / b.name for b in wanted]
    with _build_lock():
        # Asked again under the lock: the holder before us may have built them meanwhile.
        stale = [b for b in wanted if not is_current(b)]
        # Largest first, so the long Kubernetes build starts at once and the short ones fill in beside it.
        groups = sorted(_groups(stale), key=len, reverse=True)
        with ThreadPoolExecutor(max_workers=PARALLEL_BUILDS) as pool:
            for _ in pool.map(lambda group: _build_logged(group, log), groups):
                pass  # map re-raises the first BuildError in group order once every build has ended
    return [bin_dir() / b.name for b in wanted]


def _build_logged(group: Sequence[GoBinary], log: bool) -> float:
    label = ", ".join(b.name for b in group)
    if log:
        print(f"building {label} ({group[0].version}) ...", flush=True)
    seconds = _build_group(group)
    if log:
        print(f"built   {label:<24} {group[0].version:<36} in {seconds:.0f} s", flush=True)
    return seconds


def ensure(name: str) -> Path:
    """The path of binary `name`, building it first when it is missing or its pin changed."""
    return build([name])[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cuda_agent.localcluster.binaries",
        description="Build the local control plane's binaries from pinned Go modules (once per machine).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build what is missing or stale, reuse the rest")
    build_cmd.add_argument(
        "names", nargs="*", help=f"binaries to build (default: all of {', '.join(BINARIES)})"
    )
    build_cmd.add_argument(
        "--for",
        dest="binary_set",
        choices=sorted(BINARY_SETS),
        help="build a named set instead: demo = what `make demo` runs, all = every binary",
    )
    sub.add_parser("list", help="print each binary, its pinned version and whether it is built")
    args = parser.parse_args(argv)
    print(f"binaries in {bin_dir()}")
    if args.command == "list":
        for binary in BINARIES.values():
            state = "built" if is_current(binary) else "missing or stale"
            print(f"{binary.name:<24} {binary.version:<36} {state}")
        return 0
    if args.binary_set is not None and args.names:
        parser.error("give binary names or --for, not both")
    names = list(BINARY_SETS[args.binary_set]) if args.binary_set else args.names or list(BINARIES)
    try:
        build(names, log=True)
    except (GoMissingError, BuildError, LookupError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
