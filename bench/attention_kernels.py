"""Which attention kernel is fastest for the trainer's long sequences on this GPU: causal self-attention
forward and forward + backward of one layer of the 1.5B-class policy (12 query heads, 2 key/value heads,
head dim 128, bf16, batch 1) at 32,768 and 131,072 tokens, through each SDPA backend forced on its own
(a backend that cannot take the call raises instead of falling back) and through FlexAttention.

    python3 bench/attention_kernels.py --out $OUT
    python3 bench/attention_kernels.py --lengths 4096 --heads 4 --kv-heads 2 --head-dim 64   # CPU smoke

Attention is most of the train step at 131,072 tokens (docs/performance.md: ~11 of 13.5 s), so this says
whether another kernel could move the long-context ratio. Every backend's output and gradients are
compared with the flash backend's (bf16, same inputs): a fast kernel that computes something else is a bug.
`--model-layer` instead profiles one decoder layer of the 1.5B shape built by transformers exactly as
the trainer builds it (`attentionBackend` auto and cudnn), forward + backward at each length, and prints
which kernels took the time: the microbenchmark above says what a kernel can do, this says which one
the trainer gets.

Times are CUDA-event medians of `--repeats` calls after a warm-up; TFLOP/s counts the causal half
(forward 2·L²·H·D, backward 2.5x the forward). The ratio column is against flash in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa(backend: SDPBackend, expand_kv: bool) -> Attention:
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        if expand_kv and groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        with sdpa_kernel([backend]):
            return scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=not expand_kv and groups > 1
            )

    return run


def flex(length: int, device: str) -> Attention:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return q_idx >= kv_idx

    mask = create_block_mask(causal, 1, 1, length, length, device=device)
    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return compiled(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])  # type: ignore[no-any-return]

    return run


def timed(fn: Callable[[], Any], repeats: int, device: str) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure(
    name: str,
    attention: Attention,
    inputs: tuple[torch.Tensor, ...],
    reference: dict[str, torch.Tensor] | None,
    repeats: int,
    device: str,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    q, k, v, grad = inputs

    def forward() -> torch.Tensor:
        return attention(q, k, v)

    def step() -> None:
        for t in (q, k, v):
            t.grad = None
        attention(q, k, v).backward(grad)

    out = forward().detach()
    step()
    result = {"out": out, "dq": q.grad.detach().clone(), "dk": k.grad.detach().clone()}  # type: ignore[union-attr]
    with torch.no_grad():
        fwd_s = timed(forward, repeats, device)
    both_s = timed(step, repeats, device)
    row: dict[str, Any] = {"backend": name, "forward_s": fwd_s, "fwd_bwd_s": both_s}
    if reference is not None:
        row["max_abs_diff"] = {
            key: float((result[key].float() - reference[key].float()).abs().max()) for key in reference
        }
        row["max_abs_ref"] = {key: float(reference[key].float().abs().max()) for key in reference}
    return row, result


def layer_step(backbone: torch.nn.Module, ids: torch.Tensor) -> None:
    backbone(input_ids=ids, use_cache=False).last_hidden_state.float().square().mean().backward()
    torch.cuda.synchronize()


def profile_model_layer(lengths: list[int], out: Path | None) -> None:
    """Kernels (CUDA time) of one Qwen2 decoder layer's forward + backward per trainer attentionBackend."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from cuda_agent.api.trainingrun import TrainerSpec
    from cuda_agent.trainer.models import attention_implementation, backbone_of, set_attention_backend

    for backend in ("auto", "cudnn"):
        spec = TrainerSpec.model_validate({"attentionBackend": backend, "engine": "torch"})
        set_attention_backend(spec)
        config = Qwen2Config(
            hidden_size=1536, intermediate_size=8960, num_hidden_layers=1, num_attention_heads=12,
            num_key_value_heads=2, vocab_size=1024, max_position_embeddings=max(lengths),
            rope_theta=1_000_000.0, use_cache=False,
        )  # fmt: skip
        model = Qwen2ForCausalLM._from_config(
            config, attn_implementation=attention_implementation(spec), dtype=torch.bfloat16
        ).cuda()
        backbone = backbone_of(model)
        for length in lengths:
            ids = torch.randint(0, 1024, (1, length), device="cuda")
            layer_step(backbone, ids)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                layer_step(backbone, ids)
            events = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
            total = sum(e.device_time_total for e in events) / 1e3
            print(f"\nattentionBackend {backend}, {length} tokens: {total:.1f} ms of kernels; the top 5:")
            for event in events[:5]:
                print(f"  {event.device_time_total / 1e3:9.1f} ms  {event.count:4d}x  {event.key[:90]}")
            if out is not None:
                rows = [
                    {"kernel": e.key, "ms": e.device_time_total / 1e3, "count": e.count} for e in events[:20]
                ]
                (out / f"layer_{backend}_{length}.json").write_text(json.dumps(rows, indent=1))
        del model, backbone
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-flex", action="store_true")
    parser.add_argument("--model-layer", action="store_true", help="profile the trainer's decoder layer")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    heads, kv_heads, dim = args.heads, args.kv_heads, args.head_dim
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, "
        f"cudnn {torch.backends.cudnn.version() if device == 'cuda' else '-'}",
        flush=True,
    )
    if args.model_layer:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        profile_model_layer([int(x) for x in args.lengths.split(",") if x], args.out)
        return 0
    candidates: list[tuple[str, Callable[[int], Attention]]] = [
        ("flash (GQA)", lambda n: sdpa(SDPBackend.FLASH_ATTENTION, expand_kv=False)),
        ("flash (kv expanded)", lambda n: sdpa(SDPBackend.FLASH_ATTENTION, expand_kv=True)),
        ("cudnn (kv expanded)", lambda n: sdpa(SDPBackend.CUDNN_ATTENTION, expand_kv=True)),
        ("efficient (kv expanded)", lambda n: sdpa(SDPBackend.EFFICIENT_ATTENTION, expand_kv=True)),
    ]
    if not args.no_flex:
        candidates.append(("flex (compiled)", lambda n: flex(n, device)))
    rows: list[dict[str, Any]] = []
    for length in (int(x) for x in args.lengths.split(",") if x):
        torch.manual_seed(0)
        shape = (1, heads, length, dim)
        q = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn((1, kv_heads, length, dim), device=device, dtype=dtype, requires_grad=True)
        v = torch.randn((1, kv_heads, length, dim), device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(shape, device=device, dtype=dtype)
        forward_flop = 2 * length * length * heads * dim  # causal: half of 4·L²·H·D
        reference: dict[str, torch.Tensor] | None = None
        for name, make in candidates:
            try:
                row, result = measure(name, make(length), (q, k, v, grad), reference, args.repeats, device)
            except Exception as exc:  # an ineligible backend raises: record why, keep going
                row = {"backend": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
                result = None
            row |= {"tokens": length}
            if "forward_s" in row:
                row["forward_tflops"] = forward_flop / row["forward_s"] / 1e12
                row["fwd_bwd_tflops"] = 3.5 * forward_flop / row["fwd_bwd_s"] / 1e12
                if reference is None and result is not None:
                    reference = result
            rows.append(row)
            print(json.dumps(row), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention_kernels.json").write_text(json.dumps(rows, indent=1))
    header = f"{'tokens':>8} {'backend':<24} {'fwd ms':>9} {'fwd+bwd ms':>11} {'TFLOP/s':>8} {'vs flash':>8}"
    print(f"\n{header}  max|d out|")
    base: dict[int, float] = {}
    for row in rows:
        if "fwd_bwd_s" not in row:
            print(f"{row['tokens']:>8} {row['backend']:<24} {row['error']}")
            continue
        base.setdefault(row["tokens"], row["fwd_bwd_s"])
        diff = row.get("max_abs_diff", {}).get("out", math.nan)
        print(
            f"{row['tokens']:>8} {row['backend']:<24} {row['forward_s'] * 1e3:>9.1f}"
            f" {row['fwd_bwd_s'] * 1e3:>11.1f}"
            f" {row['fwd_bwd_tflops']:>8.0f} {base[row['tokens']] / row['fwd_bwd_s']:>8.2f}x  {diff:.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
