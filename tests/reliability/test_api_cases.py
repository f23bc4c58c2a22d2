"""Bad input from Python, one table: each call raises one exception of the stated type whose
message names the field (or argument) and what to do, never a bare error from deep inside."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from attnlab.budget import MemoryBudgetError
from attnlab.checkpoint import save_checkpoint
from attnlab.config import ModelConfig
from attnlab.generate import GenerationConfig, generate
from attnlab.inspect import run_with_cache
from attnlab.models import build_model
from attnlab.train import RunConfig, TrainConfig, train
from tiny_configs import tiny_config

NAN, INF = math.nan, math.inf
LM_CFG = tiny_config("decoder_lm", vocab_size=12)


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return build_model(LM_CFG).eval()


def _nan_copy(model):
    broken = copy.deepcopy(model)
    with torch.no_grad():
        for p in broken.parameters():
            p.fill_(NAN)
    return broken


def _meta_copy(cfg):
    with torch.device("meta"):
        return build_model(cfg)


def _stop_at(tmp_path):
    run = TrainConfig(task="seq2seq", data="reverse", steps=2, warmup_steps=1)
    cfg = RunConfig(tiny_config("encoder_decoder", max_len=24), run)
    return train(cfg, run_dir=tmp_path / "run", stop_at=-5)


def _save_other_kind(tmp_path, lm):
    other = tiny_config("encoder_decoder", vocab_size=12)
    return save_checkpoint(tmp_path / "run", model=lm, config=other, step=1)


IDS = torch.tensor([[1, 2, 3]])
CASES = [
    ("ModelConfig(norm_eps=nan)", lambda t, m: ModelConfig(norm_eps=NAN), ValueError,
     "norm_eps=nan must be a finite number"),
    ("ModelConfig(rope_base=nan)", lambda t, m: ModelConfig(rope_base=NAN), ValueError,
     "rope_base=nan must be a finite number"),
    ("ModelConfig(ffn_mult=nan)", lambda t, m: ModelConfig(ffn_mult=NAN), ValueError,
     "ffn_mult=nan must be a finite number"),
    ("ModelConfig(ffn_mult=inf)", lambda t, m: ModelConfig(ffn_mult=INF), ValueError,
     "ffn_mult=inf must be a finite number"),
    ("TrainConfig(weight_decay=inf)", lambda t, m: TrainConfig(weight_decay=INF), ValueError,
     "weight_decay=inf must be a finite number >= 0"),
    ("train(stop_at=-5)", lambda t, m: _stop_at(t), ValueError, "stop_at=-5 must be a global step"),
    ("save_checkpoint with a config of another kind", _save_other_kind, ValueError,
     "save with the ModelConfig the model was built from"),
    ("build_model of d_model 1e6", lambda t, m: build_model(ModelConfig(d_model=10**6)),
     MemoryBudgetError, "make it smaller"),
    ("run_with_cache(names=123)", lambda t, m: run_with_cache(m, IDS, names=123), ValueError,
     "is not a selection"),
    ("run_with_cache(names=[1, 2])", lambda t, m: run_with_cache(m, IDS, names=[1, 2]),
     ValueError, "must hold names or globs"),
    ("generate with a dict config",
     lambda t, m: generate(m, [[1, 2]], {"max_new_tokens": 3}), TypeError,
     "GenerationConfig(**settings)"),
    ("sampling from NaN weights",
     lambda t, m: generate(_nan_copy(m), [[1, 2]], GenerationConfig(max_new_tokens=2, seed=0)),
     ValueError, "logits hold NaN or inf"),
    ("greedy decoding of NaN weights",
     lambda t, m: generate(_nan_copy(m), [[1, 2]], GenerationConfig(max_new_tokens=2,
                                                                     temperature=0)),
     ValueError, "logits hold NaN or inf"),
    ("beam search of NaN weights",
     lambda t, m: generate(_nan_copy(m), [[1, 2]], GenerationConfig(max_new_tokens=2,
                                                                     num_beams=2)),
     ValueError, "logits hold NaN or inf"),
    ("a meta-device model", lambda t, m: generate(_meta_copy(LM_CFG), [[1, 2]]), ValueError,
     "meta device"),
    ("pad_token_id beyond the vocabulary",
     lambda t, m: generate(m, [[1], [1, 2]], GenerationConfig(max_new_tokens=2, seed=0,
                                                              pad_token_id=99)),
     ValueError, "pad_token_id=99 is not a token of the model"),
    ("GenerationConfig(temperature=1e-45)", lambda t, m: GenerationConfig(temperature=1e-45),
     ValueError, "use 0"),
    ("GenerationConfig(length_penalty=1e308)",
     lambda t, m: GenerationConfig(length_penalty=1e308), ValueError, "must be between"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_python_input_is_one_clear_error(tmp_path, lm, call, error, words):
    with pytest.raises(error) as caught:
        call(tmp_path, lm)
    assert words in str(caught.value)
    assert not (tmp_path / "run").exists()  # nothing was written


def test_the_gpu_budget_reads_the_devices_free_memory(monkeypatch):
    import torch

    from attnlab import budget
    from attnlab.budget import MemoryBudgetError, check_allocation

    monkeypatch.setattr(budget, "gpu_available_bytes", lambda device: 2 * budget.GIB)
    check_allocation(budget.GIB, "a model", "shrink it", device=torch.device("cuda:0"))
    with pytest.raises(MemoryBudgetError, match=r"cuda:0 has 2\.0 GiB available; shrink it"):
        check_allocation(3 * budget.GIB, "a model", "shrink it", device=torch.device("cuda:0"))


def test_a_model_is_checked_against_the_gpus_free_memory(monkeypatch):
    import torch

    from attnlab import budget
    from attnlab.budget import MemoryBudgetError
    from attnlab.config import ModelConfig
    from attnlab.models.build import check_model_memory

    cfg = ModelConfig(kind="decoder_lm", d_model=32, n_heads=2, n_layers=1, max_len=16)
    monkeypatch.setattr(budget, "gpu_available_bytes", lambda device: 1024)  # a 1 KiB GPU
    check_model_memory(cfg, copies=4)  # the machine's memory: fits
    with pytest.raises(MemoryBudgetError, match="on cuda:0 needs about .* but cuda:0 has"):
        check_model_memory(cfg, copies=4, purpose=" on cuda:0", device=torch.device("cuda:0"))
