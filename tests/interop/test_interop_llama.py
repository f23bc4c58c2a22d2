"""Llama-family parity with ``transformers`` on random-weight models built here (nothing is
downloaded): logits to 1e-5 in float32 with and without grouped-query attention, tied and untied
heads, scaled rotary frequencies, biases and Mistral's sliding window; greedy and beam
continuations of left-padded batches identical to ``generate``; export round trips; clear errors."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import CheckpointError, ConfigError
from attnlab.generate import GenerationConfig, generate
from attnlab.interop.llama import llama_config_to_model_config
from attnlab.interop.pretrained import from_hf_model, load_pretrained
from hf_dirs import SMALL_LLAMA, assert_export_round_trip, hf_causal_lm, llama_bpe, redraw

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
TOL = {"rtol": 1e-5, "atol": 1e-5}
CASES = {
    "mha": dict(num_key_value_heads=4),
    "gqa": dict(num_key_value_heads=2, rope_theta=500000.0),
    "mqa_tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "llama3_scaling": dict(num_key_value_heads=2, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "linear_scaling_biases": dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                  rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "head_dim": dict(num_key_value_heads=2, head_dim=16),
}  # fmt: skip


def hf_llama(case: str, cls=None, seed: int = 0, **extra):
    family = "Mistral" if cls == "mistral" else "Llama"
    hf = hf_causal_lm(family, {**SMALL_LLAMA, **CASES.get(case, {}), **extra}, seed)
    redraw(hf, bias_std=0.2)
    return hf


def left_padded(prompts: list[list[int]], pad: int = 0):
    longest = max(map(len, prompts))
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_transformers(case):
    hf = hf_llama(case)
    ours = from_hf_model(hf)
    assert ours.cfg.kv_heads == hf.config.num_key_value_heads
    ids = torch.randint(3, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, **TOL)
        # A left-padded batch: transformers' attention mask and positions vs attnlab's.
        pids, mask = left_padded([ids[0, :20].tolist(), ids[1, :11].tolist()])
        positions = (mask.cumsum(1) - 1).clamp_min(0)
        want = hf(pids, attention_mask=mask, position_ids=positions).logits
        got = ours(pids, key_padding_mask=mask.bool(), positions=positions).logits
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **TOL)


def test_mistral_sliding_window_equals_transformers_beyond_the_window():
    hf = hf_llama("gqa", cls="mistral", sliding_window=5)
    ours = from_hf_model(hf)
    assert ours.cfg.attn_window == 5
    ids = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, **TOL)
    cfg = GenerationConfig(temperature=0, max_new_tokens=16, stop_token_ids=())
    want = hf.generate(
        ids[:1, :12], do_sample=False, max_new_tokens=16, min_new_tokens=16, pad_token_id=0
    )[0, 12:].tolist()
    assert generate(ours, [ids[0, :12].tolist()], cfg).tokens[0] == want


PROMPTS = [[5, 17, 33, 8, 9, 10, 11], [44], [70, 71, 3, 60]]


@pytest.mark.parametrize("case", ["gqa", "mha"])
@pytest.mark.parametrize("beams", [1, 3])
def test_left_padded_greedy_and_beam_continuations_equal_generate(case, beams):
    hf = hf_llama(case)
    ours = from_hf_model(hf)
    ids, mask = left_padded(PROMPTS)
    out = hf.generate(ids, attention_mask=mask, do_sample=False, num_beams=beams,
                      max_new_tokens=12, min_new_tokens=12, pad_token_id=0, eos_token_id=None,
                      length_penalty=1.0, early_stopping=False)  # fmt: skip
    want = out[:, ids.size(1) :].tolist()
    cfg = GenerationConfig(
        temperature=0, num_beams=beams, max_new_tokens=12, stop_token_ids=(), length_penalty=1.0
    )
    got = generate(ours, PROMPTS, cfg).tokens
    assert got == want
    assert len({tuple(r) for r in want}) == 3


def test_export_round_trip_loads_in_transformers_with_equal_logits(tmp_path):
    hf = hf_llama("gqa")
    ids = torch.randint(3, 97, (1, 15), generator=torch.Generator().manual_seed(4))
    again = assert_export_round_trip(hf, tmp_path / "out", ids, rtol=0, atol=0)
    assert type(again) is transformers.LlamaForCausalLM


def test_a_saved_directory_with_its_tokenizer_generates_from_text(tmp_path):
    tok = llama_bpe()
    hf = hf_llama("gqa", vocab_size=tok.get_vocab_size())
    hf.save_pretrained(tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    found = load_pretrained(tmp_path)
    assert (found.model_type, found.config.kv_heads) == ("llama", 2)
    prompt = "the quick brown fox"
    ids = found.tokenizer.encode(prompt)
    assert ids[0] == found.tokenizer.bos_id == 1
    want = hf.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=8,
        min_new_tokens=8,
        pad_token_id=0,
        eos_token_id=None,
    )[0, len(ids) :].tolist()
    cfg = GenerationConfig(temperature=0, max_new_tokens=8, stop_token_ids=())
    assert generate(found.model, prompt, cfg, tokenizer=found.tokenizer).tokens[0] == want


def test_unsupported_llama_settings_are_listed_together():
    bad = {
        **SMALL_LLAMA,
        "model_type": "llama",
        "hidden_act": "gelu",
        "pretraining_tp": 2,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    }
    with pytest.raises(ConfigError) as err:
        llama_config_to_model_config(bad)
    message = str(err.value)
    assert "hidden_act='gelu'" in message and "pretraining_tp=2" in message
    assert "'yarn'" in message and "attnlab supports" in message


def test_missing_and_unexpected_llama_tensors_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = hf_llama("gqa")
    hf.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_pretrained(tmp_path)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(48, 32)
    tensors["model.layers.7.extra.weight"] = torch.zeros(1)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.7\.extra\.weight"):
        load_pretrained(tmp_path)


def test_evaluate_and_plot_a_llama_directory_from_the_command_line(tmp_path, capsys):
    import json

    from attnlab.cli import main

    tok = llama_bpe()
    hf = hf_llama("gqa", vocab_size=tok.get_vocab_size(), max_position_embeddings=32)
    hf.save_pretrained(tmp_path / "m")
    tok.save(str(tmp_path / "m" / "tokenizer.json"))
    (tmp_path / "m" / "tokenizer_config.json").write_text(
        '{"bos_token": "<s>", "eos_token": "</s>"}'
    )
    text = "the quick brown fox jumps over the lazy dog. a cat sat on the mat. " * 6
    (tmp_path / "t.txt").write_text(text)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "m"), "--text",
                 str(tmp_path / "t.txt"), "--json"]) == 0  # fmt: skip
    got = json.loads(capsys.readouterr().out)
    ids = load_pretrained(tmp_path / "m").tokenizer.encode(text)
    nll, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 32, 32):
            x = torch.tensor([ids[s : s + 33]])
            logits = hf(x[:, :-1]).logits[0]
            nll += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
            n += 32
    loss = next(v for k, v in got.items() if k.endswith("loss"))
    assert loss == pytest.approx(nll / n, rel=1e-4)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "m"), "--text",
                 str(tmp_path / "t.txt")]) == 0  # fmt: skip
    head = capsys.readouterr().out.splitlines()[0]  # no training step of its own to name
    assert head.endswith("(a Hugging Face model)") and "step" not in head
    assert main(["plot", "attention", "--checkpoint", str(tmp_path / "m"), "--input",
                 "the lazy dog", "--out", str(tmp_path / "plots")]) == 0  # fmt: skip
    assert (tmp_path / "plots" / "self_attention.png").is_file()


def test_an_attnlab_trained_llama_style_run_exports_to_transformers(tmp_path, capsys):
    """`attnlab export --format hf` of a GQA/SwiGLU/RMSNorm/rotary model with attnlab's BPE."""
    from attnlab.checkpoint import save_checkpoint
    from attnlab.cli import main
    from attnlab.config import ModelConfig
    from attnlab.data import BPETokenizer
    from attnlab.models import build_model

    tok = BPETokenizer.train(["the quick brown fox jumps over the lazy dog"] * 20, 280)
    cfg = ModelConfig(kind="decoder_lm", vocab_size=tok.vocab_size, d_model=32, n_heads=4,
                      n_kv_heads=2, n_layers=2, d_ff=48, max_len=32, positional="rotary",
                      norm="rmsnorm", ffn="swiglu", activation="silu", bias=False,
                      tie_embeddings=False, rope_base=5000.0)  # fmt: skip
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    save_checkpoint(tmp_path / "run", model=model, config=cfg, tokenizer=tok, step=1)
    assert main(["export", "--checkpoint", str(tmp_path / "run"), "--format", "hf",
                 "--out", str(tmp_path / "hf")]) == 0  # fmt: skip
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.num_key_value_heads == 2
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    ids = hf_tok("the lazy fox")["input_ids"]
    assert ids == tok.encode("the lazy fox")
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, **TOL)


def test_the_explorer_opens_a_llama_directory(tmp_path):
    from attnlab.explore.loading import load
    from attnlab.explore.session import Session

    tok = llama_bpe()
    hf = hf_llama("gqa", vocab_size=tok.get_vocab_size())
    hf.save_pretrained(tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load(tmp_path)
    assert loaded.model.cfg.kv_heads == 2
    got = Session(loaded.model, loaded.tokenizer, name=loaded.name).attention("the lazy dog")
    ids = torch.tensor([loaded.tokenizer.encode("the lazy dog")])
    with torch.no_grad():
        want = hf(ids, output_attentions=True).attentions
    for layer, w in zip(got["sites"]["decoder"]["layers"], want):
        torch.testing.assert_close(torch.tensor(layer), w[0], rtol=1e-4, atol=1e-5)
