"""Where an experiment's real data is: the folder given by ``attnlab experiment --data DIR``.

The product never looks for data on its own. ``DIR`` holds the datasets under their usual names
(``tinyshakespeare.txt``; ``multi30k/`` with ``train.de``/``train.en``, ``val.*`` and
``test_2016_flickr.*``); the CLI's default is the environment variable ``ATTNLAB_DATA``. Without
it, the character-level experiments train on a text generated from a small grammar
(:func:`attnlab.lab.kit.corpus.generated_text`) and ``translation`` runs only its quick form on
synthetic pairs. The committed reports record the ``--data`` they ran with in their command.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.errors import UserError

SHAKESPEARE = "tinyshakespeare.txt"
MULTI30K = "multi30k"


def dataset(data: Path | str | None, name: str) -> Path | None:
    """``data/name``, or ``data`` itself when it is that dataset (a ``.txt`` file for a text, a
    folder holding ``train.de`` for Multi30k); None when no data folder is given. A folder that
    lacks the dataset is an error naming what to put there."""
    if data is None:
        return None
    root = Path(data).expanduser()
    if name == SHAKESPEARE and root.is_file():
        return root  # any text file stands for the text
    if name == MULTI30K and (root / "train.de").is_file():
        return root
    path = root / name
    if not path.exists():
        raise UserError(
            f"data={str(data)!r} has no {name}: give as data a folder holding {name} "
            "(tinyshakespeare.txt, multi30k/), or leave data unset to use generated data",
            fields=("data",),
        )
    return path
