"""Every process-wide backend setting of torch, enumerated at run time, read as one snapshot.

A candidate that flips a process-wide switch (cuDNN off, flash attention off, a BLAS preference, TunableOp,
a deterministic mode, ...) from its import or from its forward changes which kernels the eager and
compiled baselines run in the same process: the baseline gets slower and the candidate earns a milestone
it did not earn (issue 30: 26.8x from one switch). A hand list of such switches falls behind every torch
release, so the settings are enumerated from torch itself, in the worker, before any candidate code runs:

- every function of `torch._C` whose name reads a value (`_get_*`, `_is_*`, `_cuda_get*`, `*_enabled`,
  ...) and that answers with no argument: at::globalContext()'s switches are all exposed this way (the
  `torch.backends` modules are thin wrappers over them), and so are TunableOp, the sync-debug mode,
  autocast, anomaly mode and the JIT's switches;
- every public attribute of every `torch.backends` module (ContextProp properties, module globals such as
  `opt_einsum.strategy`), one level into the objects they hold (`cudnn.conv`, `mkldnn.matmul`, ...), the
  `fp32_precision` of every such object (an attribute torch serves from `__getattr__`, which `dir()`
  does not list), and every public reader function there (`get_*`, `is_*`, `*_enabled`, `preferred_*`);
- the public readers of the `torch` namespace (`get_num_threads`, `get_default_dtype`, ...);
- the readers of `torch.cuda` and `torch.cuda.memory` that have a setter beside them (the caching
  allocator's memory fraction, the sync-debug mode).

A reader is kept when two reads in a row agree and give a plain value (bool, number, string, enum
(Python or pybind11), dtype, device, or tuples of these); `Snapshot.changes()` then lists every key that
moved, and `restore()` writes the snapshot's value back through the matching setter (`_set_*` beside a
`_get_*`, the property's setter, `set_*` beside `get_*`). Fingerprints compare against the snapshot after
the import, after construction, after every trial and at the end; the worker's BaselineGuard does so
before every eager and compile call that follows candidate code, warm-ups included. Any change is a
violation; restoring only keeps the measurement clean.

Left out on purpose (`EXCLUDED`): autograd's grad mode, which the judge itself switches off around every
call (the baseline guard checks it separately: it must be off), and counters that are statistics, not
settings. C++ reaches the same state through at::globalContext() (an alias of it included): the state is
read here by value, so how the setter was reached does not matter.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import inspect
import pkgutil
import re
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

# A function that reads a value, by its name (torch's own naming of readers). torch._C's builtins are
# only called when their name starts like a reader: a builtin that parses its own arguments can crash
# when called with none (`_any_output_is_alias_to_input_or_output()` does), so no looser match there.
READER_NAME = re.compile(r"(?:^|_)(?:get|is|are)(?:_|[A-Z])|_(?:enabled|allowed)$|^preferred_")
C_READER_NAME = re.compile(
    r"^_(?:get|is)_|^_(?:cuda|accelerator)_(?:get|is)|^_cuda_tunableop_(?:get|is)_|_enabled$"
)
# Context-dependent by design, or statistics rather than switches (module docstring).
EXCLUDED = frozenset({"torch._C.is_grad_enabled", "torch.is_grad_enabled"})
EXCLUDED_WORDS = ("stats", "rng_state")  # statistics; random-number state (not a kernel choice)
# Attributes that torch.backends objects serve from __getattr__ only (invisible to dir()).
PROBED_ATTRIBUTES = ("fp32_precision",)
_PLAIN = (bool, int, float, str, type(None), enum.Enum, torch.dtype, torch.device)
_MISSING = object()


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN) or hasattr(type(value), "__members__"):  # pybind11 enums too
        return True
    return isinstance(value, (tuple, list)) and len(value) <= 64 and all(_plain(v) for v in value)


def _frozen(value: Any) -> Any:
    """A comparable copy (lists become tuples; a reader returning a fresh list each time stays equal)."""
    if isinstance(value, (tuple, list)):
        return tuple(_frozen(v) for v in value)
    return value


def _zero_arg(fn: Any) -> bool:
    """True when `fn` can be called with no argument (builtins without a signature are tried)."""
    if inspect.isgeneratorfunction(inspect.unwrap(fn)):
        return False  # a context manager: calling it does nothing useful
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    return all(
        p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )


@dataclass(frozen=True)
class Setting:
    """One process-wide setting: how to read it and, where torch offers one, how to write it back."""

    key: str
    read: Callable[[], Any]
    write: Callable[[Any], Any] | None


def _writer_name(name: str) -> str | None:
    """The setter torch names beside a reader: `_get_X`/`_is_X` -> `_set_X`, `_cuda_get_X` ->
    `_cuda_set_X`, `X_is_enabled` -> `X_enable`, `get_X` -> `set_X`, `X_enabled` -> `enable_X`."""
    if name.endswith("_is_enabled"):
        return name.removesuffix("_is_enabled") + "_enable"
    renamed = re.sub(r"(^|_)(?:get|is)_", r"\1set_", name, count=1)
    if renamed != name:
        return renamed
    if name.endswith("_enabled") and not name.startswith("_"):
        return "enable_" + name.removesuffix("_enabled")
    return None


def _c_settings() -> list[Setting]:
    found: list[Setting] = []
    c = torch._C
    for name in sorted(dir(c)):
        fn = getattr(c, name, None)
        if not callable(fn) or isinstance(fn, type) or not C_READER_NAME.search(name):
            continue
        partner = _writer_name(name)
        write = getattr(c, partner, None) if partner else None
        found.append(Setting(f"torch._C.{name}", fn, _setter(write) if callable(write) else None))
    return found


def _setter(fn: Callable[..., Any]) -> Callable[[Any], Any]:
    """Write a value back; a tuple reader (e.g. (allow, allow_splitk)) is written as arguments."""

    def write(value: Any) -> Any:
        if isinstance(value, tuple):
            # (allow, allow_splitk) pairs are arguments; anything else (a priority order) is one list.
            if all(isinstance(v, bool) for v in value):
                return fn(*value)
            return fn(list(value))
        return fn(value)

    return write


def _attribute(owner: Any, name: str, label: str) -> Setting:
    def read() -> Any:
        return getattr(owner, name)

    def write(value: Any) -> None:
        setattr(owner, name, value)

    return Setting(f"{label}.{name}", read, write)


def _public_names(module: Any) -> list[str]:
    """A torch.backends module's names: a PropModule lists only its own dict, so its class (the
    ContextProps) and the module it wraps (`m`: functions, globals) are read too."""
    names = set(dir(module)) | set(dir(type(module)))
    wrapped = vars(module).get("m")
    if isinstance(wrapped, types.ModuleType):
        names |= set(dir(wrapped))
    return sorted(n for n in names if not n.startswith("_") and n != "m")


def _module_readers(module: Any, label: str) -> list[Setting]:
    found: list[Setting] = []
    for name in _public_names(module):
        if name.startswith("_"):
            continue
        with _quiet():
            value = getattr(module, name, _MISSING)
        if value is _MISSING or isinstance(value, (types.ModuleType, type)):
            continue
        if callable(value):
            if READER_NAME.search(name) and _zero_arg(value):
                partner = _writer_name(name)
                write = getattr(module, partner, None) if partner else None
                if name.startswith("preferred_"):
                    write = value
                found.append(Setting(f"{label}.{name}()", value, write if callable(write) else None))
            continue
        found.append(_attribute(module, name, label))
        if type(value).__module__.startswith("torch.backends"):
            inner = f"{label}.{name}"
            names = [n for n in dir(value) if not n.startswith("_")] + list(PROBED_ATTRIBUTES)
            found += [_attribute(value, n, inner) for n in dict.fromkeys(names)]
    return found


def _settable_readers(module: Any, label: str) -> list[Setting]:
    """The CUDA allocator's and runtime's settings: readers of `module` that have a setter beside them
    (`get_per_process_memory_fraction` / `set_per_process_memory_fraction`, `get_sync_debug_mode`). Only
    those: torch.cuda's other readers are device capabilities, and some of them launch work to find out."""
    found: list[Setting] = []
    for name in sorted(dir(module)):
        reader, writer = getattr(module, name, None), getattr(module, "set_" + name[4:], None)
        if name.startswith("get_") and callable(reader) and callable(writer) and _zero_arg(reader):
            found.append(Setting(f"{label}.{name}()", reader, writer))
    return found


