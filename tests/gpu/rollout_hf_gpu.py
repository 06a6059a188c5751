#!/usr/bin/env python3
"""The transformers rollout backend (`cuda_agent.rollout.hf`) on one GPU: correctness, then throughput.

Run from the repository root on the GPU machine (torch, transformers; pydantic carried as wheels):

    PYTHONUNBUFFERED=1 python3 tests/gpu/rollout_hf_gpu.py --out $OUT [--deps /tmp/site]

and as a CPU smoke run here (seconds):

    .venv/bin/python tests/gpu/rollout_hf_gpu.py --model tiny --device cpu --out /tmp/rollout_hf

The model is built from a config with random weights (nothing can be downloaded there): Qwen2-0.5B's shape
(hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151,936, tied embeddings) in bf16, or `tiny`
(2 layers, hidden 64, vocabulary 512). Prompts are token ids; no tokenizer is needed. Checks:

- logprobs: concurrent sessions with different prompt lengths (left padding in the batch cache) and
  sampling settings; every log-prob the engine returned is compared with one teacher-forced forward of
  prompt + generated tokens, in the model's dtype and in fp32 over the same (bf16-rounded) weights. The
  engine must be within TOL = 3 x max|bf16 forward - fp32 forward| + 1e-4 of the fp32 forward: it may
  not be further from the exact answer than rounding noise of the kind a plain bf16 forward has (two
  noisy values each within d of the truth are within 2d of each other; 3x leaves room for the decode
  path's other kernel shapes); their mean must be within 3x the bf16 forward's mean difference. A
  negative control (the same tokens scored without the first half of the first prompt) shows what a
  lost or misaligned context costs: its median must exceed TOL, or the check proves nothing.
- cache: the second turn of every session extends its prompt; the backend's `prefill_tokens` counter
  must grow by exactly the new tokens (last sampled token + observation), and the turn is checked like
  the first.
- greedy: temperature 0, the same prompts decoded concurrently and one at a time. In bf16 a batch of
  another size runs other GEMM kernels, so logits differ by rounding and a near-tie between the top two
  tokens can flip, after which the sequences part. Each divergence is reported with the top-2 margin
  (teacher-forced) at the first differing position; it passes only when that margin is within TOL (a
  genuine near-tie). The same is run over the fp32 copy of the weights, where divergences should vanish.
- update_weights (over an fp32 copy of the weights: an exact check): a perturbed bucket (fp32 tensors on
  the CPU, as a trainer sends) is loaded into a
  serving backend whose sessions hold caches; its next turns must equal a fresh model with those weights
  (tokens, log-probs), re-run the whole context (stale caches dropped), and differ from before. The same
  for `TransformersEngine` (the Ray actor body) loaded from a saved directory.
- throughput: N concurrent sessions (1, 8, 32, 64 by default), two turns each (prompt, then an
  observation), --max-tokens per turn, temperature 1: generated tokens/s and its ratio to N = 1 in the
  same run, decode steps, and peak GPU memory.

Writes $OUT/rollout_hf_gpu.json (rewritten after every phase, so a run stopped by `timeout` keeps what
finished) and $OUT/rollout_hf_gpu.log, and prints a short table last. A phase that would not fit in
what is left of --budget is skipped and says so; a hang dumps every thread's stack and exits at
--budget + 60 s. Exit status: 0 when every check passed, 1 when one failed, 2 when setup failed.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import faulthandler
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from fixtures.tiny_model import TINY_SHAPE, build_tiny_model  # noqa: E402

log = logging.getLogger("rollout_hf_gpu")

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": dict(
        vocab_size=151_936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32_768,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},  # transformers 5 spelling
        tie_word_embeddings=True,
    ),
    "tiny": dict(**TINY_SHAPE, vocab_size=512, max_position_embeddings=4096, tie_word_embeddings=True),
}
# Per-model defaults of the knobs (flags override): prompt lengths, tokens per turn, concurrency sweep.
DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": dict(
        concurrency="1,8,32,64", max_tokens=128, prompt=(256, 1024), check_tokens=64, checks=8
    ),
    "tiny": dict(concurrency="1,4", max_tokens=16, prompt=(8, 96), check_tokens=12, checks=4),
}


@dataclass
class Ctx:
    args: argparse.Namespace
    device: Any
    dtype: Any
    model: Any  # the served model, in --dtype
    ref: Any  # fp32 copy of the same (rounded) weights: the teacher-forced reference
    eos: int
    rng: random.Random
    results: dict[str, Any]
    started: float

    def left(self) -> float:
        return float(self.args.budget) - (time.monotonic() - self.started)


# ---------------------------------------------------------------------------------------------- helpers


def build_model(shape: str, dtype: Any, device: Any, init_std: float, seed: int) -> Any:
    # Built in `dtype` as from_pretrained(dtype=...) builds it: the rotary inv_freq buffer stays fp32
    # (model.to(bf16) would round it, and a saved-and-loaded copy would then compute other angles).
    return build_tiny_model(
        seed=seed, dtype=dtype, device=device, initializer_range=init_std, **SHAPES[shape]
    )


def tokens(rng: random.Random, n: int, vocab: int, eos: int) -> list[int]:
    """Random prompt / observation ids that never contain the end-of-sequence id."""
    out = [rng.randrange(vocab - 1) for _ in range(n)]
    return [t if t != eos else t - 1 for t in out]


def teacher_forced(model: Any, ids: list[int], start: int, temperature: float) -> list[float]:
    """Log-probs of ids[start:] from one forward pass over ids (no cache), in fp32 from the logits."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), logits_to_keep=len(ids) - start + 1)
    logits = out.logits[0, :-1].float()  # the positions that predict ids[start:]
    logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    target = torch.tensor(ids[start:], device=device)
    return [float(x) for x in logp.gather(1, target[:, None])[:, 0].cpu()]


