"""Greedy decoding through a KV cache, for generation agreement: each prompt prefilled into a fresh cache of the
variant's KV format, then one token a step, the most likely one (``follow`` None) or the given continuation's
(teacher-forced along another model's continuation), so every step attends to what the cache stores."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


@torch.inference_mode()
def decode(model: nn.Module, prompts: torch.Tensor, kv: Any, steps: int, device: torch.device,
           follow: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [N, steps], log-probabilities [N, steps, vocab] float32)``: the next-token distribution before each
    step and the token taken (its argmax, or ``follow[:, step]``). ``prompts``: ``[N, P]`` token ids."""
    from ..fidelity.log_probs import log_probs
    from ..kv.hf_compat import cache_kwarg

    prompts = prompts.to(device)
    n, length = prompts.shape
    cache = kv.make_cache(model.config)
    arg = cache_kwarg(model)
    logits = model(input_ids=prompts, use_cache=True, cache_position=torch.arange(length, device=device),
                   **{arg: cache}).logits[:, -1].float()
    tokens, logprobs = [], []
    for step in range(steps):
        logp = log_probs(logits)
        token = logp.argmax(-1) if follow is None else follow[:, step].to(device)
        tokens.append(token.cpu())
        logprobs.append(logp.cpu())
        if step + 1 < steps:
            position = torch.tensor([length + step], device=device)
            logits = model(input_ids=token[:, None], use_cache=True, cache_position=position,
                           **{arg: cache}).logits[:, -1].float()
    return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)


def prompt_windows(ids: torch.Tensor, prompts: int, prompt_tokens: int) -> torch.Tensor:
    """``prompts`` windows ``[prompts, prompt_tokens]`` of the text's ids, evenly spaced from its start to its end."""
    last = ids.numel() - prompt_tokens
    if last < 0:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than one prompt of {prompt_tokens}")
    starts = torch.linspace(0, last, prompts).round().long() if prompts > 1 else torch.zeros(1, dtype=torch.long)
    return torch.stack([ids[s: s + prompt_tokens] for s in starts.tolist()])


def agreement(base: torch.Tensor, variant: torch.Tensor, base_logprobs: torch.Tensor,
              forced_logprobs: torch.Tensor) -> dict[str, float]:
    """Greedy continuations ``[N, M]`` of the baseline and the variant compared: the mean number of tokens before
    the first difference (M where none), the share of identical continuations, and KL(baseline ‖ variant) of the
    next-token distributions along the baseline's continuation (``forced_logprobs``: the variant teacher-forced
    on it), mean and maximum over its N × M steps."""
    steps = base.shape[1]
    differ = base != variant
    first = torch.where(differ.any(1), differ.int().argmax(1), torch.full_like(differ[:, 0], steps, dtype=torch.long))
    kl = (base_logprobs.exp() * (base_logprobs - forced_logprobs)).sum(-1).clamp(min=0)
    return {"generation_tokens_to_first_difference_mean": first.double().mean().item(),
            "generation_identical_percent": 100 * (~differ.any(1)).double().mean().item(),
            "generation_kl_mean": kl.double().mean().item(), "generation_kl_max": kl.max().item()}
