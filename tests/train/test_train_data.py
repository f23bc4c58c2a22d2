"""Task data of training runs: deterministic streams, rank shards, held-out sets, evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer, CopyTask
from attnlab.models import build_model
from attnlab.train.build_data import build_task_data
from attnlab.train.evaluate import evaluate, greedy_decode
from attnlab.train.objectives import batch_loss, correct_predictions, target_count
from attnlab.train.run_config import TrainConfig
from attnlab.train.setup import fit_model_config
from attnlab.train.task_data import PairData, ShuffledStream


def _pairs_cfg(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(task="seq2seq", data="reverse", n_train=200, n_val=40), **kw})


def _tiny_config(data, kind: str = "encoder_decoder", max_len: int = 32) -> ModelConfig:
    """A one-layer, width-16 model of ``kind`` fitted to ``data``'s vocabulary."""
    extra = dict(n_heads=2, d_ff=32, max_len=max_len) if kind == "encoder_decoder" else {}
    return fit_model_config(ModelConfig(kind=kind, d_model=16, n_layers=1, **extra), data)


def test_stream_epochs_are_permutations_and_a_pure_function_of_the_index():
    stream = ShuffledStream(7, seed=3)
    first, second = stream.indices(0, 7), stream.indices(7, 7)
    assert sorted(first) == sorted(second) == list(range(7)) and first != second
    assert ShuffledStream(7, seed=3).indices(5, 6) == first[5:] + second[:4]


def test_rank_shards_union_is_the_single_process_batch():
    data = build_task_data(_pairs_cfg())
    whole = data.train_batch(3, 8, shard=0, shards=1)
    shards = [data.train_batch(3, 4, shard=r, shards=2) for r in range(2)]
    rows = {tuple(r[m].tolist()) for s in shards for r, m in zip(s.src, s.src_mask)}
    assert rows == {tuple(r[m].tolist()) for r, m in zip(whole.src, whole.src_mask)}
    assert data.train_batch(3, 8).src.equal(whole.src)  # same call, same batch


def test_validation_sources_are_never_training_sources():
    data = build_task_data(_pairs_cfg())
    train_src = {tuple(s) for s, _ in data.train_ids}
    assert data.val_ids and not any(tuple(s) in train_src for s, _ in data.val_ids)
    test = build_task_data(_pairs_cfg(), split="test")
    assert [e.source for e in test.val_examples] != [e.source for e in data.val_examples]


def test_greedy_decode_agrees_with_teacher_forcing_on_its_own_output():
    """Cached step-by-step decoding and one teacher-forced pass must pick the same tokens."""
    data = build_task_data(_pairs_cfg())
    cfg = _tiny_config(data)
    model = build_model(cfg).eval()
    batch = data.val_batches(8, 1)[0]
    tok = data.tokenizer
    outs = greedy_decode(
        model, batch.src, batch.src_mask, bos_id=tok.bos_id, eos_id=tok.eos_id, max_new_tokens=12
    )
    for row, ids in enumerate(outs):
        tgt_in = torch.tensor([[tok.bos_id, *ids]])
        src, mask = batch.src[row : row + 1], batch.src_mask[row : row + 1]
        logits = model(src, tgt_in, src_mask=mask).logits  # (1, L + 1, V)
        forced = logits.argmax(-1)[0].tolist()
        assert forced[: len(ids)] == ids
        if len(ids) < 12:  # stopped early: the next choice was <eos>
            assert forced[len(ids)] == tok.eos_id


def test_teacher_forced_all_correct_equals_greedy_exact_match():
    task = CopyTask(min_len=1, max_len=3, alphabet="abcd")
    data = PairData(
        CharTokenizer(task.characters()),
        task.make_pairs(300, seed=0),
        task.make_pairs(64, seed=1),
        seed=0,
        origin="copy",
    )
    cfg = _tiny_config(data, max_len=8)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), 1e-2)
    for step in range(20):  # enough for some, not all, examples to be right
        loss = batch_loss(model, data.train_batch(step, 32), "seq2seq")
        (loss.total / loss.n_targets).backward()
        opt.step()
        opt.zero_grad()
    res = evaluate(model, data, batch_size=64, max_batches=1)
    batch = data.val_batches(64, 1)[0]
    with torch.no_grad():
        model.eval()
        logits = model(
            batch.src, batch.tgt_in, src_mask=batch.src_mask, tgt_mask=batch.tgt_mask
        ).logits
    forced = correct_predictions(logits, batch, "seq2seq").tolist()
    assert forced == [p.correct for p in res.predictions]
    assert 0 < sum(forced) < len(forced)  # both outcomes occur, so the comparison has teeth
    assert {"val_loss", "val_ppl", "val_exact_match", "val_bleu", "val_chrf"} == set(res.metrics)


