"""The KV cache's dtype (``GenerationConfig(cache_dtype=...)``, ``--kv-cache``): the cache follows
the compute dtype by default; a bf16 cache decodes every Transformer decoder-LM kind (plain, rotary
with grouped-query heads, ALiBi, a sliding attention window, an imported GPT-2) with left padding
and window slides, compiled or not, within the documented tolerance of the fp32 cache; bad input
names the supported dtypes.

Tolerance (docs/generation.md, "KV cache dtype"): bf16 keeps 8 significant bits, so each cached
key and value is off by at most 2^-8 of itself; on these random models (|logits| <= ~4) the
logits of a bf16-cache step stay within 2% of their largest magnitude of the fp32 cache's, and
greedy tokens agree wherever fp32's top two logits are further apart than that.
"""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.generate import GenerationConfig, generate, quantize_weights
from attnlab.generate.weights import check_cache_dtype
from attnlab.models import build_model
from tiny_configs import small_config

GREEDY = GenerationConfig(temperature=0, max_new_tokens=16)
TOL = 0.02  # of the largest |logit|: see the module docstring
KINDS = {
    "gpt": {},
    "rotary_gqa": {"positional": "rotary", "n_kv_heads": 2},
    "alibi": {"positional": "alibi"},
    "window": {"attn_window": 6},
}


@pytest.fixture(autouse=True, scope="module")
def _forget_compiled_steps():
    """This module compiles the decode step of several model shapes; afterwards forget them, so
    the compile-count and replay checks of later modules in the same process see what they
    would alone (dynamo's recompile limit is per compiled function, shared by a model class)."""
    yield
    from attnlab.generate import steppers

    steppers._COMPILED.clear()
    torch._dynamo.reset()


def tiny(max_len: int = 64, **kw):
    torch.manual_seed(5)
    cfg = small_config("decoder_lm", 40, d_model=64, d_ff=128, max_len=max_len, **kw)
    return build_model(cfg).eval()


def close_logits(got, want) -> None:
    """Step logits of two runs along the same tokens, within TOL of their scale."""
    got, want = torch.stack(got), torch.stack(want)  # (N, R, V)
    assert (got - want).abs().max() <= TOL * want.abs().max()


def test_the_cache_follows_the_compute_dtype_unless_asked():
    model = tiny()
    assert model.new_cache(1, 8).layers[0].k.dtype == torch.float32
    assert model.new_cache(1, 8, dtype="bf16").layers[0].v.dtype == torch.bfloat16
    bf16_model = copy.deepcopy(model).to(torch.bfloat16)  # a bf16 model computes in bf16
    assert bf16_model.new_cache(1, 8).layers[0].k.dtype == torch.bfloat16
    # reduced-precision weights keep fp32 activations (attnlab.nn.quantized): fp32 cache
    for mode in ("bf16", "int8"):
        q = quantize_weights(copy.deepcopy(model), mode)
        assert q.new_cache(1, 8).layers[0].k.dtype == torch.float32
        assert q.new_cache(1, 8, dtype="bf16").layers[0].k.dtype == torch.bfloat16
    out = generate(bf16_model, [[3, 4, 5]], GREEDY)  # a bf16 model decodes with its bf16 cache
    assert len(out.tokens[0]) == GREEDY.max_new_tokens


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_bf16_cache_decodes_every_kind_like_the_fp32_cache(kind):
    """Left-padded batch == each prompt alone, cached bf16 logits close to fp32's; past the
    context window (max_len 12: slides) too; the compiled step on the engine agrees with eager."""
    from attnlab.fast import accelerate

    model = tiny(max_len=12 if kind == "gpt" else 64, **KINDS[kind])
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    cfg = GREEDY.replace(cache_dtype="bf16")
    fp32 = generate(model, prompts, GREEDY, return_logits=True)
    bf16 = generate(model, prompts, cfg, return_logits=True)
    assert bf16.tokens == [generate(model, [p], cfg).tokens[0] for p in prompts]
    # along fp32's tokens (teacher-forced through the same loop), the logits stay close
    assert bf16.tokens == fp32.tokens
    close_logits(bf16.logits, fp32.logits)
    fast = accelerate(copy.deepcopy(model))
    compiled = generate(fast, prompts[:1], cfg.replace(compile=True), return_logits=True)
    assert compiled.tokens[0] == bf16.tokens[0]
    close_logits(compiled.logits, generate(model, prompts[:1], cfg, return_logits=True).logits)


