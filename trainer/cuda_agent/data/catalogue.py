"""The operator catalogue: every operator class and function the crawler finds in torch (`torch.nn`
modules, `torch.nn.functional`, tensor ops) and, when installed, transformers (activation and RMSNorm
modules), each with a family, its required constructor arguments and a status.

Coverage is what the family table (families.py) covers. Each candidate is probed: a one-operator task is
rendered exactly as the composer would render it, run on CPU at small shapes for every input rank the
family accepts, and its output shape checked against the family's rule. Operators without a rule, with
arguments no rule fills, or that fail the probe are kept in the catalogue with the reason, so `cuda-agent
data catalogue` shows what is and is not covered.
"""

from __future__ import annotations

import ast
import functools
import inspect
import random
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from cuda_agent.data.decontam import is_docstring
from cuda_agent.data.execution import load_task
from cuda_agent.data.families import RMS_NORM_HIDDEN, SIZES, Family, Plan, family_named, family_of
from cuda_agent.data.records import CatalogueEntry, OpKind
from cuda_agent.data.taskcode import AppliedOp, render_task

# Shapes the probe runs each input rank at (small enough that the whole probe takes seconds on CPU).
PROBE_SHAPES = {2: (4, 64), 3: (2, 8, 32), 4: (2, 8, 16, 16), 5: (2, 4, 8, 8, 8)}

_STOCHASTIC = (
    "dropout", "rrelu", "fractional", "gumbel", "bernoulli", "multinomial", "normal", "poisson", "rand",
    "random", "uniform", "exponential", "geometric", "cauchy", "log_normal",
)  # fmt: skip
_CONTAINERS = {
    "Module",
    "Sequential",
    "ModuleList",
    "ModuleDict",
    "ParameterList",
    "ParameterDict",
    "Container",
}
_INTEGER_INPUTS = {
    "Embedding", "EmbeddingBag", "CrossEntropyLoss", "NLLLoss", "NLLLoss2d", "MultiLabelMarginLoss",
    "MultiMarginLoss", "CTCLoss", "AdaptiveLogSoftmaxWithLoss", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
    "embedding", "embedding_bag", "cross_entropy", "nll_loss", "one_hot", "multi_margin_loss",
    "multilabel_margin_loss", "ctc_loss", "max_unpool1d", "max_unpool2d", "max_unpool3d",
}  # fmt: skip


def _exclusion(short: str) -> str | None:
    """Why an operator may never be composed, or None. Stochastic operators break the determinism the
    judge relies on; the others take integer indices or are not operators."""
    lowered = short.lower()
    if any(word in lowered for word in _STOCHASTIC):
        return "stochastic"
    if short in _CONTAINERS:
        return "container, not an operator"
    if short.startswith("Lazy"):
        return "lazy module: same operator as its non-lazy form"
    if short == "SyncBatchNorm":
        return "needs a distributed process group"
    if short in _INTEGER_INPUTS:
        return "takes integer indices"
    if short.endswith("_") and not short.endswith("__"):
        return "in-place"
    if short in ("Identity", "LinearActivation"):
        return "identity"
    return None


