"""Generation from language models: the KV cache against a naive loop for every position kind and
the recurrent LM, batched == one at a time, strategies, stops, the window, streaming, bad input."""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.data import ByteTokenizer, CharTokenizer
from attnlab.data.tokenizers import DEFAULT_SPECIALS
from attnlab.fast import accelerate
from attnlab.generate import GenerationConfig, IncrementalDecoder, generate, stream
from attnlab.models import LanguageModel, ModelOutput, build_model
from hf_dirs import spread
from tiny_configs import small_config

GREEDY = GenerationConfig(temperature=0, max_new_tokens=20)


def tiny_lm(positional: str = "learned", max_len: int = 256, kind: str = "decoder_lm", **kw):
    cfg = small_config(kind, 40, max_len=max_len, positional=positional, **kw)
    # A recurrent W_hh with std 0.3 has spectral radius ~1.7: chaotic, so float32 rounding
    # alone would grow past 1e-5 over 200 steps. 0.12 keeps the recurrence contracting.
    return spread(build_model(cfg), 0.12 if kind == "rnn_lm" else 0.3)


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(1)
    return tiny_lm()


@torch.no_grad()
def naive_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """The textbook loop (nanoGPT sample.py): rerun the whole sequence, append the argmax."""
    ids = torch.tensor([prompt])
    out, logits = [], []
    for _ in range(n):
        z = model(ids).logits[0, -1]
        logits.append(z)
        w = int(z.argmax())
        out.append(w)
        ids = torch.cat([ids, torch.tensor([[w]])], dim=1)
    return out, logits


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "concat", "rotary", "none"])
def test_cached_greedy_equals_uncached_for_every_position_kind(positional):
    torch.manual_seed(2)
    model = tiny_lm(positional)
    prompt = [5, 6, 7, 8]
    want, want_logits = naive_greedy(model, prompt, 200)
    res = generate(model, prompt, GREEDY.replace(max_new_tokens=200), return_logits=True)
    assert res.tokens[0] == want
    for got, ref in zip(res.logits, want_logits, strict=True):
        torch.testing.assert_close(got[0], ref, atol=1e-5, rtol=0)
    ref = generate(model, prompt, GREEDY.replace(max_new_tokens=200, use_cache=False))
    assert ref.tokens == res.tokens
    # Greedy paths of random models settle into loops; a sampled path visits many more states.
    cfg = GenerationConfig(max_new_tokens=200, seed=11)
    cached = generate(model, [prompt, prompt[:2]], cfg, return_logits=True)
    full = generate(model, [prompt, prompt[:2]], cfg.replace(use_cache=False), return_logits=True)
    assert cached.tokens == full.tokens and len(set(cached.tokens[0])) > 10
    for got, ref in zip(cached.logits, full.logits, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_recurrent_lm_cached_equals_uncached():
    torch.manual_seed(3)
    model = tiny_lm(kind="rnn_lm")
    want, want_logits = naive_greedy(model, [4, 9], 200)
    res = generate(model, [4, 9], GREEDY.replace(max_new_tokens=200), return_logits=True)
    assert res.tokens[0] == want
    for got, ref in zip(res.logits, want_logits, strict=True):
        torch.testing.assert_close(got[0], ref, atol=1e-5, rtol=0)


def assert_batch_equals_one_at_a_time(model, prompts: list[list[int]], cfg) -> None:
    """Each row of a left-padded batch gets the tokens and logits of its prompt alone."""
    batch = generate(model, prompts, cfg, return_logits=True)
    for i, p in enumerate(prompts):
        one = generate(model, p, cfg, return_logits=True)
        assert batch.tokens[i] == one.tokens[0]
        for a, b in zip(batch.logits, one.logits, strict=True):
            torch.testing.assert_close(a[i], b[0], atol=1e-5, rtol=0)
    assert batch.prompts == prompts


@pytest.mark.parametrize(
    "kind,positional", [("decoder_lm", "learned"), ("decoder_lm", "rotary"), ("rnn_lm", "learned")]
)
def test_batched_prompts_of_different_lengths_equal_one_at_a_time(kind, positional):
    torch.manual_seed(4)
    model = tiny_lm(positional, kind=kind)
    prompts = [[5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2], [4], [11, 12]]
    cfg = GREEDY.replace(max_new_tokens=40)
    assert_batch_equals_one_at_a_time(model, prompts, cfg)


def test_temperature_zero_and_top_k_one_equal_greedy(lm):
    greedy = generate(lm, [3, 4, 5], GREEDY).tokens
    assert (
        generate(lm, [3, 4, 5], GenerationConfig(temperature=0.0, max_new_tokens=20)).tokens
        == greedy
    )
    assert (
        generate(lm, [3, 4, 5], GenerationConfig(top_k=1, seed=5, max_new_tokens=20)).tokens
        == greedy
    )
    assert (
        generate(lm, [3, 4, 5], GREEDY.replace(do_sample=False, temperature=0.7)).tokens == greedy
    )


def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng_alone(lm):
    cfg = GenerationConfig(max_new_tokens=30, seed=123, top_p=0.95, temperature=1.3)
    state = torch.get_rng_state()
    a = generate(lm, [[3, 4], [5]], cfg)
    assert torch.equal(torch.get_rng_state(), state)
    b = generate(lm, [[3, 4], [5]], cfg)
    c = generate(lm, [[3, 4], [5]], cfg.replace(seed=124))
    assert a.tokens == b.tokens and a.seed == 123
    assert a.tokens != c.tokens
    fresh = generate(lm, [3, 4], cfg.replace(seed=None))
    assert isinstance(fresh.seed, int)  # reported, so the run can be repeated
    again = generate(lm, [3, 4], cfg.replace(seed=fresh.seed))
    assert again.tokens == fresh.tokens


def test_stop_tokens_end_rows_independently(lm):
    free = generate(lm, [[5, 6, 7], [9, 8]], GREEDY).tokens
    stop = free[0][3]
    res = generate(lm, [[5, 6, 7], [9, 8]], GREEDY.replace(stop_token_ids=(stop,)))
    assert res.tokens[0] == free[0][: free[0].index(stop)]
    assert res.finish_reasons[0] == "stop_token"
    if stop in free[1]:
        assert res.tokens[1] == free[1][: free[1].index(stop)]
    else:
        assert res.tokens[1] == free[1] and res.finish_reasons[1] == "length"


def test_rows_keep_every_token_until_one_finishes(lm):
    from attnlab.generate.lm import prepare_lm

    prompts = [[5, 6, 7], [9, 8]]
    free = prepare_lm(lm, prompts, GREEDY.replace(stop_token_ids=()), None).loop()
    steps = []
    while (step := free.step()) is not None:
        steps.append(step)
        assert not torch.is_inference_mode_enabled()
    assert len(steps) == GREEDY.max_new_tokens and all(bool(kept.all()) for _, kept in steps)
    tokens = free.tokens()
    assert [len(t) for t in tokens] == [GREEDY.max_new_tokens] * 2
    unused = next(i for i in range(3, 40) if all(i not in t for t in tokens))
    masked = prepare_lm(lm, prompts, GREEDY.replace(stop_token_ids=(unused,)), None).loop()
    masked.run()
    assert masked.tokens() == tokens and masked.reasons == ["length", "length"]
    assert not torch.is_inference_mode_enabled()


class BigramLM(LanguageModel):
    """A scripted LM: the logits of the next token depend only on the current one (a table)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table)  # (V, V)
        self.vocab_size, self.max_len = table.size(0), None

    def forward(
        self, ids, *, key_padding_mask=None, positions=None, cache=None, need_weights=False
    ):
        if cache is not None:
            cache.length += ids.size(1)
        return ModelOutput(self.table[ids])  # (B, T, V)

    def new_cache(self, batch_size, max_len=None):
        return SimpleNamespace(length=0, reorder=lambda index: None)


def cycle_lm(cycle: list[int], vocab_size: int) -> BigramLM:
    """Greedy decoding walks ``cycle`` forever: after cycle[i] comes cycle[i + 1]."""
    table = torch.zeros(vocab_size, vocab_size)
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        table[a, b] = 10.0
    return BigramLM(table)


def test_tokenizer_eos_is_the_default_stop_token_and_empty_prompt_starts_from_bos():
    tok = CharTokenizer("abcdefghij ")
    a, b, c = tok.encode("abc")
    model = cycle_lm([tok.bos_id, a, b, c, tok.eos_id], tok.vocab_size)
    res = generate(model, "", GREEDY, tokenizer=tok)
    assert res.prompts == [[tok.bos_id]]
    assert res.tokens == [[a, b, c]] and res.texts == ["abc"]
    assert res.finish_reasons == ["stop_token"]
    res = generate(model, "", GREEDY.replace(stop_token_ids=()), tokenizer=tok)
    assert len(res.tokens[0]) == 20 and res.finish_reasons == ["length"]
    with pytest.raises(ValueError, match="empty and no BOS"):
        generate(model, [[]], GREEDY)
    assert generate(model, [[]], GREEDY.replace(bos_token_id=a)).tokens[0][:2] == [b, c]


def test_stop_strings_cut_the_text_before_the_stop(lm):
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz0123456789 ")  # 40 ids
    free = generate(lm, "abc", GREEDY.replace(max_new_tokens=30), tokenizer=tok)
    text = free.texts[0]
    stop = text[5:7]
    res = generate(
        lm, "abc", GREEDY.replace(max_new_tokens=30, stop_strings=(stop,)), tokenizer=tok
    )
    assert res.texts[0] == text[: text.index(stop)]
    assert res.finish_reasons == ["stop_string"]
    assert tok.decode(res.tokens[0]).startswith(res.texts[0] + stop)  # tokens keep the stop
    with pytest.raises(ValueError, match="tokenizer"):
        generate(lm, [1, 2], GREEDY.replace(stop_strings=("x",)))


def test_stream_yields_the_tokens_and_text_of_generate(lm):
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz0123456789 ")
    cfg = GenerationConfig(max_new_tokens=25, seed=7, stop_token_ids=())
    full = generate(lm, "hello", cfg, tokenizer=tok)
    assert len(full.texts[0]) > 15
    tokens = []
    for token in stream(lm, "hello", cfg, tokenizer=tok):
        assert not torch.is_inference_mode_enabled()  # the caller's code runs in normal mode
        tokens.append(token)
    assert tokens == full.tokens[0]
    pieces = list(stream(lm, "hello", cfg, tokenizer=tok, text=True))
    assert "".join(pieces) == full.texts[0] and len(pieces) > 1
    stop = full.texts[0][10:12]
    cfg_stop = cfg.replace(stop_strings=(stop,))
    pieces = list(stream(lm, "hello", cfg_stop, tokenizer=tok, text=True))
    assert "".join(pieces) == generate(lm, "hello", cfg_stop, tokenizer=tok).texts[0]
    assert stop not in "".join(pieces)
    with pytest.raises(ValueError, match="cannot stream"):
        stream(lm, "hello", GREEDY.replace(num_beams=2), tokenizer=tok)


def test_stream_warns_once_of_characters_the_tokenizer_does_not_know(lm):
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz0123456789 ", (*DEFAULT_SPECIALS, "<unk>"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        list(stream(lm, "héllo", GREEDY.replace(max_new_tokens=3), tokenizer=tok))
    said = [str(w.message) for w in seen if "does not know" in str(w.message)]
    assert len(said) == 1 and "'é'" in said[0]  # the prompt is encoded once, not twice


def test_byte_tokens_stream_whole_characters_and_hold_back_stop_prefixes():
    tok = ByteTokenizer()
    e1, e2 = (3 + x for x in "é".encode())  # a 2-byte character
    bang, dot = 3 + ord("!"), 3 + ord(".")
    model = cycle_lm([e1, e2, bang, dot], tok.vocab_size)
    cfg = GREEDY.replace(max_new_tokens=11)
    pieces = list(stream(model, "!", cfg, tokenizer=tok, text=True))  # prompt "!" -> "."
    assert "".join(pieces) == ".é!.é!.é" and "\ufffd" not in "".join(pieces)
    assert "é" in pieces  # emitted whole, once both bytes exist
    dec = IncrementalDecoder(tok)
    assert [dec.push(w) for w in (e1, e2, bang)] == ["", "é", "!"]
    cfg = cfg.replace(stop_strings=("!.é!",))
    pieces = list(stream(model, "!", cfg, tokenizer=tok, text=True))
    assert "".join(pieces) == ".é"
    assert generate(model, "!", cfg, tokenizer=tok).texts == [".é"]


def test_long_prompt_is_cropped_with_a_warning_and_generation_slides_the_window():
    torch.manual_seed(9)
    model = tiny_lm("learned", max_len=16)
    prompt = list(range(3, 23))  # 20 tokens > max_len 16
    with pytest.warns(UserWarning, match="keeping its last 16"):
        res = generate(model, prompt, GREEDY.replace(max_new_tokens=30))
    assert res.prompts == [prompt[-16:]] and len(res.tokens[0]) == 30
    # The sliding cache re-prefills the last max_len // 2 tokens when full: check that against
    # naive windows of exactly the same context.
    seq, cache_start, out = prompt[-16:], 0, []
    with torch.no_grad():
        for _ in range(30):
            if len(seq) - cache_start > 16:
                cache_start = len(seq) - 8
            z = model(torch.tensor([seq[cache_start:]])).logits[0, -1]
            out.append(int(z.argmax()))
            seq.append(out[-1])
    assert res.tokens[0] == out
    uncached = generate(model, prompt[-16:], GREEDY.replace(max_new_tokens=30, use_cache=False))
    assert len(uncached.tokens[0]) == 30  # crops to the last 16 each step, no error


def test_sliding_window_in_a_left_padded_batch_equals_one_at_a_time():
    torch.manual_seed(12)
    model = tiny_lm("rotary", max_len=16)
    prompts = [[5, 6, 7], list(range(3, 15)), [9]]
    cfg = GREEDY.replace(max_new_tokens=40)
    assert_batch_equals_one_at_a_time(model, prompts, cfg)


def test_repetition_penalty_discourages_repeats(lm):
    base = generate(lm, [5, 6], GREEDY.replace(max_new_tokens=40)).tokens[0]
    pen = generate(lm, [5, 6], GREEDY.replace(max_new_tokens=40, repetition_penalty=5.0))
    assert len(set(pen.tokens[0])) > len(set(base))


def test_dropout_model_is_generated_in_eval_mode_and_mode_restored():
    torch.manual_seed(10)
    model = tiny_lm(dropout=0.5).train()
    a = generate(model, [5, 6], GREEDY).tokens
    b = generate(model, [5, 6], GREEDY).tokens
    assert a == b and model.training


def test_bad_input_errors_name_the_problem(lm):
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match=r"cannot be encoded.*'z'"):
        generate(lm, "abz", GREEDY, tokenizer=tok)
    with pytest.raises(ValueError, match="no tokenizer"):
        generate(lm, "abc", GREEDY)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate(lm, [1, 400], GREEDY)
    with pytest.raises(ValueError, match="integer ids"):
        generate(lm, torch.ones(2, 3), GREEDY)
    with pytest.raises(ValueError, match=r"integer ids .* got torch.bool"):
        generate(lm, torch.tensor([[True, False]]), GREEDY)  # was read as ids 1, 0
    with pytest.raises(TypeError, match="prompt 0 must be"):
        generate(lm, [torch.tensor([True, False])], GREEDY)
    with pytest.raises(TypeError, match="prompt 1 must be a string or a list of token ids"):
        generate(lm, [[1, 2], 3.5], GREEDY)
    clf = build_model(ModelConfig(kind="classifier", vocab_size=40, n_classes=3, d_model=32))
    with pytest.raises(TypeError, match="not generative"):
        generate(clf, [1, 2], GREEDY)
    s2s = build_model(ModelConfig(kind="encoder_decoder", vocab_size=40, d_model=32))
    with pytest.raises(TypeError, match="generate_seq2seq"):
        generate(s2s, [1, 2], GREEDY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate(lm, [1, 2], GREEDY)  # a normal call warns about nothing


def assert_compiled_matches_eager(model, prompts, config, tol: float | None = 1e-5) -> None:
    """generate() with config.replace(compile=True) gives the eager tokens, and logits equal to
    ``tol`` (None: assert_close's defaults for the dtype)."""
    eager = generate(model, prompts, config, return_logits=True)
    compiled = generate(model, prompts, config.replace(compile=True), return_logits=True)
    assert compiled.tokens == eager.tokens
    torch.testing.assert_close(
        torch.stack(compiled.logits), torch.stack(eager.logits), atol=tol, rtol=tol
    )


def test_compiled_decode_step_gives_the_eager_tokens_and_logits(lm):
    """compile=True: the same greedy tokens and (to 1e-5) logits for a left-padded batch."""
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    assert_compiled_matches_eager(lm, prompts, GREEDY.replace(max_new_tokens=30))
    with pytest.raises(ValueError, match="compile=True.*use_cache=False"):
        GenerationConfig(compile=True, use_cache=False)


def test_compiled_batch_one_step_matches_eager_and_compiles_a_bounded_number_of_times(lm):
    """Batch 1 is the case where the compiled step turns weight products into loops
    (decompose_mm_pass) and attention into reductions: same tokens, logits to 1e-5. Shapes
    become dynamic after one recompilation, so longer outputs and other prompt lengths do not
    recompile per token."""
    from torch._dynamo.utils import counters

    prompt = [3, 4, 5, 6, 7, 8]
    before = counters["stats"]["unique_graphs"]  # eager generation compiles nothing
    tags = torch._dynamo.config.use_recursive_dict_tags_for_guards  # the release's default
    assert_compiled_matches_eager(lm, [prompt], GREEDY.replace(max_new_tokens=40))
    generate(lm, [prompt[:3]], GREEDY.replace(max_new_tokens=25, compile=True))
    assert counters["stats"]["unique_graphs"] - before <= 3
    assert torch._dynamo.config.use_recursive_dict_tags_for_guards is tags  # only around calls


def test_the_step_config_is_switched_on_only_around_the_compiled_calls():
    from attnlab.generate.steppers import STEP_RECOMPILE_LIMIT, _with_step_config

    config = torch._dynamo.config
    outside = (config.recompile_limit, config.use_recursive_dict_tags_for_guards)
    seen = _with_step_config(
        lambda: (config.recompile_limit, config.use_recursive_dict_tags_for_guards)
    )
    assert seen == (max(outside[0], STEP_RECOMPILE_LIMIT), True)
    assert (config.recompile_limit, config.use_recursive_dict_tags_for_guards) == outside


def test_compiled_step_follows_a_model_changed_in_place(lm):
    """The compiled step's guards check the module tree by dictionary tags (see
    ``steppers._with_step_config``); a model whose parameters were swapped through ``.data``
    (what ``model.double()`` does) or rescaled in place must still give its own eager result."""
    import copy

    model = copy.deepcopy(lm)
    prompt = [3, 4, 5, 6, 7, 8]
    config = GREEDY.replace(max_new_tokens=12)
    generate(model, [prompt], config.replace(compile=True))
    with torch.no_grad():
        model.double()
        for p in model.parameters():
            p.mul_(1.5)
    assert_compiled_matches_eager(model, [prompt], config, tol=None)


def test_compiled_generation_replays_the_graph_and_keeps_the_eager_tokens(lm, replays):
    """On the engine, after two recorded steps through dynamo, the compiled graph is called
    directly: the same greedy and seeded-sampling tokens as eager, logits to 1e-5. The plain
    model's compiled step always goes through dynamo."""
    prompt, n = [3, 4, 5, 6, 7, 8], 30
    assert_compiled_matches_eager(lm, [prompt], GREEDY.replace(max_new_tokens=n))
    assert replays[0] == 0
    fast = accelerate(copy.deepcopy(lm))
    for config in (GREEDY.replace(max_new_tokens=n), GenerationConfig(max_new_tokens=n, seed=5)):
        replays[0] = 0
        assert_compiled_matches_eager(fast, [prompt], config)
        # n - 1 steps after the prefill; the first two (three while shapes become dynamic) are
        # recorded through dynamo
        assert n - 4 <= replays[0] <= n - 3


def test_compiled_models_of_other_widths_in_one_process_each_keep_their_eager_tokens(replays):
    """The compiled step is shared by a class: a second model with other widths and depth makes
    dynamo recompile (with symbolic head sizes), and each model, in turn, still replays its own
    graph and matches its eager tokens and logits."""
    torch.manual_seed(4)
    narrow = accelerate(tiny_lm("learned"))
    cfg = ModelConfig(kind="decoder_lm", vocab_size=40, d_model=48, n_heads=2, n_layers=3)
    wide = spread(build_model(cfg, fast=True), 0.3)
    prompt, cfg = [3, 4, 5, 6, 7], GREEDY.replace(max_new_tokens=20)
    for model in (narrow, wide, narrow, wide):
        replays[0] = 0
        assert_compiled_matches_eager(model, [prompt], cfg)
        assert replays[0] > 0


def test_replay_stops_at_a_window_slide_and_resumes_on_the_new_cache(replays):
    torch.manual_seed(9)
    model = accelerate(tiny_lm("learned", max_len=16))
    prompt, cfg = list(range(3, 15)), GREEDY.replace(max_new_tokens=40)
    assert_compiled_matches_eager(model, [prompt], cfg)
    # 39 steps, 5 slides (each a prefill, then two recorded steps): some replays, not all
    assert 0 < replays[0] < 39 - 5


def test_no_replay_while_a_hook_is_registered(lm, replays):
    """The replay (which skips dynamo's guards) stays off while any module has a hook, and
    resumes after it is removed; tokens match eager either way."""
    fast = accelerate(copy.deepcopy(lm))
    prompt, config = [3, 4, 5, 6], GREEDY.replace(max_new_tokens=12)
    seen = []
    handle = fast.blocks[0].self_attn.hook_A.register_forward_hook(lambda m, a, o: seen.append(o))
    assert_compiled_matches_eager(fast, [prompt], config)
    assert replays[0] == 0 and len(seen) >= 12  # the eager run: every step
    handle.remove()
    assert_compiled_matches_eager(fast, [prompt], config)
    assert replays[0] > 0


def test_replay_needs_two_steps_that_differ_only_in_token_and_lengths():
    from attnlab.fast.replay import GraphCall, Replay

    def graph(*args):
        return (torch.full((1, 1, 3), float(args[2])), args[0])

    weight, ids1, ids2 = torch.ones(2), torch.tensor([[1]]), torch.tensor([[2]])
    out1, out2 = graph(weight, ids1, 5), graph(weight, ids2, 6)
    prev = GraphCall(graph, [weight, ids1, 5], out1, ids1, out1[0])
    cur = GraphCall(graph, [weight, ids2, 6], out2, ids2, out2[0])
    layers = [SimpleNamespace(length=6, max_len=8), SimpleNamespace(length=6, max_len=8)]
    replay = Replay.between(prev, cur, layers)
    assert (replay.token_at, replay.length_at, replay.logits_at) == (1, [2], 0)
    assert replay(torch.tensor([[3]]))[0, 0, 0] == 7.0  # the graph saw lengths + 1
    assert [layer.length for layer in layers] == [7, 7]  # the model's side effect, replayed
    replay(torch.tensor([[3]]))
    with pytest.raises(ValueError, match="KV cache overflow"):
        replay(torch.tensor([[3]]))
    # anything else changed: no replay
    other = GraphCall(graph, [torch.ones(2), ids2, 6], out2, ids2, out2[0])  # a new weight tensor
    assert Replay.between(prev, other, layers) is None
    jump = GraphCall(graph, [weight, ids2, 7], out2, ids2, out2[0])  # lengths + 2
    assert Replay.between(prev, jump, layers) is None
    elsewhere = GraphCall(lambda *a: a, cur.args, out2, ids2, out2[0])  # another graph
    assert Replay.between(prev, elsewhere, layers) is None
    unseen = GraphCall(graph, cur.args, out2, ids2, torch.zeros(1))  # logits not a graph output
    assert Replay.between(prev, unseen, layers) is None
