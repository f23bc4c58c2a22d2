"""The scripts under ``benchmarks/`` (not a package), for the tests that check them."""

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` imported as a module, so a test calls its functions (its ``main``
    runs only under ``__main__``)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
