"""A trainable module with its optimizer and LR schedule: DeepSpeed (ZeRO stage 0-3) or plain torch.

Both backends offer the same operations: `forward`, then per optimizer step `start(n)`, `backward` of each
of the n micro-batches and `finish`; `save` / `load` of the full training state (weights, optimizer,
scheduler). Plain torch serves machines without DeepSpeed (the GPU benchmark host) and single-device runs.

Under bf16 both keep fp32 master weights: the optimizer steps fp32 copies and the bf16 parameters are
rounded from them after each step. Stepping bf16 parameters directly loses the update: at the paper's
actor rate (3e-6) an AdamW step is far below bf16's resolution (2^-8 relative), and 4 such steps changed
3.7 % of a 0.02-scale weight matrix at all (fp32: every weight, by ~6e-6).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from cuda_agent.localhost import free_port

EngineBackend = Literal["deepspeed", "torch"]


def init_distributed() -> None:
    """Join (or, alone, create) the default process group DeepSpeed needs; gloo on CPU."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    import deepspeed

    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


def _lr_lambda(warmup_steps: int) -> Any:
    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0

    return factor


class TrainEngine:
    """One role's trainable module, optimizer and scheduler."""

    def __init__(
        self,
        module: nn.Module,
        *,
        lr: float,
        backend: EngineBackend,
        zero_stage: int,
        max_grad_norm: float,
        bf16: bool,
        warmup_steps: int = 0,
        sequence_parallel: bool = False,
    ) -> None:
        self.backend = backend
        self.max_grad_norm = max_grad_norm
        params = [p for p in module.parameters() if p.requires_grad]
        # DeepSpeed's bf16 optimizer keeps its own fp32 masters; plain torch gets them here.
        self._masters = MasterWeights(params) if backend == "torch" else MasterWeights([])
        optimizer = torch.optim.AdamW(
            self._masters.optimized(params), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(warmup_steps))
        self._ds: Any = None
        self._loss_factor = 1.0
        if backend == "deepspeed":
            init_distributed()
            import deepspeed

            config = {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                "gradient_clipping": max_grad_norm,
                "zero_optimization": {"stage": zero_stage},
                "bf16": {"enabled": bf16},
                "zero_allow_untested_optimizer": True,
                "steps_per_print": 1 << 30,
                "wall_clock_breakdown": False,
            }
            mpu: Any = None
            if sequence_parallel:  # groups made by sequence_parallel.sequence_layout
                from deepspeed.runtime.sequence_parallel import parallel_state_sp

                mpu = parallel_state_sp

                # Stages 0-2 average gradients over the data-parallel ranks (all ranks / group size), as
                # the roles' loss scale expects; ZeRO-3's reduce-scatter (set explicitly: its contiguous
                # alternative divides like stages 0-2) averages over every rank, so the loss is scaled up.
                if zero_stage == 3:
                    config["zero_optimization"] = {"stage": 3, "reduce_scatter": True}
                    self._loss_factor = float(
                        torch.distributed.get_world_size(mpu.get_sequence_parallel_group())
                    )
            self._ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=module, optimizer=optimizer, lr_scheduler=scheduler, config=config, mpu=mpu
            )
            if self._ds.dp_world_size is None:
                # DeepSpeed leaves it unset under a sequence-parallel mpu; set_train_batch_size reads it.
                self._ds.dp_world_size = self._ds.seq_dp_world_size // self._ds.sequence_parallel_size
            self.module: nn.Module = self._ds.module
        else:
            self.module, self.optimizer, self.scheduler = module, optimizer, scheduler

    def forward(self, *args: Any) -> Any:
        """Through DeepSpeed's engine when there is one: ZeRO-3 counts micro-steps in its forward."""
        return self._ds(*args) if self._ds is not None else self.module(*args)

    def start(self, micro_batches: int) -> None:
        """Begin an optimizer step of `micro_batches` backward passes (DeepSpeed reduces after the last)."""
        if self._ds is not None:
            self._ds.set_train_batch_size(micro_batches * self._ds.dp_world_size)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate one micro-batch's gradients; `loss` is already scaled to its share of the step."""
        if self._ds is not None:
            self._ds.backward(loss * self._loss_factor, scale_wrt_gas=False)
            self._ds.step()  # applies the update only at the accumulation boundary
        else:
            loss.backward()  # type: ignore[no-untyped-call]
            self._masters.accumulate_grads()

    def finish(self) -> float:
        """End the optimizer step begun by `start`; returns the gradient norm before clipping."""
        if self._ds is not None:
            norm = self._ds.get_global_grad_norm()
            return float(norm) if norm is not None else 0.0
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._masters.write_back()
        return float(norm)

    def pending_bytes(self) -> int:
        """Device bytes the next backward and optimizer step will still allocate: gradients not yet there
        and, before the first step, plain AdamW's two moments (DeepSpeed allocates its own at start)."""
        if self._ds is not None:
            return 0
        total = self._masters.transient_grad_bytes()
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                size = p.numel() * p.element_size()
                total += size if p.grad is None else 0
                total += 2 * size if p not in self.optimizer.state else 0
        return total

    def train(self, mode: bool = True) -> None:
        self.module.train(mode)

    @contextmanager
    def learning_rate(self, lr: float | None) -> Iterator[None]:
        """Optimizer steps inside the block use `lr` (a warm-up stage's own rate), warm-up factor kept.
        The scheduler's base rates are what LambdaLR multiplies at every step (DeepSpeed steps the same
        scheduler), so both they and the current groups change, and both are restored on exit."""
        if lr is None:
            yield
            return
        scheduler: Any = self.scheduler
        groups = scheduler.optimizer.param_groups
        saved = list(scheduler.base_lrs), [g["lr"] for g in groups]
        factor = groups[0]["lr"] / saved[0][0] if saved[0][0] else 1.0
        scheduler.base_lrs = [lr] * len(groups)
        for group in groups:
            group["lr"] = lr * factor
        try:
            yield
        finally:
            factor = groups[0]["lr"] / lr
            scheduler.base_lrs = saved[0]
            for group, base in zip(groups, saved[0], strict=True):
                group["lr"] = base * factor

    @contextmanager
    def gathered(self, params: list[nn.Parameter]) -> Iterator[None]:
        """Full parameters inside the block (ZeRO-3 partitions them between forwards)."""
        if self._ds is not None and self._ds.zero_optimization_stage() == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(params):
                yield
        else:
            with nullcontext():
                yield

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        if self._ds is not None:
            self._ds.save_checkpoint(str(directory), tag="state", save_latest=False)
            return
        torch.save(
            {
                "module": self.module.state_dict(),
                "masters": self._masters.state(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
            },
            directory / "state.pt",
        )

    def load(self, directory: Path) -> None:
        if self._ds is not None:
            path, _ = self._ds.load_checkpoint(str(directory), tag="state")
            if path is None:
                raise FileNotFoundError(f"{directory}: no DeepSpeed checkpoint")
            return
        state = torch.load(directory / "state.pt", map_location="cpu", weights_only=True)
        self.module.load_state_dict(state["module"])
        self._masters.load(state.get("masters"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


class MasterWeights:
    """fp32 copies of a module's low-precision trainable parameters, for the plain-torch backend.

    The optimizer steps the copies; gradients are accumulated into them in fp32 after every backward (a
    bf16 sum over many micro-batches loses the small ones), and the parameters are rounded from them after
    every step. fp32 parameters are stepped as they are.
    """

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.pairs = [
            (p, nn.Parameter(p.detach().float().clone())) for p in params if p.dtype != torch.float32
        ]
        self._master_of = {id(p): master for p, master in self.pairs}

    def optimized(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """What the optimizer steps: each parameter's master where it has one, in the module's order."""
        return [self._master_of.get(id(p), p) for p in params]

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        for p, master in self.pairs:
            if p.grad is None:
                continue
            if master.grad is None:
                master.grad = p.grad.float()
            else:
                master.grad.add_(p.grad)
            p.grad = None

    @torch.no_grad()
    def write_back(self) -> None:
        for p, master in self.pairs:
            p.copy_(master)

    def transient_grad_bytes(self) -> int:
        """A backward's low-precision gradients, alive until they are added to the masters."""
        return sum(p.numel() * p.element_size() for p, _ in self.pairs)

    def state(self) -> list[torch.Tensor]:
        return [master.detach() for _, master in self.pairs]

    @torch.no_grad()
    def load(self, saved: list[torch.Tensor] | None) -> None:
        """Masters from a checkpoint; one written without them (older) rounds them from the parameters."""
        if saved is None:
            saved = [p.detach() for p, _ in self.pairs]
        if len(saved) != len(self.pairs):
            raise ValueError(
                f"checkpoint has {len(saved)} master weights, the module needs {len(self.pairs)}"
            )
        for (_, master), value in zip(self.pairs, saved, strict=True):
            master.copy_(value)
