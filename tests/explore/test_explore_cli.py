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