def _backend_modules() -> list[tuple[str, Any]]:
    mods: list[tuple[str, Any]] = [("torch.backends", torch.backends)]
    for info in pkgutil.iter_modules(torch.backends.__path__):
        if info.name.startswith("_"):
            continue
        try:
            mods.append(
                (f"torch.backends.{info.name}", importlib.import_module(f"torch.backends.{info.name}"))
            )
        except Exception:  # a backend this build lacks (its import fails): nothing to read there
            continue
    return mods


def enumerate_settings() -> list[Setting]:
    """Every readable process-wide setting of this torch, found by walking it (module docstring)."""
    candidates = _c_settings()
    for label, module in _backend_modules():
        candidates += _module_readers(module, label)
    for name in sorted(dir(torch)):
        fn = getattr(torch, name, None)
        if (
            not name.startswith("_")
            and callable(fn)
            and not isinstance(fn, type)
            and re.match(r"(?:get|is|are)_", name)
            and _zero_arg(fn)
        ):
            partner = _writer_name(name)
            setter = getattr(torch, partner, None) if partner else None
            candidates.append(Setting(f"torch.{name}()", fn, setter if callable(setter) else None))
    candidates += _settable_readers(torch.cuda, "torch.cuda") + _settable_readers(
        torch.cuda.memory, "torch.cuda.memory"
    )
    kept: dict[str, Setting] = {}
    for setting in candidates:
        if setting.key in EXCLUDED or setting.key.rstrip("()") in EXCLUDED:
            continue
        if any(word in setting.key for word in EXCLUDED_WORDS) or setting.key in kept:
            continue
        first, second = _try_read(setting), _try_read(setting)
        if first is _MISSING or first != second:
            continue  # unreadable here, or a value that moves by itself (a clock, a counter)
        kept[setting.key] = setting
    return list(kept.values())


