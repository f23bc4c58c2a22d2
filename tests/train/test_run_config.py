"""Run configs (attnlab.train.run_config): validation, TOML round trips, CLI overrides."""

from __future__ import annotations

import dataclasses
import json

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.train.run_config import (
    RunConfig,
    TrainConfig,
    dump_toml,
    load_toml,
    merge_overrides,
)


def write(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_valid_and_tables_do_not_share_names():
    rc = RunConfig()
    assert rc.train.task == "seq2seq" and rc.train.betas == (0.9, 0.95)
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not model_fields & train_fields  # so a bare --flag names exactly one field


def test_toml_round_trip(tmp_path):
    rc = RunConfig(
        ModelConfig(kind="classifier", n_classes=4, d_model=48, n_heads=3, d_ff=96, dropout=0.1),
        TrainConfig(
            task="classify",
            data='C:\\data\\"quoted" ünï\ttab.csv',
            val_data="v.csv",
            lr=3e-4,
            min_lr=1e-16,
            betas=(0.8, 0.99),
            max_src_len=40,
            compile=True,
            keep_last=0,
            best_metric="val_accuracy",
        ),
    )
    text = dump_toml(rc)
    assert "[model]" in text and "[train]" in text and "tgt_vocab_size" not in text  # None omitted
    assert load_toml(write(tmp_path, text)) == rc
    assert dump_toml(load_toml(write(tmp_path, text))) == text


@settings(max_examples=60, deadline=None)
@given(
    st.text(min_size=1).filter(lambda s: s.strip() and "\x00" not in s),
    st.floats(1e-12, 1.0),
    st.integers(1, 10**9),
)
def test_toml_values_round_trip(data, lr, seed):
    train = TrainConfig(data=data, lr=lr, min_lr=0.0, seed=seed)
    parsed = tomllib.loads(dump_toml(RunConfig(train=train)))
    assert TrainConfig.from_dict(parsed["train"]) == train


@pytest.mark.parametrize("field", ["data", "val_data", "out", "init_from"])
def test_a_path_with_a_nul_character_is_refused_by_name(field):
    # Found by the round trip above: os.path.expanduser("~\x00") raised "embedded null byte".
    with pytest.raises(ConfigError, match=rf"train\.{field}='~\\x00' contains a NUL character"):
        TrainConfig(**{field: "~\x00"})


def test_partial_file_uses_defaults_and_normalises_types(tmp_path):
    rc = load_toml(write(tmp_path, "[train]\nlr = 1\nbetas = [0.9, 1e-1]\n[model]\nd_model = 64\n"))
    assert rc.train.lr == 1.0 and isinstance(rc.train.lr, float)
    assert rc.train.betas == (0.9, 0.1) and isinstance(rc.train.betas, tuple)
    assert rc.model == ModelConfig(d_model=64) and rc.train.steps == TrainConfig().steps


def test_unknown_keys_list_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"'lrate'.*valid TrainConfig keys are: task, data"):
        load_toml(write(tmp_path, "[train]\nlrate = 0.1\n"))
    with pytest.raises(ConfigError, match=r"'d_modle' \(did you mean 'd_model'\?\)"):
        load_toml(write(tmp_path, "[model]\nd_modle = 64\n"))
    with pytest.raises(ConfigError, match=r"unknown table.*\['optim'\].*\[model\] and \[train\]"):
        load_toml(write(tmp_path, "[optim]\nlr = 0.1\n"))
    with pytest.raises(ConfigError, match=r"\[train\] must be a table"):
        load_toml(write(tmp_path, "train = 3\n"))


