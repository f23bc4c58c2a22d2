"""Look inside a model: cache every named activation, ablate a head, patch activations.

Run: python examples/look_inside.py
"""

import torch

from attnlab import ModelConfig, build_model, inspect

torch.manual_seed(0)
model = build_model(
    ModelConfig(kind="decoder_lm", vocab_size=40, d_model=32, n_heads=4, n_layers=2)
)
model.eval()
clean, corrupt = torch.randint(0, 40, (1, 8)), torch.randint(0, 40, (1, 8))

torch.set_grad_enabled(False)  # inference only
out, cache = inspect.run_with_cache(model, clean)
print(f"{len(cache)} cached activations, e.g.:", sorted(cache)[:5])
print("attention weights of layer 1:", tuple(cache["blocks.1.self_attn.A"].shape), "(B, H, T, S)")

with inspect.ablate_heads(model, [(1, 2)]):  # layer 1, head 2 zeroed
    ablated = model(clean).logits
print("largest logit change from ablating head 1.2:", float((ablated - out.logits).abs().max()))

_, corrupt_cache = inspect.run_with_cache(model, corrupt)
with inspect.patch(model, corrupt_cache, "blocks.0.*"):  # layer 0 from the corrupted run
    patched = model(clean).logits
print(
    "patching layer 0 changes the last logits by", float((patched - out.logits)[0, -1].abs().max())
)
