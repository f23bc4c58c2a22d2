"""A resumable run refuses to continue under changed code (kit.resume)."""

from __future__ import annotations

import pytest

from attnlab.errors import UserError
from attnlab.lab.kit.provenance import code_hash
from attnlab.lab.kit.resume import STAMP, CodeChangedError, check_same_code

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
