"""The pieces of a full-size run made over several sessions, so that its report's wall time is
the whole run's and not the last piece's.

An experiment that checkpoints and resumes (``translation``: hours of training, made with
``timeout -s INT -k 5m 85m attnlab experiment translation ...`` repeated) checks with
:mod:`attnlab.lab.kit.resume` that every piece runs the same code; that module among those its
code hash covers (:mod:`attnlab.lab.kit.provenance`) is what makes a run resumable here. Each
piece that ends without a report (interrupted, or failed) leaves its start and wall time in
``OUT/.attnlab-pieces.json`` under the code hash it ran; the piece that writes the report adds
the earlier pieces of the same code to its own time, lists them in the report's machine record
(``machine["pieces"]``) and a setup line, and once the report is written drops them from the
ledger. Pieces of other code (a run started over after a code change) are never added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from attnlab.checkpoint.atomic import atomic_write_json
from attnlab.lab.kit import resume
from attnlab.lab.kit.provenance import CodeHash

LEDGER = ".attnlab-pieces.json"  # {code hash: [{"started": ISO time, "seconds": float}, ...]}
RESUME_MODULE = resume.__name__  # among a run's code modules: the run resumes across pieces


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _read(path: Path) -> dict[str, list[dict[str, Any]]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise ValueError(
            f"{str(path)!r} (the wall times of this run's earlier pieces) is unreadable ({err}); "
            "delete it to count from this piece on"
        ) from err
    return data if isinstance(data, dict) else {}


@dataclass
class Pieces:
    """The ledger of one resumable run's pieces under one code hash."""

    path: Path
    digest: str
    started: str = field(default_factory=_now)

    @classmethod
    def of(cls, out: Path, code: CodeHash, quick: bool) -> Pieces | None:
        """The ledger of a full-size run of resumable code in ``out``; None for any other run."""
        if quick or RESUME_MODULE not in code.modules:
            return None
        return cls(out / LEDGER, code.digest)

    def record(self, seconds: float) -> None:
        """This piece ended without a report: keep its wall time for the piece that writes it."""
        data = _read(self.path)
        data.setdefault(self.digest, []).append({"started": self.started, "seconds": seconds})
        atomic_write_json(self.path, data)

    def every(self, seconds: float) -> list[dict[str, Any]]:
        """Every piece of the run, oldest first, this last one (``seconds`` long) included."""
        this = {"started": self.started, "seconds": seconds}
        return [*_read(self.path).get(self.digest, []), this]

    def forget(self) -> None:
        """The report is written: the ledger drops this code's pieces (and goes when empty)."""
        data = _read(self.path)
        if data.pop(self.digest, None) is None:
            return
        if data:
            atomic_write_json(self.path, data)
        else:
            self.path.unlink(missing_ok=True)


def describe(pieces: list[dict[str, Any]]) -> str:
    """The setup line of a run made in pieces: how many, when, and each piece's wall time."""
    total = sum(p["seconds"] for p in pieces)
    each = ", ".join(f"{p['started'][:16].replace('T', ' ')}: {p['seconds']:.0f} s" for p in pieces)
    return (
        f"Run made in {len(pieces)} pieces (each piece reloaded the runs the earlier ones had "
        f"finished and trained the rest; one code hash): {total:.0f} s ({total / 3600:.1f} h) "
        f"of wall time in all (start UTC: seconds; {each})."
    )
