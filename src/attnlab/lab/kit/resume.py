"""A run made in pieces must be made by one code, and a finished job of it is never trained
twice.

An experiment that checkpoints and resumes across sessions (``translation``) trains some steps
under the code of one day and the rest under the code of another if the code changed in between;
its report would then record only the last piece's hash (:mod:`attnlab.lab.kit.provenance`).
:func:`check_same_code` stamps the work directory with the hash on the first piece and refuses a
later piece whose code differs, saying how to start over.

The work directory (checkpoints, hundreds of MB) may not outlive the machine a piece ran on.
:class:`Finished` keeps each finished job's result -- the small numbers the report is written
from -- as one JSON file beside the report (``OUT/.attnlab-jobs/JOB.json``, committed with it),
so a later piece on a fresh machine reloads every finished job and loses only the jobs that were
still running when the earlier piece ended.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.checkpoint.atomic import atomic_write_json
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


JOBS_DIR = ".attnlab-jobs"  # OUT/.attnlab-jobs/JOB.json: {"code": hash, "job": JOB, "result": ...}


class Finished:
    """The results of a resumable run's finished jobs, one JSON file per job in ``folder``, each
    stamped with the code hash that made it. A job's result must be JSON data (numbers, strings,
    lists, dicts); :meth:`put` returns it as :meth:`get` will (tuples become lists), so a job
    computed now and one reloaded later look the same to the report."""

    def __init__(self, folder: Path, module: str):
        self.folder, self.module, self.digest = folder, module, code_hash(module).digest

    def path(self, job: str) -> Path:
        return self.folder / f"{job}.json"

    def get(self, job: str) -> Any | None:
        """The kept result of ``job``, or None when it has not finished; a result kept by other
        code stops the run (its numbers would not be this code's)."""
        try:
            kept = json.loads(self.path(job).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise UserError(
                f"{str(self.path(job))!r} (the kept result of a finished job) is unreadable "
                f"({err}); delete it to train that job again"
            ) from err
        if kept.get("code") != self.digest:
            raise CodeChangedError(
                f"the code of {self.module} changed since the job {job!r} finished (code hash "
                f"{kept.get('code')} then, {self.digest} now): its result in "
                f"{str(self.path(job))!r} was measured by other code. Delete {str(self.folder)!r} "
                "(and the run's work directory) to start the run over with today's code, or "
                "check out the code the run began with."
            )
        return kept["result"]

    def put(self, job: str, result: Any) -> Any:
        """Keep ``job``'s result (atomically: an interrupt never leaves half a file) and return
        it as :meth:`get` will."""
        kept = json.loads(json.dumps(result))
        atomic_write_json(
            self.path(job), {"code": self.digest, "job": job, "result": kept}, indent=None
        )
        return kept
