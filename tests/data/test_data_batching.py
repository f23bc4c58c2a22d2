"""Collation (shapes, masks, teacher-forcing shift), the bucket sampler and deterministic splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data import (
    BucketBatchSampler,
    CharTokenizer,
    LabelSet,
    collate_labelled,
    collate_pairs,
    encode_labelled,
    encode_pairs,
    make_task,
    split_items,
)

PAD, BOS, EOS = 0, 1, 2
id_lists = st.lists(st.integers(min_value=3, max_value=20), min_size=1, max_size=9)


@given(st.lists(st.tuples(id_lists, st.lists(st.integers(3, 20), max_size=9)), min_size=1))
@settings(max_examples=50, deadline=None)
def test_collate_pairs_shapes_masks_and_shift(pairs):
    batch = collate_pairs(pairs, PAD, BOS, EOS)
    B, S, T = len(pairs), max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs) + 1
    assert batch.src.shape == batch.src_mask.shape == (B, S)
    assert batch.tgt_in.shape == batch.tgt_out.shape == batch.tgt_mask.shape == (B, T)
    assert batch.src_mask.dtype == batch.tgt_mask.dtype == torch.bool
    assert batch.src.dtype == batch.tgt_in.dtype == torch.int64
    for i, (src, tgt) in enumerate(pairs):
        n = len(tgt) + 1
        assert batch.src[i, : len(src)].tolist() == src
        assert batch.src_mask[i].tolist() == [True] * len(src) + [False] * (S - len(src))
        assert batch.tgt_in[i, :n].tolist() == [BOS, *tgt]
        assert batch.tgt_out[i, :n].tolist() == [*tgt, EOS]
        assert batch.tgt_mask[i].sum() == n
    assert (batch.src[~batch.src_mask] == PAD).all()
    assert (batch.tgt_in[~batch.tgt_mask] == PAD).all()
    assert (batch.tgt_out[~batch.tgt_mask] == PAD).all()
    # teacher forcing: the input at t+1 is the target at t
    real_next = batch.tgt_mask[:, 1:]
    assert torch.equal(batch.tgt_in[:, 1:][real_next], batch.tgt_out[:, :-1][real_next])


def test_collate_errors():
    with pytest.raises(ValueError, match="pair 1 has an empty source"):
        collate_pairs([([5], [6]), ([], [7])], PAD, BOS, EOS)
    with pytest.raises(ValueError, match="empty batch"):
        collate_pairs([], PAD, BOS, EOS)


def test_collate_labelled_and_encode_helpers():
    tok = CharTokenizer.train(["abc"])
    labels = LabelSet(["no", "yes"])
    examples = encode_labelled([("ab", "yes"), ("cab", "no")], tok, labels)
    batch = collate_labelled(examples, tok.pad_id)
    assert batch.ids.shape == batch.mask.shape == (2, 3)
    assert batch.mask.tolist() == [[True, True, False], [True, True, True]]
    assert batch.labels.tolist() == [1, 0]
    pairs = encode_pairs(make_task("reverse", alphabet="abc").make_pairs(5, seed=0), tok)
    batch = collate_pairs(pairs, tok.pad_id, tok.bos_id, tok.eos_id)
    src = tok.decode(batch.src[0][batch.src_mask[0]])
    assert tok.decode(batch.tgt_out[0]) == src[::-1]


# Bucket sampler -----------------------------------------------------------------------------
@pytest.fixture
def lengths():
    return np.random.default_rng(0).integers(1, 60, size=500).tolist()


def test_bucket_sampler_covers_every_index_once(lengths):
    sampler = BucketBatchSampler(lengths, batch_size=16, seed=1)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 16 for b in batches) and len(sampler) == len(batches)


def test_bucket_sampler_is_deterministic_per_seed_and_epoch(lengths):
    a = BucketBatchSampler(lengths, batch_size=16, seed=1)
    b = BucketBatchSampler(lengths, batch_size=16, seed=1)
    assert a.batches(epoch=0) == b.batches(epoch=0)
    assert a.batches(epoch=0) != a.batches(epoch=1)
    b.set_epoch(1)
    assert list(b) == a.batches(epoch=1)
    assert a.batches(0) != BucketBatchSampler(lengths, batch_size=16, seed=2).batches(0)


def test_bucketing_reduces_padding(lengths):
    def padded(batches):
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    bucketed = BucketBatchSampler(lengths, batch_size=16, seed=0).batches()
    order = np.random.default_rng(0).permutation(len(lengths)).tolist()
    random_batches = [order[i : i + 16] for i in range(0, len(order), 16)]
    assert padded(bucketed) < 0.75 * padded(random_batches)


def test_token_budget(lengths):
    batches = BucketBatchSampler(lengths + [500], max_tokens=256, seed=0).batches()
    for b in batches:
        longest = max((lengths + [500])[i] for i in b)
        assert len(b) * longest <= 256 or len(b) == 1  # an oversize example rides alone
    assert [len(lengths)] in batches


def test_ranks_split_batches_without_overlap(lengths):
    sampler = BucketBatchSampler(lengths, batch_size=8, seed=0)
    parts = [sampler.batches(epoch=2, rank=r, world_size=3) for r in range(3)]
    flat = [i for part in parts for b in part for i in b]
    assert sorted(flat) == list(range(len(lengths)))


def test_bucket_sampler_validation(lengths):
    with pytest.raises(ValueError, match="exactly one of batch_size or max_tokens"):
        BucketBatchSampler(lengths)
    with pytest.raises(ValueError, match="seed=-1"):
        BucketBatchSampler(lengths, batch_size=4, seed=-1)
    with pytest.raises(ValueError, match="rank=2"):
        BucketBatchSampler(lengths, batch_size=4).batches(rank=2, world_size=2)
    dropped = BucketBatchSampler([3] * 10, batch_size=4, drop_last=True).batches()
    assert sorted(len(b) for b in dropped) == [4, 4]


def test_works_as_dataloader_batch_sampler(lengths):
    data = list(range(len(lengths)))
    loader = torch.utils.data.DataLoader(
        data, batch_sampler=BucketBatchSampler(lengths, batch_size=32), collate_fn=list
    )
    assert sorted(i for b in loader for i in b) == data


# Splits -------------------------------------------------------------------------------------
@given(st.integers(0, 300), st.floats(0.0, 0.9), st.integers(0, 1000))
@settings(max_examples=50)
def test_split_items_is_a_deterministic_partition(n, fraction, seed):
    items = list(range(n))
    train, val = split_items(items, fraction, seed)
    assert (train, val) == split_items(items, fraction, seed)
    assert sorted(train + val) == items and not set(train) & set(val)
    assert len(val) == round(n * fraction)
    assert train == sorted(train) and val == sorted(val)  # original order kept


def test_split_items_validation():
    with pytest.raises(ValueError, match="val_fraction"):
        split_items([1, 2], 1.5)
