"""Walk every process-wide backend setter torch has and flip it, the way candidate code could (issue 30).

Run as a script (a subprocess of test_engine_backend_state.py, so the flips never touch the test
process); prints one JSON object: for each setter, what flipping it did to the judge's snapshot
(`backend_state.Snapshot`, taken first, as the worker takes it before a candidate's import):

- "detected": the snapshot's `changes()` named at least one setting (or autograd came back on), and
  `restore()` put every one back (`restored`);
- "refused": every value tried raised (a setter of another build, or one taking arguments no candidate
  value fits: the test keeps a reasoned list of these);
- "unchanged": a value was accepted and nothing the judge reads moved (the test allows only a reasoned list).

Setters come from torch itself, at run time:
- Python: every `torch._C` builtin whose name reads as a setter (`_set_*`, `*_enable*`, ...), every
  writable setting in the snapshot (torch.backends properties and module globals), every public setter
  function of torch.backends.* and of the `torch` namespace (`set_*`, `enable_*`, `use_*`, `allow_*`,
  `preferred_*`);
- C++: every `void set*(...)` member of ATen's `at::Context` declared in the installed `ATen/Context.h`,
  each called through an alias (`at::Context& ctx = at::globalContext(); ctx.setX(v);`) from a shared
  library compiled here against the installed torch and called through ctypes.
"""

from __future__ import annotations

import ctypes
import inspect
import itertools
import json
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils.cpp_extension

from cuda_agent.sandbox.judge import backend_state

warnings.simplefilter("ignore")

C_SETTER = re.compile(r"(?:^|_)(?:set|enable|disable)(?:_|[A-Z]|$)|_enable$")
PUBLIC_SETTER = re.compile(r"^(?:set|enable|use|allow|preferred)(?:_|$)|_enable$")
# Values tried, in order, for a setter of one argument (the first that moves a setting wins).
VALUES: list[Any] = [
    True, False, "high", "medium", "highest", "tf32", "ieee", "bf16", "none", "default", "cublas",
    "cublaslt", "ck", "magma", "cusolver", "warn", "nothing", "error", "x86", "qnnpack", "onednn",
    "fbgemm", 1, 0, 2, 7, 0.5, torch.float64, torch.float16, "cpu", "meta", "greedy", "optimal",
]  # fmt: skip


# Setters the walk does not call: a wrong-typed call throws a C++ error through a noexcept boundary and
# aborts the process (set_vital), or the call leaves this thread building meta tensors with no reader to
# see it (a thread-local dispatch key). Each is listed in the test with why it cannot move a baseline.
NOT_CALLED = frozenset({"torch._C.set_vital", "torch._C._set_meta_in_tls_dispatch_include"})


