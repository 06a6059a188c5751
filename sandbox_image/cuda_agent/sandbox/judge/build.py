"""Trusted builds of candidate extensions into a content-addressed cache (orchestrator side only).

Why not torch's own load_inline: it recompiles torch headers into every translation unit (76 s cold for a
trivial kernel on the H200 host, MEASUREMENTS.md). Here every translation unit is cached by the hash of
its source, its quoted includes, its flags and the toolchain; torch TUs compile against a precompiled
header of torch/extension.h built once per flag set; TUs compile in parallel; linking is cached by the
objects' keys. Workspace `.cu` kernels never see torch headers, so an edit to one rebuilds in ~2 s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.api.judge_files import FROZEN_FILES, FROZEN_SUBDIR, IMAGE_JUDGE_SEED_DIR, JUDGE_SEED_ENV
from cuda_agent.sandbox.judge import screen

FROZEN_DIR = Path(__file__).parent / FROZEN_SUBDIR
WORKSPACE_MODULE = "cuda_extension"
BUILD_LOG_LIMIT = 8192
HEADER_SUFFIXES = screen.HEADER_SUFFIXES
BINDING_OPT = "-O1"  # optimisation level of workspace bindings (torch glue) and of their precompiled header
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
INCLUDE_ANY = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
PCH_HEADER = "torch_extension_pch.h"  # in pch/<key>/ of the build cache and of the seed, beside its .gch
# The precompiled headers `cuda-agent judge-seed` builds by default: the flag sets of a workspace's bindings,
# of a load_inline candidate without extra_cflags, and of one with KernelBench's usual extra_cflags=["-O3"].
SEED_FLAG_SETS: dict[str, tuple[str, ...]] = {
    "workspace bindings": (BINDING_OPT,),
    "load_inline, no extra_cflags": (),
    "load_inline, extra_cflags=['-O3']": ("-O3",),
}


class BuildTimeout(Exception):
    """The build phase ran past its deadline."""


@dataclass(frozen=True)
class VendorLibrary:
    """A vendor library a CUDA extension may link (CUDA Agent's rules: cuBLAS/cuBLASLt, cuDNN)."""

    name: str  # as in -l<name>
    include_dir: str
    lib_dir: str
    link: str  # -l<name>, or -l:lib<name>.so.<N> where only the versioned file exists (pip wheels)


# name -> (the header that declares it, the headers whose inclusion links it into a workspace build)
VENDOR_HEADERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cublas": ("cublas_v2.h", ("cublas_v2.h", "cublas.h", "cublas_api.h")),
    "cublasLt": ("cublasLt.h", ("cublasLt.h",)),
    "cudnn": ("cudnn.h", ("cudnn.h", "cudnn_frontend.h")),
}


def _vendor_roots(site_packages: str, cuda_home: str | None) -> list[Path]:
    """Where the libraries may live: the pip wheels torch itself loads first, then the CUDA toolkit and
    the system (in the sandbox image, whose toolkit is NVIDIA's PyPI wheels, cuBLAS is in nvidia/cu13 and
    cuDNN in nvidia/cudnn; on a CUDA devel base the toolkit has its own cuBLAS)."""
    roots = [Path(site_packages, "nvidia", sub) for sub in ("cudnn", "cu13", "cu12", "cublas")]
    if cuda_home:
        roots.append(Path(cuda_home))
    roots += [Path("/usr"), Path("/usr/local/cuda")]
    return roots


def find_vendor_libraries(site_packages: str, cuda_home: str | None) -> tuple[VendorLibrary, ...]:
    """Each vendor library whose header and shared library are both found (first root that has them)."""
    found: list[VendorLibrary] = []
    for name, (header, _) in VENDOR_HEADERS.items():
        for root in _vendor_roots(site_packages, cuda_home):
            includes = [
                root / "include",
                root / "include" / "x86_64-linux-gnu",
                root / "targets" / "x86_64-linux" / "include",
            ]
            include = next((d for d in includes if (d / header).is_file()), None)
            libs = [
                root / "lib",
                root / "lib64",
                root / "lib" / "x86_64-linux-gnu",
                root / "targets" / "x86_64-linux" / "lib",
            ]
            lib_dir = next((d for d in libs if any(d.glob(f"lib{name}.so*"))), None)
            if include is None or lib_dir is None:
                continue
            if (lib_dir / f"lib{name}.so").exists():
                link = f"-l{name}"
            else:
                versioned = sorted((p.name for p in lib_dir.glob(f"lib{name}.so.*")), key=len)
                link = f"-l:{versioned[0]}"
            found.append(VendorLibrary(name, str(include), str(lib_dir), link))
            break
    return tuple(found)


def vendor_libraries_used(texts: Iterable[str]) -> list[str]:
    """Vendor libraries whose headers the sources include: a workspace build links them."""
    used: list[str] = []
    for text in texts:
        for path in INCLUDE_ANY.findall(text):
            for name, (_, headers) in VENDOR_HEADERS.items():
                if path.split("/")[-1] in headers and name not in used:
                    used.append(name)
    if "cublasLt" in used and "cublas" not in used:
        used.append("cublas")
    return used


