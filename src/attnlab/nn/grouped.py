"""Grouped-query and multi-query attention: fewer key/value heads than query heads.

Multi-query attention (Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need")
gives all H query heads one shared key head and value head; grouped-query attention (Ainslie et
al. 2023, "GQA") is the middle ground: H_kv key/value heads, each shared by a group of
G = H / H_kv query heads. Query head h uses key/value head g(h) = floor(h / G):

    head_h = Attention(X W_q^h, X W_k^{g(h)}, X W_v^{g(h)}),    h = 0 .. H - 1.

H_kv = H is ordinary multi-head attention, H_kv = 1 is MQA. The point is decoding: the KV cache
holds only the H_kv heads, H / H_kv times less memory per token, and each decode step reads that
much less. The attention itself is unchanged: expand the H_kv heads to H and attend as usual.

Shapes: B batch, H query heads, H_kv key/value heads, S keys, Dh head width.
"""

from __future__ import annotations

from torch import Tensor


def repeat_kv(x: Tensor, n_heads: int) -> Tensor:
    """(B, H_kv, S, Dh) -> (B, H, S, Dh): each key/value head repeated for its G = H / H_kv
    query heads.

    Head order: [g_0 x G, g_1 x G, ...], so query head h reads key/value head h // G (the layout of
    Hugging Face Llama's ``repeat_kv``). Returns ``x`` itself when H_kv == H.
    """
    kv_heads = x.size(1)
    if n_heads % kv_heads:
        raise ValueError(
            f"{n_heads} query heads cannot be shared evenly by {kv_heads} key/value heads"
        )
    if kv_heads == n_heads:
        return x
    return x.repeat_interleave(n_heads // kv_heads, dim=1)  # (B, H, S, Dh)
