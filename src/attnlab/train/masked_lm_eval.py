"""Masked-LM evaluation of a text file: BERT's pre-training loss, for ``attnlab evaluate``.

A masked language model has no left-to-right perplexity. Its own objective (Devlin et al. 2019,
§3.1) is measured instead: the text is cut into windows of at most ``max_len - 2`` tokens, each
framed as [CLS] ... [SEP]; a fixed 15% of the inner positions (seeded, so every run scores the
same ones) are replaced by [MASK], and

    mlm_loss = -(1/M) sum_{masked i} log p(w_i | the window with its masks),   mlm_ppl = exp(loss)

over all M masked positions. (BERT's 80/10/10 replacement trick is a training device; here every
chosen position is [MASK].)

Shapes: B windows per batch, T window length, V vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

MASK_FRACTION = 0.15


@torch.no_grad()
def masked_lm_metrics(
    model: Any,
    tokenizer: Any,
    text: str,
    *,
    batch_size: int = 8,
    max_batches: int | None = None,
    seed: int = 0,
    prefix: str = "val",
) -> dict[str, float]:
    """{prefix_mlm_loss, prefix_mlm_ppl, prefix_masked_tokens} of ``model`` on ``text``."""
    cls_id, sep_id = _framing(tokenizer)
    mask_id = getattr(tokenizer, "mask_id", None)
    if mask_id is None:
        raise ValueError("the tokenizer has no mask token; a masked LM cannot be evaluated")
    ids = tokenizer.encode(text, add_special=False)
    inner = model.max_len - 2
    windows = [ids[s : s + inner] for s in range(0, len(ids), inner)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise ValueError("the text has fewer than 2 tokens; give more text to evaluate")
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for b, start in enumerate(range(0, len(windows), batch_size)):
        if max_batches is not None and b >= max_batches:
            break
        rows = [[cls_id, *w, sep_id] for w in windows[start : start + batch_size]]
        longest = max(map(len, rows))
        x = torch.full((len(rows), longest), tokenizer.pad_id, dtype=torch.long)  # (B, T)
        real = torch.zeros(len(rows), longest, dtype=torch.bool)
        for i, row in enumerate(rows):
            x[i, : len(row)], real[i, : len(row)] = torch.tensor(row), True
        inner_pos = real.clone()
        inner_pos[:, 0] = False  # never mask [CLS] ...
        inner_pos[torch.arange(len(rows)), real.sum(1) - 1] = False  # ... or [SEP]
        chosen = inner_pos & (torch.rand(x.shape, generator=gen) < MASK_FRACTION)
        for i in range(len(rows)):  # at least one masked token per window
            if not chosen[i].any():
                chosen[i, 1] = True
        masked = x.masked_fill(chosen, mask_id)
        logits = model(masked.to(device), key_padding_mask=real.to(device)).logits  # (B, T, V)
        nll = F.cross_entropy(
            logits[chosen.to(device)].float(), x[chosen].to(device), reduction="sum"
        )
        total += float(nll)
        count += int(chosen.sum())
    loss = total / count
    return {
        f"{prefix}_mlm_loss": loss,
        f"{prefix}_mlm_ppl": math.exp(min(loss, 700.0)),
        f"{prefix}_masked_tokens": count,
    }


def _framing(tokenizer: Any) -> tuple[int, int]:
    special = getattr(tokenizer, "special_tokens", {})
    cls, sep = (
        tokenizer.hf.token_to_id(special[r]) if r in special else None for r in ("cls", "sep")
    )
    if cls is None or sep is None:
        raise ValueError("the tokenizer names no [CLS]/[SEP] tokens to frame the windows with")
    return cls, sep