def top_margin(model: Any, context: list[int], a: int, b: int) -> float:
    """logp(a) - logp(b) for the token after `context` (teacher-forced, fp32 from the logits)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context], device=device), logits_to_keep=1).logits[0, -1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(logp[a] - logp[b])


def max_abs(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def gpu_peak_gib(device: Any) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    return float(torch.cuda.max_memory_allocated(device)) / 2**30


def reset_peak(device: Any) -> float | None:
    """Start a new peak; what is allocated now (the weights of both models) is returned."""
    import torch

    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return float(torch.cuda.memory_allocated(device)) / 2**30


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def backend_for(ctx: Ctx, model: Any, max_batch: int = 64) -> Any:
    from cuda_agent.rollout.hf import TransformersBackend

    return TransformersBackend(model, [ctx.eos], max_batch=max_batch)


async def together(backend: Any, calls: list[tuple[list[int], Any, str | None]]) -> list[Any]:
    """Concurrent requests: they join the worker's running batch between decode steps."""
    return list(await asyncio.gather(*(backend.generate(p, s, session=sess) for p, s, sess in calls)))


async def one_by_one(backend: Any, calls: list[tuple[list[int], Any, str | None]]) -> list[Any]:
    return [await backend.generate(p, s, session=sess) for p, s, sess in calls]


# ----------------------------------------------------------------------------------------------- phases


