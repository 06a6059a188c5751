"""The judge's own `torch.utils.cpp_extension.load_inline` / `load`, installed before candidate import.

Two modes. In the build process (`collect`) a call records the extension's exact sources and flags and
returns a placeholder; the orchestrator then screens and compiles them into the content-addressed cache
(candidate code never writes there). In the worker (`load`) a call recomputes the same digest, copies the
orchestrator-built `.so` to a private directory, checks its SHA-256 and imports it. Sources that were not
built in the build phase are an error: nothing is compiled inside the worker.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.utils.cpp_extension as cpp_extension

if TYPE_CHECKING:
    from cuda_agent.sandbox.judge import protocol

EXTENSION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RESERVED_NAMES = frozenset({"torch", "cuda_agent", "model_new", "numpy"})


class ExtensionError(ImportError):
    """A load_inline/load call the judge cannot honour (bad name, unbuilt sources, tampered binary)."""


def _as_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ExtensionError(f"{what} must be a string or a list of strings")


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not EXTENSION_NAME.match(name):
        raise ExtensionError(f"extension name {name!r} must be a Python identifier (at most 64 characters)")
    if name in RESERVED_NAMES or name in sys.stdlib_module_names or name == "cuda_extension":
        raise ExtensionError(f"extension name {name!r} shadows another module")
    return name


def _functions_map(functions: Any) -> dict[str, str] | None:
    if functions is None:
        return None
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, (list, tuple)):
        functions = {f: f for f in functions}
    if not isinstance(functions, dict):
        raise ExtensionError(f"functions must be a list or dict, got {type(functions).__name__}")
    for fn, doc in functions.items():
        if not isinstance(fn, str) or not re.match(r"^[A-Za-z_]\w*(::\w+)*$", fn):
            raise ExtensionError(f"function name {fn!r} is not a C++ identifier")
        if not isinstance(doc, str) or '"' in doc or "\\" in doc or "\n" in doc:
            raise ExtensionError(f"docstring of {fn!r} must be a plain one-line string")
    return dict(functions)


def spec_digest(spec: dict[str, Any]) -> str:
    body = {k: v for k, v in spec.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def inline_spec(
    name: Any,
    cpp_sources: Any,
    cuda_sources: Any = None,
    functions: Any = None,
    extra_cflags: Any = None,
    extra_cuda_cflags: Any = None,
    extra_ldflags: Any = None,
    extra_include_paths: Any = None,
    with_cuda: Any = None,
    with_pytorch_error_handling: bool = True,
    no_implicit_headers: bool = False,
) -> dict[str, Any]:
    """The translation units load_inline would write, assembled exactly as torch 2.11 does."""
    cpp = _as_list(cpp_sources, "cpp_sources")
    cuda = _as_list(cuda_sources, "cuda_sources")
    if not no_implicit_headers:
        cpp.insert(0, "#include <torch/extension.h>")
    fmap = _functions_map(functions)
    if fmap is not None:
        cpp.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fn, doc in fmap.items():
            target = f"torch::wrap_pybind_function({fn})" if with_pytorch_error_handling else fn
            cpp.append(f'm.def("{fn}", {target}, "{doc}");')
        cpp.append("}")
    units = [{"file": "main.cpp", "lang": "cxx", "code": "\n".join(cpp)}]
    if cuda:
        if not no_implicit_headers:
            cuda[:0] = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
        units.append({"file": "cuda.cu", "lang": "cuda", "code": "\n".join(cuda)})
    return _spec(name, units, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, with_cuda)


def file_spec(
    name: Any,
    sources: Any,
    extra_cflags: Any = None,
    extra_cuda_cflags: Any = None,
    extra_ldflags: Any = None,
    extra_include_paths: Any = None,
    with_cuda: Any = None,
    root: Path | None = None,
) -> dict[str, Any]:
    """`load(name, sources=[files])`: the files' contents (each must lie inside the candidate directory)."""
    base = (root or Path.cwd()).resolve()
    units = []
    for src in _as_list(sources, "sources"):
        path = (base / src).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            raise ExtensionError(f"source {src!r} is not a file inside the candidate directory")
        lang = "cuda" if path.suffix in (".cu", ".cuh") else "cxx"
        units.append({"file": path.relative_to(base).as_posix(), "lang": lang, "code": path.read_text()})
    return _spec(name, units, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, with_cuda)


def _spec(
    name: Any,
    units: list[dict[str, str]],
    extra_cflags: Any,
    extra_cuda_cflags: Any,
    extra_ldflags: Any,
    extra_include_paths: Any,
    with_cuda: Any,
) -> dict[str, Any]:
    """The build spec of both load forms; without an explicit with_cuda, CUDA is on when a unit is CUDA."""
    spec = {
        "name": check_name(name),
        "units": units,
        "extra_cflags": _as_list(extra_cflags, "extra_cflags"),
        "extra_cuda_cflags": _as_list(extra_cuda_cflags, "extra_cuda_cflags"),
        "extra_ldflags": _as_list(extra_ldflags, "extra_ldflags"),
        "include_dirs": _as_list(extra_include_paths, "extra_include_paths"),
        "with_cuda": any(u["lang"] == "cuda" for u in units) if with_cuda is None else bool(with_cuda),
    }
    spec["digest"] = spec_digest(spec)
    return spec


