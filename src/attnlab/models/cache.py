"""Decoding state of a Transformer decoder: one KV cache per layer, the key padding mask of every
cached position, and (encoder-decoder) the cross-attention keys/values computed once per source."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.nn.cache import KVCache, resolve_cache_dtype


class TransformerCache:
    """Mutable decoding state; models update it in place when called with ``cache=``."""

    def __init__(
        self,
        layers: list[KVCache],
        batch_size: int,
        max_len: int,
        device: torch.device | None = None,
    ):
        self.layers = layers
        # key_mask[b, j]: position j of row b is a real token (False for left padding).
        self.key_mask = torch.ones(batch_size, max_len, dtype=torch.bool, device=device)
        self.has_padding = False
        self.memory_kv: list[tuple[Tensor, Tensor]] | None = None  # per decoder layer
        self.src_mask: Tensor | None = None  # (B, S)

    @classmethod
    def empty(
        cls,
        cfg: ModelConfig,
        n_layers: int,
        batch_size: int,
        max_len: int,
        like: Tensor,
        dtype: str | torch.dtype | None = None,
    ) -> TransformerCache:
        """A fresh cache of ``n_layers`` KV buffers for ``max_len`` positions on ``like``'s device,
        in ``dtype`` ("fp32", "bf16", ``attnlab.nn.cache.CACHE_DTYPES``) or, by default, in
        ``like``'s dtype: the model's compute dtype (its parameters', or the compute dtype of
        reduced-precision layers)."""
        dtype = resolve_cache_dtype(dtype) or like.dtype
        # Trimmed to the window only when every layer slides: the layers then hold the same
        # keys, and one padding mask (``record_keys``) serves them all.
        windows = {cfg.layer_window(i) for i in range(n_layers)}
        window = windows.pop() if len(windows) == 1 else None
        layers = [
            KVCache(
                batch_size,
                cfg.kv_heads,  # grouped-query attention caches only the key/value heads
                max_len,
                cfg.head_dim,
                cfg.value_dim,
                dtype=dtype,
                device=like.device,
                window=window,  # sliding-window attention: trimmed to the window
            )
            for _ in range(n_layers)
        ]
        return cls(layers, batch_size, max_len, like.device)

    @property
    def length(self) -> int:
        return self.layers[0].length

    @property
    def max_len(self) -> int:
        return self.layers[0].max_len

    def record_keys(self, key_padding_mask: Tensor | None, t: int) -> Tensor | None:
        """Store the padding mask of the T new positions; return the (B, 1, 1, S) mask to use."""
        start = self.length
        if key_padding_mask is not None:
            self.key_mask[:, start : start + t] = key_padding_mask
            self.has_padding = self.has_padding or not bool(key_padding_mask.all())
        if not self.has_padding:
            return None
        first = self.layers[0].start_after(t)  # the first key the layers hold after appending
        return self.key_mask[:, None, None, first : start + t]  # (B, 1, 1, S)

    def reorder(self, index: Tensor) -> None:
        for layer in self.layers:
            layer.reorder(index)
        self.key_mask = self.key_mask.index_select(0, index)
        if self.memory_kv is not None:
            self.memory_kv = [
                (k.index_select(0, index), v.index_select(0, index)) for k, v in self.memory_kv
            ]
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, index)
