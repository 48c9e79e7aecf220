"""Source reading shared by the runtime analysis and the fix builders: parsed modules, scopes,
loops, assignments to an expression, and position conversion (AST byte offsets to the 1-based
code-point columns of our data model)."""
from __future__ import annotations

import ast
import linecache
import re
import threading
import warnings
from dataclasses import dataclass
from functools import lru_cache

from . import linking

_SCOPES = linking.SCOPES


@dataclass(frozen=True)
class Source:
    filename: str
    text: str
    lines: tuple[str, ...]
    tree: ast.Module

    def line(self, row: int) -> str:
        return self.lines[row - 1].rstrip("\r\n") if 0 < row <= len(self.lines) else ""

    def column(self, row: int, byte_col: int) -> int:
        """1-based code-point column of an AST byte offset."""
        raw = self.line(row).encode("utf-8")[:byte_col]
        return len(raw.decode("utf-8", errors="replace")) + 1

    def segment(self, node: ast.AST) -> str:
        """The source text of `node` (`ast.get_source_segment`, without re-splitting the file)."""
        end_row = getattr(node, "end_lineno", None)
        if end_row is None or node.end_col_offset is None:
            return ast.unparse(node)
        first = self.lines[node.lineno - 1].encode("utf-8")
        if node.lineno == end_row:
            return first[node.col_offset:node.end_col_offset].decode("utf-8", errors="replace")
        middle = self.lines[node.lineno:end_row - 1]
        last = self.lines[end_row - 1].encode("utf-8")[:node.end_col_offset]
        return "".join([first[node.col_offset:].decode("utf-8", errors="replace"), *middle,
                        last.decode("utf-8", errors="replace")])

    def indent_of(self, row: int) -> str:
        line = self.line(row)
        return line[: len(line) - len(line.lstrip())]


def load(filename: str) -> Source | None:
    lines = linecache.getlines(filename)
    if not lines:
        return None
    return _parse(filename, "".join(lines))


# How deeply a checked file's AST may nest. Brackets nest at most 200 deep and blocks 100 (the
# tokenizer's limits), but chains do not bracket: `a + a + ...`, `x.f().g()...`, `a[0][0]...`,
# `-(-...)` parse up to about 3 x sys.getrecursionlimit() levels, and the rules and ast.unparse
# recurse along them. Real code stays far below: 9,000 files of this environment's site-packages
# (torch, sympy, numpy, jedi, ...) nest at most 569 levels (a generated sympy table), 99.9% under
# 100. Deeper files are refused with a clear "cannot parse" line rather than checked slowly or
# crashed on; the rules run with recursion headroom for this depth (see `recursion_headroom`).
MAX_DEPTH = 1000


# CPython 3.11's parser keeps its AST recursion depth in state that threads share: two threads
# parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (seen with
# four training threads explaining at once). Parsing holds the GIL anyway; one at a time costs
# nothing. (warnings.catch_warnings is not thread-safe either.)
_PARSING = threading.Lock()


