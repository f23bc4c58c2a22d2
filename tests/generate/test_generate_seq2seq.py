"""Generation from seq2seq models: cached decoding against a naive loop (Transformer encoder-
decoder with every position kind, LSTM seq2seq with and without attention), batched sources,
EOS per row, and bad input."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer
from attnlab.fast import accelerate
from attnlab.generate import GenerationConfig, generate_seq2seq, stream
from attnlab.models import build_model
from hf_dirs import spread
from tiny_configs import small_config

BOS, EOS = 1, 2
GREEDY = GenerationConfig(temperature=0, max_new_tokens=20, bos_token_id=BOS, stop_token_ids=())


def tiny_s2s(kind: str = "encoder_decoder", positional: str = "learned", **kw):
    cfg = small_config(kind, 30, n_layers=1, max_len=256, positional=positional, **kw)
    return spread(build_model(cfg), 0.3 if kind == "encoder_decoder" else 0.12)


def check_cached_equals_uncached(model, n: int = 200, n_uncached: int = 200):
    """Cached greedy decoding vs one teacher-forced forward over the generated target: at every
    step the cached logits equal the uncached ones (1e-5) and the token is their argmax. Then the
    ``use_cache=False`` loop (the whole prefix re-decoded every step) gives the same tokens."""
    src = [5, 6, 7, 8, 9]
    res = generate_seq2seq(model, src, GREEDY.replace(max_new_tokens=n), return_logits=True)
    tokens = res.tokens[0]
    assert len(tokens) == n
    with torch.no_grad():
        ref = model(torch.tensor([src]), torch.tensor([[BOS] + tokens[:-1]])).logits[0]  # (n, V)
    torch.testing.assert_close(torch.stack([z[0] for z in res.logits]), ref, atol=1e-5, rtol=0)
    assert ref.argmax(-1).tolist() == tokens
    cfg = GREEDY.replace(max_new_tokens=n_uncached, use_cache=False)
    assert generate_seq2seq(model, src, cfg).tokens[0] == tokens[:n_uncached]


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "concat", "rotary", "none"])
def test_encoder_decoder_cached_equals_uncached(positional):
    torch.manual_seed(1)
    check_cached_equals_uncached(tiny_s2s(positional=positional))


@pytest.mark.parametrize("attention", ["none", "additive", "dot", "general"])
def test_lstm_seq2seq_cached_equals_uncached(attention):
    torch.manual_seed(2)
    # The recurrent decoder steps in Python, so re-decoding every prefix is quadratic: 40 steps.
    check_cached_equals_uncached(tiny_s2s("lstm_seq2seq", rnn_attention=attention), n_uncached=40)


@pytest.mark.parametrize("kind", ["encoder_decoder", "lstm_seq2seq"])
def test_batched_sources_equal_one_at_a_time(kind):
    torch.manual_seed(3)
    model = tiny_s2s(kind, rnn_attention="additive" if kind == "lstm_seq2seq" else "none")
    sources = [[5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 12], [4], [11, 12]]
    batch = generate_seq2seq(model, sources, GREEDY.replace(max_new_tokens=30), return_logits=True)
    for i, s in enumerate(sources):
        one = generate_seq2seq(model, [s], GREEDY.replace(max_new_tokens=30), return_logits=True)
        assert batch.tokens[i] == one.tokens[0]
        for a, b in zip(batch.logits, one.logits, strict=True):
            torch.testing.assert_close(a[i], b[0], atol=1e-5, rtol=0)


def test_rows_stop_at_eos_independently_and_finished_rows_are_masked():
    torch.manual_seed(4)
    model = tiny_s2s()
    sources = [[5, 6, 7], [9, 8], [13, 14, 15, 16]]
    free = generate_seq2seq(model, sources, GREEDY).tokens
    stop = free[0][2]
    res = generate_seq2seq(model, sources, GREEDY.replace(stop_token_ids=(stop,)))
    for row, tokens in enumerate(free):
        if stop in tokens:
            assert res.tokens[row] == tokens[: tokens.index(stop)]
            assert res.finish_reasons[row] == "stop_token"
        else:
            assert res.tokens[row] == tokens and res.finish_reasons[row] == "length"


def test_text_sources_with_a_tokenizer_and_streaming():
    torch.manual_seed(5)
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz ")  # 30 ids
    model = tiny_s2s()
    cfg = GenerationConfig(max_new_tokens=15, seed=3, stop_token_ids=())
    res = generate_seq2seq(model, ["hello", "a b"], cfg, tokenizer=tok)
    assert res.prompts == [tok.encode("hello"), tok.encode("a b")]
    assert res.texts == [tok.decode(t) for t in res.tokens]
    one = generate_seq2seq(model, "hello", cfg, tokenizer=tok)
    assert list(stream(model, "hello", cfg, tokenizer=tok)) == one.tokens[0]
    assert "".join(stream(model, "hello", cfg, tokenizer=tok, text=True)) == one.texts[0]


def test_target_length_is_capped_at_the_decoder_window_with_a_warning():
    torch.manual_seed(6)
    cfg = ModelConfig(
        kind="encoder_decoder", vocab_size=30, d_model=32, n_heads=4, n_layers=1, max_len=12
    )
    model = build_model(cfg).eval()
    with pytest.warns(UserWarning, match="generating at most 12"):
        res = generate_seq2seq(model, [5, 6], GREEDY.replace(max_new_tokens=50))
    assert len(res.tokens[0]) == 12


def test_bad_sources_are_clear_errors():
    model = tiny_s2s()
    with pytest.raises(ValueError, match="source 1 is empty"):
        generate_seq2seq(model, [[5], []], GREEDY)
    with pytest.raises(ValueError, match="source 0 has 300 tokens .* max_len=256"):
        generate_seq2seq(model, [[5] * 300], GREEDY)
    with pytest.raises(ValueError, match="starts from a BOS token"):
        generate_seq2seq(model, [5, 6], GenerationConfig(temperature=0))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate_seq2seq(model, [5, 99], GREEDY)
    lm = build_model(ModelConfig(vocab_size=30, d_model=32))
    with pytest.raises(TypeError, match="use generate"):
        generate_seq2seq(lm, [5, 6], GREEDY)


def test_compiled_decode_step_gives_the_eager_tokens(replays):
    """Greedy and beam search; after its first steps greedy decoding replays the compiled graph
    without dynamo on the engine (fast.replay.Replay), beam search (which reorders the cache)
    does not."""
    torch.manual_seed(3)
    model = accelerate(tiny_s2s())
    sources = [[5, 6, 7, 8, 9], [10, 11]]
    greedy = GREEDY.replace(max_new_tokens=25)
    eager = generate_seq2seq(model, sources, greedy, return_logits=True)
    compiled = generate_seq2seq(model, sources, greedy.replace(compile=True), return_logits=True)
    assert compiled.tokens == eager.tokens
    torch.testing.assert_close(
        torch.stack(compiled.logits), torch.stack(eager.logits), atol=1e-5, rtol=1e-5
    )
    assert replays[0] >= 25 - 5  # rows stop at different steps; the batch runs until all stop
    replays[0] = 0
    beams = greedy.replace(num_beams=3)
    assert (
        generate_seq2seq(model, sources, beams.replace(compile=True)).tokens
        == generate_seq2seq(model, sources, beams).tokens
    )
    assert replays[0] == 0
