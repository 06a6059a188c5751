"""KernelBench-format task source: rendering a chain of applied operators into a `Model` with
`get_inputs` / `get_init_inputs` (execution.load_task loads it back).

The crawler's probe and the programmatic composer both render through `render_task`, so an operator the
probe found runnable is spelled exactly as the composer will spell it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cuda_agent.data.families import Plan, Shape
from cuda_agent.data.records import CatalogueEntry

_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
_INLINE_HEADER = "import math\n\nfrom torch import Tensor\n"


@dataclass(frozen=True)
class AppliedOp:
    """One operator of a task: what it is, how it is called, which values it reads and writes."""

    entry: CatalogueEntry
    plan: Plan
    x: str
    y: str | None
    out: str


def spelled(entry: CatalogueEntry) -> str:
    """How generated code names the operator's class or function (`nn.Conv2d`, `F.gelu`, `torch.sum`);
    a transformers class is inlined into the task, so it is spelled by its bare class name."""
    return entry.name.removeprefix("transformers.") if entry.source == "transformers" else entry.name


def _literal(value: Any) -> str:
    return repr(value)


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{key}={_literal(value)}" for key, value in kwargs.items())


def _call(op: AppliedOp, index: int) -> tuple[str | None, str]:
    """(constructor expression or None, forward expression) of one applied operator."""
    kw = _kwargs_text(op.plan.kwargs)
    if op.entry.kind == "module":
        init: str | None = f"{spelled(op.entry)}({kw})"
        target, kw_suffix = f"self.op{index}", ""
    else:
        init, target, kw_suffix = None, spelled(op.entry), f", {kw}" if kw else ""
    template = op.plan.template or ("{op}({x}, {y}{kw})" if op.y else "{op}({x}{kw})")
    return init, template.format(op=target, x=op.x, y=op.y, kw=kw_suffix)


def _tensor_expr(shape: Shape) -> str:
    return f"torch.randn({', '.join(str(d) for d in shape)})"


def render_task(ops: Sequence[AppliedOp], inputs: Sequence[tuple[str, Shape]], doc: str) -> str:
    """Source of a KernelBench task computing `ops` in order over forward inputs `inputs` (name, shape)."""
    inline = [op.entry.inline_source for op in ops if op.entry.inline_source]
    parts = [f'"""{doc}"""\n\n', _HEADER]
    if inline:
        parts += [_INLINE_HEADER, *(f"\n{source.strip()}\n" for source in dict.fromkeys(inline))]
    init_lines, forward_lines = [], []
    for index, op in enumerate(ops):
        init, expr = _call(op, index)
        if init:
            init_lines.append(f"        self.op{index} = {init}")
        forward_lines.append(f"        {op.out} = {expr}")
    params = ", ".join(name for name, _ in inputs)
    body = [
        "\n\nclass Model(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        *init_lines,
        "",
        f"    def forward(self, {params}):",
        *forward_lines,
        f"        return {ops[-1].out}",
        "",
        "",
        "def get_inputs():",
        f"    return [{', '.join(_tensor_expr(shape) for _, shape in inputs)}]",
        "",
        "",
        "def get_init_inputs():",
        "    return []",
        "",
    ]
    return "".join(parts) + "\n".join(body)