@dataclass(frozen=True)
class Toolchain:
    """Compilers, torch paths and target flags; `tag` changes whenever any of them does."""

    device: str
    cxx: str
    cxx_version: str
    nvcc: str | None
    nvcc_version: str
    torch_version: str
    torch_includes: tuple[str, ...]
    torch_lib: str
    cuda_lib: str | None
    cuda_arch_flags: tuple[str, ...]
    cpu_model: str
    # Where torch's package directory lives (site-packages); not part of any cache key, see `key`.
    site_packages: str = ""
    # Vendor libraries found for CUDA builds (cuBLAS, cuBLASLt, cuDNN): see `find_vendor_libraries`.
    vendor: tuple[VendorLibrary, ...] = ()

    @property
    def tag(self) -> str:
        identity = {k: v for k, v in self.__dict__.items() if k != "site_packages"}
        if self.vendor:
            identity["vendor"] = [dataclasses.astuple(lib) for lib in self.vendor]
        else:  # CPU toolchains: the same key as before vendor libraries existed
            identity.pop("vendor")
        return self.key(identity)[:24]

    def vendor_include_flags(self) -> list[str]:
        flags: list[str] = []
        for lib in self.vendor:
            if lib.include_dir not in self.torch_includes and "-isystem" + lib.include_dir not in flags:
                flags += ["-isystem", lib.include_dir]
        return flags

    def link_args(self, names: Sequence[str]) -> list[str]:
        """Linker arguments for the vendor libraries `names` (`-lcudnn` -> the copy torch itself loads)."""
        args: list[str] = []
        for lib in self.vendor:
            if lib.name in names:
                args += ["-L", lib.lib_dir, lib.link]
        return args

    def key(self, material: Any) -> str:
        """A cache key for `material`. Paths under site-packages are named relative to it: the same torch
        in another virtualenv (a fresh clone, another image layer) reuses the cache instead of rebuilding
        every precompiled header and torch-including object. Built objects carry no path of the venv
        (no rpath: torch's libraries are already loaded when an extension is)."""
        text = json.dumps(material, sort_keys=True, default=list)
        if self.site_packages:
            text = text.replace(self.site_packages, "<site-packages>")
        return hashlib.sha256(text.encode()).hexdigest()


def _version(cmd: Sequence[str], *, last_line: bool = False) -> str:
    """A compiler's version line (nvcc prints it last, g++ first): part of every cache key."""
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (out.stdout or out.stderr).strip().splitlines()
    if not lines:
        return "unknown"
    return lines[-1] if last_line else lines[0]


