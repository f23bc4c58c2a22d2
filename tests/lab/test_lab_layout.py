"""The lab's layout rule that import-linter enforces: no experiment imports another. The contract
lists its modules by name, so this test keeps the list equal to the experiments that exist."""

from __future__ import annotations

import pkgutil
import sys
from pathlib import Path

import attnlab.lab.experiments as experiments

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_the_independence_contract_lists_every_experiment():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (independent,) = [c for c in contracts["contracts"] if c["type"] == "independence"]
    names = [m.name for m in pkgutil.iter_modules(experiments.__path__)]
    assert len(names) >= 26
    assert set(independent["modules"]) == {f"{experiments.__name__}.{n}" for n in names}
