"""The three networks of PPO, built from `spec.model`: policy (causal LM), critic (the same backbone with
a scalar value head) and a frozen reference policy for the KL term.

Forward passes return hidden states, never full logits: `chunked` turns them into log-probs and entropy.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel

from cuda_agent.api.trainingrun import ModelSource, TrainerSpec
from cuda_agent.storage import StorageConfig, open_store, parse_uri
from cuda_agent.trainer.checkpointing import enable_checkpointing as enable_checkpointing
from cuda_agent.trainer.chunked import token_logprobs

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def local_model_dir(uri: str, cache_dir: Path | None = None) -> Path:
    """A local directory holding the checkpoint at `uri` (s3:// is downloaded once into cache_dir)."""
    location = parse_uri(uri)
    if location.scheme != "s3":
        return location.local_path(StorageConfig.from_env().pvc_root)
    target = (cache_dir or Path(tempfile.gettempdir()) / "cuda-agent-models") / location.bucket / location.key
    if not (target / "config.json").exists():
        open_store(uri).download_dir(uri, target)
    return target


def load_pretrained(auto: Any, source: ModelSource, uri: str, spec: TrainerSpec) -> PreTrainedModel:
    directory = local_model_dir(uri)
    dtype = DTYPES[spec.precision]
    if source.random_init:
        config = AutoConfig.from_pretrained(directory)
        torch.manual_seed(spec.seed)
        model = auto.from_config(config, dtype=dtype, attn_implementation=attention_implementation(spec))
    elif source.gguf_file:
        model = auto.from_pretrained(
            directory,
            gguf_file=source.gguf_file,
            dtype=dtype,
            attn_implementation=attention_implementation(spec),
        )
    else:
        model = auto.from_pretrained(
            directory, dtype=dtype, attn_implementation=attention_implementation(spec)
        )
    model.config.use_cache = False
    return cast(PreTrainedModel, model)


EXPANDED_KV_SDPA = "cuda_agent_sdpa"


def _sdpa_expanded_kv(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA with grouped key/value heads expanded first: cuDNN's fused attention does not take GQA, and
    transformers' own SDPA path hands GQA to the kernel whenever there is no mask (every long sequence)."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal and attention_mask is None and query.shape[2] > 1,
    )
    return out.transpose(1, 2).contiguous(), None


def attention_implementation(spec: TrainerSpec) -> str:
    """The transformers attention implementation for spec.attentionBackend (registered on first use)."""
    if spec.attention_backend != "cudnn":
        return "sdpa"
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(EXPANDED_KV_SDPA, _sdpa_expanded_kv)
    AttentionMaskInterface.register(EXPANDED_KV_SDPA, sdpa_mask)
    return EXPANDED_KV_SDPA


def set_attention_backend(spec: TrainerSpec) -> None:
    """Process-wide SDPA kernel choice (the backward's recompute must pick the same kernel as the forward)."""
    if spec.attention_backend == "auto":
        return
    cudnn = spec.attention_backend == "cudnn"
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    torch.backends.cuda.enable_flash_sdp(not cudnn)
    torch.backends.cuda.enable_mem_efficient_sdp(False)


def backbone_of(model: PreTrainedModel) -> nn.Module:
    """The decoder stack without its LM head (`model.model` for Llama/Qwen-style models)."""
    return cast(nn.Module, getattr(model, model.base_model_prefix))


def hidden_states(
    backbone: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    out = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    )
    return cast(torch.Tensor, out.last_hidden_state)


class Policy(nn.Module):
    """A causal LM whose forward returns fp32 log-probs of the next tokens and the entropy, computed from
    hidden states in chunks (the whole computation is one forward, as DeepSpeed's engine expects).

    Given `targets` (a sequence-parallel slice: `position_ids` global, targets the token after each
    position), every position is scored; otherwise all but the last, against the following ids. With
    `select` only the selected positions go through the LM head (the others read 0)."""

    def __init__(self, lm: PreTrainedModel, chunk_tokens: int) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        select: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = hidden_states(backbone_of(self.lm), input_ids, attention_mask, position_ids)
        if targets is None:
            hidden, targets = hidden[:, :-1], input_ids[:, 1:]
        head = self.lm.get_output_embeddings()  # type: ignore[no-untyped-call]
        return token_logprobs(hidden, head, targets, self.chunk_tokens, select)

    def hf_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters under the Hugging Face names a rollout engine loads them by."""
        return list(self.lm.named_parameters())


def build_policy(source: ModelSource, spec: TrainerSpec) -> Policy:
    set_attention_backend(spec)
    model = load_pretrained(AutoModelForCausalLM, source, source.base, spec)
    enable_checkpointing(model, spec)
    return Policy(model, spec.logits_chunk_tokens)


def build_reference(source: ModelSource, spec: TrainerSpec) -> Policy:
    model = load_pretrained(AutoModelForCausalLM, source, source.base, spec)
    model.requires_grad_(False)
    return Policy(model, spec.logits_chunk_tokens).eval()


class Critic(nn.Module):
    """The base LM's decoder with a scalar value head on every position."""

    def __init__(self, backbone: PreTrainedModel, hidden_size: int, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1, dtype=next(backbone.parameters()).dtype)
        # Small initial values: value pretraining fits them; a large random head would swamp early GAE.
        # Seeded on its own so that two runs of one spec start from the same critic.
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            weight = torch.randn(self.value_head.weight.shape, generator=generator) / (hidden_size + 1)
            self.value_head.weight.copy_(weight)
            self.value_head.bias.zero_()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = hidden_states(self.backbone, input_ids, attention_mask, position_ids)
        values: torch.Tensor = self.value_head(hidden).squeeze(-1).float()
        return values


def build_critic(source: ModelSource, spec: TrainerSpec) -> Critic:
    uri = source.critic or source.base
    backbone = load_pretrained(AutoModel, source, uri, spec)
    enable_checkpointing(backbone, spec)
    critic = Critic(backbone, int(backbone.config.hidden_size), spec.seed)
    head = Path(local_model_dir(uri)) / "value_head.pt"
    if source.critic and head.exists():
        critic.value_head.load_state_dict(torch.load(head, map_location="cpu"))
    return critic
