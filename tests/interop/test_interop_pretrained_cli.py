"""Hugging Face directories used directly by the CLI (generate, evaluate, plot attention) and the
loader's errors for bad directories. Models and tokenizers are built here; nothing downloads."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch

from attnlab.cli import main
from attnlab.errors import CheckpointError, ConfigError
from attnlab.interop.hf_tokenizer import load_pretrained_tokenizer
from attnlab.interop.pretrained import load_pretrained
from hf_dirs import gpt2_dir, write_json

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return gpt2_dir(tmp_path_factory.mktemp("gpt2"), transformers)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_on_a_gpt2_directory_equals_transformers_greedy(gpt2, capsys):
    root, hf = gpt2
    tok = load_pretrained_tokenizer(root)
    prompt = "the quick brown"
    ids = torch.tensor([tok.encode(prompt)])
    want = hf.generate(
        ids,
        do_sample=False,
        max_new_tokens=12,
        min_new_tokens=12,
        pad_token_id=0,
        eos_token_id=None,
    )[0, ids.size(1) :]
    code, out, _ = run(
        capsys,
        "generate",
        "--checkpoint",
        str(root),
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-new-tokens",
        "12",
        "--no-stream",
    )
    assert code == 0
    new = want.tolist()
    if tok.eos_id in new:  # attnlab stops at the tokenizer's EOS; HF was told not to
        new = new[: new.index(tok.eos_id)]
    expected = prompt + tok.decode(new)
    assert out.rstrip("\n") == expected


def test_evaluate_text_file_perplexity_equals_transformers(gpt2, tmp_path, capsys):
    root, hf = gpt2
    text = "the quick brown fox jumps over the lazy dog. a cat sat on the mat. " * 12
    (tmp_path / "eval.txt").write_text(text)
    code, out, _ = run(
        capsys,
        "evaluate",
        "--checkpoint",
        str(root),
        "--text",
        str(tmp_path / "eval.txt"),
        "--json",
    )
    assert code == 0
    got = json.loads(out)
    ids = load_pretrained_tokenizer(root).encode(text)
    t = 64  # windows of max_len, stride max_len (attnlab.data.windows)
    losses = []
    with torch.no_grad():
        for s in range(0, len(ids) - t, t):
            x = torch.tensor([ids[s : s + t + 1]])
            logits = hf(x[:, :-1]).logits
            losses.append(torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="sum"))
    want = float(sum(losses)) / (len(losses) * t)
    loss_key = next(k for k in got if k.endswith("loss"))
    assert got[loss_key] == pytest.approx(want, rel=1e-4)
    ppl_key = next(k for k in got if k.endswith("ppl"))
    assert got[ppl_key] == pytest.approx(math.exp(want), rel=1e-3)


def test_plot_attention_on_a_gpt2_directory(gpt2, tmp_path, capsys):
    root, _ = gpt2
    code, out, _ = run(
        capsys,
        "plot",
        "attention",
        "--checkpoint",
        str(root),
        "--input",
        "the lazy dog",
        "--out",
        str(tmp_path / "plots"),
    )
    assert code == 0 and "wrote" in out
    assert any((tmp_path / "plots").glob("*.png"))


def test_unsupported_model_type_names_itself_and_the_supported_ones(tmp_path):
    write_json(tmp_path / "config.json", {"model_type": "t5", "d_model": 8})
    with pytest.raises(ConfigError, match=r"model_type='t5'.*gpt2.*llama.*mistral.*bert"):
        load_pretrained(tmp_path)


def test_missing_and_extra_weights_are_named(gpt2, tmp_path):
    from safetensors.torch import load_file, save_file

    root, _ = gpt2
    tensors = load_file(str(root / "model.safetensors"))
    (tmp_path / "config.json").write_text((root / "config.json").read_text())
    partial = {k: v for k, v in tensors.items() if "h.1.mlp.c_fc" not in k}
    save_file(partial, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing .*h\.1\.mlp\.c_fc"):
        load_pretrained(tmp_path)
    save_file(
        {**tensors, "transformer.h.9.attn.extra": torch.zeros(1)},
        str(tmp_path / "model.safetensors"),
    )
    with pytest.raises(CheckpointError, match=r"h\.9\.attn\.extra"):
        load_pretrained(tmp_path)


class Payload:  # pickling this needs code execution on load: weights_only refuses it
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_a_pickled_bin_file_is_refused_without_advice_to_unpickle(gpt2, tmp_path):
    root, _ = gpt2
    (tmp_path / "config.json").write_text((root / "config.json").read_text())
    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"x": Payload()}, f)
    with pytest.raises(CheckpointError) as err:
        load_pretrained(tmp_path)
    message = str(err.value)
    assert "only plain" in message and "model.safetensors" in message
    assert "weights_only=False" not in message and "weights_only" not in message.lower()
