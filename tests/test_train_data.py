"""Task data of training runs: deterministic streams, rank shards, held-out sets, evaluation."""

from __future__ import annotations

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
    cfg = fit_model_config(ModelConfig(kind="encoder_decoder", d_model=16, n_heads=2,
                                       n_layers=1, d_ff=32, max_len=32), data)  # fmt: skip
    model = build_model(cfg).eval()
    batch = data.val_batches(8, 1)[0]
    tok = data.tokenizer
    outs = greedy_decode(model, batch.src, batch.src_mask, bos_id=tok.bos_id, eos_id=tok.eos_id,
                         max_new_tokens=12)  # fmt: skip
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
    data = PairData(CharTokenizer(task.characters()), task.make_pairs(300, seed=0),
                    task.make_pairs(64, seed=1), seed=0, origin="copy")  # fmt: skip
    cfg = fit_model_config(ModelConfig(kind="encoder_decoder", d_model=16, n_heads=2,
                                       n_layers=1, d_ff=32, max_len=8), data)  # fmt: skip
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), 1e-2)
    for step in range(20):  # enough for some, not all, examples to be right
        loss = batch_loss(model, data.train_batch(step, 32), "seq2seq")
        (loss.total / loss.count).backward()
        opt.step()
        opt.zero_grad()
    res = evaluate(model, data, batch_size=64, max_batches=1)
    batch = data.val_batches(64, 1)[0]
    with torch.no_grad():
        model.eval()
        logits = model(batch.src, batch.tgt_in, src_mask=batch.src_mask,
                       tgt_mask=batch.tgt_mask).logits  # fmt: skip
    forced = correct_predictions(logits, batch, "seq2seq").tolist()
    assert forced == [p.correct for p in res.predictions]
    assert 0 < sum(forced) < len(forced)  # both outcomes occur, so the comparison has teeth
    assert {"val_loss", "val_ppl", "val_exact_match", "val_bleu", "val_chrf"} == set(res.metrics)


def test_loss_sums_and_counts_ignore_padding():
    data = build_task_data(_pairs_cfg())
    batch = data.train_batch(0, 16)
    cfg = fit_model_config(ModelConfig(kind="encoder_decoder", d_model=16, n_heads=2,
                                       n_layers=1, d_ff=32, max_len=32), data)  # fmt: skip
    model = build_model(cfg).eval()
    loss = batch_loss(model, batch, "seq2seq")
    assert loss.count == target_count(batch, "seq2seq") == int(batch.tgt_mask.sum())
    s, t = int(batch.src_mask[0].sum()), int(batch.tgt_mask[0].sum())
    padded = type(batch)(*(x[:1] for x in batch))  # row 0 with the batch's padding
    alone = type(batch)(padded.src[:, :s], padded.src_mask[:, :s], padded.tgt_in[:, :t],
                        padded.tgt_out[:, :t], padded.tgt_mask[:, :t])  # fmt: skip
    assert s < batch.src.size(1) or t < batch.tgt_in.size(1)  # row 0 really is padded
    a, b = batch_loss(model, padded, "seq2seq"), batch_loss(model, alone, "seq2seq")
    assert a.count == b.count == t and torch.allclose(a.total, b.total, atol=1e-5)


def test_classification_data_and_accuracy():
    cfg = TrainConfig(task="classify", data="parens", n_train=100, n_val=30)
    data = build_task_data(cfg)
    mcfg = fit_model_config(ModelConfig(kind="classifier", n_classes=2, d_model=16, n_heads=2,
                                        n_layers=1, d_ff=32, max_len=32), data)  # fmt: skip
    assert mcfg.n_classes == 2 and mcfg.vocab_size == data.tokenizer.vocab_size
    batch = data.train_batch(0, 8)
    assert bool((batch.ids[:, 0] == data.tokenizer.bos_id).all())  # the CLS position
    res = evaluate(build_model(mcfg), data, batch_size=16, max_batches=10)
    assert set(res.metrics) == {"val_loss", "val_accuracy"} and len(res.predictions) == 30
