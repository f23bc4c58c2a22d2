"""The one-head walkthrough and the position view: each step with the note and equation it shows.

Notes are cited by their file number in ``shared/seeds/`` (000 "Self-Attention and Transformers,
a mathematical approach", 001 "Basic self-attention", 002 "Q, K, V as projections", 003
"Transformers" (Agarwal), 004 "Lecture notes on attention & transformers"); see docs/math.md.

Shapes: T queries, S keys, D d_model, Dm memory width, H heads, Dk, Dv per head, Do output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.explore.probes import kv_head, matrix
from attnlab.models.layers import Embeddings
from attnlab.nn.multihead import CrossAttention, MultiHeadBase
from attnlab.nn.positional import PositionDescription


def _step(key, title, equation, note, values, rows, cols, **extra) -> dict[str, Any]:
    """One step; ``values`` stays a tensor (session.py sends it as JSON lists or packed)."""
    return {
        "key": key,
        "title": title,
        "equation": equation,
        "note": note,
        "shape": list(values.shape),
        "rows": rows,
        "cols": cols,
        "values": values,
        **extra,
    }


def _dims(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def scaled_equation(module: MultiHeadBase, factor: float, dk: int, bias: str = "") -> str:
    """The scaled logits of eq. 9 as ``module`` computes them (``attnlab.nn.attention``'s
    scaled_dot_product): Q K^T times the factor, plus a position bias, soft-capped to
    c tanh(s / c) where the module caps its logits (Gemma 2)."""
    why = f" (1/√{dk})" if abs(factor * math.sqrt(dk) - 1) < 1e-6 else ""  # float32 factors
    logits = f"Q Kᵀ · {factor:.6g}{why}{bias}"
    cap = getattr(module, "softcap", None)
    return logits if cap is None else f"{cap:g} tanh(({logits}) / {cap:g})"


def position_bias(module: MultiHeadBase) -> tuple[str, str]:
    """(the '+ bias' term of ``module``'s scaled logits, its note) when its position scheme adds
    a bias to them (ALiBi), from the scheme's own description; ('', '') otherwise."""
    scheme = getattr(module, "pos_enc", None)
    if scheme is None or not scheme.biases:
        return "", ""
    inside = scheme.describe(torch.arange(1))  # its equation and summary, whatever the length
    return f" + bias ({inside.kind}: {inside.equation})", " " + inside.summary


def group_note(module: MultiHeadBase, h: int) -> str:
    """Which key/value head query head ``h`` reads under grouped-query attention ('' without)."""
    kv = getattr(module, "n_kv_heads", module.n_heads)
    if kv == module.n_heads:
        return ""
    return f", key/value head {kv_head(module, h)} of {kv}, shared (grouped-query)"


def walkthrough_steps(
    q: dict[str, Tensor],
    module: MultiHeadBase,
    head: Any,
    axes: dict[str, list[str]],
    cfg: Any,
    switched_off: bool = False,
) -> list[dict[str, Any]]:
    """The steps of head_h = softmax(Q K^T / sqrt(d_k) + mask) V and of W^O, for head ``head.head``.

    ``q`` holds the quantities of :func:`attnlab.explore.probes.cached_steps` (all heads).
    ``switched_off``: the head is ablated, so its A V is computed but replaced by zeros before
    the concatenation; its step shows A V and says so.
    """
    h, rows, cols = head.head, axes["rows"], axes["cols"]
    cross = isinstance(module, CrossAttention)
    dk, dv, n_heads = module.d_head, module.d_v, module.n_heads
    scheme = getattr(module, "pos_enc", None)  # a position scheme acting inside attention
    inside = scheme.describe(torch.arange(q["A"].size(-1))) if scheme is not None else None
    a = module.activation.name  # the row activation of eq. 9
    pre = getattr(cfg, "norm_placement", "pre") == "pre"
    src = "M" if cross else "X"
    x_note = (
        "000 'Notation': x_i = E w_i, plus the position signal (000 'Position representations'); "
        + (
            "pre-norm blocks feed LN(h) to attention (000 'Add & Norm')."
            if pre
            else "post-norm blocks feed the residual stream h itself."
        )
    )
    steps = [
        _step(
            "X",
            "Input X (one row per query token)",
            "X ∈ R^{T×d}",
            x_note,
            q["X"],
            rows,
            _dims("d", q["X"].size(-1)),
        ),
    ]
    if cross:
        steps.append(
            _step(
                "M",
                "Memory M (the encoder's output)",
                "M = h^(x) ∈ R^{S×d}",
                "000 'Cross-Attention': keys and values come from the encoder.",
                q["M"],
                cols,
                _dims("d", q["M"].size(-1)),
            )
        )
    rot = ""
    if scheme is not None and inside is not None and scheme.rotates:
        rot = f" (then rotated, {inside.kind}: {inside.equation})"
    bias, bias_note = position_bias(module)
    shared, cap = group_note(module, h), getattr(module, "softcap", None)
    g = kv_head(module, h)  # h itself unless key/value heads are shared
    steps += [
        _step(
            "Q",
            f"Queries Q = X W_Q (head {h})",
            f"Q = X W_Q^{h} ∈ R^{{T×{dk}}}" + rot,
            "002: Q = X W_Q with W_Q ∈ R^{d_model×d_k}; 004 eq. 13 head_i uses Q W_i^Q.",
            q["Q"][h],
            rows,
            _dims("d", dk),
        ),
        _step(
            "K",
            f"Keys K = {src} W_K (head {h}{shared})",
            f"K = {src} W_K^{g} ∈ R^{{S×{dk}}}" + rot,
            "002: K = X W_K; 000 'Cross-Attention': k_j = K h^(x)_j."
            if cross
            else "002: K = X W_K; 001: the key k_i = W_k x_i.",
            q["K"][h],
            cols,
            _dims("d", dk),
        ),
        _step(
            "V",
            f"Values V = {src} W_V (head {h}{shared})",
            f"V = {src} W_V^{g} ∈ R^{{S×{dv}}}",
            "002: V = X W_V; 001: the value v_i = W_v x_i.",
            q["V"][h],
            cols,
            _dims("d", dv),
        ),
        _step(
            "scores",
            "Dot products Q Kᵀ",
            "scores_ij = q_i · k_j",
            "000: alpha_ij = softmax(q_i^T k_j); 001: w'_ij = q_i^T k_j.",
            q["scores"][h],
            rows,
            cols,
        ),
        _step(
            "scaled",
            "Scaled by 1/√d_k"
            + (", plus the position bias" if bias else "")
            + (", soft-capped" if cap is not None else ""),
            "scaled = " + scaled_equation(module, float(q["factor"]), dk, bias),
            "004 eq. 9: a(Q K^T / sqrt(d_q)); 001 'scaling the dot product' "
            "keeps the softmax out of its flat regions."
            + bias_note
            + (
                f" Soft-capping (Gemma 2): c tanh(s / c) keeps every logit in (-{cap:g}, {cap:g})."
                if cap is not None
                else ""
            ),
            q["scaled"][h],
            rows,
            cols,
        ),
        _step(
            "mask",
            "Mask (1 = may attend)",
            "M_ij = 0 ⇒ A_ij = 0",
            "000 'future mask': alpha_ij = 0 for j > i; 004: M ∈ {0,1}^{N×M}."
            if not cross
            else "004: M ∈ {0,1}^{N×M}; cross-attention sees every real source token.",
            q["mask"],
            rows,
            cols,
        ),
        _step(
            "A",
            f"{a.capitalize()} over each row: the attention weights A",
            f"A = {a}(scaled + log M)",
            f"004 eq. 9 with a = {a}, row by row (000 'Notation': over the last axis); each row "
            "sums to 1" + (" (one-hot: hard attention)." if a == "hardmax" else "."),
            q["A"][h],
            rows,
            cols,
        ),
        _step(
            "heads",
            f"Head output A V (head {h})" + (", switched off" if switched_off else ""),
            f"head_{h} = A V ∈ R^{{T×{dv}}}" + (" → 0" if switched_off else ""),
            "000: h_i = sum_j alpha_ij v_j; 004 eq. 9."
            + (
                " This head is switched off: A V is computed as shown, then replaced by zeros "
                "before the concatenation (its columns there are 0)."
                if switched_off
                else ""
            ),
            q["A"][h] @ q["V"][h] if switched_off else q["heads"][h],  # (T, S) @ (S, Dv)
            rows,
            _dims("d", dv),
        ),
        _step(
            "concat",
            "Concatenate the heads",
            f"[head_0; …; head_{n_heads - 1}] ∈ R^{{T×{n_heads * dv}}}",
            "004 eq. 13 concat(head_1, ..., head_h); 002: Z = Concat(Z^(1), ..., Z^(H)) (the notes "
            "count heads from 1, this page from 0).",
            q["concat"],
            rows,
            [f"h{i}.{j}" for i in range(n_heads) for j in range(dv)],
            highlight=[h * dv, (h + 1) * dv],
        ),
    ]
    if module.out_proj is not None:
        steps.append(
            _step(
                "out",
                "Output projection W^O",
                "MultiHead = concat W^O",
                "004 eq. 13: MultiHead(Q, K, V) = concat(head_1..head_h) W^O; 003: O = A W_O^T.",
                q["out"],
                rows,
                _dims("d", q["out"].size(-1)),
            )
        )
    else:
        steps.append(
            {
                "key": "out",
                "title": "No output projection",
                "equation": "Z = concat",
                "note": "002 keeps the concatenation without W^O.",
                "shape": [],
                "rows": [],
                "cols": [],
                "values": [],
            }
        )
    return steps


def positions_view(
    model: nn.Module, cfg: Any, inputs: dict[str, list[int]], labels
) -> dict[str, Any]:
    """For each embedding of the model, what its position scheme says of itself for these tokens
    (``attnlab.nn.positional``'s ``describe``: the same tables the forward uses)."""
    views = []
    embeds = [(p, m) for p, m in model.named_modules() if isinstance(m, Embeddings)]
    for path, embed in embeds:
        side = "source" if "encoder" in path and "source" in inputs else "target"
        ids = inputs[side]
        with torch.inference_mode():
            described = embed.pos_enc.describe(torch.arange(len(ids)))  # positions 0..T-1
        views.append(
            {"module": path, "side": side, "tokens": labels(ids), **description_json(described)}
        )
    if not embeds:
        views.append(
            {
                "module": "",
                "side": "target",
                "tokens": labels(inputs["target"]),
                "kind": "none",
                "acts_on": "nothing",
                "equation": "h_t = σ(W h_{t-1} + U x_t)",
                "values": [],
                "cols": [],
                "tables": {},
                "note": "A recurrent model has no position signal: order comes from reading the "
                "tokens one after another (000 'Problems with RNN'; 004 eq. 2).",
            }
        )
    return {"views": views}


def description_json(d: PositionDescription) -> dict[str, Any]:
    """A scheme's description as the page draws it: values (T, C) with column labels, and its
    named tables."""
    return {
        "kind": d.kind,
        "acts_on": d.acts_on,
        "equation": d.equation,
        "note": d.summary,
        "values": matrix(d.values) if d.values is not None else [],
        "cols": d.cols,
        "tables": {name: matrix(t) for name, t in d.tables.items()},
    }


SCORES = {
    "additive": ("e_lt = v^T tanh(W h^d_{l-1} + U f_t)", "U f_t", "Bahdanau's additive score"),
    "dot": ("e_lt = (h^d_{l-1})^T f_t", "f_t", "Luong's dot score"),
    "general": ("e_lt = (h^d_{l-1})^T W f_t", "W f_t", "Luong's general score"),
}


def bahdanau_steps(q: Mapping[str, Tensor], axes: dict[str, list[str]], score: str) -> list[dict]:
    """The recurrent attention decoder's steps (004 eq. 2, 5-8) with the model's numbers, read
    through attnlab.inspect: h_enc (S, E), f and keys (S, .), e and alpha (T, S), v_l and h_dec
    (T, D). Rows of e and alpha are target steps l, columns source positions t."""
    rows, cols = axes["rows"], axes["cols"]
    energy, keys, name = SCORES[score]
    return [
        _step(
            "h_enc",
            "Encoder states h^e_t",
            "h^e_t, c^e_t = LSTM(x_t, h^e_{t-1}, c^e_{t-1})",
            "004 eq. 2: the LSTM encoder reads the source.",
            q["h_enc"],
            cols,
            _dims("d", q["h_enc"].size(-1)),
        ),
        _step(
            "f",
            "Features f_t = T_θ(h^e_t)",
            "f_t = T_θ(h^e_t)",
            "004 eq. 5: a learned map of each encoder state.",
            q["f"],
            cols,
            _dims("d", q["f"].size(-1)),
        ),
        _step(
            "keys",
            f"The source half of the score, {keys}",
            keys,
            f"004 eq. 6 ({name}): it depends only on the source, so it is computed once.",
            q["keys"],
            cols,
            _dims("a", q["keys"].size(-1)),
        ),
        _step(
            "e",
            "Energies e_lt",
            energy,
            f"004 eq. 6 ({name}); h^d_{{l-1}} is the decoder state before step l.",
            q["e"],
            rows,
            cols,
        ),
        _step(
            "alpha",
            "Alignment α_l = softmax(e_l)",
            "α_lt = exp(e_lt) / Σ_t' exp(e_lt')",
            "004 eq. 7: over the real source positions; each row sums to 1.",
            q["alpha"],
            rows,
            cols,
        ),
        _step(
            "v_l",
            "Context v_l = Σ_t α_lt f_t",
            "v_l = Σ_t α_lt f_t",
            "004 eq. 8: the attention-weighted sum of the features.",
            q["v_l"],
            rows,
            _dims("d", q["v_l"].size(-1)),
        ),
        _step(
            "h_dec",
            "Decoder states h^d_l",
            "h^d_l, c^d_l = LSTM([y_{l-1}; v_l], h^d_{l-1}, c^d_{l-1})",
            "004 eq. 4: the context joins the previous output as input.",
            q["h_dec"],
            rows,
            _dims("d", q["h_dec"].size(-1)),
        ),
    ]