def phase_logprobs(ctx: Ctx) -> dict[str, Any]:
    """Concurrent sessions, two turns each: log-probs vs teacher-forced forwards, and the cache counter."""
    from cuda_agent.rollout import SamplingParams

    args, vocab = ctx.args, ctx.model.config.vocab_size
    lo, hi = args.prompt
    n = args.checks
    # Spread over the range, all different: the batch cache left-pads every row but the longest.
    lengths = [lo + (hi - lo) * k // max(1, n - 1) + ctx.rng.randint(0, 3) for k in range(n)]
    ctx.rng.shuffle(lengths)
    prompts = [tokens(ctx.rng, length, vocab, ctx.eos) for length in lengths]
    # Mixed settings: plain sampling at two temperatures, and top-k / top-p truncation (log-probs are
    # still of the untruncated logits / temperature).
    settings: list[dict[str, Any]] = [
        dict(temperature=1.0),
        dict(temperature=0.7),
        dict(temperature=1.0, top_p=0.9),
        dict(temperature=0.8, top_k=50),
    ]
    samplings = [
        SamplingParams(max_tokens=args.check_tokens, seed=100 + i, **settings[i % len(settings)])
        for i in range(n)
    ]
    backend = backend_for(ctx, ctx.model)
    turns: list[list[tuple[list[int], int, Any, Any]]] = []  # per turn: (ids, start, sampling, generation)
    counters: list[dict[str, int]] = []
    try:
        current = [list(p) for p in prompts]
        held: list[int] = [0] * n  # tokens each session's cache holds after the previous turn
        for turn in range(2):
            before = backend.prefill_tokens
            gens = asyncio.run(together(backend, [(current[i], samplings[i], f"c{i}") for i in range(n)]))
            expected = sum(len(current[i]) - held[i] for i in range(n))
            counters.append(
                {"turn": turn + 1, "prefill_tokens": backend.prefill_tokens - before, "expected": expected}
            )
            turns.append([(current[i], len(current[i]), samplings[i], gens[i]) for i in range(n)])
            held = [len(current[i]) + len(gens[i].token_ids) - 1 for i in range(n)]
            observation = [tokens(ctx.rng, ctx.rng.randint(8, 48), vocab, ctx.eos) for _ in range(n)]
            current = [current[i] + gens[i].token_ids + observation[i] for i in range(n)]
    finally:
        backend.close()

    rows = []
    d_engine_ref = d_engine_same = d_noise = 0.0
    all_diffs: list[float] = []
    noise_diffs: list[float] = []
    control_diffs: list[float] = []
    for turn, items in enumerate(turns):
        for i, (ids, start, sampling, gen) in enumerate(items):
            full = ids + gen.token_ids
            same = teacher_forced(ctx.model, full, start, sampling.temperature)
            ref = teacher_forced(ctx.ref, full, start, sampling.temperature)
            diffs = [abs(a - b) for a, b in zip(gen.logprobs, ref, strict=True)]
            all_diffs += diffs
            d_engine_ref = max(d_engine_ref, max(diffs))
            d_engine_same = max(d_engine_same, max_abs(gen.logprobs, same))
            d_noise = max(d_noise, max_abs(same, ref))
            noise_diffs += [abs(a - b) for a, b in zip(same, ref, strict=True)]
            cut = len(prompts[i]) // 2
            control = teacher_forced(ctx.model, full[cut:], start - cut, sampling.temperature)
            control_diffs += [abs(a - b) for a, b in zip(control, same, strict=True)]
            rows.append(
                {
                    "turn": turn + 1,
                    "request": i,
                    "prompt_tokens": start,
                    "generated": len(gen.token_ids),
                    "finish": gen.finish_reason,
                    "sampling": sampling.model_dump(exclude={"stop_token_ids"}),
                    "max_abs_vs_fp32": max(diffs),
                    "max_abs_vs_same_dtype": max_abs(gen.logprobs, same),
                    "bf16_forward_vs_fp32": max_abs(same, ref),
                    "finite": all(math.isfinite(x) for x in gen.logprobs),
                }
            )
    tol = 3 * d_noise + 1e-4
    control_median = statistics.median(control_diffs) if control_diffs else 0.0
    # The mean too: a bug that shifts every token a little hides under a max-based bound, not here.
    engine_mean = statistics.fmean(all_diffs) if all_diffs else 0.0
    noise_mean = statistics.fmean(noise_diffs) if noise_diffs else 0.0
    ok = (
        all(r["finite"] for r in rows)
        and d_engine_ref <= tol
        and engine_mean <= 3 * noise_mean + 1e-4
        and control_median > tol  # else the check could not tell a bug from rounding
    )
    ctx.results["tolerance"] = tol
    return {
        "ok": ok,
        "tolerance": tol,
        "engine_vs_fp32_max": d_engine_ref,
        "engine_vs_fp32_mean": engine_mean,
        "forward_dtype_vs_fp32_mean": noise_mean,
        "engine_vs_same_dtype_max": d_engine_same,
        "forward_dtype_vs_fp32_max": d_noise,
        "control_median": control_median,
        "control_max": max(control_diffs, default=0.0),
        "control_above_tolerance": control_median > tol,
        "tokens_checked": len(all_diffs),
        "rows": rows,
        "cache": {
            "counters": counters,
            "ok": all(c["prefill_tokens"] == c["expected"] for c in counters),
        },
    }


def greedy_divergence(ctx: Ctx, model: Any, tol: float) -> dict[str, Any]:
    """Temperature 0: the same prompts decoded together and alone; where they part, the top-2 margin."""
    from cuda_agent.rollout import SamplingParams

    args, vocab = ctx.args, ctx.model.config.vocab_size
    lo, hi = args.prompt
    prompts = [tokens(ctx.rng, ctx.rng.randint(lo, hi), vocab, ctx.eos) for _ in range(args.checks)]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.check_tokens)
    calls: list[tuple[list[int], Any, str | None]] = [(p, greedy, None) for p in prompts]
    backend = backend_for(ctx, model)
    try:
        batched = asyncio.run(together(backend, calls))
        alone = asyncio.run(one_by_one(backend, calls))
    finally:
        backend.close()
    rows = []
    for i, (b, a) in enumerate(zip(batched, alone, strict=True)):
        first = next(
            (k for k, (x, y) in enumerate(zip(b.token_ids, a.token_ids, strict=False)) if x != y),
            None if len(b.token_ids) == len(a.token_ids) else min(len(b.token_ids), len(a.token_ids)),
        )
        row: dict[str, Any] = {"request": i, "prompt_tokens": len(prompts[i]), "tokens": len(a.token_ids)}
        if first is None:
            row.update(match=True, logprob_max_abs=max_abs(a.logprobs, b.logprobs))
        else:
            row.update(match=False, first_divergence=first)
            if first < min(len(b.token_ids), len(a.token_ids)):
                context = prompts[i] + a.token_ids[:first]
                margin = top_margin(model, context, a.token_ids[first], b.token_ids[first])
                row.update(margin=margin, near_tie=abs(margin) <= tol)
                row["logprob_max_abs_before"] = max_abs(a.logprobs[:first], b.logprobs[:first])
            else:
                row.update(margin=None, near_tie=False)  # one stopped, the other went on
        rows.append(row)
    return {
        "ok": all(r["match"] or r["near_tie"] for r in rows),
        "matched": sum(r["match"] for r in rows),
        "requests": len(rows),
        "tolerance": tol,
        "rows": rows,
    }


