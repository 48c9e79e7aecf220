"""What jedi can tell about a name this file imports: does calling it give an `nn.Module`?

`from models import build_model; model = build_model()` hides from the file alone that `model`
is a module. jedi follows the import through the workspace's own source and infers what the call
returns; the class it finds is then checked by its bases (`nn.Module`, or a workspace class that
derives from one). jedi reads source only: the project's sys.path is the workspace, so no
library is introspected and nothing is imported or run. Three settings make sure of it:
`load_unsafe_extensions=False` (no compiled module of the workspace is loaded), an empty
`auto_import_modules` (jedi would otherwise really import a package named `gi`, even the
workspace's), and the in-process `InterpreterEnvironment` (jedi's default spawns a helper
subprocess). Without jedi installed, the answer is "unknown" and the rules fall back to what the
file shows.
"""
from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

from . import source as src

_PROBE = "__explainer_probe__"
_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# Base classes that make a module, by their last name: torch's, Lightning's, and ours' subclasses.
_MODULE_BASES = ("Module", "LightningModule", "Sequential", "ModuleList", "ModuleDict")


def call_gives_module(tree: ast.Module, callee: ast.expr) -> bool | None:
    """Whether `callee(...)` returns an nn.Module, when `callee` is imported by this file
    (None: jedi can't tell, or the file never imported it)."""
    filename = getattr(tree, "_filename", None)
    root = callee
    while isinstance(root, ast.Attribute):
        root = root.value
    if not filename or not isinstance(root, ast.Name):
        return None
    filename = os.path.abspath(filename)
    importing = workspace_imports(tree, filename).get(root.id)
    if importing is None or _jedi() is None:
        return None
    return _call_gives_module(filename, importing, src.canonical(callee))


def workspace_imports(tree: ast.Module, filename: str) -> dict[str, str]:
    """Names this file imports from the workspace's own modules (not from installed packages),
    each with the import statement that binds it."""
    def find() -> dict[str, str]:
        found = {}
        for node in src.nodes_of(tree, (ast.Import, ast.ImportFrom)):
            module = node.module or "" if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                target = module if module is not None else alias.name
                relative = isinstance(node, ast.ImportFrom) and node.level > 0
                if alias.name != "*" and (relative or _in_workspace(target, filename)):
                    found[(alias.asname or alias.name).split(".")[0]] = ast.unparse(node)
        return found

    return src.cached(tree, "_workspace_imports", find)


def _in_workspace(module: str, filename: str) -> bool:
    """`module` is a file or package of the project `filename` belongs to."""
    relative = Path(*module.split(".")) if module else None
    if relative is None:
        return False
    directory = Path(filename).parent
    for base in dict.fromkeys([directory, _project_root(str(directory))]):
        if (base / relative).with_suffix(".py").is_file() or (base / relative / "__init__.py").is_file():
            return True
    return False


@functools.lru_cache(maxsize=1024)
def _call_gives_module(filename: str, importing: str, callee: str) -> bool | None:
    """Only the import is given to jedi: what the call returns depends on the imported module,
    not on the rest of the file (and a tiny script keeps each question fast and cacheable)."""
    code = f"{importing}\n{_PROBE} = {callee}()\n{_PROBE}\n"
    try:
        jedi = _jedi()
        script = jedi.Script(code=code, path=filename, project=_project(os.path.dirname(filename)),
                             environment=jedi.api.environment.InterpreterEnvironment())
        found = script.infer(len(code.splitlines()), 1)
    except Exception:  # noqa: BLE001 - jedi's inference is best effort; the file alone decides
        return None
    verdicts = [_is_module_class(d.module_path, d.line) for d in found if d.type == "instance" and d.line]
    if any(verdicts):
        return True
    return False if verdicts else None


