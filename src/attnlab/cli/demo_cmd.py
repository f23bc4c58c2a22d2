"""``attnlab demo``: a one-minute tour. Parameter-free self-attention on a toy sentence (001), then
the ``reverse`` preset's encoder-decoder trained for a few hundred steps by the real training
loop, read from inside with :mod:`attnlab.inspect` (its cross-attention A, 004 eq. 9), and one
of its heads ablated: the worked example of docs/inspect.md, run.

The run goes to a temporary directory removed at the end, unless ``--out`` keeps it (then
``attnlab explore OUT`` opens it in the explorer).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from attnlab.cli.options import DOCS_URL, count
from attnlab.config import ModelConfig
from attnlab.data.tasks import make_task
from attnlab.errors import ConfigError
from attnlab.models import Seq2SeqModel, build_model
from attnlab.models.base import config_of
from attnlab.nn import basic_self_attention

STEPS = 300  # the worked example's: ~100% exact match on held-out strings, about a minute


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="a one-minute tour: self-attention on a toy sentence, then a string reverser "
        "trained, read from inside and ablated",
        description="Self-attention on a toy sentence (permutation equivariance), then the "
        "reverse preset's encoder-decoder trained for --steps steps and looked at: where each "
        "output step's cross-attention reads, which head matters most, and what the model "
        f"writes without it. The same in Python: {DOCS_URL}inspect.md",
    )
    p.add_argument(
        "--steps", type=count, default=STEPS, help="training steps (default: %(default)s)"
    )
    p.add_argument(
        "--word",
        default="attention",
        help="the lower-case word the model reverses (default: %(default)s)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="keep the trained run here, to open with `attnlab explore DIR` (default: a "
        "temporary directory, removed at the end)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise ConfigError("--steps must be at least 1 (the demo trains a model)")
    task = make_task("reverse")  # what the preset trains on: the --word must be one of its strings
    if not 1 <= len(args.word) <= task.max_len or not set(args.word) <= set(task.alphabet):
        raise ConfigError(
            f"--word {args.word!r}: the reverser learns strings of 1-{task.max_len} characters "
            f"of {task.alphabet!r}; choose one such word, e.g. --word attention"
        )
    _equivariance()
    _model_size()
    if args.out:
        _reverser(args.steps, args.word, Path(args.out))
        print(f"the run is in {args.out}: `attnlab explore {args.out}` shows every layer and head")
        return 0
    with tempfile.TemporaryDirectory(prefix="attnlab-demo-") as tmp:
        _reverser(args.steps, args.word, Path(tmp) / "reverse")
    return 0


def _equivariance() -> None:
    """001: Y = softmax(X X^T) X permutes with its input rows."""
    torch.manual_seed(0)
    words = ["the", "oven", "cooked", "the", "bread", "so"]
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    x = torch.randn(len(vocab), 8)[torch.tensor([vocab[w] for w in words])]  # (T, D)
    y = basic_self_attention(x)
    perm = torch.tensor([0, 4, 2, 3, 1, 5])  # "the bread cooked the oven so"
    same = torch.allclose(basic_self_attention(x[perm]), y[perm], atol=1e-6)
    print(f"1. basic self-attention is permutation equivariant on {' '.join(words)!r}: {same}")


def _model_size() -> None:
    cfg = ModelConfig(kind="decoder_lm", vocab_size=5, d_model=32, n_heads=4)
    n = sum(p.numel() for p in build_model(cfg).parameters())
    defaults = ModelConfig().to_dict()
    given = ", ".join(f"{k}={v!r}" for k, v in cfg.to_dict().items() if v != defaults[k])
    print(f"2. a decoder-only LM of ModelConfig({given}) (every other field at its default) has "
          f"{n:,} parameters")  # fmt: skip


def _reverser(steps: int, word: str, out: Path) -> None:
    """Train the reverse preset for ``steps`` steps into ``out``, then look inside."""
    from attnlab import inspect
    from attnlab.generate import GenerationConfig, generate_seq2seq
    from attnlab.train import RunConfig, train
    from attnlab.train.presets import preset_tables

    tables = preset_tables("reverse")
    warmup = min(tables["train"]["warmup_steps"], max(1, steps // 3))
    tables["train"].update(steps=steps, eval_every=steps, save_every=steps, warmup_steps=warmup)
    print(f"3. training the reverse preset's encoder-decoder for {steps} steps into {out} ...")
    result = train(RunConfig.from_dict(tables, source="attnlab demo"), run_dir=out)
    model, tok = result.model.eval(), result.tokenizer
    if not isinstance(model, Seq2SeqModel):  # the preset's kind is encoder_decoder
        raise TypeError(f"the reverse preset trained a {type(model).__name__}")
    print(f"   held-out exact match {100 * result.metrics.get('val_exact_match', 0.0):.1f}%")
    src = torch.tensor([tok.encode(word)])  # (1, S)
    target = tok.encode(word[::-1])
    tgt_in = torch.tensor([[tok.bos_id, *target]])  # (1, T) shifted right
    tgt_out = torch.tensor([[*target, tok.eos_id]])  # (1, T)
    with torch.no_grad():
        _, cache = inspect.run_with_cache(model, src, tgt_in)
        last = config_of(model).n_layers - 1
        A = cache[f"blocks.{last}.cross_attn.A"][0]  # (H, T, S), 004 eq. 9
        print(f"4. source position each output step reads ({word!r}: S = {src.size(1)}; the "
              f"anti-diagonal reads S - 1 - t), argmax of A per head of layer {last}:")  # fmt: skip
        for h in range(A.size(0)):
            print(f"   cross head {h}: {A[h].argmax(-1).tolist()}")
        clean, effects = inspect.head_ablation_effects(
            model, src, tgt_in, targets=tgt_out, site="cross"
        )
    layer, head = divmod(int(effects.argmax()), effects.size(1))
    print(f"5. loss {clean:.4f}; the largest increase when one cross-attention head is zeroed: "
          f"{float(effects.max()):+.4f} (layer {layer}, head {head})")  # fmt: skip
    config = GenerationConfig(temperature=0.0, max_new_tokens=2 * len(word) + 2)
    fine = generate_seq2seq(model, [word], config, tokenizer=tok).texts or [""]
    with inspect.ablate_heads(model, [(layer, head)], site="cross"):
        broken = generate_seq2seq(model, [word], config, tokenizer=tok).texts or [""]
    print(f"   greedy output {fine[0]!r}; with that head ablated {broken[0]!r}")