def test_syntax_errors_name_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 3.*fix that line"):
        load_toml(write(tmp_path, '[train]\ntask = "lm"\nsteps = \n'))
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")
    (tmp_path / "latin1.toml").write_bytes(b'[train]\ndata = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_toml(tmp_path / "latin1.toml")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"task": "translate"}, r"train.task='translate' must be one of \['lm', 'seq2seq'"),
        ({"tokenizer": "word"}, "must be one of"),
        ({"optimizer": "sgd"}, "must be one of"),
        ({"dtype": "fp16"}, "must be one of"),
        ({"batch_size": 0}, "batch_size=0 must be > 0"),
        ({"grad_accum": -1}, "must be > 0"),
        ({"keep_last": -1}, "keep_last=-1 must be >= 0"),
        ({"lr": 0.0}, "lr=0.0 must be a finite number > 0"),
        ({"lr": float("inf")}, "finite"),
        ({"min_lr": 0.5, "lr": 0.1}, "min_lr=0.5 must be between 0 and lr=0.1"),
        ({"betas": (0.9, 1.0)}, r"betas=\[0.9, 1.0\] must be two numbers in \[0, 1\)"),
        ({"betas": (0.9,)}, "must be a list of 2 values"),
        ({"label_smoothing": 1.0}, "label_smoothing=1.0 must be in"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"warmup_steps": 300, "steps": 200}, "warmup_steps=300 must not exceed steps=200"),
        ({"device": "gpu"}, "device='gpu' must be 'auto', 'cpu'"),
        ({"max_src_len": 0}, "max_src_len=0 must be > 0"),
        ({"out": " "}, "out=' ' must not be empty"),
        ({"lr": "3e-4"}, r"lr='3e-4' \(str\) must be a number \(in TOML: no quotes"),
        ({"steps": 10.5}, r"steps=10.5 \(float\) must be a whole number"),
        ({"steps": True}, "must be a whole number"),
        ({"compile": 1}, "compile=1 (int) must be true or false"),
        ({"data": 5}, "must be a string"),
    ],
)
def test_bad_values_are_named(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(int)", r"\(int\)")):
        TrainConfig(**changes)
    with pytest.raises(ValueError):  # a ConfigError for the CLI, a ValueError for Python callers
        TrainConfig(**changes)


def test_bad_model_values_in_a_file(tmp_path):
    with pytest.raises(ConfigError, match=r"ModelConfig.dropout='0.1' \(str\) must be a number"):
        load_toml(write(tmp_path, '[model]\ndropout = "0.1"\n'))
    with pytest.raises(ConfigError, match=r"run.toml: \[model\] d_model=30 must be divisible"):
        load_toml(write(tmp_path, "[model]\nd_model = 30\nn_heads = 4\n"))


def test_merge_overrides():
    base = RunConfig(ModelConfig(d_model=64), TrainConfig(lr=1e-3, seed=1))
    flags = {
        "lr": 3e-4,
        "d-model": 32,
        "--n-heads": 2,
        "model.dropout": "0.2",
        "train.betas": "[0.8, 0.9]",
        "seed": None,
        "data": "reverse",
    }
    rc = merge_overrides(base, flags)
    assert (rc.train.lr, rc.train.seed, rc.train.betas, rc.train.data) == (
        3e-4,
        1,
        (0.8, 0.9),
        "reverse",
    )
    assert (rc.model.d_model, rc.model.n_heads, rc.model.dropout) == (32, 2, 0.2)
    assert base.train.lr == 1e-3  # frozen: the original is unchanged
    with pytest.raises(ConfigError, match=r"unknown setting 'lrate'.*valid settings are: "):
        merge_overrides(base, {"lrate": 1.0})
    with pytest.raises(ConfigError, match=r"'train.d_model'"):
        merge_overrides(base, {"train.d_model": 32})  # d_model lives in [model]
    with pytest.raises(ConfigError, match=r"command-line flags: train.steps=0 must be > 0"):
        merge_overrides(base, {"steps": 0})
    with pytest.raises(ConfigError, match="cannot read lr='3e-4x' as a value"):
        merge_overrides(base, {"lr": "3e-4x"})


def test_dict_round_trip_through_json_and_derived_values():
    train = TrainConfig(best_metric="val_exact_match", batch_size=8, grad_accum=4)
    assert TrainConfig.from_dict(json.loads(json.dumps(train.to_dict()))) == train
    assert train.higher_is_better and not TrainConfig().higher_is_better
    assert train.effective_batch_size == 32
    assert train.replace(steps=10, warmup_steps=5).steps == 10
    rc = RunConfig(train=train)
    assert RunConfig.from_dict(json.loads(json.dumps(rc.to_dict()))) == rc


def test_an_unknown_best_metric_is_rejected_up_front():
    from attnlab.train.run_config import ConfigValueError, TrainConfig

    with pytest.raises(
        ConfigValueError,
        match=r"'bogus' is not a metric of task 'seq2seq'.*"
        r"'val_exact_match'.*best_metric='val_exact_match'",
    ):
        TrainConfig(best_metric="bogus")
    with pytest.raises(ConfigValueError, match=r"\['val_loss', 'val_ppl'\]"):
        TrainConfig(task="lm", data="x.txt", best_metric="val_exact_match")
    with pytest.raises(ConfigValueError, match="val_bleu"):  # generated tasks have no BLEU
        TrainConfig(best_metric="val_bleu")
    assert TrainConfig(data="pairs.tsv", best_metric="val_bleu").higher_is_better
    assert TrainConfig(task="classify", data="parens", best_metric="val_accuracy")


def test_cli_rejects_an_unknown_best_metric_before_training(tmp_path, capsys):
    from attnlab.cli import main

    out = tmp_path / "run"
    assert main(["train", "--task", "reverse", "--best-metric", "bogus", "--out", str(out)]) == 2
    assert "not a metric of task 'seq2seq'" in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_paths_in_a_train_config_expand_home_and_variables(tmp_path, monkeypatch):
    from attnlab.train.run_config import TrainConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CORPORA", str(tmp_path / "corpora"))
    cfg = TrainConfig(task="lm", data="$CORPORA/text.txt", out="~/runs/x")
    assert cfg.data == str(tmp_path / "corpora" / "text.txt")
    assert cfg.out == str(tmp_path / "runs" / "x")
    assert TrainConfig(data="dates").data == "dates"
