"""Property-based fuzzing of the numbers a user can type: the CLI's numeric options (through the
CLI's own main, in process: --dump-config resolves and validates a run without training) and
every field of the configs. Whatever the value, the answer is a config or one clear error."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.cli import main
from attnlab.cli.train_cmd import FLAG_FIELDS
from attnlab.config import ModelConfig
from attnlab.generate import GenerationConfig
from attnlab.train import TrainConfig

NUMERIC_FLAGS = sorted(f for f, (_, kind, _) in FLAG_FIELDS.items() if kind in (int, float))
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "-0", "0x10", "1_000", "", "abc"]),
)
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


@FAST
@given(flag=st.sampled_from(NUMERIC_FLAGS), value=NUMBERS)
def test_numeric_train_flags_give_a_config_or_one_clear_error(tmp_path, capsys, flag, value):
    out = tmp_path / "run.toml"
    out.unlink(missing_ok=True)  # tmp_path is shared by the examples
    argv = ["train", "--task", "reverse", f"{flag}={value}", "--dump-config", str(out)]
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse: not a number of the flag's type
        code = stop.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code in (0, 2), err
    if code == 2:
        assert "error" in err and out.exists() is False
    else:  # what was written loads back and every number in it is finite
        from attnlab.train import load_toml

        loaded = load_toml(out)
        for table in (loaded.model, loaded.train):
            for f in dataclasses.fields(table):
                v = getattr(table, f.name)
                assert not (isinstance(v, float) and not math.isfinite(v)), (f.name, v)


def _values(hint) -> st.SearchStrategy:
    base = [st.none(), st.booleans(), st.text(max_size=5), NUMBERS]
    if hint is int or int in typing.get_args(hint):
        base.append(st.integers(min_value=-4, max_value=300))
    return st.one_of(*base)


# config class -> (the errors a bad value may raise, words one of them may name instead of the
# field: a bad value can break a rule between fields, e.g. d_model % n_heads or min_lr <= lr)
CONFIGS = {
    ModelConfig: ((ValueError, TypeError), ("n_heads", "d_")),
    TrainConfig: ((ValueError,), ("best_metric", "min_lr")),
}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_config_fields_give_a_config_or_a_value_error(config, data):
    hints = typing.get_type_hints(config)
    errors, related = CONFIGS[config]
    name = data.draw(st.sampled_from(sorted(hints)))
    value = data.draw(_values(hints[name]))
    try:
        cfg = config(**{name: value})
    except errors as err:
        assert name in str(err) or any(word in str(err) for word in related), str(err)
        return
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        assert not (isinstance(v, float) and not math.isfinite(v)), (f.name, v)


GENERATION_NUMBERS = ["temperature", "top_p", "repetition_penalty", "length_penalty", "top_k",
                      "max_new_tokens", "num_beams"]  # fmt: skip


@FAST
@given(name=st.sampled_from(GENERATION_NUMBERS), value=NUMBERS)
def test_generation_numbers_give_a_config_or_a_value_error(name, value):
    try:
        GenerationConfig(**{name: value})
    except ValueError as err:
        assert name in str(err), str(err)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e-45, 1e-300])
def test_sampling_temperatures_that_overflow_are_refused(value):
    with pytest.raises(ValueError, match="temperature"):
        GenerationConfig(temperature=value)


GENERATE_FLAGS = ["--temperature", "--top-k", "--top-p", "--repetition-penalty", "--beams",
                  "--length-penalty", "--max-new-tokens", "--num-samples", "--seed"]  # fmt: skip


@FAST
@given(flag=st.sampled_from(GENERATE_FLAGS), value=NUMBERS)
def test_numeric_generate_flags_are_one_clear_error(tmp_path, capsys, flag, value):
    """The settings are checked before the checkpoint is read: whatever the number, a bad one is
    named (and a good one reaches the missing checkpoint's error), never a traceback."""
    argv = ["generate", "--checkpoint", str(tmp_path / "none"), "--prompt", "a", f"{flag}={value}"]
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "error" in err, err