def phase_greedy(ctx: Ctx) -> dict[str, Any]:
    import torch

    tol = float(ctx.results.get("tolerance", 1e-3))
    out = {ctx.args.dtype: greedy_divergence(ctx, ctx.model, tol)}
    if ctx.dtype != torch.float32:
        # fp32 rounding is ~2^-24 relative: a flip needs a margin near 1e-5, not a bf16 one.
        out["float32"] = greedy_divergence(ctx, ctx.ref, 1e-4)
    return {"ok": all(v["ok"] for v in out.values()), **out}


# fp32 copies of one set of weights in other allocations may still pick other GEMM kernels: 1e-4 nats.
UPDATE_TOL = 1e-4


def perturbed_bucket(ctx: Ctx) -> list[tuple[str, Any]]:
    """A few whole tensors with noise of half their spread added: fp32 on the CPU, as a trainer sends."""
    import torch

    layers = ctx.model.config.num_hidden_layers
    names = [
        "model.layers.0.mlp.down_proj.weight",
        f"model.layers.{layers // 2}.self_attn.q_proj.weight",
        f"model.layers.{layers - 1}.self_attn.o_proj.weight",
        "model.norm.weight",
    ]
    state = ctx.model.state_dict()
    gen = torch.Generator().manual_seed(7)
    bucket = []
    for name in names:
        base = state[name].detach().float().cpu()
        spread = float(base.std()) if base.numel() > 1 and float(base.std()) > 0 else 1.0
        bucket.append((name, base + 0.5 * spread * torch.randn(base.shape, generator=gen)))
    return bucket


