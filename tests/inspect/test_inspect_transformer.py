"""attnlab.inspect on every Transformer kind: the cached quantities against attnlab.reference
(NumPy loops, float64), ablation == W^O columns zeroed, activation patching, clean removal,
gradients, generation with a head ablated, HF GPT-2 imports and saved checkpoints."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch

import attnlab
from attnlab import inspect
from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.generate import GenerationConfig
from attnlab.models.build import build_model
from attnlab.nn.multihead import CrossAttention

V, D, H = 11, 8, 2


def _model(kind="decoder_lm", **changes):
    cfg = dict(kind=kind, vocab_size=V, d_model=D, n_heads=H, n_layers=2, max_len=16, d_ff=16)
    if kind == "classifier":
        cfg["n_classes"] = 3
    if kind == "encoder_decoder":
        cfg["tgt_vocab_size"] = 7
    torch.manual_seed(0)
    return build_model(ModelConfig(**{**cfg, **changes})).eval().double()


def _inputs(kind: str, b: int = 2, t: int = 6):
    """(args, kwargs, key padding mask of the self-attended source or None)."""
    ids = torch.randint(0, V, (b, t))
    if kind == "decoder_lm":
        return (ids,), {}, None
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 4:] = False
    if kind == "encoder_decoder":
        return (ids, torch.randint(0, 7, (b, 5))), dict(src_mask=mask), mask
    return (ids,), dict(key_padding_mask=mask), mask


def _np(t):
    return t.detach().numpy()


def _record_inputs(model):
    """Forward pre-hooks that keep each attention module's call: {module: (args, kwargs)}."""
    seen, handles = {}, []
    for layer in _all_layers(model):
        hook = lambda m, a, k, path=layer.path: seen.__setitem__(path, (a, k))  # noqa: E731
        handles.append(layer.module.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles


def _all_layers(model):
    layers = []
    for site in ("self", "cross"):
        try:
            parts = [None]
            if any(n.startswith("encoder.") for n in inspect.activation_names(model)) and any(
                n.startswith("blocks.") for n in inspect.activation_names(model)
            ):
                parts = ["encoder", "decoder"] if site == "self" else [None]
            for part in parts:
                layers += inspect.attention_layers(model, site, part)
        except inspect.InspectError:
            pass
    return layers


def _split(weight, bias, n_heads, widths):
    """A fused torch Linear (out, in) -> per block of ``widths``: per-head (in, d) W and b."""
    W, b = _np(weight).T, _np(bias)
    out, start = [], 0
    for w in widths:
        out.append(
            (
                ref.split_heads_weights(W[:, start : start + w], n_heads),
                ref.split_heads_weights(b[start : start + w], n_heads),
            )
        )
        start += w
    return out


KINDS = [
    ("decoder_lm", {}),
    ("decoder_lm", dict(positional="rotary")),
    ("decoder_lm", dict(positional="sinusoidal", norm_placement="post", norm="rmsnorm")),
    ("decoder_lm", dict(positional="concat")),
    ("encoder", {}),
    ("classifier", dict(pooling="cls")),
    ("encoder_decoder", {}),
]


@pytest.mark.parametrize(("kind", "changes"), KINDS, ids=lambda v: str(v))
def test_cached_attention_quantities_match_the_reference(kind, changes):
    model = _model(kind, **changes)
    args, kwargs, pad = _inputs(kind)
    seen, handles = _record_inputs(model)
    try:
        _, cache = inspect.run_with_cache(model, *args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    layers = _all_layers(model)
    assert layers and len(seen) == len(layers)
    for layer in layers:
        attn, p = layer.module, layer.path
        call_args, call_kwargs = seen[p]
        x = _np(call_args[0])  # (B, T, D) the attention's input
        cross = isinstance(attn, CrossAttention)
        dk, dv = attn.d_head, attn.d_v
        if cross:
            ((Wq, bq),) = _split(attn.q_proj.weight, attn.q_proj.bias, H, [H * dk])
            (Wk, bk), (Wv, bv) = _split(attn.kv_proj.weight, attn.kv_proj.bias, H, [H * dk, H * dv])
            memory = _np(call_args[1] if len(call_args) > 1 else call_kwargs["memory"])
        else:
            (Wq, bq), (Wk, bk), (Wv, bv) = _split(
                attn.qkv_proj.weight, attn.qkv_proj.bias, H, [H * dk, H * dk, H * dv]
            )
            memory = x
        in_encoder = p.startswith(("encoder", "stack")) or kind in ("encoder", "classifier")
        causal = not cross and not in_encoder  # decoder self-attention
        key_pad = pad if (cross or in_encoder) else None  # the source's padding
        t, s = x.shape[1], memory.shape[1]
        for b in range(x.shape[0]):
            allowed = ref.causal_mask(t, s) if causal else np.ones((t, s), dtype=bool)
            if key_pad is not None:
                allowed = allowed & _np(key_pad[b])[None, :]
            got_mask = _np(cache[f"{p}.mask"][b].expand(H, t, s))
            assert (got_mask == allowed[None]).all()
            for h in range(H):
                q = x[b] @ Wq[h] + bq[h]  # (T, Dk) 004 eq. 10 for head h
                k = memory[b] @ Wk[h] + bk[h]  # (S, Dk) eq. 11
                v = memory[b] @ Wv[h] + bv[h]  # (S, Dv) eq. 12
                for name, want in (("Q", q), ("K", k), ("V", v)):
                    np.testing.assert_allclose(_np(cache[f"{p}.{name}"][b, h]), want, atol=1e-12)
                if getattr(attn, "rotates", False):
                    pos = np.arange(t)
                    q = ref.rotary(q, pos, attn.pos_enc.base)
                    k = ref.rotary(k, pos, attn.pos_enc.base)
                    np.testing.assert_allclose(_np(cache[f"{p}.Q_rot"][b, h]), q, atol=1e-12)
                    np.testing.assert_allclose(_np(cache[f"{p}.K_rot"][b, h]), k, atol=1e-12)
                scores = np.array([[ref._dot(q[i], k[j]) for j in range(s)] for i in range(t)])
                np.testing.assert_allclose(_np(cache[f"{p}.scores"][b, h]), scores, atol=1e-12)
                np.testing.assert_allclose(
                    _np(cache[f"{p}.scaled"][b, h]), scores / np.sqrt(dk), atol=1e-12
                )
                heads, A = ref.attention(q, k, v, mask=allowed)  # eq. 9
                np.testing.assert_allclose(_np(cache[f"{p}.A"][b, h]), A, atol=1e-12)
                np.testing.assert_allclose(_np(cache[f"{p}.heads"][b, h]), heads, atol=1e-12)
            concat = _np(cache[f"{p}.concat"][b])
            np.testing.assert_allclose(
                concat, np.concatenate([_np(cache[f"{p}.heads"][b, h]) for h in range(H)], -1)
            )
            if not getattr(attn, "rotates", False):  # the reference MHA has no rotary
                Wo, bo = _np(attn.out_proj.weight).T, _np(attn.out_proj.bias)
                want = ref.multi_head_attention(
                    x[b],
                    None if not cross else memory[b],
                    Wq,
                    Wk,
                    Wv,
                    Wo,
                    bq,
                    bk,
                    bv,
                    bo,
                    mask=allowed,
                )
                np.testing.assert_allclose(_np(cache[f"{p}.out"][b]), want.out, atol=1e-12)


def _zero_wo_columns(model, path, heads):
    """A copy of ``model`` with head h's Dv columns of W^O zeroed at ``path`` (004 eq. 13)."""
    clone = copy.deepcopy(model)
    attn = clone.get_submodule(path)
    with torch.no_grad():
        for h in heads:
            attn.out_proj.weight[:, h * attn.d_v : (h + 1) * attn.d_v] = 0.0
    return clone


@pytest.mark.parametrize(
    ("kind", "site", "part"),
    [
        ("decoder_lm", "self", None),
        ("classifier", "self", None),
        ("encoder_decoder", "self", "encoder"),
        ("encoder_decoder", "self", "decoder"),
        ("encoder_decoder", "cross", None),
    ],
)
def test_ablating_a_head_equals_zeroing_its_columns_of_w_o(kind, site, part):
    model = _model(kind)
    args, kwargs, _ = _inputs(kind)
    layer = inspect.attention_layers(model, site, part)[1]
    with inspect.ablate_heads(model, [(1, 0)], site=site, part=part):
        ablated = model(*args, **kwargs).logits
    want = _zero_wo_columns(model, layer.path, [0])(*args, **kwargs).logits
    torch.testing.assert_close(ablated, want, rtol=0, atol=1e-10)
    assert not torch.allclose(ablated, model(*args, **kwargs).logits)

    # Mean ablation = the columns zeroed and the head's mean output moved into the bias.
    _, reference = inspect.run_with_cache(model, *args, names="*.heads", **kwargs)
    with inspect.ablate_heads(model, [(1, 0)], mode="mean", site=site, part=part, means=reference):
        ablated = model(*args, **kwargs).logits
    clone = _zero_wo_columns(model, layer.path, [0])
    attn = clone.get_submodule(layer.path)
    mean = reference[f"{layer.path}.heads"][:, 0].mean(dim=(0, 1))  # (Dv,)
    with torch.no_grad():
        attn.out_proj.bias += model.get_submodule(layer.path).out_proj.weight[:, : attn.d_v] @ mean
    torch.testing.assert_close(ablated, clone(*args, **kwargs).logits, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", ["decoder_lm", "encoder", "encoder_decoder"])
def test_patching_a_whole_layer_from_input_b_gives_b_from_that_layer_on(kind):
    model = _model(kind)
    args_a, kwargs, _ = _inputs(kind)
    args_b = (torch.randint(0, V, args_a[0].shape),) + args_a[1:]
    prefix = "encoder.stack.blocks.1." if kind == "encoder_decoder" else None
    prefix = prefix or ("stack.blocks.1." if kind == "encoder" else "blocks.1.")
    # B's run with layer 1 cached (so on the explicit path, as the patched run will be)
    out_b, cache_b = inspect.run_with_cache(model, *args_b, names=prefix + "*", **kwargs)
    want = out_b[0]  # logits, or the encoder's hidden states
    assert not torch.equal(model(*args_a, **kwargs)[0], want)
    with inspect.patch(model, cache_b):
        assert torch.equal(model(*args_a, **kwargs)[0], want)
    # The end of the chain alone does it too: layer 1's output from B, layer 0 from A.
    with inspect.patch(model, cache_b, prefix + "resid_post"):
        assert torch.equal(model(*args_a, **kwargs)[0], want)


def test_caching_is_bit_identical_on_the_same_path_and_hooks_leave_no_trace():
    model = _model().float()
    ids = torch.randint(0, V, (2, 7))
    plain = model(ids).logits
    explicit = model(ids, need_weights=True).logits
    out, _ = inspect.run_with_cache(model, ids, names=["*resid*", "*.Q", "*.out", "final"])
    assert torch.equal(out.logits, plain)  # no inner point: the fused path, untouched
    out, cache = inspect.run_with_cache(model, ids)  # every point: the explicit path
    assert torch.equal(out.logits, explicit)
    torch.testing.assert_close(model.lm_head(cache["final"]), plain)
    boom = pytest.raises(RuntimeError, match="boom")
    with boom, inspect.ablate_heads(model, [(0, 1)]), inspect.capture(model, "*.A"):
        model(ids)
        raise RuntimeError("boom")
    bad = {"blocks.0.self_attn.A": torch.zeros(2, 2, 7, 6)}
    with pytest.raises(inspect.InspectError, match="shape"), inspect.intervene(model, bad):
        model(ids)
    assert all(not p._forward_hooks for p in inspect.hook_points(model).values())
    assert torch.equal(model(ids).logits, plain)
    assert torch.equal(model(ids, need_weights=True).logits, explicit)


def test_gradients_with_respect_to_activations_and_no_grad():
    model = _model()
    ids = torch.randint(0, V, (2, 6))
    out, cache = inspect.run_with_cache(model, ids, detach=False)
    loss = out.logits.logsumexp(-1).mean()
    grads = torch.autograd.grad(loss, [cache["blocks.0.self_attn.A"], cache["embed.P"]])
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    with torch.no_grad():
        out, cache = inspect.run_with_cache(model, ids)
        with inspect.ablate_heads(model, [(0, 0)]):
            ablated = model(ids).logits
    assert not out.logits.requires_grad and not ablated.requires_grad
    # a gradient through an ablation reaches the weights of the other heads only
    with inspect.ablate_heads(model, [(1, 0)]):
        model(ids).logits.sum().backward()
    w_o = model.blocks[1].self_attn.out_proj.weight.grad
    dv = model.blocks[1].self_attn.d_v
    assert torch.all(w_o[:, :dv] == 0) and w_o[:, dv:].abs().sum() > 0


def test_generation_with_a_head_ablated_matches_the_zeroed_model():
    model = _model().float()
    config = GenerationConfig(max_new_tokens=6, temperature=0.0, stop_token_ids=(), bos_token_id=0)
    prompts = [[1, 2, 3], [4, 5]]
    with inspect.ablate_heads(model, [(0, 1), (1, 0)]):
        got = attnlab.generate(model, prompts, config, return_logits=True)
    zeroed = _zero_wo_columns(model, "blocks.0.self_attn", [1])
    zeroed = _zero_wo_columns(zeroed, "blocks.1.self_attn", [0])
    want = attnlab.generate(zeroed, prompts, config, return_logits=True)
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with inspect.capture(model, "blocks.0.self_attn.A") as cache:
        attnlab.generate(model, prompts, config)
    steps = cache.calls("blocks.0.self_attn.A")
    assert steps[0].shape[2] == 3 and all(a.shape[2] == 1 for a in steps[1:])


def test_position_signal_can_be_scaled_replaced_and_is_absent_for_rotary():
    model = _model()
    ids = torch.randint(0, V, (2, 6))
    with inspect.scale_positions(model, 0.0):
        no_p = model(ids).logits
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.embed.pos_enc.table.weight.zero_()
    torch.testing.assert_close(no_p, clone(ids).logits, rtol=0, atol=0)
    _, cache = inspect.run_with_cache(model, ids, names="embed.P")
    shuffled = cache["embed.P"].flip(0)  # (T, D): P of the positions in reverse order
    with inspect.replace_positions(model, shuffled):
        _, patched = inspect.run_with_cache(model, ids, names="embed.*")
    torch.testing.assert_close(patched["embed.embed"], patched["embed.X"] + shuffled)
    with pytest.raises(inspect.InspectError, match="rotary.*Q_rot"):
        inspect.position_names(_model(positional="rotary"))
    with pytest.raises(inspect.InspectError, match="alibi positions are a bias.*scaled"):
        inspect.position_names(_model(positional="alibi"))
    assert "blocks.0.self_attn.Q_rot" not in inspect.activation_names(model)


def test_bad_requests_name_the_fix():
    model = _model("encoder_decoder")
    with pytest.raises(inspect.InspectError, match="part='encoder' or part='decoder'"):
        inspect.attention_layers(model, "self")
    with pytest.raises(inspect.InspectError, match="head 2 is out of range.*0..1"):
        inspect.ablate_heads(model, [(0, 2)], site="cross").__enter__()
    with pytest.raises(inspect.InspectError, match=r"layer 5 is out of range.*\[0, 1\]"):
        inspect.ablate_heads(model, [(5, 0)], site="cross").__enter__()
    with pytest.raises(inspect.InspectError, match="no cross-attention"):
        inspect.ablate_heads(_model(), [(0, 0)], site="cross").__enter__()
    with pytest.raises(inspect.InspectError, match="mean ablation needs"):
        inspect.ablate_heads(_model(), [(0, 0)], mode="mean").__enter__()
    with pytest.raises(inspect.InspectError, match="read-only"):
        inspect.intervene(_model(), {"blocks.0.self_attn.mask": lambda m: m}).__enter__()
    with pytest.raises(inspect.InspectError, match="pairs of ints"):
        inspect.ablate_heads(_model(), [0, 1]).__enter__()
    assert all(not p._forward_hooks for p in inspect.hook_points(model).values())


def test_head_ablation_effects_and_direct_logit_attribution():
    model = _model(norm="layernorm")
    ids = torch.randint(0, V, (3, 7))
    clean, effects = inspect.head_ablation_effects(model, ids)
    assert effects.shape == (2, H)
    targets = ids[:, 1:]
    zeroed = _zero_wo_columns(model, "blocks.1.self_attn", [1])
    loss = torch.nn.functional.cross_entropy(
        zeroed(ids).logits[:, :-1].flatten(0, 1), targets.flatten()
    )
    torch.testing.assert_close(effects[1, 1], (loss - clean).float(), rtol=0, atol=1e-6)
    _, lp = inspect.head_ablation_effects(model, ids, metric="logprob", token=3, position=-1)
    assert lp.shape == (2, H) and lp.abs().sum() > 0

    for norm in ("layernorm", "rmsnorm"):
        lm = _model(norm=norm)
        attribution = inspect.direct_logit_attribution(lm, ids, tokens=torch.tensor([1, 2, 3]))
        assert attribution.heads.shape == (3, 2, H)
        torch.testing.assert_close(attribution.total, attribution.logit, rtol=0, atol=1e-10)
    with pytest.raises(inspect.InspectError, match="pre-norm"):
        inspect.direct_logit_attribution(_model(norm_placement="post"), ids, 1)
    with pytest.raises(inspect.InspectError, match="decoder LM"):
        inspect.direct_logit_attribution(_model("encoder"), ids, 1)


def test_gpt2_imports_and_saved_checkpoints_can_be_inspected(tmp_path):
    transformers = pytest.importorskip("transformers")
    from attnlab.interop import from_transformers

    cfg = transformers.GPT2Config(
        vocab_size=V,
        n_positions=16,
        n_embd=D,
        n_layer=2,
        n_head=H,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    model = from_transformers(hf)
    ids = torch.randint(0, V, (2, 6))
    out, cache = inspect.run_with_cache(model, ids, names="*.A")
    hf_out = hf(ids, output_attentions=True)
    for layer, weights in enumerate(hf_out.attentions):
        torch.testing.assert_close(cache[f"blocks.{layer}.self_attn.A"], weights)
    torch.testing.assert_close(out.logits, hf_out.logits, rtol=1e-4, atol=1e-4)

    from attnlab.checkpoint import save_inference_checkpoint
    from attnlab.checkpoint.load import load_checkpoint

    save_inference_checkpoint(tmp_path / "ckpt", model=model, config=model.cfg)
    loaded = load_checkpoint(tmp_path / "ckpt").model
    _, again = inspect.run_with_cache(loaded, ids, names="*.A")
    for name in cache:
        torch.testing.assert_close(again[name], cache[name])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cache_and_interventions_on_cuda():
    model = _model().float().cuda()
    ids = torch.randint(0, V, (2, 6), device="cuda")
    out, cache = inspect.run_with_cache(model, ids)
    assert all(v.is_cuda for v in cache.values())
    with inspect.ablate_heads(model, [(0, 0)]):
        ablated = model(ids).logits
    want = _zero_wo_columns(model, "blocks.0.self_attn", [0])(ids).logits
    torch.testing.assert_close(ablated, want)
    cpu_p = cache["embed.P"].cpu()  # a CPU tensor patches a CUDA model
    with inspect.replace_positions(model, cpu_p):
        torch.testing.assert_close(model(ids).logits, out.logits)
    attribution = inspect.direct_logit_attribution(model, ids, 1)
    torch.testing.assert_close(attribution.total, attribution.logit, rtol=1e-4, atol=1e-4)


def test_the_worked_example_of_docs_inspect_runs(tmp_path, monkeypatch, capsys):
    """docs/inspect.md's example, on a tiny untrained checkpoint (its numbers mean nothing here)."""
    import pathlib
    import re
    import sys

    from attnlab.checkpoint import save_inference_checkpoint
    from attnlab.data.tokenizers import CharTokenizer

    doc = pathlib.Path(__file__).parents[2] / "docs" / "inspect.md"
    code = re.search(r"```python\n(# example\.py\n.*?)```", doc.read_text(), re.S).group(1)
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz")
    cfg = ModelConfig(kind="encoder_decoder", vocab_size=tok.vocab_size, d_model=8, n_heads=2,
                      n_layers=2, d_ff=16, max_len=32)  # fmt: skip
    save_inference_checkpoint(tmp_path / "run", model=build_model(cfg), config=cfg, tokenizer=tok)
    monkeypatch.setattr(sys, "argv", ["example.py", str(tmp_path / "run")])
    exec(compile(code, str(doc), "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    assert "layer 1 cross head 1" in printed and "patched memory writes" in printed


@pytest.mark.parametrize("kind", ["decoder_lm", "classifier", "encoder_decoder"])
def test_models_on_the_fast_engine_show_the_plain_values(kind):
    from attnlab.fast import accelerate, is_fast

    plain = _model(kind)
    fast = accelerate(copy.deepcopy(plain))
    assert is_fast(fast)
    args, kwargs, _ = _inputs(kind)
    _, want = inspect.run_with_cache(plain, *args, **kwargs)
    _, got = inspect.run_with_cache(fast, *args, **kwargs)
    assert got.names == want.names
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-12)
    site = "cross" if kind == "encoder_decoder" else "self"
    with inspect.ablate_heads(fast, [(0, 1)], site=site):
        ablated = fast(*args, **kwargs).logits
    want = _zero_wo_columns(plain, inspect.attention_layers(plain, site)[0].path, [1])
    torch.testing.assert_close(ablated, want(*args, **kwargs).logits, rtol=0, atol=1e-10)


@pytest.mark.parametrize("changes", [dict(final_logit_softcap=1.0), dict(out_proj=False)])
def test_direct_logit_attribution_adds_up_with_a_soft_cap_and_without_w_o(changes):
    """With a final soft-cap, ``logit`` is the logit z before it (the output is c tanh(z / c));
    without W^O each head's part is its slice of the concatenation. Either way the parts sum to
    the logit."""
    lm = _model(norm="layernorm", **changes)
    ids = torch.randint(0, V, (3, 7))
    got = inspect.direct_logit_attribution(lm, ids, tokens=torch.tensor([1, 2, 3]))
    torch.testing.assert_close(got.total, got.logit, rtol=0, atol=1e-10)
    out = lm(ids).logits[:, -1].gather(1, torch.tensor([[1], [2], [3]])).squeeze(1)
    c = lm.cfg.final_logit_softcap
    torch.testing.assert_close(c * torch.tanh(got.logit / c) if c else got.logit, out)


def test_attribution_and_ablation_refuse_what_they_cannot_score():
    lm = _model(norm="layernorm")
    ids = torch.randint(0, V, (2, 5))
    for bad, words in (
        (dict(tokens=V), f"ids in [0, {V})"),
        (dict(tokens=torch.tensor([1, 2, 3])), "3 ids for a batch of 2"),
        (dict(tokens=1, position=5), "outside the input's 5 positions"),
        (dict(tokens=torch.tensor(1.0)), "tokens must be one token id"),
    ):
        with pytest.raises(inspect.InspectError, match=re.escape(words)):
            inspect.direct_logit_attribution(lm, ids, **bad)
    with pytest.raises(inspect.InspectError, match="this input has none"):
        inspect.head_ablation_effects(lm, ids[:, :1])  # one token: no next token to score
    with pytest.raises(inspect.InspectError, match="not an id of the 11 outputs"):
        inspect.head_ablation_effects(lm, ids, metric="logprob", token=V)
    other = _model(norm="layernorm", n_heads=4)
    _, means = inspect.run_with_cache(other, ids, names="*.heads")
    ablation = inspect.ablate_heads(lm, [(0, 0)], mode="mean", means=means)
    with pytest.raises(inspect.InspectError, match="from a reference run of this model"), ablation:
        lm(ids)