def workspace_bases(tree: ast.Module, cls: ast.ClassDef) -> tuple[ast.ClassDef, ...]:
    """The classes of the workspace's other files that `cls` derives from directly (`class
    NMAC(BasicMAC)` with `from .basic_controller import BasicMAC`), read from their source;
    none where jedi can't tell."""
    filename = getattr(tree, "_filename", None)
    if not filename or _jedi() is None:
        return ()
    filename = os.path.abspath(filename)
    imports = workspace_imports(tree, filename)
    found = []
    for base in cls.bases:
        root = base
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in imports:
            found.extend(_class_at(path, line) for path, line in _class_definitions(filename, imports[root.id],
                                                                                  src.canonical(base)))
    return tuple(c for c in found if c is not None)


def imported_class(tree: ast.Module, name: ast.Name) -> ast.ClassDef | None:
    """The workspace class that `name` is, where this file imports it from one of the
    workspace's own files (`from utils import AverageMeter`), read from its source; None where
    jedi can't tell or finds more than one."""
    filename = getattr(tree, "_filename", None)
    if not filename or _jedi() is None:
        return None
    filename = os.path.abspath(filename)
    importing = workspace_imports(tree, filename).get(name.id)
    if importing is None:
        return None
    found = [c for c in (_class_at(path, line) for path, line in _class_definitions(filename, importing, name.id))
             if c is not None]
    return found[0] if len(found) == 1 else None


@functools.lru_cache(maxsize=1024)
def _class_definitions(filename: str, importing: str, name: str) -> tuple[tuple[str, int], ...]:
    code = f"{importing}\n{name}\n"
    try:
        jedi = _jedi()
        script = jedi.Script(code=code, path=filename, project=_project(os.path.dirname(filename)),
                             environment=jedi.api.environment.InterpreterEnvironment())
        found = script.goto(2, len(name) - 1, follow_imports=True)
    except Exception:  # noqa: BLE001 - jedi's inference is best effort; the file alone decides
        return ()
    return tuple((str(d.module_path), d.line) for d in found if d.type == "class" and d.module_path and d.line)


@functools.lru_cache(maxsize=64)
def _class_at(path: str, line: int) -> ast.ClassDef | None:
    try:
        tree = src.parse(path, Path(path).read_text(encoding="utf-8")).tree
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.lineno == line), None)


@functools.lru_cache(maxsize=1)
def _jedi():
    """jedi, imported on the first question (it takes a few hundred ms), or None."""
    try:
        import jedi
        import jedi.api.environment
    except ImportError:
        return None
    jedi.settings.auto_import_modules = []  # only this process's jedi: the checker's or the server's
    return jedi


@functools.lru_cache(maxsize=256)
def _project_root(directory: str) -> Path:
    """The nearest folder above `directory` that looks like a project root (or `directory`)."""
    start = Path(directory)
    return next((c for c in [start, *start.parents] if any((c / m).exists() for m in _ROOT_MARKERS)), start)


@functools.lru_cache(maxsize=64)
def _project(directory: str):
    root = _project_root(directory)
    paths = list(dict.fromkeys([str(root), directory]))
    return _jedi().Project(str(root), sys_path=paths, smart_sys_path=False, load_unsafe_extensions=False)


def _is_module_class(path, line: int, depth: int = 0) -> bool:
    """The class defined at `path:line` derives from nn.Module, as far as its bases show."""
    if path is None or depth > 4:
        return False
    try:
        tree = src.parse_tree(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return False
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    found = next((c for c in classes.values() if c.lineno == line), None)
    return found is not None and _derives_from_module(found, classes, depth)


def _derives_from_module(cls: ast.ClassDef, classes: dict[str, ast.ClassDef], depth: int) -> bool:
    for base in cls.bases:
        name = src.canonical(base).rsplit(".", 1)[-1]
        if name in _MODULE_BASES:
            return True
        if name in classes and classes[name] is not cls and depth < 4 \
                and _derives_from_module(classes[name], classes, depth + 1):
            return True
    return False
