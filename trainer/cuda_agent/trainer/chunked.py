"""Log-probs, entropy and values from hidden states, a chunk of tokens at a time.

At 131k tokens a [tokens x vocab] logits tensor is ~80 GiB in fp32 (151,936-word vocabulary); computed
per chunk inside activation checkpointing only one chunk's logits exist at a time, in the forward and again
in the backward. Log-softmax is taken in fp32 whatever the model's dtype: bf16 log-probs of
near-zero-probability tokens blow PPO ratios up.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

Head = Callable[[torch.Tensor], torch.Tensor]


def _chunk_stats(
    head: Head, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def token_logprobs(
    hidden: torch.Tensor,
    head: Head,
    targets: torch.Tensor,
    chunk_tokens: int,
    select: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of `targets` and the policy's entropy at each position, both fp32 [batch, tokens].

    `hidden` is [batch, tokens, hidden]; `targets` [batch, tokens] holds the token that follows each
    position. Entropy is a metric (no gradient). With gradients enabled each chunk is checkpointed, so the
    backward recomputes its logits instead of keeping them.

    `select` ([batch, tokens], bool) limits the head to those positions (the policy tokens: prompts and
    tool output carry no loss, and an agent's episode is mostly tool output); the others read 0.
    """
    batch, length, width = hidden.shape
    flat_hidden = hidden.reshape(batch * length, width)
    flat_targets = targets.reshape(batch * length)
    if select is not None and bool(select.any()):
        index = select.reshape(batch * length).nonzero().squeeze(1)
        logp, entropy = token_logprobs(
            flat_hidden[index][None], head, flat_targets[index][None], chunk_tokens
        )
        zeros = torch.zeros(batch * length, dtype=logp.dtype, device=logp.device)
        return (
            zeros.index_copy(0, index, logp[0]).view(batch, length),
            zeros.index_copy(0, index, entropy[0]).view(batch, length),
        )
    logps, entropies = [], []
    for start in range(0, batch * length, chunk_tokens):
        h = flat_hidden[start : start + chunk_tokens]
        t = flat_targets[start : start + chunk_tokens]
        if torch.is_grad_enabled() and h.requires_grad:
            logp, entropy = checkpoint(_chunk_stats, head, h, t, use_reentrant=False)
        else:
            logp, entropy = _chunk_stats(head, h, t)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps).view(batch, length), torch.cat(entropies).view(batch, length)


def nll_sum(
    hidden: torch.Tensor, head: Head, targets: torch.Tensor, mask: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Summed negative log-likelihood of the masked targets (the RFT loss), chunked like token_logprobs."""
    logp, _ = token_logprobs(hidden, head, targets, chunk_tokens)
    return -(logp * mask).sum()
