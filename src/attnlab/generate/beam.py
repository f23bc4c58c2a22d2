"""Beam search for language models and seq2seq models (003 "Decoding"; Wu et al. 2016, GNMT).

Each input keeps K = num_beams live prefixes. A prefix y_{1:t} scores s(y_{1:t}) = sum_i log
p(y_i | y_{<i}, x). Per step every live beam proposes every token; the 2K best candidates (in score
order) are read in turn:

  * a candidate ending in a stop token and ranked among the best K is a *finished hypothesis*
    with the length-penalised score  s(y) / |y|^alpha  (|y| counts the new tokens, including the
    stop token; alpha = ``length_penalty``); at most K finished hypotheses are kept per input;
  * other candidates become the next live beams, until there are K of them.

An input is done when it has K finished hypotheses and no live beam can still beat the worst of
them (or, with ``early_stopping``, as soon as it has K). The bound is exact: sum log p only falls
as a beam grows, so the best any live beam b can reach is s_b / L^alpha, with L = max length if
alpha > 0 and L = t + 1 otherwise. At ``max_new_tokens`` the live beams join the hypotheses.
Done inputs leave the batch (``cache.reorder`` drops their rows), so the remaining ones run faster.

Conventions (docs/generation.md): |y| counts new tokens only, as current Hugging Face does; the
default stopping rule is HF's exact ``early_stopping="never"`` (tests check the n-best lists and
scores against ``transformers``); GNMT's ((5 + |y|) / 6)^alpha differs from |y|^alpha only by a
constant factor between hypotheses of equal length. The returned tokens exclude the stop token.

Shapes: B inputs, A inputs still searching, K beams, R = A * K rows, V vocabulary, N new tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.generate.config import GenerationConfig, GenerationResult, Hypothesis, SpecialIds
from attnlab.generate.sampling import check_finite_logits, process_logits, seen_tokens
from attnlab.generate.steppers import Stepper
from attnlab.generate.text import decode_after, row_contexts

NEG_INF = float("-inf")


def length_normalised(score: float, length: int, alpha: float) -> float:
    """s(y) / |y|^alpha  (alpha = 0: raw log-probability; alpha = 1: mean log-probability)."""
    return score / (max(length, 1) ** alpha)


class _Finished:
    """The best <= K finished hypotheses of one input."""

    def __init__(self, k: int, alpha: float, max_len: int, early_stopping: bool):
        self.k, self.alpha, self.max_len, self.early = k, alpha, max_len, early_stopping
        self.hyps: list[Hypothesis] = []

    def add(self, tokens: list[int], logp: float, reason: str) -> None:
        score = length_normalised(logp, len(tokens) + (reason == "stop_token"), self.alpha)
        if len(self.hyps) < self.k or score > self.hyps[-1].score:
            self.hyps.append(Hypothesis(tokens, score, reason))
            self.hyps.sort(key=lambda h: -h.score)  # stable: earlier (shorter) wins ties
            del self.hyps[self.k :]

    def done(self, best_live: float, t: int) -> bool:
        """No live beam (best raw score ``best_live`` after t new tokens) can still get in."""
        if len(self.hyps) < self.k:
            return False
        if self.early or best_live == NEG_INF:
            return True
        bound_len = self.max_len if self.alpha > 0 else t + 1
        return length_normalised(best_live, bound_len, self.alpha) <= self.hyps[-1].score


@torch.inference_mode()
def beam_search(
    stepper: Stepper,
    config: GenerationConfig,
    *,
    vocab_size: int,
    specials: SpecialIds,
    prompts: list[list[int]],
    tokenizer: Any | None = None,
) -> GenerationResult:
    """Run beam search over the rows of a fresh stepper (one row per input)."""
    k, n, b = config.num_beams, config.max_new_tokens, stepper.rows
    contexts = row_contexts(tokenizer, stepper.history()) if tokenizer is not None else []
    stop = set(specials.stop)
    logits = check_finite_logits(stepper.start())  # (B, V)
    device = logits.device
    expand = torch.arange(b, device=device).repeat_interleave(k)  # (B*K,) row b*K + j <- b
    stepper.reorder(expand)
    logits = logits.index_select(0, expand)  # (R, V)
    scores = torch.full((b, k), NEG_INF, device=device)
    scores[:, 0] = 0.0  # only beam 0 is live at first, so the K beams do not start identical
    seen = None
    if config.repetition_penalty != 1.0:
        seen = seen_tokens(*stepper.history(), vocab_size)  # (R, V)
    gen = torch.full((b * k, n), specials.pad, dtype=torch.long, device=device)  # (R, N)
    finished = [_Finished(k, config.length_penalty, n, config.early_stopping) for _ in range(b)]
    active = list(range(b))  # the input each block of K rows belongs to
    n_cand = min(2 * k, k * vocab_size)
    for t in range(n):
        logp = process_logits(logits, config, seen).float().log_softmax(dim=-1)  # (R, V)
        cand = (scores.view(-1, 1) + logp).view(len(active), k * vocab_size)  # (A, K*V)
        top, flat = cand.topk(n_cand, dim=1)  # (A, 2K), sorted best first
        beam, token = (flat // vocab_size).tolist(), (flat % vocab_size).tolist()
        top_scores: list[list[float]] = top.tolist()
        rows: list[int] = []
        tokens: list[int] = []
        new_scores: list[float] = []
        still: list[int] = []
        for a, item in enumerate(active):
            chosen: list[tuple[int, int, float]] = []  # (row, token, score)
            for rank in range(n_cand):
                s, w, row = top_scores[a][rank], token[a][rank], a * k + beam[a][rank]
                if s == NEG_INF:
                    break
                if w in stop:
                    if rank < k:
                        finished[item].add(gen[row, :t].tolist(), s, "stop_token")
                    continue
                chosen.append((row, w, s))
                if len(chosen) == k:
                    break
            if not chosen or finished[item].done(chosen[0][2], t + 1):
                continue
            chosen += [(chosen[0][0], chosen[0][1], NEG_INF)] * (k - len(chosen))  # dead fillers
            for row, w, s in chosen:
                rows.append(row)
                tokens.append(w)
                new_scores.append(s)
            still.append(item)
        if not still:
            break
        index = torch.tensor(rows, device=device)  # (R',)
        nxt = torch.tensor(tokens, device=device)  # (R',)
        gen = gen.index_select(0, index)
        gen[:, t] = nxt
        scores = torch.tensor(new_scores, device=device).view(len(still), k)  # (A', K)
        active = still
        if seen is not None:
            seen = seen.index_select(0, index)
            seen[torch.arange(len(rows), device=device), nxt] = True
        stepper.reorder(index)
        if t == n - 1:
            for a, item in enumerate(active):
                for j in range(k):
                    if scores[a, j] > NEG_INF:
                        finished[item].add(gen[a * k + j].tolist(), float(scores[a, j]), "length")
            break
        logits = stepper.advance(nxt)
    return _result(finished, prompts, tokenizer, contexts)


def _result(
    finished: list[_Finished],
    prompts: list[list[int]],
    tokenizer: Any | None,
    contexts: list[list[int]],
) -> GenerationResult:
    # An input with no hypothesis at all (every candidate was a stop token ranked below K) gets
    # the empty output.
    empty = Hypothesis([], NEG_INF, "stop_token")
    best = [f.hyps[0] if f.hyps else empty for f in finished]
    tokens = [h.tokens for h in best]
    texts = None
    if tokenizer is not None:  # each decoded after its prompt's last tokens (text.context_of)
        texts = [decode_after(tokenizer, c, t) for c, t in zip(contexts, tokens, strict=True)]
    return GenerationResult(
        tokens,
        texts,
        [h.finish_reason for h in best],
        prompts,
        scores=[h.score for h in best],
        nbest=[list(f.hyps) for f in finished],
    )