def test_loss_sums_and_counts_ignore_padding():
    data = build_task_data(_pairs_cfg())
    batch = data.train_batch(0, 16)
    cfg = _tiny_config(data)
    model = build_model(cfg).eval()
    loss = batch_loss(model, batch, "seq2seq")
    assert loss.n_targets == target_count(batch, "seq2seq") == int(batch.tgt_mask.sum())
    s, t = int(batch.src_mask[0].sum()), int(batch.tgt_mask[0].sum())
    padded = type(batch)(*(x[:1] for x in batch))  # row 0 with the batch's padding
    alone = type(batch)(
        padded.src[:, :s],
        padded.src_mask[:, :s],
        padded.tgt_in[:, :t],
        padded.tgt_out[:, :t],
        padded.tgt_mask[:, :t],
    )
    assert s < batch.src.size(1) or t < batch.tgt_in.size(1)  # row 0 really is padded
    a, b = batch_loss(model, padded, "seq2seq"), batch_loss(model, alone, "seq2seq")
    assert a.n_targets == b.n_targets == t and torch.allclose(a.total, b.total, atol=1e-5)


def test_classification_data_and_accuracy():
    cfg = TrainConfig(task="classify", data="parens", n_train=100, n_val=30)
    data = build_task_data(cfg)
    mcfg = fit_model_config(
        ModelConfig(
            kind="classifier", n_classes=2, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32
        ),
        data,
    )
    assert mcfg.n_classes == 2 and mcfg.vocab_size == data.tokenizer.vocab_size
    batch = data.train_batch(0, 8)
    assert bool((batch.ids[:, 0] == data.tokenizer.bos_id).all())  # the CLS position
    res = evaluate(build_model(mcfg), data, batch_size=16, max_batches=10)
    assert set(res.metrics) == {"val_loss", "val_accuracy"} and len(res.predictions) == 30


def test_bucketed_stream_sorts_each_pool_and_is_a_pure_function_of_the_index():
    lengths = np.random.default_rng(0).integers(1, 50, size=103)
    stream = ShuffledStream(103, seed=5, lengths=lengths, pool_batches=4)
    batches = [stream.indices(k * 8, 8) for k in range(12)]  # 3 pools of 4 batches
    for pool in range(3):
        group = batches[pool * 4 : (pool + 1) * 4]
        plain = ShuffledStream(103, seed=5).indices(pool * 32, 32)
        assert sorted(i for b in group for i in b) == sorted(plain)  # same items, regrouped
        spans = sorted((lengths[b].min(), lengths[b].max()) for b in group)
        assert all(hi <= lo_next for (_, hi), (lo_next, _) in zip(spans, spans[1:]))
    again = ShuffledStream(103, seed=5, lengths=lengths, pool_batches=4)
    assert [again.indices(k * 8, 8) for k in (7, 2, 11)] == [batches[7], batches[2], batches[11]]
    with pytest.raises(ValueError, match="whole batches"):
        stream.indices(3, 8)


def test_length_buckets_cut_padding_and_keep_rank_shards_consistent():
    plain, bucketed = build_task_data(_pairs_cfg()), build_task_data(_pairs_cfg(length_buckets=8))

    def padding(data):
        batches = [data.train_batch(step, 16) for step in range(8)]
        return sum(int((~b.src_mask).sum() + (~b.tgt_mask).sum()) for b in batches)

    assert padding(bucketed) < padding(plain) / 2
    whole = bucketed.train_batch(5, 8)
    shards = [bucketed.train_batch(5, 4, shard=r, shards=2) for r in range(2)]
    rows = {tuple(r[m].tolist()) for s in shards for r, m in zip(s.src, s.src_mask)}
    assert rows == {tuple(r[m].tolist()) for r, m in zip(whole.src, whole.src_mask)}
    with pytest.raises(ValueError, match="length_buckets"):
        _pairs_cfg(length_buckets=-1)


@pytest.mark.parametrize(
    "kind,fast", [("encoder_decoder", False), ("encoder_decoder", True), ("lstm_seq2seq", False)]
)
def test_real_only_logits_are_the_padded_logits_at_real_positions(kind, fast):
    data = build_task_data(_pairs_cfg())
    batch = data.train_batch(0, 40)  # > fast.packing.GROUP_ROWS: fast attention on row groups
    model = build_model(_tiny_config(data, kind), fast=fast).eval()
    args = dict(src_mask=batch.src_mask, tgt_mask=batch.tgt_mask)
    full = model(batch.src, batch.tgt_in, **args).logits  # (B, T, V)
    real = model(batch.src, batch.tgt_in, real_only=True, **args).logits  # (N, V)
    assert not batch.tgt_mask.all() and real.shape == (int(batch.tgt_mask.sum()), full.size(-1))
    assert torch.allclose(real, full[batch.tgt_mask], atol=1e-5)
    no_mask = model(batch.src[:2, :3], batch.tgt_in[:2, :4], real_only=True).logits
    assert no_mask.shape == (8, full.size(-1))


def test_seq2seq_loss_is_label_smoothed_cross_entropy_over_real_targets():
    data = build_task_data(_pairs_cfg())
    batch = data.train_batch(1, 16)
    cfg = _tiny_config(data)
    model = build_model(cfg).eval()
    logits = model(
        batch.src, batch.tgt_in, src_mask=batch.src_mask, tgt_mask=batch.tgt_mask
    ).logits  # (B, T, V)
    targets = batch.tgt_out.masked_fill(~batch.tgt_mask, -100)
    expected = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), reduction="sum", label_smoothing=0.1
    )
    loss = batch_loss(model, batch, "seq2seq", label_smoothing=0.1)
    assert torch.allclose(loss.total, expected, rtol=1e-5)