def parse_tree(text: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """ast.parse, with the parser's own "too deep" failures (RecursionError during AST
    construction, MemoryError from its stack, e.g. 3,000 unary minuses) raised as SyntaxError,
    like every other source it refuses. The parser's warnings about the code it reads
    (`SyntaxWarning: invalid escape sequence`) are the user's compiler's business, not ours."""
    try:
        with _PARSING, warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            return ast.parse(text, filename, mode)
    except (RecursionError, MemoryError) as error:
        raise SyntaxError(f"too deeply nested for Python's parser ({type(error).__name__})") from None


def parse(filename: str, text: str) -> Source:
    """Parse `text` as `filename`; raises SyntaxError / ValueError for code that does not parse,
    or that nests deeper than MAX_DEPTH."""
    tree = parse_tree(text, filename)
    depth = linking.assemble(tree, linking.link(tree))
    if depth > MAX_DEPTH:
        dispose(tree)
        raise SyntaxError(f"nested too deeply to check ({depth} levels; the limit is {MAX_DEPTH})")
    tree._filename, tree._text = filename, text  # type: ignore[attr-defined]
    return Source(filename, text, split_lines(text), tree)


@lru_cache(maxsize=64)
def _parse(filename: str, text: str) -> Source | None:
    try:
        tree = parse_tree(text, filename)
    except (SyntaxError, ValueError):
        return None
    linking.assemble(tree, linking.link(tree))
    tree._filename, tree._text = filename, text  # type: ignore[attr-defined]
    return Source(filename, text, split_lines(text), tree)


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_lines(text: str) -> tuple[str, ...]:
    """Lines as Python's tokenizer counts them (only \\r, \\n and \\r\\n end a line, unlike
    str.splitlines), each with its line ending."""
    return tuple(_LINE.findall(text))


def dispose(tree: ast.Module) -> None:
    """Break the parent links of a tree no longer needed, so reference counting frees it at
    once: otherwise every checked file leaves cyclic garbage, and the collector's pauses become
    an editor's latency."""
    for node in getattr(tree, "_nodes", ()):
        node.__dict__.clear()


def all_nodes(tree: ast.Module) -> tuple[ast.AST, ...]:
    """Every node of a parsed module (breadth first, as ast.walk), listed once at parse time."""
    return cached(tree, "_nodes", lambda: tuple(ast.walk(tree)), subtree_only=True)


def statement_nodes(statement: ast.stmt):
    """Every node of a top-level statement (listed when linked), breadth first."""
    levels = getattr(statement, "_levels", None)
    return (n for level in levels for n in level) if levels is not None else ast.walk(statement)


def nodes_of(tree: ast.Module, types: tuple[type, ...]) -> tuple[ast.AST, ...]:
    """The module's nodes of `types` (defs, classes, imports: `linking.INDEXED`), in
    `all_nodes` order, without going through every node."""
    indexed = getattr(tree, "_indexed", None)
    if indexed is None:
        return tuple(n for n in all_nodes(tree) if isinstance(n, types))
    assert all(t in linking.INDEXED for t in types), types
    return tuple(n for n in indexed if isinstance(n, types))


def parent(node: ast.AST) -> ast.AST | None:
    return getattr(node, "_parent", None)


def module_of(node: ast.AST) -> ast.AST:
    """The parsed module that `node` belongs to."""
    while parent(node) is not None:
        node = parent(node)
    return node


def ancestors(node: ast.AST):
    node = parent(node)
    while node is not None:
        yield node
        node = parent(node)


def enclosing_function(node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The def (or method) `node` is in, innermost first."""
    return next((a for a in ancestors(node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


def enclosing_class(node: ast.AST) -> ast.ClassDef | None:
    return next((a for a in ancestors(node) if isinstance(a, ast.ClassDef)), None)


def inside(node: ast.AST, outer: ast.AST) -> bool:
    """Whether `outer` encloses `node`."""
    return any(ancestor is outer for ancestor in ancestors(node))


def canonical(expression: str | ast.AST) -> str:
    """One spelling per expression: `cache["prev"]` and `cache['prev']` compare equal (it is
    ast.unparse's spelling)."""
    if isinstance(expression, str):
        return _canonical_text(expression)
    # Rules ask for the same nodes' spelling many times; unparsing is the checker's hot spot.
    spelled = getattr(expression, "_canonical", None)
    if spelled is not None:
        return spelled
    # A chain of trailers (`x.detach()[0].h`) is spelled link by link from its innermost end,
    # each link remembered, without recursion: unparsing every link of a long chain whole was
    # quadratic (a 300-link chain took 2 s), and ast.unparse recursed once per link.
    chain = []
    node = expression
    while spelled is None and _trailer_of(node) is not None:
        chain.append(node)
        node = _trailer_of(node)
        spelled = getattr(node, "_canonical", None)
    if spelled is None:
        spelled = node.id if isinstance(node, ast.Name) else ast.unparse(node)
        node._canonical = spelled  # type: ignore[attr-defined]
    for link in reversed(chain):
        spelled = _spell_link(link, spelled)
        link._canonical = spelled  # type: ignore[attr-defined]
    return spelled


_PRIMARY = (ast.Name, ast.Attribute, ast.Subscript, ast.Call)


def _trailer_of(node: ast.AST) -> ast.expr | None:
    """What `node` (`a.b`, `a[i]`, `a(x)`) trails, when that is spelled without parentheses."""
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        inner = node.value
    elif isinstance(node, ast.Call):
        inner = node.func
    else:
        return None
    return inner if isinstance(inner, _PRIMARY) else None


def _spell_link(node: ast.AST, inner: str) -> str:
    """ast.unparse's spelling of a trailer whose inner part is spelled `inner`."""
    if isinstance(node, ast.Attribute):
        return f"{inner}.{node.attr}"
    if isinstance(node, ast.Subscript):
        index = node.slice
        if isinstance(index, ast.Tuple) and index.elts:  # `a[i, j]`, `a[i,]`: no parentheses
            items = [canonical(e) for e in index.elts]
            return f"{inner}[{', '.join(items)}{',' if len(items) == 1 else ''}]"
        return f"{inner}[{canonical(index)}]"
    arguments = [canonical(a) for a in node.args]
    arguments += [f"{k.arg}={canonical(k.value)}" if k.arg else f"**{canonical(k.value)}" for k in node.keywords]
    return f"{inner}({', '.join(arguments)})"


@lru_cache(maxsize=4096)
def _canonical_text(expression: str) -> str:
    try:
        return canonical(parse_tree(expression, mode="eval").body)
    except SyntaxError:
        return expression


def function_for_code(source: Source, name: str, first_line: int) -> ast.AST:
    """The def whose code object is (name, first_line); the module for `<module>`."""
    if name == "<module>":
        return source.tree
    for node in ast.walk(source.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            starts = [node.lineno] + [d.lineno for d in node.decorator_list]
            if first_line in starts:
                return node
    return source.tree


def class_named(source: Source, name: str, containing_row: int | None = None) -> ast.ClassDef | None:
    best = None
    for node in _classes(source.tree).get(name, ()):
        if containing_row is None or node.lineno <= containing_row <= node.end_lineno:
            best = node
    return best


def _classes(tree: ast.AST) -> dict[str, list[ast.ClassDef]]:
    """Every class of the tree by name, in walk order (a model's classes are looked up by name
    once per module of the model)."""
    def build() -> dict[str, list[ast.ClassDef]]:
        found: dict[str, list[ast.ClassDef]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
        return found

    return cached(tree, "_classes_by_name", build)


def cached(node: ast.AST, name: str, compute, *, subtree_only: bool = False):
    """`compute()`, remembered on `node` as `name`: the checker asks the same questions of a
    tree many times, and trees are never changed after parsing. `subtree_only`: the answer
    depends on nothing but `node`'s own subtree, so it stays right for a statement an edit did
    not touch (`reparse.Reparser` keeps it); any other answer (history, steps, the module's
    classes...) is listed on the scope that owns `node`, to be forgotten before the next edit."""
    found = node.__dict__.get(name)
    if found is None:
        found = compute()
        setattr(node, name, found)
        if not subtree_only:
            scope = node if isinstance(node, (ast.Module, *_SCOPES)) else getattr(node, "_owner", None)
            if scope is not None:
                scope.__dict__.setdefault("_remembered", []).append((node, name))
    return found


def forget(scope: ast.AST) -> None:
    """Forget what `cached` remembered on `scope` and the nodes it owns that depends on more
    than their own subtrees."""
    for node, name in scope.__dict__.pop("_remembered", ()):
        node.__dict__.pop(name, None)


def own_nodes(scope: ast.AST) -> tuple[ast.AST, ...]:
    """Nodes of `scope` without descending into nested defs, lambdas or classes."""
    return cached(scope, "_own_nodes", lambda: tuple(_own_nodes(scope)), subtree_only=True)


def _own_nodes(scope: ast.AST):
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def statement_of(node: ast.AST) -> ast.stmt:
    while not isinstance(node, ast.stmt):
        node = parent(node)
    return node


def enclosing_block(stmt: ast.stmt) -> list[ast.stmt]:
    """The statement list that holds `stmt` (its parent's body, orelse or finalbody)."""
    owner = parent(stmt)
    for field in ("body", "orelse", "finalbody"):
        block = getattr(owner, field, None)
        if isinstance(block, list) and any(s is stmt for s in block):
            return block
    return []


def statements_at(scope: ast.AST, row: int) -> list[ast.stmt]:
    """The statements of `scope` (itself included) that span `row`, outermost first. Statements
    nest in the lines of those around them, and no statement is inside an expression, so only
    the statements that span `row` are descended into (a walk of the whole tree cost most of
    an explanation's time)."""
    found, pending = [], [scope]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.stmt):
            if not node.lineno <= row <= (node.end_lineno or node.lineno):
                continue
            found.append(node)
        pending.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, ast.expr))
    return sorted(found, key=lambda n: (n.lineno, -(n.end_lineno or n.lineno), n.col_offset))


_COMPOUND = (ast.For, ast.While, ast.If, ast.With, ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def innermost_statement(scope: ast.AST, row: int) -> ast.stmt | None:
    """The innermost simple statement spanning `row` (a compound one if there is none)."""
    spanning = statements_at(scope, row)
    simple = [s for s in spanning if not isinstance(s, _COMPOUND)]
    return (simple or spanning)[-1] if spanning else None


def statement_at(scope: ast.AST, row: int, column: int | None = None) -> ast.stmt | None:
    """As `innermost_statement`, but where simple statements share the row (`opt.zero_grad();
    loss.backward(); opt.step()`), the one at `column` (0-based, UTF-8 bytes, as the AST's)."""
    if column is not None:
        at = [s for s in statements_at(scope, row) if not isinstance(s, _COMPOUND)
              and (s.lineno, s.col_offset) <= (row, column) < (s.end_lineno, s.end_col_offset)]
        if at:
            return at[-1]
    return innermost_statement(scope, row)


def statement_code(source: Source, row: int, column: int | None = None) -> str:
    """The statement at `row` as the user wrote it (the one at `column` where several share the
    row); the line itself where no statement starts there."""
    stmt = statement_at(source.tree, row, column)
    return source.segment(stmt) if stmt is not None and stmt.lineno == row else source.line(row).strip()


def loops_around(node: ast.AST, stop: ast.AST | None = None) -> list[ast.stmt]:
    """Enclosing for/while loops, innermost first, not crossing a def."""
    loops = []
    for ancestor in ancestors(node):
        if ancestor is stop or isinstance(ancestor, _SCOPES):
            break
        if isinstance(ancestor, (ast.For, ast.AsyncFor, ast.While)):
            loops.append(ancestor)
    return loops


def targets_of(stmt: ast.AST) -> list[ast.expr]:
    """Flattened assignment targets of an assignment-like node."""
    if isinstance(stmt, ast.Assign):
        raw = stmt.targets
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        raw = [stmt.target]
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        raw = [stmt.target]
    elif isinstance(stmt, ast.NamedExpr):
        raw = [stmt.target]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        raw = [item.optional_vars for item in stmt.items if item.optional_vars is not None]
    else:
        return []
    flat = []
    stack = list(raw)
    while stack:
        target = stack.pop(0)
        if isinstance(target, (ast.Tuple, ast.List)):
            stack[:0] = target.elts
        elif isinstance(target, ast.Starred):
            stack.insert(0, target.value)
        else:
            flat.append(target)
    return flat


def is_docstring(stmt: ast.stmt) -> bool:
    """Whether `stmt` is a string on its own, as the docstring that opens a body is."""
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def value_of(stmt: ast.AST) -> ast.expr | None:
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
        return stmt.value
    return None


@dataclass(frozen=True)
class Assignment:
    stmt: ast.AST
    target: ast.expr

    @property
    def value(self) -> ast.expr | None:
        """What this target was assigned: the matching element for `a, b = f(), g()`, else the
        statement's whole value."""
        value = value_of(self.stmt)
        targets = getattr(self.stmt, "targets", ())
        if len(targets) == 1 and isinstance(targets[0], ast.Tuple) and isinstance(value, ast.Tuple) \
                and len(targets[0].elts) == len(value.elts) \
                and not any(isinstance(e, ast.Starred) for e in (*targets[0].elts, *value.elts)):
            for element, assigned in zip(targets[0].elts, value.elts):
                if element is self.target:
                    return assigned
        return value

    @property
    def position(self) -> int | None:
        """Where this target sits in `a, b = f()` (1 for `b`) when the value is not a tuple
        literal: which element of what `f` returns it gets."""
        targets = getattr(self.stmt, "targets", ())
        if len(targets) != 1 or not isinstance(targets[0], ast.Tuple) or isinstance(value_of(self.stmt), ast.Tuple) \
                or any(isinstance(e, ast.Starred) for e in targets[0].elts):
            return None
        return next((i for i, element in enumerate(targets[0].elts) if element is self.target), None)


def assignments(scope: ast.AST, expression: str, *, deep: bool = False) -> list[Assignment]:
    """Assignments to `expression` (canonical) in `scope`, in source order. `deep` also looks
    into nested defs (for a class: its methods)."""
    return _assignment_index(scope, deep).get(canonical(expression), [])


def last_assignment(scope: ast.AST, expression: str, before: int) -> Assignment | None:
    """The last assignment to `expression` in `scope` on a line before `before`: what a name
    read on line `before` was last set to, as far as straight-line code goes."""
    for assignment in reversed(assignments(scope, expression)):
        if assignment.stmt.lineno < before:
            return assignment
    return None


def _assignment_index(scope: ast.AST, deep: bool) -> dict[str, list[Assignment]]:
    """Every assignment in `scope` by canonical target, built once per scope (trees are never
    changed after parsing)."""
    def build() -> dict[str, list[Assignment]]:
        index: dict[str, list[Assignment]] = {}
        for node in ast.walk(scope) if deep else own_nodes(scope):
            for target in targets_of(node):
                index.setdefault(canonical(target), []).append(Assignment(node, target))
        for found in index.values():
            found.sort(key=lambda a: (a.stmt.lineno, a.stmt.col_offset))
        return index

    return cached(scope, "_assignments_deep" if deep else "_assignments", build, subtree_only=True)


def item_assignments(scope: ast.AST, container: str, *, deep: bool = False) -> list[Assignment]:
    """Assignments into an element of `container` (`states[i] = ...`, `self.cache[key] = ...`)."""
    name = canonical(container)
    found = [a for assigned in _assignment_index(scope, deep).values() for a in assigned
             if isinstance(a.target, ast.Subscript) and canonical(a.target.value) == name]
    return sorted(found, key=lambda a: (a.stmt.lineno, a.stmt.col_offset))


def appends(scope: ast.AST, container: str, *, deep: bool = False) -> list[ast.Call]:
    """`container.append(x)` / `.extend` / `.insert` calls in `scope`."""
    wanted = canonical(container)
    nodes = ast.walk(scope) if deep else own_nodes(scope)
    calls = [
        n for n in nodes
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("append", "extend", "insert", "appendleft")
        and canonical(n.func.value) == wanted
    ]
    calls.sort(key=lambda c: (c.lineno, c.col_offset))
    return calls


def reads(node: ast.AST, expression: str) -> list[ast.expr]:
    """Loads of `expression` inside `node`, in ast.walk order."""
    return _read_index(node).get(canonical(expression), [])


def _read_index(node: ast.AST) -> dict[str, list[ast.expr]]:
    def build() -> dict[str, list[ast.expr]]:
        index: dict[str, list[ast.expr]] = {}
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Name, ast.Attribute, ast.Subscript)) and isinstance(
                getattr(sub, "ctx", None), ast.Load
            ):
                index.setdefault(canonical(sub), []).append(sub)
            name = _read_by_name(sub)
            if name is not None:
                index.setdefault(name, []).append(sub)
        return index

    return cached(node, "_read_index", build, subtree_only=True)


def _read_by_name(node: ast.AST) -> str | None:
    """`locals().get("out")`, `locals()["out"]`, `vars()["out"]`: a read of `out`, spelled as a
    string (a loop that reads last pass's output this way carries it like `prev = out` does)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        namespace, key = node.func.value, node.args[0] if node.args else None
    elif isinstance(node, ast.Subscript) and isinstance(getattr(node, "ctx", None), ast.Load):
        namespace, key = node.value, node.slice
    else:
        return None
    if isinstance(namespace, ast.Call) and isinstance(namespace.func, ast.Name) \
            and namespace.func.id in ("locals", "vars", "globals") and not namespace.args \
            and isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier():
        return key.value
    return None


def names_read(node: ast.AST) -> set[str]:
    """The names loaded in `node`: a set of the caller's own (the walk is remembered)."""
    return set(cached(node, "_names_read", lambda: frozenset(
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)), subtree_only=True))