def phase_update(ctx: Ctx) -> dict[str, Any]:
    from cuda_agent.rollout import SamplingParams
    from cuda_agent.rollout.hf import TransformersEngine

    args, vocab = ctx.args, ctx.model.config.vocab_size
    lo, hi = args.prompt
    prompts = [tokens(ctx.rng, ctx.rng.randint(lo, hi), vocab, ctx.eos) for _ in range(3)]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.check_tokens)
    bucket = perturbed_bucket(ctx)

    # In fp32: this phase asks whether an update takes effect and drops stale caches, which needs an exact
    # comparison. On the H200 in bf16, two copies of the same weights in other allocations (cuBLAS picks
    # kernels by alignment) parted at greedy near-ties and differed by 0.07 in log-probs (first GPU run).
    served = copy.deepcopy(ctx.model).float()
    backend = backend_for(ctx, served)
    try:
        first = asyncio.run(one_by_one(backend, [(p, greedy, f"u{i}") for i, p in enumerate(prompts)]))
        follow = [
            p + g.token_ids + tokens(ctx.rng, 16, vocab, ctx.eos) for p, g in zip(prompts, first, strict=True)
        ]
        asyncio.run(backend.update_weights(bucket))
        before = backend.prefill_tokens
        after = asyncio.run(one_by_one(backend, [(p, greedy, f"u{i}") for i, p in enumerate(follow)]))
        rerun = backend.prefill_tokens - before
    finally:
        backend.close()

    fresh_model = copy.deepcopy(ctx.model).float()
    fresh_model.load_state_dict({name: t.float() for name, t in bucket}, strict=False)
    fresh = backend_for(ctx, fresh_model)
    try:
        want_first = asyncio.run(one_by_one(fresh, [(p, greedy, None) for p in prompts]))
        want = asyncio.run(one_by_one(fresh, [(p, greedy, None) for p in follow]))
    finally:
        fresh.close()
    del fresh_model, served

    same_tokens = all(a.token_ids == w.token_ids for a, w in zip(after, want, strict=True))
    lp_diff = max(max_abs(a.logprobs, w.logprobs) for a, w in zip(after, want, strict=True))
    changed = any(
        f.token_ids != w.token_ids or max_abs(f.logprobs[:1], w.logprobs[:1]) > 1e-3
        for f, w in zip(first, want_first, strict=True)
    )
    result: dict[str, Any] = {
        "bucket": [name for name, _ in bucket],
        "after_equals_fresh_tokens": same_tokens,
        "after_vs_fresh_logprob_max_abs": lp_diff,
        "outputs_changed": changed,
        "prefill_after_update": rerun,
        "prefill_expected": sum(len(p) for p in follow),
    }
    ok = same_tokens and lp_diff <= UPDATE_TOL and changed and rerun == result["prefill_expected"]

    # The Ray actor body, in-process: load from a saved directory onto the device, serve, take the bucket.
    if ctx.left() > 60:
        with tempfile.TemporaryDirectory(prefix="rollout_hf_gpu_") as tmp:
            ctx.model.save_pretrained(tmp)
            engine = TransformersEngine(tmp, [ctx.eos], dtype="float32", device=str(ctx.device))
            try:
                where = str(next(engine.backend.model.parameters()).device)
                e_first = asyncio.run(engine.generate(prompts[0], greedy))
                asyncio.run(engine.update_weights(bucket))
                e_after = asyncio.run(engine.generate(follow[0], greedy))
            finally:
                engine.backend.close()
        checks = {
            "before_equals_served": e_first[0] == first[0].token_ids,
            "after_equals_fresh": e_after[0] == want[0].token_ids,
            "after_logprob_max_abs": max_abs(e_after[1], want[0].logprobs),
            "device": where,
        }
        engine_ok = (
            checks["before_equals_served"]
            and checks["after_equals_fresh"]
            and checks["after_logprob_max_abs"] <= UPDATE_TOL
            and where.startswith(ctx.device.type)
        )
        result["engine"] = {"ok": engine_ok, **checks}
        ok = ok and engine_ok
    else:
        result["engine"] = {"ok": None, "skipped": "budget"}
    result["ok"] = ok
    return result