def _cpu_model() -> str:
    """-march=native objects are only valid on the CPU that built them: the cache key says which."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.MULTILINE)
    flags = re.search(r"^flags\s*:\s*(.*)$", info, re.MULTILINE)
    flag_hash = hashlib.sha256((flags.group(1) if flags else "").encode()).hexdigest()[:12]
    return f"{model.group(1) if model else platform.machine()} [{flag_hash}]"


@functools.cache
def detect_toolchain(device: str, capability: tuple[int, int] | None = None) -> Toolchain:
    """The toolchain of this host; `capability` stands in for the GPU's (only `cuda-agent judge-seed` on a
    host without a GPU passes it: precompiled headers do not depend on the GPU, `_pch_key`)."""
    import torch
    import torch.utils.cpp_extension as cpp_extension

    cxx = shutil.which(os.environ.get("CXX", "g++")) or "g++"
    nvcc = None
    cuda_lib = None
    arch: tuple[str, ...] = ()
    if device == "cuda":
        cuda_home = cpp_extension.CUDA_HOME
        candidate = Path(cuda_home, "bin", "nvcc") if cuda_home else None
        nvcc = str(candidate) if candidate and candidate.exists() else shutil.which("nvcc")
        cuda_lib = cpp_extension.library_paths("cuda")[-1]
        major, minor = capability or torch.cuda.get_device_capability()
        arch = (f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}",)
    site_packages = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    includes = [*cpp_extension.include_paths("cuda" if device == "cuda" else "cpu")]
    includes.append(sysconfig.get_path("include", scheme="posix_prefix"))
    return Toolchain(
        device=device,
        cxx=cxx,
        cxx_version=_version([cxx, "--version"]),
        nvcc=nvcc,
        nvcc_version=_version([nvcc, "--version"], last_line=True) if nvcc else "",
        torch_version=torch.__version__,
        torch_includes=tuple(includes),
        torch_lib=cpp_extension.library_paths("cpu")[0],
        cuda_lib=cuda_lib,
        cuda_arch_flags=arch,
        cpu_model=_cpu_model(),
        site_packages=site_packages,
        vendor=find_vendor_libraries(site_packages, cpp_extension.CUDA_HOME) if device == "cuda" else (),
    )


class BuildCache:
    """Layout: pch/<key>/, obj/<k2>/<key>.o, ext/<key>/<name>.so, locks/. Entries appear atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for sub in ("pch", "obj", "ext", "locks", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.lock_wait_s = 0.0
        # Entries built in a mkdtemp scratch directory (always 0700, and chmod clears setgid) are renamed
        # into place: give them what the umask grants (never "other") and the root's setgid bit, so a
        # cache shared by the judges' group (setgid root, umask 007) stays the group's.
        self.dir_mode = (0o770 & ~current_umask()) | (root.stat().st_mode & stat.S_ISGID)

    def obj(self, key: str) -> Path:
        return self.root / "obj" / key[:2] / f"{key}.o"

    def ext(self, key: str, name: str) -> Path:
        return self.root / "ext" / key / f"{name}.so"

    def pch_dir(self, key: str) -> Path:
        return self.root / "pch" / key

    @contextmanager
    def lock(self, name: str, deadline: float) -> Iterator[None]:
        """Exclusive file lock (shared by concurrent judges); the wait is counted in lock_wait_s."""
        path = self.root / "locks" / f"{name}.lock"
        start = time.monotonic()
        with open(path, "a+") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BuildTimeout() from None
                    time.sleep(0.1)
            self.lock_wait_s += time.monotonic() - start
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def publish(self, produced: Path, final: Path) -> None:
        """First writer wins: an entry, once published, never changes. Two judges building the same
        unit at once produce different bytes (nvcc names its fatbin module uniquely), and a judge that
        hashed the entry it linked must find those bytes when its worker loads the copy (measured on
        the H200: `binary does not match the build` when the second build replaced the first)."""
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(produced, final)
        except FileExistsError:
            pass
        except OSError:  # no hard links on this filesystem
            if not final.exists():
                os.replace(produced, final)
        finally:
            with contextlib.suppress(OSError):
                produced.unlink()

    def scratch(self) -> Path:
        directory = Path(tempfile.mkdtemp(dir=self.root / "tmp"))
        directory.chmod(self.dir_mode)
        return directory

    @staticmethod
    def touch(path: Path) -> None:
        """Mark an entry used now (its mtime): eviction removes the least recently used first."""
        with contextlib.suppress(OSError):
            os.utime(path)

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, path) of every evictable entry: objects, extensions, precompiled headers,
        collected load_inline sources and the torch.compile baseline's per-kernel cache directories."""
        found: list[tuple[float, int, Path]] = []
        groups = [
            *self.root.glob("obj/*/*.o"),
            *self.root.glob("ext/*"),
            *self.root.glob("pch/*"),
            *self.root.glob("src/*"),
            *self.root.glob("baseline/*/*"),
        ]
        for path in groups:
            try:
                files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
                size = sum(p.stat().st_size for p in files)
                used = max([path.stat().st_mtime, *(p.stat().st_mtime for p in files)])
            except OSError:
                continue
            found.append((used, size, path))
        return found

    def size(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def evict(self, max_bytes: int, min_idle_s: float = 3600.0) -> tuple[int, int]:
        """Remove least recently used entries until the cache holds at most `max_bytes`; never one used
        in the last `min_idle_s` seconds (a concurrent judge may be about to read it: the default is
        twice the longest judge run). Returns (bytes removed, bytes left)."""
        with self.lock("evict", time.monotonic() + 60):
            entries = sorted(self.entries())
            total = sum(size for _, size, _ in entries)
            removed = 0
            now = time.time()
            for used, size, path in entries:
                if total - removed <= max_bytes:
                    break
                if now - used < min_idle_s:
                    continue
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        path.unlink()
                removed += size
            return removed, total - removed


@dataclass
class Unit:
    """One translation unit: where its source is, how it compiles, and its content key."""

    label: str
    lang: str  # "cxx-torch" | "cxx-plain" | "cuda-torch" | "cuda-plain"
    source: Path
    flags: list[str]
    search_dirs: list[Path]
    module: str
    key: str = ""
    # The same unit with fewer torch headers (lightest first), tried before this exact source: the lightest
    # that compiles is used, so the choice is deterministic for a given source and toolchain.
    lighter: list[Unit] = field(default_factory=list)

    @property
    def variants(self) -> list[Unit]:
        """Lightest first, this exact source last."""
        return [*self.lighter, self]


@dataclass
class UnitOutcome:
    unit: Unit
    ok: bool
    cached: bool
    output: str
    seconds: float


@dataclass
class BuiltExtension:
    name: str
    path: str
    sha256: str
    digest: str
    kernels: list[str]
    cached: bool


@dataclass
class BuildOutcome:
    ok: bool = True
    extensions: list[BuiltExtension] = field(default_factory=list)
    log: str = ""
    cached: bool = True
    violations: list[str] = field(default_factory=list)
    error: str | None = None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise BuildTimeout()
    return left


def _quoted_deps(source: Path, search_dirs: Sequence[Path], limit: int = 256) -> dict[str, str]:
    """Hashes of the files a source pulls in through quoted #includes (recursively): part of its key."""
    seen: dict[str, str] = {}
    stack = [source]
    while stack and len(seen) < limit:
        current = stack.pop()
        try:
            text = current.read_text(errors="replace")
        except OSError:
            continue
        for name in QUOTED_INCLUDE.findall(text):
            for base in (current.parent, *search_dirs):
                path = (base / name).resolve()
                if path.is_file():
                    label = str(path)
                    if label not in seen:
                        seen[label] = hashlib.sha256(path.read_bytes()).hexdigest()
                        stack.append(path)
                    break
    return seen


def _unit_key(unit: Unit, toolchain: Toolchain, pch_key: str | None) -> str:
    body = {
        "lang": unit.lang,
        "flags": unit.flags,
        "module": unit.module,
        "source": hashlib.sha256(unit.source.read_bytes()).hexdigest(),
        "deps": sorted(_quoted_deps(unit.source, unit.search_dirs).values()),
        "toolchain": toolchain.tag,
        "pch": pch_key,
    }
    return toolchain.key(body)


def _torch_cxx_flags(toolchain: Toolchain, module: str) -> list[str]:
    flags = [f"-DTORCH_EXTENSION_NAME={module}", "-DTORCH_API_INCLUDE_EXTENSION_H", "-fPIC", "-std=c++17"]
    for inc in toolchain.torch_includes:
        flags += ["-isystem", inc]
    return flags


def _pch_flags(toolchain: Toolchain, user_flags: Sequence[str]) -> list[str]:
    """Flags that must match between the PCH and its users. GCC silently ignores a PCH built at another
    optimisation level (measured: an -O1 binding against an -O2 PCH compiled as slowly as without one),
    so the PCH takes the user's last -O flag exactly, along with its -m/-f/-std/-D/-U flags."""
    flags = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-fPIC", "-std=c++17"]
    for inc in toolchain.torch_includes:
        flags += ["-isystem", inc]
    level: str | None = None
    for flag in user_flags:
        if flag.startswith("-O"):
            level = flag
        elif flag.startswith(("-m", "-f", "-std=", "-D", "-U")) and not flag.startswith(
            "-DTORCH_EXTENSION_NAME"
        ):
            flags.append(flag)
    if level is not None:
        flags.append(level)
    return flags


def _pch_source(toolchain: Toolchain) -> str:
    """torch/extension.h, plus on CUDA the two headers nearly every binding adds (stream and device guard):
    parsed once here instead of in every binding (they pull in the CUDA runtime and cuBLAS headers)."""
    lines = ["#pragma once", "#include <torch/extension.h>"]
    if toolchain.device == "cuda":
        lines += ["#include <ATen/cuda/CUDAContext.h>", "#include <c10/cuda/CUDAGuard.h>"]
    return "\n".join(lines) + "\n"


def _pch_key(toolchain: Toolchain, flags: Sequence[str], source: str) -> str:
    """What the header's compile reads: the compiler, torch's headers (and the CUDA toolkit's, named by its
    nvcc), the flags and the source. Not the GPU or the CPU model (unless a -m...=native flag asks for it):
    the header never sees them, so a seed built where no GPU exists (an image build) or on another CPU keys
    exactly as the judge does where it runs."""
    identity: dict[str, Any] = {
        "device": toolchain.device,
        "cxx": toolchain.cxx,
        "cxx_version": toolchain.cxx_version,
        "nvcc_version": toolchain.nvcc_version,
        "torch_version": toolchain.torch_version,
        "torch_includes": toolchain.torch_includes,
    }
    if any(flag.startswith("-m") and flag.endswith("=native") for flag in flags):
        identity["cpu_model"] = toolchain.cpu_model
    return toolchain.key(["pch", identity, list(flags), source])[:32]


def _pch_entry(toolchain: Toolchain, user_flags: Sequence[str]) -> tuple[str, list[str], str]:
    """(key, compiler flags, header source) of the precompiled torch headers for this flag set."""
    flags = _pch_flags(toolchain, user_flags)
    source = _pch_source(toolchain)
    return _pch_key(toolchain, flags, source), flags, source


def seeded_pch(seed: Path, key: str, source: str) -> Path | None:
    """The header of a complete entry `pch/<key>/` in a seed (its text is the expected source and its .gch
    is a readable file), else None. Only reads: a judge never writes the seed, and a missing, unreadable
    or partial entry means building the header as without a seed."""
    header = seed / "pch" / key / PCH_HEADER
    gch = header.with_name(f"{PCH_HEADER}.gch")
    try:
        if header.read_text() != source or not gch.is_file() or not os.access(gch, os.R_OK):
            return None
    except (OSError, UnicodeDecodeError):
        return None
    return header


def _compile_pch(
    toolchain: Toolchain, flags: Sequence[str], source: str, directory: Path, deadline: float
) -> None:
    """Write the header into `directory` and precompile it beside itself (the .gch GCC looks for)."""
    header = directory / PCH_HEADER
    header.write_text(source)
    cmd = [toolchain.cxx, "-x", "c++-header", str(header), "-o", f"{header}.gch", *flags]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_remaining(deadline), check=False)
    except subprocess.TimeoutExpired:
        raise BuildTimeout() from None
    if proc.returncode != 0:
        raise RuntimeError(f"precompiled header failed:\n{proc.stdout}{proc.stderr}")