def names_bound(statements) -> set[str]:
    """The names `statements` assign (`a` and `b` of `a, b = f(x)`; not `self` of `self.x = y`,
    which the assignment reads)."""
    return {n.id for stmt in statements for target in targets_of(stmt) for n in ast.walk(target)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def call_receiver(stmt: ast.AST, method: str) -> ast.expr | None:
    """`loss` for a statement containing `loss.backward(...)`."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
            return node.func.value
    return None


def call_named(node: ast.AST | None, name: str) -> ast.Call | None:
    """The first call in `node` whose function's last name part is `name` (None without a node)."""
    found = calls_named(node, name) if node is not None else []
    return found[0] if found else None


def calls_named(node: ast.AST, *names: str) -> list[ast.Call]:
    """Calls whose function's last name part is one of `names` (`x.detach()`, `torch.no_grad()`)."""
    return [sub for sub in ast.walk(node) if isinstance(sub, ast.Call) and called_name(sub) in names]


def called_name(call: ast.Call) -> str:
    """The name a call calls by, its function's last name part: `f` in `f(x)` and in
    `self.helper.f(x)`; empty where the function is no name (`fs[0](x)`)."""
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def method_of(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    """The method `name` the class defines in its own body (`__init__`, `forward`)."""
    return next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == name), None)


