"""A run made in pieces must be made by one code: the code hash of an interrupted run's first
piece, checked when a later piece resumes it.

An experiment that checkpoints and resumes across sessions (``translation``) trains some steps
under the code of one day and the rest under the code of another if the code changed in between;
its report would then record only the last piece's hash (:mod:`attnlab.lab.kit.provenance`).
:func:`check_same_code` stamps the work directory with the hash on the first piece and refuses a
later piece whose code differs, saying how to start over.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.errors import UserError
from attnlab.lab.kit.provenance import code_hash

STAMP = "code_hash.txt"


class CodeChangedError(UserError):
    """The code of an experiment changed between the pieces of one resumable run."""


def check_same_code(work_dir: Path, module: str) -> str:
    """Stamp ``work_dir`` with the code hash of experiment ``module`` (the first piece of a run),
    or check that it is unchanged (a later piece); returns the hash."""
    digest = code_hash(module).digest
    stamp = work_dir / STAMP
    if stamp.exists():
        before = stamp.read_text(encoding="utf-8").strip()
        if before != digest:
            raise CodeChangedError(
                f"the code of {module} changed since the run in {str(work_dir)!r} started (code "
                f"hash {before}, now {digest}): its checkpoints were trained by other code, so "
                f"the report could not say which code it measured. Delete {str(work_dir)!r} to "
                "start the run over with today's code, or check out the code the run began with."
            )
        return digest
    work_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest + "\n", encoding="utf-8")
    return digest
