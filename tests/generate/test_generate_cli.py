"""``attnlab generate`` end to end on tiny saved checkpoints: output equals the Python API, seeds
repeat, seq2seq sources from text and files, and every bad input is one clear paragraph."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.generate import GenerationConfig, generate, generate_seq2seq
from saved_models import TOK, save  # noqa: F401 - shared helpers


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    return {
        "lm": save(root, "decoder_lm", "lm"),
        "s2s": save(root, "encoder_decoder", "s2s"),
        "clf": save(root, "classifier", "clf", n_classes=2),
    }


def cli(capsys, *argv):
    code = main(["generate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_cli(capsys, path, flags: str, *values: str):
    """`attnlab generate --checkpoint PATH` + the space-separated ``flags`` + raw ``values``."""
    return cli(capsys, "--checkpoint", path, *flags.split(), *values)


def test_lm_output_streams_the_prompt_and_the_generated_text(runs, capsys):
    path, model = runs["lm"]
    code, out, _ = run_cli(capsys, path, "--temperature 0 --max-new-tokens 12 --prompt", "the ")
    want = generate(
        model, "the ", GenerationConfig(temperature=0, max_new_tokens=12), tokenizer=TOK
    )
    assert code == 0 and out == "the " + want.texts[0] + "\n"


def test_seeded_samples_repeat_and_are_separated(runs, capsys):
    path, model = runs["lm"]
    flags = "--seed 5 --num-samples 2 --top-p 0.9 --max-new-tokens 15 --prompt"
    args = ("--checkpoint", path, *flags.split(), "")
    _, first, _ = cli(capsys, *args)
    _, again, _ = cli(capsys, *args, "--no-stream")
    assert first == again and first.count("\n---\n") == 1
    sample2 = generate(
        model, "", GenerationConfig(seed=6, top_p=0.9, max_new_tokens=15), tokenizer=TOK
    )
    assert first.endswith("---\n" + sample2.texts[0] + "\n")
    _, _, err = cli(capsys, "--checkpoint", path, "--max-new-tokens", "3")
    assert "attnlab: seed " in err  # a fresh seed is reported so the sample can be repeated


def test_beams_print_the_n_best(runs, capsys):
    path, model = runs["lm"]
    code, out, err = run_cli(
        capsys, path, "--prompt ab --beams 3 --num-samples 2 --max-new-tokens 6"
    )
    res = generate(model, "ab", GenerationConfig(num_beams=3, max_new_tokens=6), tokenizer=TOK)
    assert out.splitlines() == ["ab" + TOK.decode(h.tokens) for h in res.nbest[0][:2]]
    assert err.count("[score") == 2


def test_seq2seq_source_and_source_file(runs, capsys, tmp_path):
    path, model = runs["s2s"]
    cfg = GenerationConfig(temperature=0, max_new_tokens=10)
    code, out, _ = run_cli(capsys, path, "--source abc --temperature 0 --max-new-tokens 10")
    assert code == 0
    assert out == generate_seq2seq(model, "abc", cfg, tokenizer=TOK).texts[0] + "\n"
    src = tmp_path / "src.txt"
    src.write_text("abc\nhello there\nz\n", encoding="utf-8")
    code, out, _ = run_cli(
        capsys, path, "--temperature 0 --max-new-tokens 10 --source-file", str(src)
    )
    want = generate_seq2seq(model, ["abc", "hello there", "z"], cfg, tokenizer=TOK).texts
    assert out.splitlines() == want


def test_long_prompt_warning_goes_to_stderr(runs, capsys):
    path, _ = runs["lm"]
    code, out, err = run_cli(capsys, path, "--temperature 0 --max-new-tokens 5 --prompt", "ab" * 30)
    assert code == 0 and "attnlab: warning: prompt 0 has 60 tokens" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "run,argv,message",
    [
        ("lm", ["--prompt", "abc!"], "'!' at 3"),
        ("lm", ["--prompt", "a", "--top-p", "1.5"], "top_p must be in (0, 1] (1 = off), got 1.5"),
        ("lm", ["--prompt", "a", "--top-p", "1.5"], "(on the command line: --top-p)"),
        ("lm", ["--prompt", "a", "--temperature", "-1"], "--temperature"),
        ("lm", ["--prompt", "a", "--beams", "0"], "--beams"),
        ("lm", ["--prompt", "a", "--beams", "2", "--top-k", "5"], "top_k/top_p"),
        ("lm", ["--prompt", "a", "--beams", "2", "--num-samples", "3"], "raise --beams"),
        ("lm", ["--source", "a"], "is a language model: give --prompt"),
        ("s2s", ["--prompt", "a"], "is a sequence-to-sequence model: give --source TEXT"),
        ("s2s", ["--source", ""], "source 0 is empty"),
        ("s2s", ["--source-file", "/nonexistent/x.txt"], "does not exist"),
        ("clf", ["--prompt", "a"], "predicts labels, not text"),
    ],
)
def test_bad_input_is_one_clear_paragraph(runs, capsys, run, argv, message):
    code, out, err = cli(capsys, "--checkpoint", runs[run][0], *argv)
    assert code != 0 and message in " ".join(err.split())
    assert "Traceback" not in err and err.startswith("attnlab:")