def _ensure_pch(
    toolchain: Toolchain, cache: BuildCache, user_flags: Sequence[str], deadline: float
) -> tuple[str, Path, str]:
    """(key, header to -include, log) of the precompiled torch headers for this flag set: from the build
    cache, else from the read-only seed ($CUDA_AGENT_JUDGE_SEED, used in place), else built into the cache."""
    key, flags, source = _pch_entry(toolchain, user_flags)
    directory = cache.pch_dir(key)
    header = directory / PCH_HEADER
    gch = directory / f"{PCH_HEADER}.gch"
    if gch.exists():
        cache.touch(gch)
        return key, header, ""
    seed = os.environ.get(JUDGE_SEED_ENV) or image_seed()
    seeded = seeded_pch(Path(seed), key, source) if seed else None
    if seeded is not None:
        return (
            key,
            seeded,
            f"precompiled torch/extension.h for this flag set: from the judge seed ({seeded.parent})\n",
        )
    with cache.lock(f"pch-{key}", deadline):
        if gch.exists():
            return key, header, ""
        scratch = cache.scratch()
        try:
            _compile_pch(toolchain, flags, source, scratch, deadline)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        if directory.exists():
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            os.replace(scratch, directory)
    return key, header, "precompiled torch/extension.h built once for this flag set\n"


