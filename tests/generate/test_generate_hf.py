"""Greedy generation equals transformers' GPT2LMHeadModel.generate on the same random weights,
moved into attnlab through the GPT-2 mapping (attnlab.interop). Nothing is downloaded."""

from __future__ import annotations

import pytest
import torch

from attnlab.generate import GenerationConfig, generate
from attnlab.interop import from_transformers

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

EOS = 2


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=97,
        n_positions=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # larger than GPT-2's init (std 0.02), so the argmax is never a near-tie
        for p in hf.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return hf, from_transformers(hf)


def hf_greedy(hf, prompts: list[list[int]], n: int, eos: int | None, **options) -> list[list[int]]:
    """HF generate with left padding and an attention mask; its new tokens, cut at EOS."""
    longest = max(map(len, prompts))
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=0,
        eos_token_id=eos,
        pad_token_id=0,
        **options,
    )[:, longest:].tolist()
    return [row[: row.index(eos)] if eos is not None and eos in row else row for row in out]


def test_greedy_equals_transformers_generate(pair):
    hf, ours = pair
    prompt = [5, 17, 33, 8]
    want = hf_greedy(hf, [prompt], 60, None)
    got = generate(
        ours, prompt, GenerationConfig(temperature=0, max_new_tokens=60, stop_token_ids=())
    )
    assert got.tokens == want
    assert len(set(want[0])) > 5


def test_batched_left_padded_greedy_equals_transformers(pair):
    hf, ours = pair
    prompts = [[5, 17, 33, 8, 9, 10], [44], [70, 71, 3]]
    stop = 13  # a token the first and last rows emit after 5 steps and the middle row never does
    want = hf_greedy(hf, prompts, 30, stop)
    got = generate(
        ours, prompts, GenerationConfig(temperature=0, max_new_tokens=30, stop_token_ids=(stop,))
    )
    assert got.tokens == want
    assert got.finish_reasons == ["stop_token", "length", "stop_token"]


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_in_greedy_decoding_equals_transformers(pair, penalty):
    """The penalty inside the loop (which tokens count as seen: each row's prompt and its new
    tokens), on a left-padded batch; 0.8 rewards repeats, so both directions of the rule are
    compared."""
    hf, ours = pair
    prompts = [[5, 17, 33, 8, 9, 10], [44], [70, 71, 3]]
    want = hf_greedy(hf, prompts, 40, None, repetition_penalty=penalty)
    cfg = GenerationConfig(
        temperature=0, max_new_tokens=40, stop_token_ids=(), repetition_penalty=penalty
    )
    assert generate(ours, prompts, cfg).tokens == want
    plain = GenerationConfig(temperature=0, max_new_tokens=40, stop_token_ids=())
    assert generate(ours, prompts, plain).tokens != want  # the penalty changed the output


@pytest.mark.parametrize("early", ["never", True])
@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
def test_beam_search_n_best_equals_transformers(pair, alpha, early):
    """HF's early_stopping="never" is the exact stopping rule we use by default, and True ours
    with early_stopping=True (stop once K hypotheses have finished); both count new tokens only
    in the length penalty. Left-padded batch, a stop token that some beams emit."""
    hf, ours = pair
    prompts, stop, k, n = [[5, 17, 33, 8], [70, 71]], 27, 3, 12
    ids = torch.tensor([prompts[0], [0, 0, *prompts[1]]])  # left-padded
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    out = hf.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        num_beams=k,
        num_return_sequences=k,
        early_stopping=early,
        length_penalty=alpha,
        max_new_tokens=n,
        eos_token_id=stop,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    want = [row[4:].tolist() for row in out.sequences]
    want = [row[: row.index(stop)] if stop in row else row for row in want]
    got = generate(
        ours,
        prompts,
        GenerationConfig(
            num_beams=k,
            max_new_tokens=n,
            length_penalty=alpha,
            early_stopping=early is True,
            stop_token_ids=(stop,),
        ),
    )
    assert [h.tokens for hyps in got.nbest for h in hyps] == want
    scores = [h.score for hyps in got.nbest for h in hyps]
    torch.testing.assert_close(torch.tensor(scores), out.sequences_scores, atol=1e-4, rtol=0)
    reasons = {h.finish_reason for hyps in got.nbest for h in hyps}
    stopped = alpha <= 1.0 or early is True  # with early stopping, finished hypotheses win
    assert reasons == ({"stop_token", "length"} if stopped else {"length"})  # EOS exercised