class Walk:
    def __init__(self) -> None:
        self.snapshot = backend_state.Snapshot()
        self.results: dict[str, dict[str, Any]] = {}

    def moved(self) -> list[str]:
        keys = [key for key, _, _ in self.snapshot.changes()]
        if torch.is_grad_enabled() is False:  # the walk runs with grad on: the guard's own check
            keys.append("autograd")
        return keys

    def settle(self, keys: list[str]) -> bool:
        """Restore what moved; a setting torch offers no way back for is taken as the new reference, so
        the next setter is judged on what it moves itself."""
        failed = self.snapshot.restore([k for k in keys if k != "autograd"])
        torch._C._set_grad_enabled(True)
        restored = not failed and not self.moved()
        if not restored:
            self.snapshot = backend_state.Snapshot(self.snapshot.settings)
        return restored

    def flip(self, label: str, attempts: list[Callable[[], Any]]) -> None:
        if label in NOT_CALLED:
            self.results[label] = {"outcome": "not-called"}
            return
        """Try each attempt until one moves a setting the judge reads."""
        accepted = False
        for attempt in attempts:
            try:
                attempt()
            except BaseException:  # a refused value (TypeError, RuntimeError, ValueError)
                continue
            accepted = True
            keys = self.moved()
            if keys:
                self.results[label] = {"outcome": "detected", "keys": keys[:6], "restored": self.settle(keys)}
                return
        self.results[label] = {"outcome": "unchanged" if accepted else "refused"}

    # -- Python ---------------------------------------------------------------------------------------------
    def python(self) -> None:
        c = torch._C
        for name in sorted(dir(c)):
            fn = getattr(c, name, None)
            if callable(fn) and not isinstance(fn, type) and C_SETTER.search(name):
                self.flip(f"torch._C.{name}", self.attempts(fn, self.current(name)))
        for setting in self.snapshot.settings:
            if setting.write is not None and not setting.key.endswith("()"):
                self.flip(
                    f"attribute {setting.key}",
                    self.attempts(setting.write, self.snapshot.values[setting.key]),
                )
        owners: list[tuple[str, Any]] = [("torch", torch), ("torch.cuda", torch.cuda)]
        owners.append(("torch.cuda.tunable", torch.cuda.tunable))
        owners += [(label, module) for label, module in backend_state._backend_modules()]
        for label, owner in owners:
            names = backend_state._public_names(owner) if label.startswith("torch.backends") else dir(owner)
            for name in names:
                fn = getattr(owner, name, None)
                if PUBLIC_SETTER.match(name) and callable(fn) and not inspect.isclass(fn):
                    self.flip(f"{label}.{name}", self.attempts(fn))

    @staticmethod
    def current(name: str) -> Any:
        """The value of a torch._C setter's partner reader (`_set_X` -> `_get_X` / `_is_X`), if any."""
        for prefix in ("_get_", "_is_"):
            reader = getattr(torch._C, prefix + name.removeprefix("_set_"), None)
            if name.startswith("_set_") and callable(reader):
                try:
                    return reader()
                except Exception:
                    return None
        return None

    def attempts(self, fn: Callable[..., Any], current: Any = None) -> list[Callable[[], Any]]:
        # With a known current value, only values of its type (a setter handed the wrong type may
        # throw a C++ error that aborts the process: _set_thread_name(True)).
        if current is not None:
            spread = [lambda v=v: fn(*v) for v in _alternatives(current) if isinstance(v, tuple)]
            return spread + [lambda v=v: fn(v) for v in _alternatives(current)]
        tries: list[Callable[[], Any]] = [lambda v=v: fn(v) for v in VALUES]
        tries += [lambda v=v: fn(v, v) for v in (True, False)]
        order = [list(p) for p in ((0, 1, 2, 3, 4), (4, 3, 2, 1, 0), (3, 0, 1, 2, 4))]
        tries += [lambda o=o: fn(o) for o in order]
        tries += [
            lambda b=b, o=o, p=p: fn(b, o, p)
            for b, o in (("cuda", "matmul"), ("cuda", "conv"), ("mkldnn", "matmul"), ("generic", "all"))
            for p in ("tf32", "ieee", "bf16", "none")
        ]
        return tries

    # -- C++ ------------------------------------------------------------------------------------------------
    def cpp(self, workdir: Path) -> None:
        header = Path(torch.utils.cpp_extension.include_paths()[0]) / "ATen" / "Context.h"
        text = re.sub(r"/\*.*?\*/", "", header.read_text(), flags=re.S)
        setters = sorted(set(re.findall(r"\bvoid\s+(set\w+)\s*\(([^;{]*)\)\s*;", text)))
        functions: dict[str, list[str]] = {}
        lines = ["#include <ATen/Context.h>", "#include <string>", "#include <vector>"]
        for name, params in setters:
            variants = _cpp_arguments(params)
            functions[name] = []
            for i, args in enumerate(variants):
                symbol = f"flip_{name}_{i}"
                functions[name].append(symbol)
                # Through an alias of the global context: what the static screen's old regex missed.
                lines.append(
                    f'extern "C" int {symbol}() {{ try {{ at::Context& ctx = at::globalContext(); '
                    f"ctx.{name}({args}); return 0; }} catch (...) {{ return 1; }} }}"
                )
        source = workdir / "flips.cpp"
        source.write_text("\n".join(lines) + "\n")
        library = workdir / "flips.so"
        torch_dir = Path(torch.__file__).parent
        abi = int(torch.compiled_with_cxx11_abi())
        includes = [f"-I{p}" for p in torch.utils.cpp_extension.include_paths()]
        command = [
            "g++", "-shared", "-fPIC", "-O0", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes,
            str(source), "-o", str(library), f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu",
            f"-Wl,-rpath,{torch_dir / 'lib'}",
        ]  # fmt: skip
        built = subprocess.run(command, capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"g++ failed: {built.stderr[-3000:]}")
        lib = ctypes.CDLL(str(library))
        for name, symbols in functions.items():
            calls = [getattr(lib, s) for s in symbols]
            for call in calls:
                call.restype = ctypes.c_int

            def refused_if_nonzero(call: Any) -> Callable[[], None]:
                def run() -> None:
                    if call() != 0:
                        raise RuntimeError("refused")

                return run

            self.flip(f"at::Context::{name}", [refused_if_nonzero(c) for c in calls])