def phase_throughput(ctx: Ctx) -> dict[str, Any]:
    """N sessions at once, two turns each; tokens/s against N = 1 measured in the same run."""
    from cuda_agent.rollout import SamplingParams

    args, vocab = ctx.args, ctx.model.config.vocab_size
    lo, hi = args.prompt
    sweep = [int(x) for x in args.concurrency.split(",")]
    rows: list[dict[str, Any]] = []

    async def session(backend: Any, i: int, prompt: list[int], obs: list[int]) -> int:
        ids, generated = prompt, 0
        for turn in range(2):
            sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=1000 * i + turn)
            gen = await backend.generate(ids, sampling, session=f"t{i}")
            generated += len(gen.token_ids)
            ids = ids + gen.token_ids + obs
        await backend.release(f"t{i}")
        return generated

    async def run(backend: Any, n: int) -> int:
        rng = random.Random(n)
        plans = [
            (tokens(rng, rng.randint(lo, hi), vocab, ctx.eos), tokens(rng, 64, vocab, ctx.eos))
            for _ in range(n)
        ]
        counts = await asyncio.gather(*(session(backend, i, p, o) for i, (p, o) in enumerate(plans)))
        return sum(counts)

    warm = backend_for(ctx, ctx.model, max_batch=max(sweep))
    try:
        asyncio.run(run(warm, min(2, max(sweep))))  # kernels loaded, allocator warm
    finally:
        warm.close()
    last = 0.0
    for n in sweep:
        # Skip what would not fit, assuming the next N takes at most twice the last one's wall: as many
        # decode steps, each over more rows.
        if rows and ctx.left() < last * 2 + 30:
            rows.append({"concurrency": n, "skipped": "budget"})
            continue
        backend = backend_for(ctx, ctx.model, max_batch=max(sweep))
        try:
            resident = reset_peak(ctx.device)
            t0 = time.perf_counter()
            generated = asyncio.run(run(backend, n))
            sync(ctx.device)
            wall = time.perf_counter() - t0
        finally:
            backend.close()
        last = wall
        rows.append(
            {
                "concurrency": n,
                "generated_tokens": generated,
                "wall_s": wall,
                "tokens_per_s": generated / wall,
                "decode_steps": backend.decode_steps,
                "ms_per_decode_step": 1e3 * wall / max(1, backend.decode_steps),
                "prefill_tokens": backend.prefill_tokens,
                "peak_gpu_gib": gpu_peak_gib(ctx.device),
                "resident_before_gib": resident,  # the served model and the fp32 reference copy
            }
        )
        log.info("throughput %s", rows[-1])
    base = next((r["tokens_per_s"] for r in rows if r.get("concurrency") == 1 and "tokens_per_s" in r), None)
    for row in rows:
        if base and "tokens_per_s" in row:
            row["ratio_vs_1"] = row["tokens_per_s"] / base
    return {"ok": True, "max_tokens": args.max_tokens, "turns": 2, "temperature": 1.0, "rows": rows}


def phase_sampling_cost(ctx: Ctx) -> dict[str, Any]:
    """What sampling one decode step's rows costs on the device at this vocabulary (`sample_tokens`,
    one call per step for all rows), for the largest N of the sweep and for one row."""
    import torch

    from cuda_agent.rollout import SamplingParams
    from cuda_agent.rollout.hf import sample_tokens

    vocab = ctx.model.config.vocab_size
    out: dict[str, Any] = {"ok": True, "vocab": vocab}
    for rows in sorted({1, max(int(x) for x in ctx.args.concurrency.split(","))}):
        logits = torch.randn(rows, vocab, device=ctx.device).to(ctx.dtype)
        generators = [torch.Generator(ctx.device).manual_seed(i) for i in range(rows)]
        for label, sampling in (
            ("temperature_1", SamplingParams(temperature=1.0)),
            ("top_p_0.9", SamplingParams(temperature=1.0, top_p=0.9)),
            ("greedy", SamplingParams(temperature=0.0)),
        ):
            samplings = [sampling] * rows
            sample_tokens(logits, samplings, generators)
            sync(ctx.device)
            t0 = time.perf_counter()
            for _ in range(10):
                sample_tokens(logits, samplings, generators)  # ends in a copy to the host: synchronous
            out[f"rows_{rows}_{label}_ms"] = 1e3 * (time.perf_counter() - t0) / 10
    return out


# ------------------------------------------------------------------------------------------------- main

# Each phase and the seconds it needs at least on the GPU (skipped when less of --budget is left).
PHASES: dict[str, tuple[Callable[[Ctx], dict[str, Any]], float]] = {
    "logprobs": (phase_logprobs, 30),
    "greedy": (phase_greedy, 40),
    "update_weights": (phase_update, 40),
    "sampling_cost": (phase_sampling_cost, 5),
    "throughput": (phase_throughput, 60),
}