def seed_pch(
    toolchain: Toolchain, seed: Path, user_flags: Sequence[str], deadline: float
) -> tuple[str, bool]:
    """Build the precompiled torch headers for one flag set into a seed, keyed as `_ensure_pch` looks them
    up; (key, built). A complete entry is kept (re-running is fast); a new one is compiled in seed/tmp,
    made readable by every uid (root-mode judges run as other users) and renamed into place whole. The
    caller holds the seed's lock (`cuda-agent judge-seed`)."""
    key, flags, source = _pch_entry(toolchain, user_flags)
    final = seed / "pch" / key
    if seeded_pch(seed, key, source) is not None:
        return key, False
    scratch = Path(tempfile.mkdtemp(dir=seed / "tmp"))
    try:
        _compile_pch(toolchain, flags, source, scratch, deadline)
        for path in scratch.iterdir():
            path.chmod(0o644)
        scratch.chmod(0o755)
        if final.exists():  # a partial entry (a build stopped between its files): replaced whole
            shutil.rmtree(final)
        os.rename(scratch, final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return key, True


def _compile_command(unit: Unit, toolchain: Toolchain, output: Path, pch_header: Path | None) -> list[str]:
    if unit.lang.startswith("cuda"):
        if toolchain.nvcc is None:
            raise RuntimeError("nvcc not found: cannot build CUDA sources")
        cmd = [toolchain.nvcc, "-c", str(unit.source), "-o", str(output), *unit.flags]
    else:
        cmd = [toolchain.cxx, "-c", str(unit.source), "-o", str(output), *unit.flags]
        if pch_header is not None:
            cmd += ["-include", str(pch_header), "-Winvalid-pch"]
    for directory in unit.search_dirs:
        cmd += ["-I", str(directory)]
    return cmd


class _Cancelled(Exception):
    """A lighter variant compiled first: this compile is no longer needed."""


def _run_compiler(
    cmd: list[str], cwd: Path, deadline: float, cancel: threading.Event | None
) -> tuple[int, str]:
    """Run one compiler command; kill its whole process group (nvcc's children too) on cancel or deadline."""
    with subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as proc:
        try:
            while True:
                try:  # communicate() may be retried after a timeout without losing output
                    out, _ = proc.communicate(timeout=0.05)
                    return proc.returncode, out or ""
                except subprocess.TimeoutExpired:
                    pass
                if cancel is not None and cancel.is_set():
                    raise _Cancelled()
                if time.monotonic() >= deadline:
                    raise BuildTimeout()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            raise


def _failure_marker(cache: BuildCache, key: str) -> Path:
    """Records that a lighter variant does not compile, so later judges go straight to the next one."""
    return cache.obj(key).with_suffix(".fail")


def _compile(
    unit: Unit,
    toolchain: Toolchain,
    cache: BuildCache,
    pch_header: Path | None,
    deadline: float,
    cancel: threading.Event | None = None,
) -> UnitOutcome:
    start = time.monotonic()
    final = cache.obj(unit.key)
    if final.exists():
        cache.touch(final)
        return UnitOutcome(unit, True, True, "", 0.0)
    scratch = cache.scratch()
    try:
        produced = scratch / "unit.o"
        cmd = _compile_command(unit, toolchain, produced, pch_header)
        returncode, output = _run_compiler(cmd, scratch, deadline, cancel)
        output = output.strip()
        if returncode != 0 or not produced.exists():
            return UnitOutcome(
                unit, False, False, output or f"exit code {returncode}", time.monotonic() - start
            )
        cache.publish(produced, final)
        return UnitOutcome(unit, True, False, output, time.monotonic() - start)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _compile_lightest(
    unit: Unit, toolchain: Toolchain, cache: BuildCache, pch_header: Path | None, deadline: float
) -> UnitOutcome:
    """Compile the lightest variant of a unit that compiles. Variants not known to fail run at once, in
    parallel (a lighter one finishes first when it works, and a failed one costs no extra wall time);
    the first success in order of lightness wins and the heavier compiles still running are killed.
    The outcome's unit is the variant used (its key names the object to link)."""
    pending: list[Unit] = []
    for variant in unit.variants:
        if cache.obj(variant.key).exists():
            pending.append(variant)
            break
        if variant is unit or not _failure_marker(cache, variant.key).exists():
            pending.append(variant)
    if len(pending) == 1:
        return _compile(pending[0], toolchain, cache, pch_header, deadline)
    cancel = threading.Event()
    with ThreadPoolExecutor(max_workers=len(pending)) as pool:
        futures = [pool.submit(_compile, v, toolchain, cache, pch_header, deadline, cancel) for v in pending]
        try:
            for variant, future in zip(pending, futures, strict=True):
                outcome = future.result()
                if outcome.ok or variant is pending[-1]:
                    return outcome
                marker = _failure_marker(cache, variant.key)
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
        finally:
            cancel.set()
    raise AssertionError("unreachable: the last pending variant always returns")


def _link(
    name: str,
    objects: list[Path],
    toolchain: Toolchain,
    cuda: bool,
    ldflags: list[str],
    cache: BuildCache,
    deadline: float,
) -> tuple[Path | None, bool, str]:
    libs = ["-L", toolchain.torch_lib, "-lc10"]
    if cuda:
        libs.append("-lc10_cuda")
    libs.append("-ltorch_cpu")
    if cuda:
        libs.append("-ltorch_cuda")
    libs += ["-ltorch", "-ltorch_python"]
    if cuda and toolchain.cuda_lib:
        libs += ["-L", toolchain.cuda_lib, "-lcudart"]
    key_body = [toolchain.tag, name, [o.stem for o in objects], libs, ldflags]
    key = toolchain.key(key_body)[:40]
    final = cache.ext(key, name)
    if final.exists():
        cache.touch(final)
        return final, True, ""
    scratch = cache.scratch()
    try:
        produced = scratch / f"{name}.so"
        cmd = [toolchain.cxx, "-shared", *map(str, objects), "-o", str(produced), *libs, *ldflags]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=_remaining(deadline), check=False
            )
        except subprocess.TimeoutExpired:
            raise BuildTimeout() from None
        if proc.returncode != 0:
            return None, False, (proc.stdout + proc.stderr).strip()
        cache.publish(produced, final)
        return final, False, ""
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _format_log(outcomes: list[UnitOutcome], extra: list[str]) -> str:
    """Errors first, then warnings; truncated to ~8 KB so the reward message stays small."""
    parts: list[str] = []
    for o in sorted(outcomes, key=lambda o: o.ok):
        if not o.ok:
            parts.append(f"== {o.unit.label}: FAILED ==\n{o.output}\n")
    parts += extra
    for o in outcomes:
        if o.ok and o.output:
            parts.append(f"== {o.unit.label}: warnings ==\n{o.output}\n")
    for o in outcomes:
        if o.ok:
            parts.append(f"{o.unit.label}: {'cached' if o.cached else f'compiled in {o.seconds:.1f} s'}\n")
    text = "".join(parts)
    if len(text) > BUILD_LOG_LIMIT:
        text = text[:BUILD_LOG_LIMIT] + f"\n... [{len(text) - BUILD_LOG_LIMIT} more characters truncated]\n"
    return text


