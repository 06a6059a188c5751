"""Composers: stack 1-5 catalogue operators into one KernelBench-format task.

Two implementations behind one interface (`Composer.compose(index) -> Sample`, deterministic in the
composer's seed and the index, so a resumed run recomposes exactly the samples it skipped):
- `ProgrammaticComposer`: shape- and dtype-driven, offline. It tracks the running tensor's shape, samples
  an operator whose family accepts that rank, lets the family fill the arguments, and may feed binary
  operators an earlier intermediate of the same shape (a residual) or a new input.
- `LLMComposer`: asks a chat model (any OpenAI-compatible endpoint, or a rollout `ChatBackend`) to stack
  sampled operators into a `Model`, and takes the fenced code block of its answer.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from cuda_agent.data.catalogue import Catalogue, fit_plan
from cuda_agent.data.families import SIZES, Plan, Shape, family_named
from cuda_agent.data.records import CatalogueEntry, ComposerConfig, Sample, Verdict
from cuda_agent.data.taskcode import AppliedOp, render_task

# Starting layouts per scale: rank -> candidate sizes of each dimension.
_LAYOUTS: dict[str, dict[int, tuple[tuple[int, ...], ...]]] = {
    "small": {
        2: ((8, 16, 32), (64, 128, 256)),
        3: ((2, 4), (16, 32), (32, 64)),
        4: ((2, 4), (4, 8, 16), (16, 32), (16, 32)),
        5: ((2,), (4, 8), (8,), (8, 16), (8, 16)),
    },
    # An H200 streams ~4.8 TB/s: an elementwise op needs ~10^8 elements to take the runtime filter's 1 ms.
    "full": {
        2: ((4096, 8192, 16384), (4096, 8192, 16384)),
        3: ((16, 32, 64), (512, 1024, 2048), (1024, 2048, 4096)),
        4: ((32, 64, 128), (32, 64, 128), (128, 256), (128, 256)),
        5: ((16, 32), (16, 32), (32, 64), (64, 128), (64, 128)),
    },
}
_RANK_WEIGHTS = {2: 0.3, 3: 0.25, 4: 0.35, 5: 0.1}
# No tensor of a task may exceed this many elements (memory and runtime stay bounded).
_MAX_ELEMENTS = {"small": 1 << 20, "full": 1 << 28}
_ATTEMPTS_PER_OP = 30


class Composer(Protocol):
    name: str

    def compose(self, index: int) -> Sample: ...


def sample_id(seed: int, index: int) -> str:
    return f"s{seed}-{index:07d}"


def _data_source(entries: list[CatalogueEntry]) -> str:
    source = "transformers" if any(e.source == "transformers" for e in entries) else "torch"
    return f"{source}#{len(entries)}"


def _op_count(rng: random.Random, weights: dict[int, float]) -> int:
    counts = sorted(weights)
    return rng.choices(counts, weights=[weights[c] for c in counts])[0]


def _numel(shape: Shape) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


@dataclass(frozen=True)
class _Step:
    """One operator of a walk, recorded so the walk can be replayed at another batch size: the family
    rule is re-run from the same random state on the new shape, so its arguments fit that shape."""

    entry: CatalogueEntry
    rule_state: Any  # random.Random state just before the family rule was called
    operand: int | None  # value index of the second tensor; None: a unary operator
    new_input: bool  # the second tensor is a new forward input (else an earlier intermediate)


@dataclass(frozen=True)
class Composition:
    """A composed chain before rendering: its start shape and its steps."""

    start: Shape
    steps: tuple[_Step, ...]


Chosen = list[tuple[CatalogueEntry, Plan, int | None]]  # (operator, plan, operand value index)


def scaled_batch(batch: int, shift: int) -> int | None:
    """`batch` times 2**shift, or None when a negative shift does not divide it exactly."""
    if shift >= 0:
        return batch << shift
    if batch % (1 << -shift):
        return None
    return batch >> -shift


class ProgrammaticComposer:
    """Offline composer: a random walk over the catalogue guided by the running tensor's shape."""

    name = "programmatic"

    def __init__(self, catalogue: Catalogue, config: ComposerConfig | None = None, seed: int = 0) -> None:
        self.catalogue = catalogue
        self.config = config or ComposerConfig()
        self.seed = seed

    def compose(self, index: int) -> Sample:
        sample = self.compose_scaled(index, 0, _MAX_ELEMENTS[self.config.scale])
        if sample is None:
            return _failed(sample_id(self.seed, index), self.name, "no operator applies to any start layout")
        return sample

    def compose_scaled(self, index: int, shift: int, max_elements: int) -> Sample | None:
        """The task of `index` with its batch dimension (dimension 0 of the start layout) times 2**shift,
        or None when that batch breaks an operator's shape rule or makes a tensor exceed `max_elements`.
        Shift 0 is `compose(index)`; calibrate.py picks the shift from runtimes on the target device."""
        composition = self.composition(index)
        if not composition.steps:
            return None
        replayed = self._replay(composition, shift, max_elements)
        if replayed is None:
            return None
        chosen, inputs = replayed
        ops, named_inputs = self._name_values(chosen, inputs)
        entries = [op.entry for op in ops]
        doc = "Fused operators: " + " -> ".join(e.name for e in entries)
        return Sample(
            id=sample_id(self.seed, index),
            ops=[e.name for e in entries],
            data_source=_data_source(entries),
            code=render_task(ops, named_inputs, doc),
            composer=self.name,
        )

    def composition(self, index: int) -> Composition:
        rng = random.Random(f"{self.seed}:{index}")
        target = _op_count(rng, self.config.op_count_weights)
        best: Composition | None = None
        for _ in range(10):  # a layout that fits fewer ops than asked: try another start
            walked = self._walk(rng, target)
            if best is None or len(walked.steps) > len(best.steps):
                best = walked
            if len(walked.steps) == target:
                break
        assert best is not None
        return best

    def _start_shape(self, rng: random.Random) -> Shape:
        ranks = sorted(_RANK_WEIGHTS)
        rank = rng.choices(ranks, weights=[_RANK_WEIGHTS[r] for r in ranks])[0]
        limit = _MAX_ELEMENTS[self.config.scale] // 2  # room for an op that doubles the size
        while True:
            shape = tuple(rng.choice(sizes) for sizes in _LAYOUTS[self.config.scale][rank])
            if _numel(shape) <= limit:
                return shape

    def _plan(self, entry: CatalogueEntry, shape: Shape, rng: random.Random) -> Plan | None:
        sizes = SIZES[self.config.scale]
        plan = family_named(entry.family or "").rule(entry.name.rsplit(".", 1)[-1], shape, rng, sizes)
        if plan is None:
            return None
        fitted = fit_plan(entry, plan)
        if isinstance(fitted, str) or (not fitted.out and not fitted.terminal):
            return None
        return fitted if min(fitted.out, default=1) >= 1 else None

    def _walk(self, rng: random.Random, target: int) -> Composition:
        limit = _MAX_ELEMENTS[self.config.scale]
        values: list[Shape] = [self._start_shape(rng)]
        steps: list[_Step] = []
        for step in range(target):
            shape = values[-1]
            candidates = self.catalogue.runnable_for(
                len(shape), include_transformers=self.config.include_transformers
            )
            picked = None
            for _ in range(_ATTEMPTS_PER_OP if candidates else 0):
                entry = rng.choice(candidates)
                state = rng.getstate()
                fitted = self._plan(entry, shape, rng)
                if fitted is None or (fitted.terminal and step < target - 1) or _numel(fitted.out) > limit:
                    continue
                if fitted.operand is not None and _numel(fitted.operand) > limit:
                    continue
                picked = (entry, fitted, state)
                break
            if picked is None:
                break
            entry, fitted, state = picked
            operand: int | None = None
            new_input = False
            if fitted.operand is not None:
                earlier = [i for i, s in enumerate(values[:-1]) if s == fitted.operand]
                if earlier and rng.random() < 0.5:
                    operand = rng.choice(earlier)
                else:
                    values.append(fitted.operand)  # a new forward input, not an intermediate
                    operand, new_input = len(values) - 1, True
            steps.append(_Step(entry, state, operand, new_input))
            values.append(fitted.out)
        return Composition(values[0], tuple(steps))

    def _replay(
        self, composition: Composition, shift: int, limit: int
    ) -> tuple[Chosen, list[tuple[int, Shape]]] | None:
        """The walk's operators re-planned on a start shape whose batch is scaled by 2**shift; None when an
        operator's rule no longer applies or the chain's structure (operands, residuals) changes."""
        batch = scaled_batch(composition.start[0], shift)
        if batch is None or batch < 1:
            return None
        values: list[Shape] = [(batch, *composition.start[1:])]
        inputs: list[tuple[int, Shape]] = [(0, values[0])]
        chosen: Chosen = []
        if _numel(values[0]) > limit:
            return None
        for step in composition.steps:
            rng = random.Random()
            rng.setstate(step.rule_state)
            plan = self._plan(step.entry, values[-1], rng)
            if plan is None or _numel(plan.out) > limit or (plan.operand is None) != (step.operand is None):
                return None
            if step.new_input:
                assert plan.operand is not None
                if _numel(plan.operand) > limit:
                    return None
                values.append(plan.operand)
                inputs.append((len(values) - 1, plan.operand))
            elif step.operand is not None and values[step.operand] != plan.operand:
                return None  # the residual no longer has the operand's shape
            chosen.append((step.entry, plan, step.operand))
            values.append(plan.out)
        return chosen, inputs

    @staticmethod
    def _name_values(
        chosen: Chosen, inputs: list[tuple[int, Shape]]
    ) -> tuple[list[AppliedOp], list[tuple[str, Shape]]]:
        """Spell values the way KernelBench tasks do (`x = op(x)`), naming only those read again later."""
        input_ids = {i for i, _ in inputs}
        referenced = {operand for _, _, operand in chosen if operand is not None}
        names: dict[int, str] = {}
        for value, _ in inputs[1:]:
            names[value] = f"y{len(names) + 1}"
        names[0] = "x0" if 0 in referenced else "x"
        ops: list[AppliedOp] = []
        current = 0
        next_value = 1
        for entry, plan, operand in chosen:
            while next_value in input_ids:
                next_value += 1
            out = f"h{len(ops)}" if next_value in referenced else "x"
            names[next_value] = out
            y = names[operand] if operand is not None else None
            ops.append(AppliedOp(entry, plan, names[current], y, out))
            current = next_value
            next_value += 1
        return ops, [(names[i], shape) for i, shape in inputs]