def _required_args(cls: type) -> tuple[str, ...]:
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(
        p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def _accepted_params(cls: type) -> set[str] | None:
    """Constructor parameter names, or None when it takes **kwargs (anything goes)."""
    params = inspect.signature(cls).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def _entry(name: str, kind: OpKind, short: str, required: tuple[str, ...] = ()) -> CatalogueEntry:
    reason = _exclusion(short)
    if reason:
        return CatalogueEntry(name=name, kind=kind, status="excluded", reason=reason, required_args=required)
    family = family_of(short)
    if family is None:
        return CatalogueEntry(
            name=name, kind=kind, status="unsupported", reason="no shape rule for it", required_args=required
        )
    return CatalogueEntry(
        name=name,
        kind=kind,
        family=family.name,
        status="unsupported",
        reason="not probed",
        required_args=required,
    )


def _torch_modules() -> Iterator[CatalogueEntry]:
    import torch.nn as nn

    for short in nn.modules.__all__:
        cls = getattr(nn, short, None)
        if inspect.isclass(cls) and issubclass(cls, nn.Module):
            yield _entry(f"nn.{short}", "module", short, _required_args(cls))


def _functional_ops() -> Iterator[CatalogueEntry]:
    import torch.nn.functional as F

    for short in sorted(dir(F)):
        value = getattr(F, short)
        if short.startswith("_") or inspect.isclass(value) or inspect.ismodule(value) or not callable(value):
            continue
        if getattr(value, "__module__", "") not in ("torch.nn.functional", "torch._C._nn", None) and not (
            inspect.isbuiltin(value)
        ):
            continue  # typing helpers and re-exported utilities
        yield _entry(f"F.{short}", "functional", short)


def _tensor_ops() -> Iterator[CatalogueEntry]:
    import torch

    for short in sorted(dir(torch)):
        value = getattr(torch, short)
        if short.startswith("_") or inspect.isclass(value) or not callable(value):
            continue
        if hasattr(torch.Tensor, short):  # a tensor op: both torch.X and Tensor.X exist
            yield _entry(f"torch.{short}", "tensor", short)


def _inline_source(cls: type) -> str:
    """The class's source without decorators (transformers wraps some in hub-kernel decorators) and
    docstrings, so the task needs no transformers import where it is judged and stays short."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    node = tree.body[0]
    if isinstance(node, ast.ClassDef):
        node.decorator_list = []
    for scope in ast.walk(tree):
        if (
            isinstance(scope, ast.ClassDef | ast.FunctionDef)
            and len(scope.body) > 1
            and is_docstring(scope.body[0])
        ):
            scope.body = scope.body[1:]
    return ast.unparse(tree)


def _transformers_modules() -> Iterator[CatalogueEntry]:
    try:
        import transformers.activations as activations
    except ImportError:
        return
    classes: dict[str, tuple[type, Family | None]] = {}
    for value in activations.ACT2CLS.values():
        cls: Any = value[0] if isinstance(value, tuple) else value
        if cls.__module__.startswith("transformers"):
            classes[cls.__name__] = (cls, family_named("elementwise_unary"))
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        from transformers.models.t5.modeling_t5 import T5LayerNorm

        for cls in (LlamaRMSNorm, T5LayerNorm):
            classes[cls.__name__] = (cls, RMS_NORM_HIDDEN)
    except ImportError:
        pass
    for short, (cls, family) in sorted(classes.items()):
        required = _required_args(cls)
        if reason := _exclusion(short):
            yield CatalogueEntry(
                name=f"transformers.{short}", kind="module", source="transformers", status="excluded",
                reason=reason, required_args=required,
            )  # fmt: skip
            continue
        try:
            source = _inline_source(cls)
        except (OSError, TypeError, SyntaxError) as exc:
            yield CatalogueEntry(
                name=f"transformers.{short}", kind="module", source="transformers", status="unsupported",
                reason=f"source not available for inlining: {exc}", required_args=required,
            )  # fmt: skip
            continue
        yield CatalogueEntry(
            name=f"transformers.{short}", kind="module", source="transformers",
            family=family.name if family else None, status="unsupported", reason="not probed",
            required_args=required, inline_source=source,
        )  # fmt: skip


def crawl(include_transformers: bool = True) -> list[CatalogueEntry]:
    """Every operator found, with family and status before probing (runnable ones still say 'not probed')."""
    found: Iterable[CatalogueEntry] = [*_torch_modules(), *_functional_ops(), *_tensor_ops()]
    if include_transformers:
        found = [*found, *_transformers_modules()]
    return list(found)


def constructor_class(entry: CatalogueEntry) -> type | None:
    """The class a module entry constructs (None for functions)."""
    if entry.kind != "module":
        return None
    if entry.source == "transformers":
        return _inlined_class(entry.name.removeprefix("transformers."), entry.inline_source)
    import torch.nn as nn

    module_cls: type = getattr(nn, entry.name.removeprefix("nn."))
    return module_cls


@functools.cache
def _inlined_class(name: str, source: str) -> type:
    """The class defined by inlined source (executed once per process, not once per composition)."""
    namespace: dict[str, Any] = {}
    exec(compile(_INLINE_PRELUDE + source, name, "exec"), namespace)
    cls: type = namespace[name]
    return cls


_INLINE_PRELUDE = "\n".join(
    [
        "import math",
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "from torch import Tensor",
        "",
    ]
)


def fit_plan(entry: CatalogueEntry, plan: Plan) -> Plan | str:
    """The plan with constructor arguments the class does not take dropped, or why it cannot be used
    (a required argument the family rule does not fill)."""
    cls = constructor_class(entry)
    if cls is None:
        return plan
    missing = [name for name in entry.required_args if name not in plan.kwargs]
    if missing:
        return f"no rule fills required argument(s) {', '.join(missing)}"
    accepted = _accepted_params(cls)
    if accepted is None:
        return plan
    kwargs = {key: value for key, value in plan.kwargs.items() if key in accepted}
    return Plan(kwargs, plan.out, plan.operand, plan.template, plan.terminal, plan.out_dtype)


def _probe_rank(entry: CatalogueEntry, family: Family, rank: int) -> str | None:
    """None when a one-op task at this rank runs and has the shape the rule predicts, else the error."""
    import torch

    shape = PROBE_SHAPES[rank]
    plan = family.rule(entry.name.rsplit(".", 1)[-1], shape, random.Random(0), SIZES["small"])
    if plan is None:
        return f"rule does not apply to rank {rank}"
    fitted = fit_plan(entry, plan)
    if isinstance(fitted, str):
        return fitted
    inputs = [("x", shape)] + ([("y", fitted.operand)] if fitted.operand is not None else [])
    op = AppliedOp(entry, fitted, "x", "y" if fitted.operand is not None else None, "x")
    try:
        task = load_task(render_task([op], inputs, f"probe of {entry.name}"), "probe")
        with torch.no_grad():
            out = task.Model(*task.get_init_inputs())(*task.get_inputs())
    except Exception as exc:  # any failure means "not runnable as composed": record it
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    if not isinstance(out, torch.Tensor):
        return f"returns {type(out).__name__}, not a tensor"
    if tuple(out.shape) != fitted.out:
        return f"output shape {tuple(out.shape)} differs from the rule's {fitted.out}"
    return None


def probe(entry: CatalogueEntry) -> CatalogueEntry:
    """The entry with status runnable (and the ranks that ran) or failed (with the first error)."""
    if entry.family is None or entry.status == "excluded":
        return entry
    family = family_named(entry.family)
    ranks, errors = [], []
    for rank in family.ranks:
        error = _probe_rank(entry, family, rank)
        if error is None:
            ranks.append(rank)
        else:
            errors.append(f"rank {rank}: {error}")
    if ranks:
        return entry.model_copy(update={"status": "runnable", "reason": "", "input_ranks": tuple(ranks)})
    return entry.model_copy(update={"status": "failed", "reason": "; ".join(errors)[:400]})


class Catalogue:
    """The probed catalogue; `runnable_for(rank)`: what the composer may apply to a tensor of that rank."""

    def __init__(self, entries: list[CatalogueEntry]) -> None:
        self.entries = entries
        self._by_rank: dict[int, list[CatalogueEntry]] = {}
        for entry in entries:
            for rank in entry.input_ranks if entry.status == "runnable" else ():
                self._by_rank.setdefault(rank, []).append(entry)

    def runnable_for(self, rank: int, *, include_transformers: bool = True) -> list[CatalogueEntry]:
        entries = self._by_rank.get(rank, [])
        return entries if include_transformers else [e for e in entries if e.source != "transformers"]

    def by_name(self, name: str) -> CatalogueEntry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(f"operator {name!r} is not in the catalogue")

    def coverage(self) -> dict[str, int]:
        """Entries per status (runnable, failed, unsupported, excluded)."""
        return dict(Counter(entry.status for entry in self.entries))


@functools.cache
def build_catalogue(include_transformers: bool = True) -> Catalogue:
    """Crawl and probe (cached per process: the probe runs every candidate operator once)."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return Catalogue([probe(entry) for entry in crawl(include_transformers)])
