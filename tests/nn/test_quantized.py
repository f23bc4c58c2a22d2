"""Reduced-precision weights (``attnlab.nn.quantized``, ``attnlab.generate.weights``): each
product against fp32 within the documented bound, generation with every mode for every decoder-LM
kind (cache, left padding, window slide, compile), the CLI option, and bad input."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer
from attnlab.generate import GenerationConfig, generate, quantize_weights
from attnlab.generate.weights import bytes_per_token, supported_modes, weights_mode
from attnlab.models import build_model
from attnlab.nn.quantized import (
    BF16_UNIT,
    BF16Linear,
    Int4Linear,
    Int8Linear,
    QuantizedWeight,
    error_bound,
    int8_kernel_is_exact,
    unpack_int4,
)

LAYERS = {"int8": Int8Linear, "int4": Int4Linear, "bf16": BF16Linear}
MODES = ("bf16", "int8", "int4")
GREEDY = GenerationConfig(temperature=0, max_new_tokens=24)


def tiny(kind: str = "decoder_lm", positional: str = "learned", max_len: int = 64, **kw):
    torch.manual_seed(3)
    sizes = {"vocab_size": 40, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128, **kw}
    cfg = ModelConfig(kind=kind, max_len=max_len, positional=positional, **sizes)
    model = build_model(cfg).eval()
    with torch.no_grad():  # larger weights than the init, so greedy outputs vary
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.12 if kind == "rnn_lm" else 0.3)
    return model


def reduced(model, mode: str):
    return quantize_weights(copy.deepcopy(model), mode)


# --- the products ------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    n=st.integers(1, 70),
    k=st.sampled_from([32, 64, 96, 128, 192]),
    rows=st.integers(1, 9),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_each_product_is_within_the_documented_bound_of_fp32(mode, n, k, rows, bias, seed):
    """|x W^T + b - layer(x)| <= error_bound (the weights' rounding times |x|, plus bf16
    rounding of x and of the output), for any shape, 2-D or 3-D inputs, with or without bias."""
    gen = torch.Generator().manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen) * 0.1)
        if bias:
            linear.bias.copy_(torch.randn(n, generator=gen))
    layer = LAYERS[mode](linear)
    x = torch.randn(2, rows, k, generator=gen)  # (B, T, K)
    want = torch.nn.functional.linear(x.double(), linear.weight.double(),
                                      None if not bias else linear.bias.double())  # fmt: skip
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (2, rows, n)
    bound = error_bound(layer, x, linear.weight).double()
    assert ((got.double() - want).abs() <= bound * 1.0001 + 1e-6).all()


@pytest.mark.parametrize("k", [1, 4, 12, 17, 20, 36])
def test_int8_takes_any_input_width(k):
    """The int8 kernel reads inputs in steps of 16 (AVX-512) or 8 (AVX2; other widths gave
    garbage or crashed the process): codes and inputs are padded with zero columns, and the
    product stays within the bound."""
    torch.manual_seed(k)
    linear = nn.Linear(k, 16)
    layer = Int8Linear(linear)
    x = torch.randn(3, k)
    want = linear(x).double()
    got = layer(x)
    bound = error_bound(layer, x, linear.weight).double()
    assert got.shape == (3, 16) and ((got.double() - want).abs() <= bound * 1.0001 + 1e-6).all()
    assert layer.dequantize().shape == (16, k)


def test_a_kernel_with_a_wider_step_is_found_and_replaced(monkeypatch):
    """A kernel that reads K in steps of 32 (ignoring the last 16 columns of a width of 48)
    fails the probe, which warns; the layers then compute the product without it, within the
    same bound, at any width."""
    real = torch._weight_int8pack_mm

    def wider_step(x, codes, scale):
        k = x.size(1) // 32 * 32
        return real(x[:, :k].contiguous(), codes[:, :k].contiguous(), scale)

    int8_kernel_is_exact.cache_clear()
    monkeypatch.setattr(torch, "_weight_int8pack_mm", wider_step)
    try:
        with pytest.warns(RuntimeWarning, match="wrong products on this CPU"):
            assert not int8_kernel_is_exact()
        for k in (1, 17, 48, 100):
            torch.manual_seed(k)
            linear = nn.Linear(k, 20)
            layer = Int8Linear(linear)
            assert not layer.use_kernel
            x = torch.randn(2, 5, k)
            want = linear(x).double()
            bound = error_bound(layer, x, linear.weight).double()
            assert ((layer(x).double() - want).abs() <= bound * 1.0001 + 1e-6).all()
    finally:
        int8_kernel_is_exact.cache_clear()
    monkeypatch.undo()
    # this machine's own kernel: the layers use it exactly when the probe passes (on the AVX2
    # and AVX-512 hosts CI has run on, it does, padded to 16)
    assert Int8Linear(nn.Linear(4, 4)).use_kernel == int8_kernel_is_exact()


def test_the_weights_rounding_is_half_a_step():
    """int8: |W - W_hat| <= s_n / 2; int4: <= a / 2 per group; bf16: <= 2^-8 |W|."""
    torch.manual_seed(0)
    linear = nn.Linear(128, 48)
    w = linear.weight.detach()
    q8 = Int8Linear(linear)
    assert ((w - q8.dequantize()).abs() <= q8.scale.float()[:, None] / 2 * 1.0001).all()
    q4 = Int4Linear(linear)
    step = q4.scales_zeros[..., 0].float().T[:48].repeat_interleave(q4.group_size, dim=1)
    assert ((w - q4.dequantize()).abs() <= step / 2 * 1.0001).all()
    qb = BF16Linear(linear)
    assert ((w - qb.dequantize()).abs() <= BF16_UNIT * w.abs()).all()


# bfloat16_at_least rounds a scale up by at most (1 + 2^-7)(1 + 2^-8): a relative 1.2 %
SCALE_SLACK = (1 + 2**-7) * (1 + 2**-8)


def test_int8_scales_and_codes_are_the_docstrings_formulas():
    """An independent NumPy reference of s_n = max_k |W_nk| / 127 and q = round(W / s): the
    stored scale is s_n rounded up to bf16, every code is round(W / s) in [-127, 127], each row's
    largest weight uses (nearly) the full code range, and |W - W_hat| <= s_n / 2 from W alone."""
    gen = torch.Generator().manual_seed(1)
    linear = nn.Linear(96, 40)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 96, generator=gen) * torch.rand(40, 1, generator=gen))
    w = linear.weight.detach().double().numpy()  # (N, K)
    layer = Int8Linear(linear)
    s_ref = np.abs(w).max(axis=1) / 127  # (N,)
    s = layer.scale.float().double().numpy()
    assert (s >= s_ref).all() and (s <= s_ref * SCALE_SLACK).all()
    codes = layer.codes.numpy().astype(np.int64)
    np.testing.assert_array_equal(codes, np.clip(np.rint(w / s[:, None]), -127, 127))
    assert (np.abs(codes).max(axis=1) >= 125).all()  # a scale too large would waste the range
    w_hat = layer.dequantize().double().numpy()
    assert (np.abs(w - w_hat) <= s_ref[:, None] * SCALE_SLACK / 2 + 1e-12).all()


def test_int4_steps_offsets_and_codes_are_the_docstrings_formulas():
    """The same for int4, per group of G inputs: a = (hi - lo) / 15 rounded up to bf16,
    z = lo + 8 a in bf16, codes round((W - (z - 8 a)) / a) in [0, 15], and |W - W_hat| within
    a / 2 plus z's bf16 rounding, all from W alone."""
    gen = torch.Generator().manual_seed(2)
    linear = nn.Linear(128, 48)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 128, generator=gen) * 0.1 + 0.05)
    layer = Int4Linear(linear)
    g = layer.group_size
    w = linear.weight.detach().double().numpy().reshape(48, 128 // g, g)  # (N, K/G, G)
    lo, hi = w.min(axis=-1), w.max(axis=-1)  # (N, K/G)
    a_ref = (hi - lo) / 15
    stored = layer.scales_zeros.float().double().numpy().transpose(1, 0, 2)[:48]  # (N, K/G, 2)
    step, offset = stored[..., 0], stored[..., 1]  # a, z: (N, K/G) each
    assert (step >= a_ref).all() and (step <= a_ref * SCALE_SLACK).all()
    z_ref = lo + 8 * step
    assert (np.abs(offset - z_ref) <= 2**-8 * np.abs(z_ref) + 1e-12).all()
    codes = unpack_int4(layer.packed)[:48].numpy().reshape(48, 128 // g, g)
    want = np.clip(np.rint((w - (offset - 8 * step)[..., None]) / step[..., None]), 0, 15)
    np.testing.assert_array_equal(codes, want)
    w_hat = layer.dequantize().double().numpy().reshape(48, 128 // g, g)
    bound = a_ref * SCALE_SLACK / 2 + 2**-8 * (np.abs(lo) + 8 * a_ref * SCALE_SLACK)
    assert (np.abs(w - w_hat) <= bound[..., None] + 1e-12).all()


@pytest.mark.parametrize("n, k", [(64, 32), (128, 256), (192, 64)])
def test_unpack_int4_inverts_the_kernels_packing(n, k):
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32)
    assert torch.equal(unpack_int4(torch._convert_weight_to_int4pack_for_cpu(codes, 1)), codes)


def test_the_layer_keeps_the_linear_interface():
    linear = nn.Linear(64, 20)
    layer = Int8Linear(linear)
    assert (layer.in_features, layer.out_features) == (64, 20)
    assert isinstance(layer.weight, QuantizedWeight)
    assert layer.weight.dtype == torch.float32 and layer.weight.shape == (20, 64)
    assert layer.weight.device == torch.device("cpu")
    torch.testing.assert_close(layer.weight.dequantize(), linear.weight.detach(), atol=0.01, rtol=0)
    with pytest.raises(AttributeError, match=r"int8 weights.*dequantize\(\)"):
        _ = layer.weight.detach
    with pytest.raises(ValueError, match="width 64"):
        layer(torch.randn(3, 32))
    assert "weights=int8" in repr(layer)


# --- generation --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "kind, positional", [("decoder_lm", "learned"), ("decoder_lm", "rotary"), ("rnn_lm", "none")]
)
def test_generation_with_reduced_weights_is_cached_batched_and_compiled_consistently(
    kind, positional, mode
):
    """A reduced model decodes like any model: cached == uncached tokens, a left-padded batch ==
    each prompt alone, compile=True == eager; and its logits stay close to fp32's."""
    model = tiny(kind, positional)
    q = reduced(model, mode)
    assert weights_mode(q) == mode and weights_mode(model) == "fp32"
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    cached = generate(q, prompts, GREEDY, return_logits=True)
    uncached = generate(q, prompts, GREEDY.replace(use_cache=False))
    assert cached.tokens == uncached.tokens
    alone = [generate(q, [p], GREEDY).tokens[0] for p in prompts]
    assert cached.tokens == alone
    compiled = generate(q, prompts, GREEDY.replace(compile=True), return_logits=True)
    assert compiled.tokens == cached.tokens
    torch.testing.assert_close(torch.stack(compiled.logits), torch.stack(cached.logits),
                               atol=2e-2, rtol=2e-2)  # fmt: skip
    fp32 = generate(model, prompts, GREEDY, return_logits=True)
    first = fp32.logits[0]  # same prompts, so the first step's logits compare directly
    tol = {"bf16": 0.05, "int8": 0.1, "int4": 0.5}[mode] * first.abs().max()
    assert (cached.logits[0] - first).abs().max() < tol


def test_reduced_weights_slide_the_window_and_replay_the_compiled_step(replays):
    """Past the context window a left-padded batch still equals its prompts one at a time, and
    the compiled batch-1 step is replayed without dynamo on the engine (the layers' buffers are
    graph inputs)."""
    from attnlab.fast import accelerate

    q = accelerate(reduced(tiny(max_len=16), "int8"))
    prompts = [list(range(3, 15)), [5, 6, 7]]
    cfg = GREEDY.replace(max_new_tokens=40)
    batch = generate(q, prompts, cfg)
    assert batch.tokens == [generate(q, [p], cfg).tokens[0] for p in prompts]
    from attnlab.fast import accelerate

    accelerate(q)  # the replay is the engine's
    replays[0] = 0
    eager = generate(q, [[3, 4, 5]], GREEDY.replace(max_new_tokens=12))
    compiled = generate(q, [[3, 4, 5]], GREEDY.replace(max_new_tokens=12, compile=True))
    assert compiled.tokens == eager.tokens and replays[0] > 0


def test_an_imported_gpt2_takes_reduced_weights_with_its_tied_head():
    """from_transformers models too; the tied input embedding stays fp32, the head is reduced."""
    transformers = pytest.importorskip("transformers")
    from attnlab.interop import from_transformers

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=64, n_embd=64, n_layer=2, n_head=4)).eval()  # fmt: skip
    ours = from_transformers(hf).eval()
    q = reduced(ours, "int8")
    assert isinstance(q.lm_head, Int8Linear) and q.embed.tok_emb.weight.dtype == torch.float32
    want = generate(ours, [[1, 2, 3]], GREEDY).tokens
    assert generate(q, [[1, 2, 3]], GREEDY).tokens[0][:8] == want[0][:8]
    assert bytes_per_token(q, "int8") < bytes_per_token(ours, "fp32") / 3.9