def _alternatives(current: Any) -> list[Any]:
    """Values of the current value's own type that differ from it (enum members, flipped tuples, ...)."""
    if hasattr(type(current), "__members__"):
        return [m for m in type(current).__members__.values() if m != current]
    if isinstance(current, (tuple, list)):
        if all(isinstance(x, bool) for x in current):
            return [tuple(not x for x in current), tuple(not x for x in current[:1])]
        return [list(reversed(current)), list(current[1:]) + list(current[:1])]
    return [v for v in VALUES if type(v) is type(current) and v != current]


def _cpp_arguments(params: str) -> list[str]:
    """Argument lists to try for one at::Context setter, from its declared parameter types."""
    types = []
    for param in params.split(","):
        declared = re.sub(r"=.*$", "", param.split("/*")[0]).strip()
        named = re.match(r"^(.*?[\w>&*])\s+\w+$", declared)  # drop the parameter's name
        if declared:
            types.append(named.group(1) if named else declared)
    if not types:
        return [""]
    choices: list[list[str]] = []
    for t in types:
        if t == "bool" or "optional<bool>" in t:
            choices.append(["true", "false"])
        elif t in ("int", "int64_t", "size_t", "int32_t"):
            choices.append(["0", "7", "1"])
        elif "string" in t:
            choices.append(['"cuda"', '"matmul"', '"tf32"', '"ieee"', '"high"', '"medium"', '"none"'])
        elif "vector" in t:
            choices.append(["std::vector<int64_t>{4, 3, 2, 1, 0}"])
        else:  # an enum: its first few values
            base = t.replace("const", "").replace("&", "").strip()
            base = base if "::" in base else f"at::{base}"
            choices.append([f"static_cast<{base}>({v})" for v in (0, 1, 2, 3)])
    if len(choices) == 1:
        return choices[0]
    if all(c[0].startswith('"') for c in choices):  # setFloat32Precision(backend, op, precision)
        pairs = (("cuda", "matmul"), ("cuda", "conv"), ("mkldnn", "matmul"))
        return [f'"{b}", "{o}", "{p}"' for b, o in pairs for p in ("tf32", "ieee", "bf16", "none")]
    return [", ".join(combo) for combo in itertools.islice(itertools.product(*choices), 48)]


def main() -> int:
    torch.set_grad_enabled(True)
    walk = Walk()
    walk.python()
    with tempfile.TemporaryDirectory() as tmp:
        walk.cpp(Path(tmp))
    json.dump({"settings": len(walk.snapshot.settings), "results": walk.results}, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
