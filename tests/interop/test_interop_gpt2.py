"""Hugging Face GPT-2 interop: parity with transformers' GPT2LMHeadModel, round trips, errors.

Every HF model here is built from a GPT2Config with random weights; nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.errors import CheckpointError, ConfigError
from attnlab.interop import (
    export_as,
    from_pretrained_dir,
    from_transformers,
    gpt2_config_to_model_config,
    load_gpt2_state_dict,
    load_safetensors,
    read_safetensors_config,
    read_safetensors_labels,
    read_safetensors_tokenizer,
    save_gpt2_dir,
    save_safetensors,
    to_gpt2_state_dict,
)
from attnlab.models import DecoderLM, build_model

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

TINY = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=101, n_positions=64)
NO_DROP = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)


def hf_gpt2(**overrides) -> transformers.GPT2LMHeadModel:
    cfg = transformers.GPT2Config(**{**TINY, **NO_DROP, **overrides})
    return transformers.GPT2LMHeadModel(cfg).eval()


def ours_gpt2(**overrides) -> DecoderLM:
    base = dict(
        kind="decoder_lm",
        vocab_size=101,
        d_model=64,
        n_heads=4,
        n_layers=2,
        max_len=64,
        activation="gelu_tanh",
        positional="learned",
    )
    return build_model(ModelConfig(**{**base, **overrides})).eval()


def logits(model, ids, **kw):
    with torch.no_grad():
        out = model(ids, **kw)
    return out.logits


def test_config_mapping_follows_gpt2_fields():
    cfg = gpt2_config_to_model_config(transformers.GPT2Config(**TINY, layer_norm_epsilon=1e-6))
    assert (cfg.kind, cfg.d_model, cfg.n_heads, cfg.n_layers) == ("decoder_lm", 64, 4, 2)
    assert (cfg.max_len, cfg.ff_dim, cfg.vocab_size, cfg.norm_eps) == (64, 256, 101, 1e-6)
    assert (cfg.activation, cfg.positional, cfg.norm_placement) == ("gelu_tanh", "learned", "pre")
    assert cfg.tie_embeddings and cfg.bias and cfg.final_norm
    assert gpt2_config_to_model_config({**TINY, "n_inner": 100}).ff_dim == 100


def test_logits_match_transformers_on_random_ids():
    hf = hf_gpt2()
    ours = from_transformers(hf)
    ids = torch.randint(0, 101, (3, 40))
    torch.testing.assert_close(logits(ours, ids), logits(hf, ids), atol=1e-5, rtol=1e-5)


def test_logits_match_with_left_padding_mask_and_positions():
    hf = hf_gpt2()
    ours = from_transformers(hf)
    ids = torch.randint(0, 101, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[0, :5] = False
    mask[1, :1] = False
    pos = (mask.long().cumsum(1) - 1).clamp_min(0)  # real tokens start at position 0
    ref = logits(hf, ids, attention_mask=mask.long(), position_ids=pos)
    got = logits(ours, ids, key_padding_mask=mask, positions=pos)
    torch.testing.assert_close(got[mask], ref[mask], atol=1e-5, rtol=1e-5)


def test_untied_head_and_other_activation_match():
    hf = hf_gpt2(tie_word_embeddings=False, activation_function="relu", n_inner=96)
    ours = from_transformers(hf)
    assert not ours.cfg.tie_embeddings and ours.lm_head.weight is not ours.embed.tok_emb.weight
    ids = torch.randint(0, 101, (2, 12))
    torch.testing.assert_close(logits(ours, ids), logits(hf, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"bias": False, "tie_embeddings": False}])
def test_export_loads_in_transformers_with_same_logits(tmp_path, overrides):
    ours = ours_gpt2(**overrides)
    with torch.no_grad():  # non-trivial norms and biases, so the mapping of each is exercised
        for name, p in ours.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    save_gpt2_dir(ours, tmp_path, bos_id=1, eos_id=2, pad_id=0)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert hf.config.n_embd == 64 and hf.config.pad_token_id == 0
    ids = torch.randint(0, 101, (2, 30))
    torch.testing.assert_close(logits(hf, ids), logits(ours, ids), atol=1e-5, rtol=1e-5)
    back = from_pretrained_dir(tmp_path)  # and back again, bit for bit
    torch.testing.assert_close(logits(back, ids), logits(ours, ids), atol=0, rtol=0)


def test_state_dict_round_trip_is_exact():
    ours = ours_gpt2()
    sd = to_gpt2_state_dict(ours)
    assert sd["transformer.h.0.attn.c_attn.weight"].shape == (64, 192)  # Conv1D (in, out)
    hf = hf_gpt2()
    hf.load_state_dict(sd)
    again = load_gpt2_state_dict(None, hf.state_dict(), hf.config)
    for (k, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_from_pretrained_dir_reads_save_pretrained_and_pytorch_bin(tmp_path):
    hf = hf_gpt2()
    hf.save_pretrained(tmp_path / "st")
    ids = torch.randint(0, 101, (2, 10))
    ref = logits(hf, ids)
    torch.testing.assert_close(logits(from_pretrained_dir(tmp_path / "st"), ids), ref)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "config.json").write_text(hf.config.to_json_string())
    sd = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}  # GPT2Model keys
    sd["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))  # old checkpoints store the mask
    torch.save(sd, bin_dir / "pytorch_model.bin")
    torch.testing.assert_close(logits(from_pretrained_dir(bin_dir), ids), ref)
    hf.save_pretrained(tmp_path / "shards", max_shard_size="100KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    torch.testing.assert_close(logits(from_pretrained_dir(tmp_path / "shards"), ids), ref)
    next((tmp_path / "shards").glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="shard 'model-00002-.*' listed in .* is missing"):
        from_pretrained_dir(tmp_path / "shards")


def test_directory_errors_name_the_problem(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory.*never downloads"):
        from_pretrained_dir(tmp_path / "gpt2")
    with pytest.raises(CheckpointError, match="config.json"):
        from_pretrained_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="no weights.*model.safetensors"):
        from_pretrained_dir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00garbage!")
    with pytest.raises(CheckpointError, match="cannot read"):
        from_pretrained_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        from_pretrained_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(ConfigError, match="'bert' model, not GPT-2"):
        from_pretrained_dir(tmp_path)


def test_config_errors():
    with pytest.raises(ConfigError, match="missing.*n_head"):
        gpt2_config_to_model_config({"vocab_size": 10, "n_positions": 8, "n_embd": 8, "n_layer": 1})
    with pytest.raises(ConfigError, match="activation_function='silu'"):
        gpt2_config_to_model_config({**TINY, "activation_function": "silu"})
    with pytest.raises(ConfigError, match="scale_attn_by_inverse_layer_idx"):
        gpt2_config_to_model_config({**TINY, "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(ConfigError, match="divisible"):
        gpt2_config_to_model_config({**TINY, "n_head": 5})
    with pytest.raises(TypeError, match="GPT2Config or a dict"):
        gpt2_config_to_model_config(42)


def test_weight_errors_name_the_key():
    hf = hf_gpt2()
    sd = dict(hf.state_dict())
    bad = {**sd, "transformer.h.1.mlp.c_fc.weight": torch.zeros(64, 100)}
    with pytest.raises(CheckpointError, match=r"h\.1\.mlp\.c_fc\.weight: the file has \(64, 100\)"):
        load_gpt2_state_dict(None, bad, hf.config)
    missing = {k: v for k, v in sd.items() if "h.1." not in k}
    with pytest.raises(CheckpointError, match="missing 12 tensor"):
        load_gpt2_state_dict(None, missing, hf.config)
    with pytest.raises(CheckpointError, match="does not know.*h.1"):
        load_gpt2_state_dict(None, sd, {**TINY, "n_layer": 1})
    untied = {**sd, "lm_head.weight": torch.randn(101, 64)}
    with pytest.raises(CheckpointError, match="tie_word_embeddings to false"):
        load_gpt2_state_dict(None, untied, hf.config)
    headless = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match="no lm_head.weight"):
        load_gpt2_state_dict(None, headless, {**TINY, "tie_word_embeddings": False})
    with pytest.raises(TypeError, match="DecoderLM"):
        load_gpt2_state_dict(torch.nn.Linear(2, 2), sd)


def test_incompatible_models_refuse_gpt2_export(tmp_path):
    with pytest.raises(ConfigError, match="positional='rotary'.*norm_placement='post'"):
        save_gpt2_dir(ours_gpt2(positional="rotary", norm_placement="post"), tmp_path)
    seq2seq = build_model(ModelConfig(kind="encoder_decoder", vocab_size=20, d_model=16))
    with pytest.raises(ConfigError, match="decoder-only.*fmt='safetensors'"):
        export_as(seq2seq, "hf-gpt2", tmp_path)
    with pytest.raises(ConfigError, match="unknown export format"):
        export_as(seq2seq, "onnx", tmp_path)
    (tmp_path / "config.json").write_text('{"format": "attnlab-checkpoint"}')
    with pytest.raises(CheckpointError, match="not a GPT-2 config"):
        save_gpt2_dir(ours_gpt2(), tmp_path)  # an attnlab checkpoint is never overwritten


def test_plain_safetensors_round_trip_with_tokenizer(tmp_path):
    from attnlab.data import CharTokenizer, LabelSet, load_tokenizer

    tok = CharTokenizer("abc ")
    cfg = ModelConfig(kind="encoder_decoder", vocab_size=tok.vocab_size, d_model=16, n_heads=2)
    model = build_model(cfg).eval()
    path = export_as(model, "safetensors", tmp_path / "m.safetensors", tokenizer=tok)
    assert read_safetensors_config(path) == cfg
    assert load_tokenizer(read_safetensors_tokenizer(path)).encode("cab") == tok.encode("cab")
    back = load_safetensors(path)
    for (k, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), k
    assert back.lm_head.weight is back.tgt_embed.tok_emb.weight  # tying survives
    assert read_safetensors_labels(path) is None
    labels = LabelSet(["neg", "pos"])
    clf_cfg = cfg.replace(kind="classifier", n_classes=2)
    clf = build_model(clf_cfg)
    clf_path = tmp_path / "clf.safetensors"
    export_as(clf, "safetensors", clf_path, config=clf_cfg, tokenizer=tok, labels=labels)
    assert LabelSet.from_dict(read_safetensors_labels(clf_path)).names == labels.names
    assert isinstance(load_safetensors(clf_path), type(clf))
    save_safetensors(clf, tmp_path / "clf2.safetensors")  # the config comes from clf.cfg
    assert isinstance(load_safetensors(tmp_path / "clf2.safetensors"), type(clf))
    other = build_model(cfg.replace(d_model=32, n_heads=2))
    with pytest.raises(CheckpointError, match="does not fit this model"):
        load_safetensors(path, other)
    plain = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, plain)
    with pytest.raises(CheckpointError, match="no attnlab config"):
        load_safetensors(plain)
    with pytest.raises(TypeError, match="pass config="):
        save_safetensors(torch.nn.Linear(2, 2), tmp_path / "lin.safetensors")


def test_bpe_tokenizer_exports_for_auto_tokenizer(tmp_path):
    from attnlab.data import BPETokenizer

    text = ["the cat sat on the mat. " * 20, "a dog and a cat and the hat. " * 20]
    tok = BPETokenizer.train(text, vocab_size=300)
    model = ours_gpt2(vocab_size=tok.vocab_size)
    out = export_as(model, "hf-gpt2", tmp_path / "export", tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok("the cat sat")["input_ids"] == tok.encode("the cat sat")
    assert hf_tok.pad_token_id == 0 and hf_tok.eos_token_id == 2
    assert (out / "attnlab_tokenizer.json").is_file()


def test_export_cli_from_a_training_checkpoint(tmp_path, capsys):
    from attnlab.checkpoint import save_checkpoint
    from attnlab.data import CharTokenizer

    tok = CharTokenizer("abcdefgh ")
    model = ours_gpt2(vocab_size=tok.vocab_size)
    save_checkpoint(tmp_path / "run", model=model, config=model.cfg, tokenizer=tok, step=3)
    out = tmp_path / "hf"
    args = ["export", "--checkpoint", str(tmp_path / "run"), "--out"]
    assert main([*args, str(out), "--format", "hf-gpt2"]) == 0
    assert "as hf-gpt2 to" in capsys.readouterr().out
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    assert (hf.config.bos_token_id, hf.config.eos_token_id) == (tok.bos_id, tok.eos_id)
    ids = torch.tensor([tok.encode("a bad egg")])
    torch.testing.assert_close(logits(hf, ids), logits(model, ids), atol=1e-5, rtol=1e-5)
    assert json.loads((out / "attnlab_tokenizer.json").read_text())["type"] == "char"
    assert main([*args, str(tmp_path / "m.safetensors"), "--format", "safetensors"]) == 0
    torch.testing.assert_close(
        logits(load_safetensors(tmp_path / "m.safetensors"), ids),
        logits(model, ids),
        atol=0,
        rtol=0,
    )
    sinus = ours_gpt2(vocab_size=tok.vocab_size, positional="sinusoidal")
    save_checkpoint(tmp_path / "sin", model=sinus, config=sinus.cfg, tokenizer=tok, step=1)
    fresh = tmp_path / "hf_sin"
    for fmt in ("hf", "hf-gpt2"):  # no family holds sinusoids: refused, nothing written
        assert main(["export", "--checkpoint", str(tmp_path / "sin"), "--out", str(fresh),
                     "--format", fmt]) == 2  # fmt: skip
        err = " ".join(capsys.readouterr().err.split())  # the CLI wraps messages at 100 columns
        assert "positional='sinusoidal' (GPT-2 needs 'learned')" in err and not fresh.exists()
    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "missing" in capsys.readouterr().err


def test_the_export_command_writes_the_models_own_family_by_default(tmp_path, capsys):
    """Without --format, a run exports to the Hugging Face family that holds it (a Llama here,
    which hf-gpt2 would refuse)."""
    from attnlab.checkpoint import save_checkpoint
    from attnlab.data import CharTokenizer

    tok = CharTokenizer("abcdefgh ")
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, max_len=16,
                      positional="rotary", norm="rmsnorm", ffn="swiglu", activation="silu",
                      bias=False, n_kv_heads=1)  # fmt: skip
    model = build_model(cfg).eval()
    save_checkpoint(tmp_path / "run", model=model, config=cfg, tokenizer=tok, step=1)
    out = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert "as hf to" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([tok.encode("a bad egg")])
    torch.testing.assert_close(logits(hf, ids), logits(model, ids), atol=1e-5, rtol=1e-5)