# --- bad input ---------------------------------------------------------------------------------


def test_bad_modes_models_and_devices_name_what_is_supported():
    model = tiny()
    with pytest.raises(ValueError, match="unknown weights mode 'int3'; choose from fp32, bf16"):
        quantize_weights(model, "int3")
    with pytest.raises(TypeError, match="language models"):
        quantize_weights(build_model(ModelConfig(kind="encoder_decoder", vocab_size=20,
                                                 d_model=32, n_heads=2)), "int8")  # fmt: skip
    q = reduced(model, "int8")
    with pytest.raises(ValueError, match="already has int8 weights"):
        quantize_weights(q, "int4")
    with pytest.raises(ValueError, match="int4 weights need .* multiple of 32.*use int8"):
        quantize_weights(tiny(d_model=48, n_heads=4, d_ff=96), "int4")
    assert supported_modes("cpu") == ("fp32", "bf16", "int8", "int4")
    meta = copy.deepcopy(model).to("meta")
    with pytest.raises(ValueError, match="'int8' is not supported on meta; supported there: fp32"):
        quantize_weights(meta, "int8")
    with pytest.raises(ValueError, match="start from an fp32 model"):
        quantize_weights(copy.deepcopy(model).double(), "int8")


def test_bf16_on_a_cpu_that_emulates_it_warns_with_the_measured_cost(monkeypatch):
    from attnlab.generate import weights

    monkeypatch.setattr(weights, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match=r"emulates them; a 1 x 2048 x 2048 product took .* ms"):
        reduced(tiny(), "bf16")
    monkeypatch.setattr(weights, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reduced(tiny(), "bf16")


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_weights_option_generates_with_reduced_weights(tmp_path, capsys):
    from attnlab.checkpoint import save_checkpoint

    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    cfg = ModelConfig(kind="decoder_lm", vocab_size=tok.vocab_size, d_model=32, n_heads=4,
                      n_layers=1, d_ff=64, max_len=32)  # fmt: skip
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    save_checkpoint(tmp_path / "lm", model=model, config=cfg, tokenizer=tok, step=1)
    argv = ["generate", "--checkpoint", str(tmp_path / "lm"), "--prompt", "the ",
            "--temperature", "0", "--max-new-tokens", "8", "--no-stream"]  # fmt: skip
    assert main([*argv, "--weights", "int8"]) == 0
    out = capsys.readouterr().out
    want = generate(reduced(model, "int8"), "the ", GREEDY.replace(max_new_tokens=8), tokenizer=tok)
    assert out == "the " + want.texts[0] + "\n"
    assert main([*argv, "--weights", "int4"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*argv, "--weights", "int2"])
    assert "invalid choice: 'int2' (choose from 'fp32', 'bf16', 'int8', 'int4')" in (
        capsys.readouterr().err
    )


# --- the benchmark suites ----------------------------------------------------------------------


def test_decode_and_quality_suites_run_on_tiny_models():
    """``attnlab bench --suite decode,quality --tiny``: every contender and mode is reported, with
    the bytes each decode step reads and the perplexity change of each mode."""
    from attnlab.bench import BenchSettings, format_text, run_bench

    settings = BenchSettings.for_mode(tiny=True, suites=("decode", "quality"), threads=1,
                                      rounds=1, warmup=1)  # fmt: skip
    result = run_bench(settings)
    decode, quality = result["suites"]["decode"], result["suites"]["quality"]
    assert decode["status"] == "ok" and quality["status"] == "ok", (decode, quality)
    assert decode["bandwidth_bytes_per_s"] > 0
    row = decode["runs"][0]
    names = [c["name"] for c in row["contenders"]]
    assert names == ["fp32", "bf16", "int8", "int4", "int8_kvbf16", "int4_kvbf16", "hf_gpt2"]
    steps = {c["name"]: c["bytes_per_step"] for c in row["contenders"] if "bytes_per_step" in c}
    assert steps["fp32"] > steps["bf16"] > steps["int8"] > steps["int4"] > steps["int4_kvbf16"]
    assert steps["int8"] > steps["int8_kvbf16"] > steps["int4_kvbf16"]
    assert {(r["batch"], r["context"]) for r in decode["runs"]} == {(1, 8), (1, 16), (2, 8),
                                                                   (2, 16)}  # fmt: skip
    modes = quality["char_lm"]["modes"]
    cached = {"fp32_kvbf16", "int8_kvbf16", "int4_kvbf16"}
    assert set(modes) == {"fp32", "bf16", "int8", "int4"} | cached
    assert all(abs(modes[m]["perplexity_change"]) < 0.05 for m in ("bf16", "int8", "fp32_kvbf16"))
    assert set(quality["gpt2"]["modes"]) == {"bf16", "int8", "int4"} | cached
    ids = {t["id"] for t in result["targets"]}
    assert "quality_char_lm_int8_perplexity_change" in ids
    assert "quality_char_lm_int8_kvbf16_perplexity_change" in ids
    assert "decode_gpt2-124M_ctx8_int8_vs_hf" in ids
    assert "decode_gpt2-124M_ctx8_int4_kvbf16_vs_hf" in ids
    text = format_text(result)
    assert "### decode" in text and "of floor" in text and "top-1 agree" in text


# --- the explorer ------------------------------------------------------------------------------


def test_the_explorer_loads_a_language_model_with_reduced_weights(tmp_path):
    """``attnlab explore PATH --weights int8``: attention maps, the walkthrough, the next token
    and a continuation all work on the reduced model; a seq2seq model is refused by name."""
    pytest.importorskip("starlette")
    from attnlab.checkpoint import save_checkpoint
    from attnlab.cli import build_parser
    from attnlab.errors import ConfigError
    from attnlab.explore import LoadOptions, Session, load

    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    for kind in ("decoder_lm", "encoder_decoder"):
        cfg = ModelConfig(kind=kind, vocab_size=tok.vocab_size, d_model=32, n_heads=4,
                          n_layers=1, d_ff=64, max_len=32)  # fmt: skip
        save_checkpoint(tmp_path / kind, model=build_model(cfg), config=cfg, tokenizer=tok, step=1)
    loaded = load(tmp_path / "decoder_lm", LoadOptions(weights="int8"))
    assert weights_mode(loaded.model) == "int8"
    session = Session(loaded.model, loaded.tokenizer)
    assert session.attention("abc")["sites"]
    assert session.walkthrough("abc")["steps"]
    assert session.next_token("abc")
    events = list(session.continuation("abc", max_new_tokens=5))
    assert events[-1]["type"] == "done" and len(events[-1]["ids"]) == 5
    with pytest.raises(ConfigError, match="weights='int8': .*language models"):
        load(tmp_path / "encoder_decoder", LoadOptions(weights="int8"))
    args = build_parser().parse_args(["explore", "runs/x", "--weights", "int4"])
    assert args.weights == "int4"


@pytest.mark.parametrize("layer_cls", [Int8Linear, Int4Linear])
def test_gradients_reach_the_inputs_of_a_quantised_layer(layer_cls):
    """The packed kernels have no derivative; dL/dx = dL/dy W_hat (dequantised) stands in."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    q = layer_cls(linear)
    x = torch.randn(3, 5, 64, requires_grad=True)
    (q(x) ** 2).sum().backward()
    ref_x = x.detach().clone().requires_grad_(True)
    w_hat = q.dequantize().float()  # (N, K)
    ((ref_x @ w_hat.T + q.bias) ** 2).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert torch.allclose(x.grad, ref_x.grad, rtol=5e-2, atol=5e-2)  # bf16 products
    assert not any(t.requires_grad for t in q.buffers())  # the codes stay frozen