def placeholder_module(name: str) -> types.ModuleType:
    """What load_inline returns while collecting: every attribute is a no-op function."""
    module = types.ModuleType(name)

    def _noop(*args: Any, **kwargs: Any) -> None:
        return None

    def _getattr(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _noop

    module.__dict__["__getattr__"] = _getattr
    return module


def install_collector(records: list[dict[str, Any]]) -> None:
    """Build-process mode: record every extension the candidate asks for; compile nothing here."""

    def load_inline(name: Any, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        spec = inline_spec(name, cpp_sources, cuda_sources, *_inline_extra(args, kwargs))
        records.append(spec)
        return placeholder_module(spec["name"])

    def load(name: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        spec = file_spec(name, sources, *_load_extra(args, kwargs))
        records.append(spec)
        return placeholder_module(spec["name"])

    cpp_extension.load_inline = load_inline
    cpp_extension.load = load


def install_loader(
    artifacts: dict[str, protocol.InlineArtifact],
    private_dir: Path,
    on_load: Callable[[types.ModuleType], None],
) -> None:
    """Worker mode: serve each call from the orchestrator's build (matched by digest, SHA-256 checked)."""

    def _serve(spec: dict[str, Any]) -> types.ModuleType:
        built = artifacts.get(spec["digest"])
        if built is None:
            raise ExtensionError(
                f"extension {spec['name']!r}: these sources were not built in the build phase "
                "(sources and flags must not depend on run-time state)"
            )
        return load_extension(spec["name"], Path(built["path"]), built["sha256"], private_dir, on_load)

    def load_inline(name: Any, cpp_sources: Any, cuda_sources: Any = None, *args: Any, **kwargs: Any) -> Any:
        return _serve(inline_spec(name, cpp_sources, cuda_sources, *_inline_extra(args, kwargs)))

    def load(name: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        return _serve(file_spec(name, sources, *_load_extra(args, kwargs)))

    cpp_extension.load_inline = load_inline
    cpp_extension.load = load


def load_extension(
    name: str, path: Path, sha256: str, private_dir: Path, on_load: Callable[[types.ModuleType], None]
) -> types.ModuleType:
    """Copy, verify and import one built extension (a private copy leaves no window to swap the file)."""
    if name in sys.modules:
        module = sys.modules[name]
        on_load(module)
        return module
    private_dir.mkdir(parents=True, exist_ok=True)
    copy = private_dir / f"{name}.so"
    shutil.copyfile(path, copy)
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    if digest != sha256:
        raise ExtensionError(f"extension {name!r}: binary does not match the build (sha256 {digest[:12]})")
    os.chmod(copy, 0o500)
    spec = importlib.util.spec_from_file_location(name, copy)
    if spec is None or spec.loader is None:
        raise ExtensionError(f"extension {name!r}: cannot load {copy}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    on_load(module)
    return module


_INLINE_KEYWORDS = (
    "functions",
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_ldflags",
    "extra_include_paths",
    "with_cuda",
    "with_pytorch_error_handling",
    "no_implicit_headers",
)
_INLINE_POSITIONAL = (
    "sycl_sources",
    "functions",
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_sycl_cflags",
    "extra_ldflags",
    "extra_include_paths",
    "build_directory",
    "verbose",
    "with_cuda",
)
_IGNORED = (
    "build_directory",
    "verbose",
    "is_python_module",
    "keep_intermediates",
    "use_pch",
    "sycl_sources",
    "extra_sycl_cflags",
    "with_sycl",
)


def _merge(
    positional_names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    merged = dict(zip(positional_names, args, strict=False))
    for key, value in kwargs.items():
        if key in merged:
            raise ExtensionError(f"argument {key!r} given twice")
        merged[key] = value
    for key in merged:
        if key not in _INLINE_KEYWORDS and key not in _IGNORED:
            raise ExtensionError(f"unsupported argument {key!r}")
    if merged.get("sycl_sources"):
        raise ExtensionError("sycl_sources are not supported")
    return merged


def _inline_extra(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    merged = _merge(_INLINE_POSITIONAL, args, kwargs)
    return (
        merged.get("functions"),
        merged.get("extra_cflags"),
        merged.get("extra_cuda_cflags"),
        merged.get("extra_ldflags"),
        merged.get("extra_include_paths"),
        merged.get("with_cuda"),
        bool(merged.get("with_pytorch_error_handling", True)),
        bool(merged.get("no_implicit_headers", False)),
    )


_LOAD_POSITIONAL = (
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_sycl_cflags",
    "extra_ldflags",
    "extra_include_paths",
    "build_directory",
    "verbose",
    "with_cuda",
)


def _load_extra(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    merged = _merge(_LOAD_POSITIONAL, args, kwargs)
    return (
        merged.get("extra_cflags"),
        merged.get("extra_cuda_cflags"),
        merged.get("extra_ldflags"),
        merged.get("extra_include_paths"),
        merged.get("with_cuda"),
    )