def iterated_by(target: ast.expr, iterable: ast.expr, name: str) -> ast.Name | None:
    """The list `name` takes its values from, as the loop's header says: `state` in `for s in
    state`, `losses` in `for i, (o, loss) in enumerate(zip(opt, losses))`."""
    if isinstance(target, ast.Name):
        return iterable if target.id == name and isinstance(iterable, ast.Name) else None
    if not (isinstance(target, (ast.Tuple, ast.List)) and isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Name) and not iterable.keywords):
        return None
    if iterable.func.id == "enumerate" and len(target.elts) == 2 and len(iterable.args) == 1:
        return iterated_by(target.elts[1], iterable.args[0], name)
    if iterable.func.id == "zip" and len(target.elts) == len(iterable.args):
        return next((found for t, a in zip(target.elts, iterable.args)
                     for found in [iterated_by(t, a, name)] if found is not None), None)
    return None


def is_none_check(node: ast.AST | None, expression: str) -> bool:
    """`self.x is not None` / `self.x is None`."""
    return isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot)) \
        and canonical(node.left) == canonical(expression) \
        and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None


def outside_training(function: ast.AST) -> list[ast.stmt]:
    """The blocks' statements of `function` that run only when its module is not training: the
    `else:` of `if self.training:` and the body of `if not self.training:` (BoTorch's PairwiseGP
    predicts there from what its last fit kept)."""
    def training_test(test: ast.expr) -> bool:
        return isinstance(test, ast.Attribute) and test.attr == "training" \
            and isinstance(test.value, ast.Name) and test.value.id == "self"

    found = []
    for node in ast.walk(function):
        if not isinstance(node, ast.If):
            continue
        if training_test(node.test):
            found.extend(node.orelse)
        elif isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not) \
                and training_test(node.test.operand):
            found.extend(node.body)
    return found


def parameter_names(function: ast.AST) -> set[str]:
    """The names of `function`'s parameters (`*args` and `**kwargs` too); none for a module."""
    arguments = getattr(function, "args", None)
    if arguments is None:
        return set()
    return {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                            arguments.vararg, arguments.kwarg) if a is not None}


def is_local(function: ast.AST, name: str) -> bool:
    """A parameter of `function`, or a name it assigns."""
    return name in parameter_names(function) or bool(assignments(function, name))


def argument_for(function: ast.AST, call: ast.Call, name: str) -> ast.expr | None:
    """The argument of `call` bound to the parameter `name` of `function` (its `self` skipped
    when the call names a method or a model)."""
    arguments = getattr(function, "args", None)
    if arguments is None:
        return None
    names = [a.arg for a in arguments.posonlyargs + arguments.args]
    if names and names[0] == "self":
        names = names[1:]
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if name not in names:
        return None
    index = names.index(name)
    positional = call.args[:next((i for i, a in enumerate(call.args) if isinstance(a, ast.Starred)), len(call.args))]
    return positional[index] if index < len(positional) else None
