"""Which code a report ran: a hash of the experiment's module and every attnlab module it uses
(the lab kit's and the library's), so a committed report whose code has changed since it ran is
seen as stale.

The hash covers the code's behaviour, not its wording: each module's syntax tree with docstrings,
comments, type annotations, ``typing.cast`` wrappers, ``assert`` statements and
``if TYPE_CHECKING:`` blocks removed (:func:`behaviour_tree`). A change of documentation or typing
alone leaves a report current; any other change to code the experiment reaches makes it stale.

The modules are found from the imports, starting at the experiment module (:func:`uses`):

- ``import attnlab.x`` and ``from attnlab import x`` (a module) use module ``attnlab.x``;
- ``from attnlab.x import f`` (a function or class) uses the module that *defines* ``f``
  (``f.__module__``), not every module the package ``attnlab.x`` re-exports: a package's
  ``__init__`` is a list of names, and following all of them would make a change anywhere in
  the package stale every report that uses one of its functions. Any other object (a constant)
  counts as a use of ``attnlab.x`` and all it imports;
- a module named in a string (``"attnlab.models.lm"``: ``build_model`` imports its model
  families on demand) or by an f-string prefix (``f"attnlab.bench.{name}"``: every module of
  that package) counts as imported.

Each used module's imports are followed in turn, imports inside functions included.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = "attnlab"
EXPERIMENTS = "attnlab.lab.experiments"
MODULE_NAME = re.compile(r"attnlab(\.[A-Za-z_][A-Za-z0-9_]*)+")


@dataclass(frozen=True)
class CodeHash:
    """The behaviour hash of the code an experiment reaches, and the modules it covers."""

    digest: str  # 16 hex digits of a SHA-256
    modules: tuple[str, ...]  # sorted attnlab module names


def module_file(name: str) -> Path | None:
    """The source file of module ``name`` (a package's ``__init__.py``), None when it is not a
    module (``from attnlab.x import some_function`` names a function, not a module)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _defining_module(base: str, name: str) -> str:
    """The module ``from base import name`` uses: the submodule ``base.name`` if there is one,
    else the module that defines the function or class ``name`` (``base`` for anything else)."""
    sub = f"{base}.{name}"
    if module_file(sub) is not None:
        return sub
    try:
        obj = getattr(importlib.import_module(base), name)
    except (ImportError, AttributeError):
        return base
    owner = getattr(obj, "__module__", None)
    defined = inspect.isfunction(obj) or inspect.isclass(obj)
    if defined and isinstance(owner, str) and owner.split(".")[0] == ROOT and module_file(owner):
        return owner
    return base


def _package_modules(package: str) -> set[str]:
    """Every module of ``package`` (for an f-string import such as ``f"attnlab.bench.{name}"``)."""
    init = module_file(package)
    if init is None or init.name != "__init__.py":
        return set()
    return {f"{package}.{p.stem}" for p in init.parent.glob("*.py") if p.stem != "__init__"}


def uses(name: str, tree: ast.AST, is_package: bool) -> set[str]:
    """The attnlab modules a module's code uses through its imports (at any depth of the tree,
    so imports inside functions count too), by the rules of this module's docstring."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == ROOT)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] == ROOT:
                found.update(_defining_module(base, a.name) for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if MODULE_NAME.fullmatch(node.value) and module_file(node.value) is not None:
                found.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                prefix = head.value
                if prefix.endswith(".") and MODULE_NAME.fullmatch(prefix[:-1]):
                    found.update(_package_modules(prefix[:-1]))
    found.discard(name)
    return found


class _Strip(ast.NodeTransformer):
    """Removes what does not change behaviour: docstrings, annotations, casts, asserts and
    ``if TYPE_CHECKING:`` blocks."""

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body = body[1:]
        return body or [ast.Pass()]

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.body = self._body(node.body)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:  # a bare declaration: a dataclass field keeps its name
            return ast.Expr(ast.Name(id=ast.unparse(node.target), ctx=ast.Load()))
        return self.generic_visit(ast.Assign(targets=[node.target], value=node.value, lineno=0))

    def visit_Assert(self, node: ast.Assert) -> None:
        return None

    def visit_If(self, node: ast.If) -> ast.AST | None:
        test = ast.unparse(node.test)
        if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            return None
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = ast.unparse(node.func)
        if name in ("cast", "typing.cast") and len(node.args) == 2:
            return self.visit(node.args[1])
        return self.generic_visit(node)


def behaviour_tree(source: str) -> str:
    """The module's syntax tree without docstrings, comments, annotations, casts, asserts and
    TYPE_CHECKING blocks, as text (comments never reach the tree)."""
    tree = _Strip().visit(ast.parse(source))
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


@cache
def _module(name: str) -> tuple[Path, frozenset[str], str] | None:
    """(file, attnlab modules it uses, behaviour tree) of module ``name``; None if not a
    module. Cached: one process reads each file once however many experiments reach it."""
    path = module_file(name)
    if path is None:
        return None
    source = path.read_text(encoding="utf-8")
    used = uses(name, ast.parse(source), path.name == "__init__.py")
    return path, frozenset(used), behaviour_tree(source)


def reached_modules(module: str) -> dict[str, Path]:
    """{name: file} of ``module`` and every attnlab module it uses, directly or through others."""
    files: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        # No experiment uses another (an import-linter contract); the registry names their
        # package only to discover them.
        other = name != module and (name == EXPERIMENTS or name.startswith(EXPERIMENTS + "."))
        info = None if name in files or other else _module(name)
        if info is None:
            continue
        files[name] = info[0]
        todo.extend(sorted(info[1] - set(files)))
    return dict(sorted(files.items()))


def code_hash(module: str) -> CodeHash:
    """The behaviour hash of an experiment module and all the attnlab code it reaches."""
    digest = hashlib.sha256()
    files = reached_modules(module)
    for name in files:
        info = _module(name)
        assert info is not None  # reached_modules kept only modules
        digest.update(name.encode() + b"\0" + info[2].encode() + b"\0")
    return CodeHash(digest.hexdigest()[:16], tuple(files))
