"""Masked-token filling with a masked language model (BERT): what "generate" means for an encoder.

Every [MASK] in the text is predicted at once from the whole sentence (Devlin et al. 2019: the
model sees both sides, so there is no left-to-right order):

    p(w_i = v | text) = softmax_v(logits_i),   i in the masked positions,

and the text is filled with each position's most likely token. Positions are filled
independently (one forward pass), as in BERT's pre-training objective.

Shapes: T tokens, V vocabulary, K candidates per mask.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class Candidate(NamedTuple):
    token: str  # the token's text
    id: int
    probability: float


class FillResult(NamedTuple):
    text: str  # the input with every mask replaced by its most likely token
    candidates: list[list[Candidate]]  # per mask, in order, the top-k tokens


@torch.no_grad()
def fill_mask(model: Any, tokenizer: Any, text: str, *, top_k: int = 5) -> FillResult:
    """Predict every mask token in ``text`` (write the tokenizer's mask token, e.g. "[MASK]")."""
    mask_id = getattr(tokenizer, "mask_id", None)
    if mask_id is None:
        raise ValueError("this tokenizer has no mask token, so there is nothing to fill in")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k={top_k!r} must be a positive int")
    ids = tokenizer.encode(text)
    positions = [i for i, t in enumerate(ids) if t == mask_id]
    if not positions:
        mask_token = tokenizer.hf.id_to_token(mask_id) if hasattr(tokenizer, "hf") else "[MASK]"
        raise ValueError(
            f"the text has no {mask_token} token to fill in; write it where a word is missing, "
            f"e.g. 'the cat sat on the {mask_token}.'"
        )
    param = next(model.parameters())
    logits = model(torch.tensor([ids], device=param.device)).logits[0]  # (T, V)
    probs = logits[positions].float().softmax(dim=-1)  # (M, V)
    top = probs.topk(min(top_k, probs.size(-1)), dim=-1)  # (M, K)
    candidates = [
        [
            Candidate(tokenizer.decode([int(i)], skip_special=False).strip(), int(i), float(p))
            for p, i in zip(row_p, row_i)
        ]
        for row_p, row_i in zip(top.values, top.indices)
    ]
    filled = list(ids)
    for pos, cands in zip(positions, candidates):
        filled[pos] = cands[0].id
    return FillResult(tokenizer.decode(filled), candidates)
