"""A resumable run refuses to continue under changed code, and keeps its finished jobs' results
where a lost work directory cannot take them (kit.resume)."""

from __future__ import annotations

import json
import math

import pytest

from attnlab.errors import UserError
from attnlab.lab.kit.provenance import code_hash
from attnlab.lab.kit.resume import JOBS_DIR, STAMP, CodeChangedError, Finished, check_same_code

MODULE = "attnlab.lab.experiments.order"


def test_the_first_piece_stamps_and_a_later_piece_of_the_same_code_resumes(tmp_path):
    work = tmp_path / "work"
    digest = check_same_code(work, MODULE)
    assert digest == code_hash(MODULE).digest
    assert (work / STAMP).read_text().strip() == digest
    assert check_same_code(work, MODULE) == digest  # same code: resumes


def test_a_piece_under_changed_code_stops_with_one_clear_error(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / STAMP).write_text("0123456789abcdef\n")
    with pytest.raises(CodeChangedError) as err:
        check_same_code(work, MODULE)
    assert isinstance(err.value, UserError)  # the CLI prints it as one line, no traceback
    message = str(err.value)
    assert "0123456789abcdef" in message and code_hash(MODULE).digest in message
    assert "Delete" in message and str(work) in message
    assert (work / STAMP).read_text().strip() == "0123456789abcdef"  # the stamp is kept


def test_finished_jobs_are_kept_as_json_and_reloaded_the_same(tmp_path):
    kept = Finished(tmp_path / ".attnlab-jobs", MODULE)
    assert kept.get("seed0-arm") is None  # not finished yet
    result = {"curve": ([1, 2], [0.5, 0.25]), "score": float("nan"), "name": "arm"}
    stored = kept.put("seed0-arm", result)
    assert stored["curve"] == [[1, 2], [0.5, 0.25]]  # as JSON keeps it: tuples become lists
    again = Finished(tmp_path / ".attnlab-jobs", MODULE).get("seed0-arm")  # a later piece
    assert again["curve"] == stored["curve"] and math.isnan(again["score"])


def test_a_finished_job_of_other_code_or_an_unreadable_one_stops_with_the_fix(tmp_path):
    folder = tmp_path / ".attnlab-jobs"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps({"code": "0123456789abcdef", "result": 1}))
    with pytest.raises(CodeChangedError, match="Delete") as err:
        Finished(folder, MODULE).get("a")
    assert "0123456789abcdef" in str(err.value) and code_hash(MODULE).digest in str(err.value)
    (folder / "b.json").write_text('{"code": ')  # half a file
    with pytest.raises(UserError, match="unreadable.*delete it to train that job again"):
        Finished(folder, MODULE).get("b")


def test_kept_jobs_are_bookkeeping_so_a_later_piece_may_write_the_report_beside_them(tmp_path):
    from attnlab.cli.outputs import not_ours

    Finished(tmp_path / JOBS_DIR, MODULE).put("seed0-arm", {"score": 1.0})  # an earlier piece
    assert not_ours(tmp_path) == []  # the next piece is not refused as over the user's files
    (tmp_path / "notes.md").write_text("mine")
    assert not_ours(tmp_path) == ["notes.md"]