def table(results: dict[str, Any]) -> str:
    lines = [f"{'check':<34} {'result':<52} {'pass':>5}"]

    def add(name: str, text: str, ok: Any) -> None:
        mark = "-" if ok is None else ("yes" if ok else "NO")
        lines.append(f"{name:<34} {text:<52} {mark:>5}")

    phases = results.get("phases", {})
    for name, value in phases.items():
        if "error" in value:
            add(name, ("error: " + value["error"])[:52], False)
        elif "skipped" in value:
            add(name, "skipped: " + value["skipped"], None)
    lp = phases.get("logprobs", {})
    if "engine_vs_fp32_max" in lp:
        add(
            "logprobs vs teacher-forced fp32",
            f"max {lp['engine_vs_fp32_max']:.1e} mean {lp['engine_vs_fp32_mean']:.1e} "
            f"(tol {lp['tolerance']:.1e}, n={lp['tokens_checked']})",
            lp["ok"],
        )
        add(
            "  bf16 forward vs fp32; control",
            f"max {lp['forward_dtype_vs_fp32_max']:.1e} mean {lp['forward_dtype_vs_fp32_mean']:.1e}; "
            f"ctl {lp['control_median']:.1e}",
            lp["control_above_tolerance"],
        )
        counters = lp["cache"]["counters"]
        add(
            "cache: turn 2 prefills only new",
            " ".join(f"t{c['turn']}:{c['prefill_tokens']}/{c['expected']}" for c in counters),
            lp["cache"]["ok"],
        )
    greedy = phases.get("greedy", {})
    for dtype, value in greedy.items():
        if isinstance(value, dict) and "matched" in value:
            parted = [r for r in value["rows"] if not r["match"]]
            margins = ", ".join(
                f"{r['first_divergence']}@{r['margin']:.1e}" if r.get("margin") is not None else "len"
                for r in parted
            )
            add(
                f"greedy batched == alone ({dtype})",
                f"{value['matched']}/{value['requests']} {margins}"[:52],
                value["ok"],
            )
    up = phases.get("update_weights", {})
    if "after_equals_fresh_tokens" in up:
        add(
            "update_weights == fresh model",
            f"tokens {up['after_equals_fresh_tokens']}, lp {up['after_vs_fresh_logprob_max_abs']:.1e}, "
            f"rerun {up['prefill_after_update']}/{up['prefill_expected']}",
            up["ok"],
        )
        engine = up.get("engine", {})
        add("TransformersEngine (saved dir)", f"device {engine.get('device', '-')}", engine.get("ok"))
    cost = phases.get("sampling_cost", {})
    for key in sorted(k for k in cost if k.endswith("temperature_1_ms")):
        rows = key.split("_")[1]
        add(
            f"sample_tokens ms/step, {rows} rows",
            f"T=1 {cost[key]:.2f}, top_p {cost[f'rows_{rows}_top_p_0.9_ms']:.2f}, "
            f"greedy {cost[f'rows_{rows}_greedy_ms']:.2f}",
            None,
        )
    tp = phases.get("throughput", {})
    for row in tp.get("rows", []):
        if "tokens_per_s" in row:
            peak = row["peak_gpu_gib"]
            add(
                f"throughput N={row['concurrency']}",
                f"{row['tokens_per_s']:.0f} tok/s x{row.get('ratio_vs_1', 0):.2f} "
                f"{row['ms_per_decode_step']:.0f} ms/step peak {'-' if peak is None else f'{peak:.1f} GiB'}",
                None,
            )
        else:
            add(f"throughput N={row['concurrency']}", "skipped: budget", None)
    env = results.get("environment", {})
    lines.append(
        f"{env.get('device_name', '?')} torch {env.get('torch', '?')} "
        f"transformers {env.get('transformers', '?')} "
        f"{results.get('model', '?')} {results.get('dtype', '?')} wall {results.get('wall_s', 0):.0f} s"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "rollout_hf_gpu_out")))
    parser.add_argument("--model", choices=sorted(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--init-std", type=float, default=0.05, help="initializer_range (see docs/agent.md)")
    parser.add_argument("--concurrency", default=None, help="comma-separated N for the throughput sweep")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per turn in the throughput sweep"
    )
    parser.add_argument("--check-tokens", type=int, default=None, help="tokens per turn in the checks")
    parser.add_argument("--checks", type=int, default=None, help="concurrent requests in the checks")
    parser.add_argument("--prompt", default=None, help="prompt length range LO,HI")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    parser.add_argument("--phases", default="logprobs,greedy,update_weights,sampling_cost,throughput")
    parser.add_argument("--deps", type=Path, default=None, help="extra sys.path directory (pydantic wheels)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        parser.error(f"--phases: unknown {sorted(unknown)}; known: {','.join(PHASES)}")
    defaults = DEFAULTS[args.model]
    args.concurrency = args.concurrency or defaults["concurrency"]
    args.max_tokens = args.max_tokens or defaults["max_tokens"]
    args.check_tokens = args.check_tokens or defaults["check_tokens"]
    args.checks = args.checks or defaults["checks"]
    args.prompt = tuple(int(x) for x in args.prompt.split(",")) if args.prompt else defaults["prompt"]

    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        handlers=[logging.FileHandler(args.out / "rollout_hf_gpu.log"), logging.StreamHandler(sys.stderr)],
    )
    hang = open(args.out / "rollout_hf_gpu.hang.txt", "w")  # noqa: SIM115 - kept open for faulthandler
    faulthandler.dump_traceback_later(args.budget + 60, exit=True, file=hang)
    for sub in ("sandbox_image", "platform", "trainer"):
        sys.path.insert(0, str(REPO / sub))
    if args.deps is not None:
        sys.path.insert(0, str(args.deps.resolve()))

    started = time.monotonic()
    results: dict[str, Any] = {
        "model": args.model,
        "dtype": args.dtype,
        "args": vars(args) | {"out": str(args.out)},
    }
    path = args.out / "rollout_hf_gpu.json"

    def save() -> None:
        results["wall_s"] = time.monotonic() - started
        path.write_text(json.dumps(results, indent=2, default=str))

    try:
        import torch
        import transformers

        device = torch.device(args.device)
        dtype = getattr(torch, args.dtype)
        results["environment"] = {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.version.cuda,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        }
        t0 = time.perf_counter()
        model = build_model(args.model, dtype, device, args.init_std, args.seed)
        ref = copy.deepcopy(model).float()  # the same rounded weights, computed in fp32
        sync(device)
        results["build_s"] = time.perf_counter() - t0
        results["parameters"] = sum(p.numel() for p in model.parameters())
        results["attn_implementation"] = model.config._attn_implementation
        log.info("model built: %s", {k: results[k] for k in ("build_s", "parameters", "attn_implementation")})
    except Exception:
        results["setup_error"] = traceback.format_exc()
        save()
        print(results["setup_error"])
        return 2

    ctx = Ctx(
        args,
        device,
        dtype,
        model,
        ref,
        SHAPES[args.model]["vocab_size"] - 1,
        random.Random(args.seed),
        results,
        started,
    )
    results["phases"] = {}
    for name in args.phases.split(","):
        run, minimum = PHASES[name]
        if device.type == "cuda" and ctx.left() < minimum:
            results["phases"][name] = {"skipped": "budget"}
            save()
            continue
        log.info("phase %s (%.0f s left)", name, ctx.left())
        t0 = time.perf_counter()
        try:
            results["phases"][name] = run(ctx)
        except Exception as exc:
            log.exception("phase %s failed", name)
            results["phases"][name] = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc(),
            }
        results["phases"][name]["seconds"] = time.perf_counter() - t0
        log.info(
            "phase %s done in %.1f s ok=%s",
            name,
            results["phases"][name]["seconds"],
            results["phases"][name].get("ok"),
        )
        save()

    faulthandler.cancel_dump_traceback_later()
    hang.close()
    if (args.out / "rollout_hf_gpu.hang.txt").stat().st_size == 0:
        (args.out / "rollout_hf_gpu.hang.txt").unlink()
    failed = [n for n, v in results["phases"].items() if v.get("ok") is False]
    results["failed"] = failed
    save()
    text = table(results)
    (args.out / "rollout_hf_gpu_table.txt").write_text(text + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