def _try_read(setting: Setting) -> Any:
    try:
        with _quiet():
            value = setting.read()
    except Exception:
        return _MISSING
    return _frozen(value) if _plain(value) else _MISSING


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Deprecated readers warn on every call (torch.is_autocast_cpu_enabled): keep the log clean."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class Snapshot:
    """The value of every enumerated setting at one moment (taken before any candidate code runs)."""

    def __init__(self, settings: list[Setting] | None = None) -> None:
        self.settings = settings if settings is not None else enumerate_settings()
        self.values = {s.key: _try_read(s) for s in self.settings}

    def changes(self) -> list[tuple[str, Any, Any]]:
        """(key, value in the snapshot, value now) for every setting that differs."""
        moved: list[tuple[str, Any, Any]] = []
        with _quiet():
            for setting in self.settings:
                try:
                    value = setting.read()
                    now = _frozen(value) if _plain(value) else _MISSING
                except Exception:
                    now = _MISSING
                before = self.values[setting.key]
                if now != before:
                    moved.append((setting.key, before, None if now is _MISSING else now))
        return moved

    def restore(self, keys: list[str]) -> list[str]:
        """Write the snapshot's values of `keys` back (all first, then check: one setter often moves
        several readers, and writing one back can move another, as the TF32 flag and the fp32_precision
        settings do; so a second pass writes whatever still differs); returns the keys still differing."""
        by_key = {s.key: s for s in self.settings}
        pending = list(keys)
        for _ in range(3):
            with _quiet():
                for key in pending:
                    setting = by_key[key]
                    if setting.write is not None:
                        try:
                            setting.write(self.values[key])
                        except Exception:
                            continue
            pending = [key for key, _, _ in self.changes()]
            if not pending:
                break
        return pending