def _failed(sample: str, composer: str, why: str, ops: list[str] | None = None) -> Sample:
    ops = ops or []
    return Sample(
        id=sample,
        ops=ops,
        data_source=f"torch#{len(ops)}",
        code="",
        composer=composer,
        verdicts=[Verdict(filter="composed", passed=False, detail=why)],
        rejected_by="composed",
    )


# -- LLM composer -----------------------------------------------------------------------------------------

ChatFn = Callable[[list[dict[str, str]]], str]


class EndpointConfig(BaseModel):
    """An OpenAI-compatible chat completions endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(
        pattern=r"^https?://[^/\s]+", description="e.g. http://127.0.0.1:8000 (serves /v1/chat/completions)"
    )
    model: str = Field(min_length=1)
    api_key: SecretStr | None = None
    temperature: float = Field(default=0.7, ge=0)
    max_tokens: int = Field(default=2048, ge=64)
    timeout_s: float = Field(default=120.0, gt=0)


def openai_chat(endpoint: EndpointConfig) -> ChatFn:
    """A ChatFn over HTTP (standard library only, so it also runs where aiohttp is absent)."""

    def chat(messages: list[dict[str, str]]) -> str:
        body = {
            "model": endpoint.model,
            "messages": messages,
            "temperature": endpoint.temperature,
            "max_tokens": endpoint.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        if endpoint.api_key is not None:
            headers["Authorization"] = f"Bearer {endpoint.api_key.get_secret_value()}"
        request = urllib.request.Request(
            endpoint.base_url.rstrip("/") + "/v1/chat/completions", json.dumps(body).encode(), headers
        )
        with urllib.request.urlopen(request, timeout=endpoint.timeout_s) as response:
            payload: dict[str, Any] = json.loads(response.read())
        content: str = payload["choices"][0]["message"].get("content") or ""
        return content

    return chat


def chat_backend(backend: Any, max_tokens: int = 2048, temperature: float = 0.7) -> ChatFn:
    """A ChatFn over a rollout `ChatBackend` (e.g. rollout.openai_http.OpenAIChatBackend)."""
    from cuda_agent.rollout.base import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature)

    async def once(messages: list[dict[str, str]]) -> str:
        try:
            generation = await backend.chat(list(messages), [], sampling)
        finally:
            # The backend's HTTP session belongs to this call's event loop; the next call has another.
            close = getattr(backend, "close", None)
            if close is not None:
                await close()
        return generation.text or ""

    def chat(messages: list[dict[str, str]]) -> str:
        return asyncio.run(once(messages))

    return chat


SYSTEM_PROMPT = (
    "You write PyTorch reference tasks in KernelBench format: a module-level `class Model(nn.Module)` "
    "whose forward computes the result, `get_inputs()` returning a list of input tensors made with "
    "torch.randn, and `get_init_inputs()` returning the constructor's arguments. No randomness inside "
    "forward, no dropout, no printing. Answer with one ```python code block and nothing else."
)
_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(answer: str) -> str | None:
    """The first fenced code block that defines a Model (or the first block at all), else None."""
    blocks = _CODE_BLOCK.findall(answer)
    for block in blocks:
        if "class Model" in block:
            return str(block).strip() + "\n"
    return str(blocks[0]).strip() + "\n" if blocks else None


class LLMComposer:
    """Composer asking a chat model to fuse sampled operators into one task."""

    name = "llm"

    def __init__(
        self, catalogue: Catalogue, chat: ChatFn, config: ComposerConfig | None = None, seed: int = 0
    ) -> None:
        self.catalogue = catalogue
        self.chat = chat
        self.config = config or ComposerConfig()
        self.seed = seed
        self._pool = sorted(
            {e.name: e for e in catalogue.entries if e.status == "runnable" and e.source == "torch"}.values(),
            key=lambda e: e.name,
        )

    def prompt(self, ops: list[CatalogueEntry], scale: str) -> list[dict[str, str]]:
        listed = "\n".join(f"- {e.name} ({e.family})" for e in ops)
        size = "a few hundred thousand elements" if scale == "small" else "tens of millions of elements"
        user = (
            f"Stack these {len(ops)} operators, in this order, into one Model whose forward applies "
            f"them to its input(s) (insert reshapes only where shapes require it):\n{listed}\n"
            f"Pick input shapes of {size} so that every operator's constraints hold."
        )
        if self.config.target_ms is not None:  # the model cannot be calibrated: it is told the aim
            user += (
                f" Size them so that one eager forward takes about {self.config.target_ms:g} ms on the GPU."
            )
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def compose(self, index: int) -> Sample:
        rng = random.Random(f"{self.seed}:{index}")
        count = _op_count(rng, self.config.op_count_weights)
        ops = [rng.choice(self._pool) for _ in range(count)]
        names = [e.name for e in ops]
        ident = sample_id(self.seed, index)
        try:
            answer = self.chat(self.prompt(ops, self.config.scale))
        except (OSError, ValueError, KeyError) as exc:  # transport errors, bad JSON, missing fields
            return _failed(ident, self.name, f"endpoint error: {exc}", names)
        code = extract_code(answer)
        if code is None:
            return _failed(ident, self.name, "the answer has no fenced code block", names)
        return Sample(id=ident, ops=names, data_source=_data_source(ops), code=code, composer=self.name)
