"""The manifest behind `experiment`, `export` and `plot`: attnlab replaces only what it wrote."""

from __future__ import annotations

import json

import pytest

from attnlab.cli.experiment_cmd import _report_of
from attnlab.cli.outputs import MANIFEST, NotOursError, outputs, recorded, remove_earlier


def test_only_files_attnlab_wrote_unchanged_may_be_replaced(tmp_path):
    with outputs(tmp_path, "a test"):
        (tmp_path / "README.md").write_text("report 1")
        (tmp_path / "fig").mkdir()
        (tmp_path / "fig" / "a.png").write_bytes(b"png")
    assert set(recorded(tmp_path)) == {"README.md", "fig/a.png"}
    with outputs(tmp_path, "a test"):  # its own earlier output: replaced
        (tmp_path / "README.md").write_text("report 2")
    (tmp_path / "README.md").write_text("edited by hand")
    refused = pytest.raises(NotOursError, match=r"README.md\); choose a new or empty --out")
    with refused, outputs(tmp_path, "a test"):
        pytest.fail("the block must not run")
    assert (tmp_path / "README.md").read_text() == "edited by hand"


def test_a_file_rewritten_with_the_same_bytes_is_listed(tmp_path):
    """An earlier report without a manifest (recognised as ours): a run that draws one of its
    figures again, byte for byte, lists that figure too, not only the files that changed."""
    (tmp_path / "report.json").write_text(json.dumps({"name": "order"}))
    (tmp_path / "map.png").write_bytes(b"png")
    with outputs(tmp_path, "a test", earlier_ours=_report_of("order")):
        (tmp_path / "report.json").write_text(json.dumps({"name": "order", "run": 2}))
        (tmp_path / "map.png").write_bytes(b"png")  # the same figure again
    assert set(recorded(tmp_path)) == {"report.json", "map.png"}


def test_a_file_target_hashes_only_its_own_name(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with outputs(tmp_path, "a plot", names={"pe.png"}):
        (tmp_path / "pe.png").write_bytes(b"png")
    assert recorded(tmp_path) == {"pe.png": recorded(tmp_path)["pe.png"]}  # notes.txt not listed


def test_remove_earlier_removes_exactly_the_listed_files(tmp_path):
    with outputs(tmp_path, "an export"):
        (tmp_path / "config.json").write_text("{}")
        (tmp_path / "tokenizer.json").write_text("{}")
    remove_earlier(tmp_path, "export")
    assert list(tmp_path.iterdir()) == []
    with outputs(tmp_path, "an export"):
        (tmp_path / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(NotOursError, match="notes.txt"):
        remove_earlier(tmp_path, "export")
    assert (tmp_path / "config.json").is_file() and (tmp_path / MANIFEST).is_file()


def test_an_earlier_report_of_the_same_experiment_counts_as_attnlab_s(tmp_path):
    """Reports written before manifests existed (the committed docs/experiments/NAME/)."""
    (tmp_path / "report.json").write_text(json.dumps({"name": "order"}))
    (tmp_path / "README.md").write_text("old report")
    with outputs(tmp_path, "attnlab experiment order", earlier_ours=_report_of("order")):
        (tmp_path / "README.md").write_text("new report")
    other = _report_of("scaling")  # another experiment's report is not this one's to replace
    with (
        pytest.raises(NotOursError),
        outputs(tmp_path, "attnlab experiment scaling", earlier_ours=other),
    ):
        pass
