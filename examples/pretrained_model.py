"""Load a Hugging Face model into attnlab's readable modules and generate from it.

Run: python examples/pretrained_model.py [HUB_ID_OR_DIR [PROMPT]]
     e.g. python examples/pretrained_model.py gpt2   (fetched into the Hugging Face cache)
Without an argument it builds a tiny random GPT-2 with transformers (no download) and shows that
attnlab's logits equal transformers' own.
"""

import sys
import tempfile

import torch

from attnlab import GenerationConfig, generate
from attnlab.interop.pretrained import load_pretrained

if len(sys.argv) > 1:
    found = load_pretrained(sys.argv[1])
    print(f"{found.model_type} model from {found.path}")
    prompt = sys.argv[2] if len(sys.argv) > 2 else "The meaning of life is"
    cfg = GenerationConfig(max_new_tokens=20, temperature=0)
    print(generate(found.model, prompt, cfg, tokenizer=found.tokenizer).texts[0])
    raise SystemExit(0)

import transformers  # noqa: E402  (only for the offline demo)

with tempfile.TemporaryDirectory() as tmp:
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp)  # config.json + model.safetensors, as on the hub
    found = load_pretrained(tmp)
    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        diff = (found.model(ids).logits - hf(ids).logits).abs().max()
    print(f"attnlab vs transformers GPT-2: max |logit difference| = {float(diff):.2e}")
    assert diff < 1e-4
