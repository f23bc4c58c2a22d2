"""Train a tiny character-level language model for a few steps, then sample from it.

Run: python examples/train_tiny_lm.py [RUN_DIR]   (default: a temporary directory; ~10 s on CPU)
"""

import sys
import tempfile
from pathlib import Path

from attnlab import GenerationConfig, ModelConfig, generate
from attnlab.train import RunConfig, TrainConfig, train

text = "the cat sat on the mat. the dog sat on the log. " * 200
with tempfile.TemporaryDirectory() as tmp:
    run_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "run"
    corpus = Path(tmp) / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    model = ModelConfig(kind="decoder_lm", d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=64)
    settings = TrainConfig(
        task="lm",
        data=str(corpus),
        context_len=32,
        batch_size=16,
        steps=60,
        lr=3e-3,
        warmup_steps=5,
        eval_every=0,
        eval_batches=2,
        progress=False,
    )
    result = train(RunConfig(model, settings), run_dir=run_dir)
    print(f"trained {result.step} steps: {result.metrics}")
    sample = generate(result.model, "the ", GenerationConfig(max_new_tokens=30, temperature=0),
                      tokenizer=result.tokenizer)  # fmt: skip
    print("greedy continuation of 'the ':", repr(sample.texts[0]))
    print("files of the run:", sorted(p.name for p in run_dir.iterdir()))