def test_an_imported_gpt2_and_reduced_weights_take_a_bf16_cache():
    transformers = pytest.importorskip("transformers")
    from attnlab.interop import from_transformers

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    ).eval()
    ours = from_transformers(hf).eval()
    int8 = quantize_weights(copy.deepcopy(ours), "int8")
    for model in (ours, int8):
        want = generate(model, [[1, 2, 3], [4]], GREEDY, return_logits=True)
        got = generate(
            model, [[1, 2, 3], [4]], GREEDY.replace(cache_dtype="bf16"), return_logits=True
        )
        assert got.tokens == want.tokens
        close_logits(got.logits, want.logits)


def test_the_engines_one_query_step_reads_the_cache_in_its_own_dtype():
    """Under compile a fast model's one-token step attends by reductions over the cache: equal
    to the plain kernel on every mask (padding, window), fp32 or bf16 cache, GQA and ALiBi."""
    from attnlab.fast.attention import one_query_attention
    from attnlab.nn.attention import scaled_dot_product_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 8, generator=gen)
    for kv_heads in (4, 2):
        k, v = torch.randn(2, 2, kv_heads, 9, 8, generator=gen).unbind(0)  # (B, H_kv, S, Dk)
        mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
        mask[0, ..., :3] = False  # left padding of row 0
        bias = -torch.rand(1, 4, 1, 9, generator=gen)
        for m, b in ((None, None), (mask, None), (mask, bias)):
            want = scaled_dot_product_attention(q, k, v, m, bias=b).out
            got = one_query_attention(q, k, v, m, 8**-0.5, b)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            half = one_query_attention(q, k.bfloat16(), v.bfloat16(), m, 8**-0.5, b)
            assert half.dtype == torch.float32
            torch.testing.assert_close(half, want, atol=3e-2, rtol=3e-2)


# --- bad input ---------------------------------------------------------------------------------


def test_unsupported_cache_dtypes_and_models_name_what_is_supported():
    with pytest.raises(
        ValueError, match=r"cache_dtype='int3' is not supported; choose from fp32, bf16"
    ):
        GenerationConfig(cache_dtype="int3")
    with pytest.raises(ValueError, match="no cache"):
        GenerationConfig(cache_dtype="bf16", use_cache=False)
    with pytest.raises(
        ValueError, match="unsupported KV cache dtype 'fp8'; choose from fp32, bf16"
    ):
        tiny().new_cache(1, 4, dtype="fp8")
    rnn = build_model(ModelConfig(kind="rnn_lm", vocab_size=20, d_model=16, n_layers=1))
    with pytest.raises(ValueError, match="rnn_lm keeps a hidden state, not a KV cache"):
        generate(rnn, [[1, 2]], GREEDY.replace(cache_dtype="bf16"))
    with pytest.raises(ValueError, match="keeps a hidden state"):
        check_cache_dtype(rnn, "bf16")
    check_cache_dtype(rnn, None)
    assert len(generate(rnn, [[1, 2]], GREEDY).tokens[0]) == GREEDY.max_new_tokens


def test_cli_kv_cache_option(tmp_path, capsys):
    from attnlab.cli import build_parser
    from attnlab.errors import ConfigError
    from saved_models import save

    save(tmp_path, "decoder_lm", "decoder_lm")
    save(tmp_path, "rnn_lm", "rnn_lm")
    argv = [
        "generate",
        "--checkpoint",
        str(tmp_path / "decoder_lm"),
        "--prompt",
        "the ",
        "--temperature",
        "0",
        "--max-new-tokens",
        "8",
        "--no-stream",
    ]
    assert main([*argv, "--kv-cache", "bf16", "--weights", "int8"]) == 0
    assert capsys.readouterr().out.startswith("the ")
    with pytest.raises(SystemExit):
        main([*argv, "--kv-cache", "int8"])
    assert "invalid choice: 'int8' (choose from 'fp32', 'bf16')" in capsys.readouterr().err
    rnn = ["generate", "--checkpoint", str(tmp_path / "rnn_lm"), "--prompt", "a", "--no-stream"]
    assert main([*rnn, "--kv-cache", "bf16"]) != 0
    assert "--kv-cache bf16: rnn_lm keeps a hidden state" in capsys.readouterr().err
    args = build_parser().parse_args(["explore", "runs/x", "--kv-cache", "bf16"])
    assert args.kv_cache == "bf16"
    pytest.importorskip("starlette")
    from attnlab.explore import LoadOptions, Session, load

    loaded = load(tmp_path / "decoder_lm", LoadOptions(weights="int8", kv_cache="bf16"))
    session = Session(loaded.model, loaded.tokenizer, cache_dtype="bf16")
    events = list(session.continuation("abc", max_new_tokens=4))
    assert events[-1]["type"] == "done" and len(events[-1]["ids"]) == 4
    with pytest.raises(ConfigError, match="kv_cache='bf16': .*hidden state"):
        load(tmp_path / "rnn_lm", LoadOptions(kv_cache="bf16"))