def _build_units(
    name: str,
    units: list[Unit],
    ldflags: list[str],
    toolchain: Toolchain,
    cache: BuildCache,
    deadline: float,
    pch_user_flags: Sequence[str] | None,
) -> tuple[Path | None, bool, str]:
    """Compile all units in parallel (cache hits skip), then link; (so path or None, all cached, log).
    Units that need no precompiled header start at once, so a cold PCH build overlaps the CUDA units
    (measured on the H200: nvcc over torch headers ~30 s, the PCH ~38 s; in sequence they cost both)."""
    extra: list[str] = []
    for unit in units:
        if unit.lang != "cxx-torch":
            for variant in unit.variants:
                variant.key = _unit_key(variant, toolchain, None)
    workers = max(1, min(len(units), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            id(u): pool.submit(_compile_lightest, u, toolchain, cache, None, deadline)
            for u in units
            if u.lang != "cxx-torch"
        }
        torch_units = [u for u in units if u.lang == "cxx-torch"]
        if torch_units:
            pch_key: str | None = None
            pch_header: Path | None = None
            if pch_user_flags is not None:
                pch_key, pch_header, note = _ensure_pch(toolchain, cache, pch_user_flags, deadline)
                if note:
                    extra.append(note)
            for unit in torch_units:
                for variant in unit.variants:
                    variant.key = _unit_key(variant, toolchain, pch_key)
                futures[id(unit)] = pool.submit(
                    _compile_lightest, unit, toolchain, cache, pch_header, deadline
                )
        outcomes = [futures[id(u)].result() for u in units]
    if not all(o.ok for o in outcomes):
        return None, False, _format_log(outcomes, extra)
    cuda = any(u.lang.startswith("cuda") for u in units) or toolchain.device == "cuda"
    so, link_cached, link_log = _link(
        name, [cache.obj(o.unit.key) for o in outcomes], toolchain, cuda, ldflags, cache, deadline
    )
    if so is None:
        extra.append(f"== link {name}.so: FAILED ==\n{link_log}\n")
    all_cached = link_cached and all(o.cached for o in outcomes)
    return so, all_cached, _format_log(outcomes, extra)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- workspace layout: kernels/*.cu | *.cpp, kernels/*_binding.cpp, frozen binding.cpp ---------------------


def image_seed(path: str = IMAGE_JUDGE_SEED_DIR) -> str | None:
    """The sandbox image's judge seed, for a judge that $CUDA_AGENT_JUDGE_SEED points nowhere (the CLI in
    the image; the session server always names its seed): used only when it and every directory above it
    are root-owned and writable by root alone, as sandbox_image/Dockerfile builds it, so that nothing a
    judge or an agent could write is ever compiled into a build (docs/judge.md, "The judge seed")."""
    current = Path(path)
    for part in (current, *current.parents):
        try:
            info = part.lstat()
        except OSError:
            return None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            return None
    return str(current)


def remove_frozen_copies(candidate: Path) -> list[str]:
    """Delete the candidate's own copies of the frozen files (never compiled); one note per file."""
    notes: list[str] = []
    for name in FROZEN_FILES:
        for path in sorted(candidate.rglob(name)):
            path.unlink()
            notes.append(
                f"candidate's {path.relative_to(candidate)} replaced: the judge's frozen copy is used"
            )
    return notes


# The CUDA Agent release's build / verify / profile harness, kept in the workspace's utils/ (frozen there, as
# binding.cpp is): the judge's side of the contract, never the candidate's code.
RELEASE_HARNESS_DIR = "utils"
RELEASE_HARNESS_FILES = frozenset({"compile.py", "compile.sh", "verification.py", "profiling.py"})


def remove_release_harness(candidate: Path) -> list[str]:
    """Delete a workspace's utils/ when it holds the release's harness (compile.py, verification.py, ...):
    the judge builds, verifies and profiles itself, so the harness is neither screened nor run. Only in a
    workspace (kernels/ present); model_new.py never imports the harness in the release's layout, and one
    that did would fail its import (reward -1), never gain anything. One note naming what was removed."""
    harness = candidate / RELEASE_HARNESS_DIR
    if not (candidate / "kernels").is_dir() or harness.is_symlink() or not harness.is_dir():
        return []
    names = sorted(p.name for p in harness.iterdir())
    if not RELEASE_HARNESS_FILES & set(names):
        return []
    shutil.rmtree(harness)
    return [
        f"candidate's {RELEASE_HARNESS_DIR}/ ({', '.join(names)}) removed: the CUDA Agent release's "
        "build/verify/profile harness, replaced by the judge's own build, verification and profile"
    ]


def install_frozen_files(candidate: Path) -> None:
    """The judge's frozen files at the workspace root, where the CUDA Agent release keeps them, so that
    `#include "../binding_registry.h"` from kernels/ resolves to the judge's header."""
    if (candidate / "kernels").is_dir():
        for name in FROZEN_FILES:
            shutil.copyfile(FROZEN_DIR / name, candidate / name)


def workspace_sources(candidate: Path) -> dict[str, list[Path]]:
    kernels = candidate / "kernels"
    files = sorted(p for p in kernels.iterdir() if p.is_file()) if kernels.is_dir() else []
    return {
        "cuda": [p for p in files if p.suffix == ".cu"],
        "binding": [p for p in files if p.name.endswith("_binding.cpp")],
        "plain": [
            p
            for p in files
            if p.suffix in (".cpp", ".cc", ".cxx")
            and not p.name.endswith("_binding.cpp")
            and p.name not in FROZEN_FILES
        ],
    }


def build_workspace(
    candidate: Path, toolchain: Toolchain, cache: BuildCache, deadline: float
) -> BuildOutcome:
    """Compile kernels (no torch headers) and bindings (against the PCH) in parallel; link cuda_extension."""
    sources = workspace_sources(candidate)
    kernels_dir = candidate / "kernels"
    if not sources["binding"]:
        return BuildOutcome(ok=False, cached=False, error="build failed: kernels/ has no *_binding.cpp")
    if sources["cuda"] and toolchain.device != "cuda":
        return BuildOutcome(ok=False, cached=False, error="build failed: kernels/*.cu need --device cuda")
    units: list[Unit] = []
    vendor_flags = toolchain.vendor_include_flags()
    for src in sources["cuda"]:
        flags = ["-O3", *toolchain.cuda_arch_flags, "-Xcompiler", "-fPIC", "-std=c++17", *vendor_flags]
        units.append(Unit(f"kernels/{src.name}", "cuda-plain", src, flags, [kernels_dir], WORKSPACE_MODULE))
    for src in sources["plain"]:
        flags = ["-O3", "-march=native", "-fPIC", "-std=c++17"]
        units.append(Unit(f"kernels/{src.name}", "cxx-plain", src, flags, [kernels_dir], WORKSPACE_MODULE))
    # Bindings are host glue (checks, allocation, a launch): -O1 compiles them in about 2/3 of -O2's time
    # against the PCH (13.1 -> 8.6 s measured) and the reward counts device time only.
    binding_flags = [*_torch_cxx_flags(toolchain, WORKSPACE_MODULE), *vendor_flags, BINDING_OPT]
    search = [FROZEN_DIR, kernels_dir]
    for src in [*sources["binding"], FROZEN_DIR / "binding.cpp"]:
        label = f"kernels/{src.name}" if src.parent == kernels_dir else f"frozen/{src.name}"
        units.append(Unit(label, "cxx-torch", src, binding_flags, search, WORKSPACE_MODULE))
    # A workspace has no linker flags of its own: including cuBLAS's or cuDNN's header links the library.
    texts = [p.read_text(errors="replace") for key in ("cuda", "plain", "binding") for p in sources[key]]
    ldflags = toolchain.link_args(vendor_libraries_used(texts))
    so, cached, log = _build_units(
        WORKSPACE_MODULE, units, ldflags, toolchain, cache, deadline, pch_user_flags=[BINDING_OPT]
    )
    if so is None:
        return BuildOutcome(ok=False, log=log, cached=False, error="build failed")
    kernels = screen.global_kernels(p.read_text(errors="replace") for p in sources["cuda"])
    ext = BuiltExtension(WORKSPACE_MODULE, str(so), _sha256(so), "workspace", kernels, cached)
    return BuildOutcome(ok=True, extensions=[ext], log=log, cached=cached)


# --- load_inline / load specs collected from the build process -------------------------------------------


def _resolve_include_dirs(spec: dict[str, Any], candidate: Path) -> list[Path]:
    dirs = []
    for raw in spec["include_dirs"]:
        path = (candidate / raw).resolve()
        if not path.is_relative_to(candidate.resolve()) or not path.is_dir():
            raise ValueError(f"extra_include_paths entry {raw!r} is not a directory inside the candidate")
        dirs.append(path)
    return dirs


def _spec_ldflags(spec: dict[str, Any], toolchain: Toolchain) -> list[str]:
    """The spec's (screened) linker flags, with `-lcublas` / `-lcudnn` pointed at the copy torch loads,
    and the vendor libraries whose headers the sources include linked even without the flag."""
    vendor = {lib.name for lib in toolchain.vendor}
    wanted = vendor_libraries_used(unit["code"] for unit in spec["units"])
    flags: list[str] = []
    for flag in spec["extra_ldflags"]:
        name = flag[2:] if flag.startswith("-l") else ""
        if name in vendor:
            wanted.append(name)
        else:
            flags.append(flag)
    return flags + toolchain.link_args(list(dict.fromkeys(wanted)))


def screen_spec(spec: dict[str, Any]) -> list[str]:
    where = f"extension {spec['name']!r}"
    findings = screen.screen_flags("cxx", spec["extra_cflags"], where)
    findings += screen.screen_flags("cuda", spec["extra_cuda_cflags"], where)
    findings += screen.screen_flags("ld", spec["extra_ldflags"], where)
    for unit in spec["units"]:
        findings += screen.screen_cpp(unit["code"], f"{spec['name']}/{unit['file']}")
    return findings


TORCH_INCLUDE = re.compile(
    r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/(?:extension|types|torch|all)\.h[>"][^\n]*$', re.MULTILINE
)
TORCH_NAMES = re.compile(r"\b(?:torch|at|c10)::|\b(?:TORCH|AT|C10)_[A-Z_]+\b")
LIGHT_HEADER = "cuda_agent_torch_light.h"
# Set to 1 to compile every CUDA unit exactly as written (the benchmark's baseline; an escape hatch).
EXACT_HEADERS_ENV = "CUDA_AGENT_JUDGE_EXACT_HEADERS"
# What most load_inline CUDA sources use from torch: the tensor, factories, dispatch macros, and torch::'s
# names for at:: (as torch/types.h makes them). Only headers that torch/types.h itself includes, so the
# light variant declares a subset of what the exact source sees. nvcc parses a fraction of ATen.h's
# headers (H200: a KernelBench-style unit ~15 s instead of ~31 s with torch/types.h, 61 s with extension.h).
LIGHT_HEADER_TEXT = """// Written by the cuda-agent judge: a light stand-in for torch/extension.h.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
namespace torch {
using namespace at;  // NOLINT
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
}  // namespace torch
"""


def write_source(path: Path, text: str) -> None:
    """Write a collected source unless it already holds text; atomically (a scratch file renamed into
    place), since judges building the same candidate at once share src/<digest>/ and a compiler of one
    must never read a half-written file of another (a correct candidate would fail its build)."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    # mkstemp makes 0600 whatever the umask: in a cache shared by the judges' group (umask 007) another
    # slot's judge could then not read the unit it compiles (PermissionError under 8 sessions on the H200).
    os.fchmod(fd, 0o666 & ~current_umask())
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(scratch, path)


def current_umask() -> int:
    """The process's umask, read without setting it (os.umask would race with other threads' files)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o077  # no Umask line (Linux < 4.7): assume the strictest


def lighter_cuda_sources(code: str) -> list[tuple[str, str]]:
    """(what, source) rewrites of a CUDA unit with fewer torch headers, lightest first: without torch
    headers when the source names nothing of torch's, then with the judge's light header. Every rewrite
    only removes declarations, so one that compiles means the same thing as the original: the builder
    uses the lightest that compiles and falls back to the exact source."""
    if not TORCH_INCLUDE.search(code):
        return []
    variants: list[tuple[str, str]] = []
    bare = TORCH_INCLUDE.sub("", code)
    if not TORCH_NAMES.search(bare):
        variants.append(("without torch headers", bare))
    variants.append(("with the judge's light torch header", f'#include "{LIGHT_HEADER}"\n{bare}'))
    return variants


def write_lighter_cuda_sources(path: Path, code: str) -> list[tuple[str, Path]]:
    """Write lighter_cuda_sources(code) beside path (and the light header they include)."""
    written: list[tuple[str, Path]] = []
    for index, (what, text) in enumerate(lighter_cuda_sources(code)):
        if LIGHT_HEADER in text:
            header = path.parent / LIGHT_HEADER
            write_source(header, LIGHT_HEADER_TEXT)
        target = path.with_name(f"{path.stem}.light{index}{path.suffix}")
        write_source(target, text)
        written.append((what, target))
    return written


def build_specs(
    specs: list[dict[str, Any]], candidate: Path, toolchain: Toolchain, cache: BuildCache, deadline: float
) -> BuildOutcome:
    """Build every distinct extension the candidate's load_inline/load calls asked for."""
    outcome = BuildOutcome()
    logs: list[str] = []
    seen: set[str] = set()
    for spec in specs:
        if spec["digest"] in seen:
            continue
        seen.add(spec["digest"])
        violations = screen_spec(spec)
        if violations:
            outcome.violations += violations
            continue
        if spec["with_cuda"] and toolchain.device != "cuda":
            return BuildOutcome(
                ok=False,
                cached=False,
                error=f"build failed: extension {spec['name']!r} has CUDA sources but the device is cpu",
            )
        if any(
            f.startswith(("-arch", "--gpu-architecture", "-gencode", "--generate-code"))
            for f in spec["extra_cuda_cflags"]
        ):
            arch = []
        else:
            arch = list(toolchain.cuda_arch_flags)
        include_dirs = _resolve_include_dirs(spec, candidate)
        vendor_flags = toolchain.vendor_include_flags()
        scratch = cache.root / "src" / spec["digest"][:32]
        scratch.mkdir(parents=True, exist_ok=True)
        units: list[Unit] = []
        for unit in spec["units"]:
            path = scratch / Path(unit["file"]).name
            write_source(path, unit["code"])
            if unit["lang"] == "cuda":
                flags = [f"-DTORCH_EXTENSION_NAME={spec['name']}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
                for inc in toolchain.torch_includes:
                    flags += ["-isystem", inc]
                flags += [
                    "-D__CUDA_NO_HALF_OPERATORS__",
                    "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
                    "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr",
                    *arch,
                    "--compiler-options",
                    "-fPIC",
                    *vendor_flags,
                    *spec["extra_cuda_cflags"],
                ]
                if not any(f.startswith("-std=") for f in spec["extra_cuda_cflags"]):
                    flags.append("-std=c++17")
                label = f"{spec['name']}/{path.name}"
                cuda_unit = Unit(label, "cuda-torch", path, flags, include_dirs, spec["name"])
                if os.environ.get(EXACT_HEADERS_ENV) != "1":
                    cuda_unit.lighter = [
                        Unit(f"{label} ({what})", "cuda-torch", source, flags, include_dirs, spec["name"])
                        for what, source in write_lighter_cuda_sources(path, unit["code"])
                    ]
                units.append(cuda_unit)
            else:
                flags = [*_torch_cxx_flags(toolchain, spec["name"]), *vendor_flags, *spec["extra_cflags"]]
                units.append(
                    Unit(f"{spec['name']}/{path.name}", "cxx-torch", path, flags, include_dirs, spec["name"])
                )
        so, cached, log = _build_units(
            spec["name"],
            units,
            _spec_ldflags(spec, toolchain),
            toolchain,
            cache,
            deadline,
            pch_user_flags=spec["extra_cflags"],
        )
        logs.append(log)
        if so is None:
            return BuildOutcome(
                ok=False, cached=False, log="".join(logs)[: BUILD_LOG_LIMIT * 2], error="build failed"
            )
        kernels = screen.global_kernels(u["code"] for u in spec["units"] if u["lang"] == "cuda")
        outcome.extensions.append(
            BuiltExtension(spec["name"], str(so), _sha256(so), spec["digest"], kernels, cached)
        )
        outcome.cached = outcome.cached and cached
    outcome.log = "".join(logs)
    if outcome.violations:
        outcome.ok = False
    return outcome
