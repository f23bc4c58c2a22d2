"""``attnlab explore PATH``: what it opens (checkpoints, run dirs, local GPT-2 directories), what it
refuses (missing or damaged checkpoints, pickle), and a real server started by the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from attnlab.checkpoint import save_checkpoint
from attnlab.cli import build_parser, main
from attnlab.explore import Session, load
from explore_models import TOK, tiny_model

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    model = tiny_model("encoder_decoder")
    save_checkpoint(run, model=model, config=model.cfg, tokenizer=TOK, step=3)
    return run


def test_the_widget_opens_a_run_directory(run_dir):
    pytest.importorskip("anywidget")
    from attnlab.explore.widget import explore

    w = explore(run_dir, text="ab", source="cd")
    assert w.call("tokens", {"text": "ab", "source": "cd"})["source"]["ids"] == TOK.encode("cd")


def test_defaults_listen_on_loopback_only():
    args = build_parser().parse_args(["explore", "runs/x"])
    assert (args.host, args.port, args.device) == ("127.0.0.1", 8000, "cpu")


def test_loads_a_run_directory_with_its_tokenizer(run_dir):
    loaded = load(run_dir)
    assert loaded.model.cfg.kind == "encoder_decoder"
    assert loaded.tokenizer.vocab_size == TOK.vocab_size
    assert "step 3" in loaded.name
    session = Session(loaded.model, loaded.tokenizer)
    assert session.tokens("ab", "cd")["source"]["ids"] == TOK.encode("cd")


def test_the_first_view_is_an_input_from_the_runs_own_data(tmp_path):
    """A reverser opens on a validation source of its own task (not a string of its whole
    alphabet, longer than anything it was trained on); an LM on the first line of its text."""
    from attnlab.config import ModelConfig
    from attnlab.data import CharTokenizer, make_task
    from attnlab.models import build_model
    from attnlab.train.build_data import VAL_SEED_OFFSET
    from explore_models import TINY

    tok = CharTokenizer.train(["abcdefghijklmnopqrstuvwxyz the cat"])
    model = build_model(ModelConfig(kind="encoder_decoder", vocab_size=tok.vocab_size, **TINY))
    train = {"task": "seq2seq", "data": "reverse", "seed": 7}
    save_checkpoint(tmp_path / "rev", model=model, config=model.cfg, tokenizer=tok, step=1,
                    train_config=train)  # fmt: skip
    source = make_task("reverse").make_pairs(1, seed=7 + VAL_SEED_OFFSET)[0][0]
    loaded = load(tmp_path / "rev")
    assert loaded.example == source
    assert Session.from_loaded(loaded).example()["source"] == source
    text = tmp_path / "corpus.txt"
    text.write_text("\n  the cat sat  \nmore text\n")
    lm = build_model(ModelConfig(kind="decoder_lm", vocab_size=tok.vocab_size, **TINY))
    save_checkpoint(tmp_path / "lm", model=lm, config=lm.cfg, tokenizer=tok, step=1,
                    train_config={"task": "lm", "data": str(text), "seed": 0})  # fmt: skip
    assert Session.from_loaded(load(tmp_path / "lm")).example()["text"] == "the cat sat"
    (tmp_path / "corpus.txt").unlink()  # data no longer at hand: a generic example, no error
    assert load(tmp_path / "lm").example is None


@pytest.mark.parametrize("damage", ["missing", "truncated", "not-a-checkpoint"])
def test_missing_or_damaged_checkpoints_are_one_message(run_dir, tmp_path, capsys, damage):
    import shutil

    target = tmp_path / "ckpt"
    shutil.copytree(run_dir, target)
    weights = next(target.rglob("model.safetensors"))
    if damage == "missing":
        target = tmp_path / "nowhere"
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        target = tmp_path / "empty"
        target.mkdir()
    assert main(["explore", str(target), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error:") and "Traceback" not in err
    assert {
        "missing": "does not exist",
        "truncated": "truncated",
        "not-a-checkpoint": "no checkpoint",
    }[damage] in err.replace("\n  ", " ")


def test_a_local_gpt2_directory_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=300,
                                     n_positions=32, bos_token_id=0, eos_token_id=0)  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the cat sat on the mat", "attention is all you need"], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load(tmp_path)
    session = Session(loaded.model, loaded.tokenizer, name=loaded.name)
    text = "the cat sat"
    got = session.attention(text)["sites"]["decoder"]
    ids = torch.tensor([tok.encode(text).ids])
    with torch.no_grad():
        want = hf(ids, output_attentions=True).attentions
    assert got["rows"] == [session.tokenizer.token_to_str(i) for i in ids[0].tolist()]
    for layer, w in zip(got["layers"], want):
        np.testing.assert_allclose(layer, w[0].numpy(), atol=1e-5)
    nxt = session.next_token(text)["candidates"]
    with torch.no_grad():
        p = hf(ids).logits[0, -1].softmax(-1)
    np.testing.assert_allclose([c["p"] for c in nxt], p[[c["id"] for c in nxt]].numpy(), atol=1e-5)


def test_the_command_serves_until_interrupted(run_dir):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "explore", str(run_dir), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert "attnlab explore:" in line and "http://127.0.0.1:" in line, proc.stderr.read()
        url = line.split(" at ")[1].split()[0]
        info = httpx.get(url + "api/info", timeout=30).json()
        assert info["kind"] == "encoder_decoder" and info["seq2seq"]
        r = httpx.post(url + "api/attention", json={"text": "", "source": ""}, timeout=30)
        assert r.status_code == 400 and "source is empty" in r.json()["error"]
        assert httpx.get(url + "api/info", timeout=30).status_code == 200  # still serving
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode in (0, 130)


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_that_is_not_one_is_refused_before_the_model_loads(port, capsys, monkeypatch):
    import attnlab.cli.explore_cmd as explore_cmd

    monkeypatch.setattr(explore_cmd, "run", lambda args: pytest.fail("the command ran"))
    with pytest.raises(SystemExit) as stop:
        main(["explore", "no-such-model", "--port", port])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--port" in err and "port" in err.split("--port")[-1]
    assert "Traceback" not in err and "ValueError" not in err


def test_bad_devices_and_a_busy_port_are_one_message_each(run_dir, capsys):
    import socket

    assert main(["explore", str(run_dir), "--device", "foo", "--port", "0"]) != 0
    err = capsys.readouterr().err
    assert "'foo' is not a device" in err and "cpu" in err and "Traceback" not in err
    if not torch.cuda.is_available():
        assert main(["explore", str(run_dir), "--device", "cuda", "--port", "0"]) != 0
        assert "no usable CUDA device" in capsys.readouterr().err
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["explore", str(run_dir), "--port", str(port)]) != 0
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err
    assert "Traceback" not in err and "Errno" not in err
