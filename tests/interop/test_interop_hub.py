"""Models by hub id through a Hugging Face cache the test builds in the hub's own layout
(models--org--name/refs/main + snapshots/<commit>/...), with HF_HUB_OFFLINE=1: nothing is
downloaded. The online failures (no such repo, private, gated, unknown revision) are the hub
library's exceptions raised by a stand-in for ``snapshot_download``."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.errors import CheckpointError
from attnlab.interop import hub, load_checkpoint
from attnlab.interop.pretrained import load_pretrained
from hf_dirs import gpt2_dir

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")
transformers.logging.set_verbosity_error()

REPO = "tiny-org/tiny-gpt2"
MAIN, OLD = "a" * 40, "b" * 40  # the commits refs/main and the tag "v0" point at


def snapshot(cache: Path, repo: str, commit: str, ref: str = "main") -> Path:
    """The folder huggingface_hub reads for ``repo`` at ``ref`` (created, with the ref file)."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    path = folder / "snapshots" / commit
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A hub cache holding REPO at main and at tag v0 (other weights), and a pickle-only repo."""
    home = tmp_path_factory.mktemp("hf_home")
    cache = home / "hub"
    _, hf = gpt2_dir(snapshot(cache, REPO, MAIN), transformers)
    old = snapshot(cache, REPO, OLD, ref="v0")
    gpt2_dir(old, transformers)
    with torch.no_grad():
        old_model = transformers.GPT2LMHeadModel.from_pretrained(old)
        old_model.transformer.wte.weight.mul_(-1.0)
        old_model.save_pretrained(old)
    pickled = snapshot(cache, "tiny-org/pickle-only", MAIN)
    (pickled / "config.json").write_text((old / "config.json").read_text())
    return home, hf, old_model


@pytest.fixture
def offline(cache, monkeypatch):
    home, hf, old = cache
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hf, old


def logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return getattr(out, "logits", out)


def test_load_pretrained_by_hub_id_reads_the_cache_with_equal_logits(offline):
    hf, _ = offline
    found = load_pretrained(REPO)
    assert found.path.name == MAIN
    ids = torch.tensor([[5, 9, 2, 7, 1]])
    torch.testing.assert_close(logits(found.model, ids), logits(hf, ids), atol=1e-5, rtol=1e-5)
    assert found.tokenizer is not None


def test_revision_picks_the_tagged_snapshot(offline):
    _, old = offline
    found = load_pretrained(REPO, revision="v0")
    assert found.path.name == OLD
    ids = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(logits(found.model, ids), logits(old, ids), atol=1e-5, rtol=1e-5)
    assert load_checkpoint(REPO, revision="v0").path.name == OLD


def test_generate_by_hub_id_from_the_cli(offline, capsys, tmp_path):
    code = main(
        ["generate", "--checkpoint", REPO, "--prompt", "the cat", "--temperature", "0"]
        + ["--max-new-tokens", "4", "--no-stream", "--device", "cpu"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("the cat")
    out_dir = tmp_path / "export"
    code = main(
        ["export", "--checkpoint", REPO, "--revision", "v0", "--format", "hf"]
        + [
            "--out",
            str(out_dir),
        ]
    )
    assert code == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(out_dir)
    ids = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(logits(again, ids), logits(offline[1], ids), atol=1e-5, rtol=1e-5)


def test_home_and_environment_variables_expand_in_paths(offline, monkeypatch, tmp_path):
    hf, _ = offline
    gpt2_dir(tmp_path / "gpt2", transformers)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MODELS", str(tmp_path))
    assert load_pretrained("~/gpt2").path == tmp_path / "gpt2"
    assert load_checkpoint("$MODELS/gpt2").path == tmp_path / "gpt2"


def run_cli(capsys, *argv):
    code = main(list(argv))
    _, err = capsys.readouterr()
    return code, " ".join(err.split())


def test_offline_and_not_cached_is_one_sentence_naming_hf_download(offline, capsys, tmp_path):
    out = tmp_path / "exported"
    code, err = run_cli(
        capsys, "export", "--checkpoint", "tiny-org/absent", "--format", "hf", "--out", str(out)
    )
    assert code == 2
    assert "HF_HUB_OFFLINE" in err and "`hf download tiny-org/absent`" in err
    assert "huggingface-cli" not in err and "Traceback" not in err
    assert not out.exists()


def test_a_repo_without_safetensors_is_refused_without_reading_pickles(offline, capsys):
    code, err = run_cli(capsys, "generate", "--checkpoint", "tiny-org/pickle-only", "--prompt", "a")
    assert code == 2
    assert "no safetensors weights" in err and "pytorch_model.bin" in err


def test_revision_with_a_local_path_is_an_error(offline, tmp_path):
    gpt2_dir(tmp_path, transformers)
    with pytest.raises(CheckpointError, match="revision='v1' picks a version"):
        load_pretrained(tmp_path, revision="v1")


def test_only_config_safetensors_and_tokenizer_files_are_fetched():
    def fetched(name):
        return any(fnmatch.fnmatch(name, p) for p in hub.ALLOW_PATTERNS)

    for name in (
        "config.json",
        "model.safetensors",
        "model-00001-of-00002.safetensors",
        "tokenizer.json",
        "vocab.txt",
    ):
        assert fetched(name), name
    for name in (
        "pytorch_model.bin",
        "tf_model.h5",
        "onnx/model.safetensors",
        "flax_model.msgpack",
    ):
        assert not fetched(name), name


def hub_error(name: str):
    cls = getattr(huggingface_hub.errors, name)
    err = cls.__new__(cls)
    Exception.__init__(err, "stand-in")
    return err


@pytest.mark.parametrize(
    "error, says",
    [
        ("RepositoryNotFoundError", "no such repository, or a private one"),
        ("GatedRepoError", "is gated: accept its licence"),
        ("RevisionNotFoundError", "has no revision"),
    ],
)
def test_online_failures_name_the_fix(monkeypatch, capsys, tmp_path, error, says):
    def refuse(*args, **kwargs):
        assert kwargs["allow_patterns"] == list(hub.ALLOW_PATTERNS)
        raise hub_error(error)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, "generate", "--checkpoint", "someone/model", "--prompt", "a")
    assert code == 2
    assert says in err
    assert list(tmp_path.iterdir()) == []


def test_a_missing_local_path_that_is_no_hub_id_says_it_does_not_exist(tmp_path):
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_pretrained(tmp_path / "no" / "such" / "dir")
    assert not hub.is_hub_id("./runs/x") and not hub.is_hub_id("a/b/c")
    assert hub.is_hub_id("gpt2") and hub.is_hub_id("HuggingFaceTB/SmolLM2-135M")


def test_a_path_object_is_a_local_path_never_a_hub_id(tmp_path, monkeypatch):
    """A resolved path handed to a loader again (Path("run") from the user's "./run") stays a
    missing local path: it is never fetched or looked up as the hub id "run"."""
    import huggingface_hub

    from attnlab.interop import load_checkpoint

    def never(*args, **kwargs):
        raise AssertionError("a Path was looked up on the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", never)
    monkeypatch.chdir(tmp_path)
    assert hub.resolve_model_path(Path("run")) == Path("run")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(Path("run"))
    assert "hub" not in str(err.value) and "run" in str(err.value)


def test_the_explorer_and_evaluate_open_a_hub_id(offline, capsys, tmp_path):
    from attnlab.explore import load

    assert load(REPO).name == REPO  # the id, not the snapshot's commit
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    code = main(["evaluate", "--checkpoint", REPO, "--text", str(text), "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "val_ppl" in out
