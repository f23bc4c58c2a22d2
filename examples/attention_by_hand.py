"""Scaled dot-product attention (notes 004, eq. 9) by hand, next to attnlab's module.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Run: python examples/attention_by_hand.py
"""

import math

import torch

from attnlab import ModelConfig, build_model, inspect

torch.manual_seed(0)
T, D = 5, 8
x = torch.randn(1, T, D)  # (B, T, D): five tokens
W_q, W_k, W_v = (torch.randn(D, D) / math.sqrt(D) for _ in range(3))
q, k, v = x @ W_q, x @ W_k, x @ W_v  # (B, T, D) each
weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), dim=-1)  # (B, T, T)
out = weights @ v  # (B, T, D)
print("attention weights, each row sums to 1:")
print(weights[0].round(decimals=3))
print("row sums:", weights[0].sum(-1).tolist())

# The same quantity inside a model, by the notes' name: blocks.L.self_attn.A is (B, H, T, S).
model = build_model(
    ModelConfig(kind="decoder_lm", vocab_size=50, d_model=16, n_heads=2, n_layers=1)
)
ids = torch.randint(0, 50, (1, T))
_, cache = inspect.run_with_cache(model.eval(), ids)
A = cache["blocks.0.self_attn.A"]
print("a causal model's attention of head 0 (zeros above the diagonal):")
print(A[0, 0].round(decimals=3))
assert torch.allclose(A.sum(-1), torch.ones_like(A.sum(-1)))
