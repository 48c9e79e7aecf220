"""What every explanation shares: the failing call, the user's frames and their bindings, and
where in the source each binding was made."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ...model import CallSite, Culprit, Location
from ...reading import source as src
from .. import graph, naming
from ..records import BackwardCall, StepCall


@dataclass
class Located:
    """The statement that made a binding's current value, as the user wrote it."""

    source: src.Source
    scope: ast.AST
    store: ast.AST  # an assignment statement or a `container.append(...)` call
    target: ast.AST  # the assigned expression (or the append call): where the culprit points
    target_text: str
    carried: bool
    in_init: bool = False
    class_node: ast.ClassDef | None = None

    @property
    def row(self) -> int:
        return self.store.lineno

    @property
    def location(self) -> Location:
        return Location(self.target.lineno, self.source.column(self.target.lineno, self.target.col_offset))

    @property
    def assignment(self) -> src.Assignment:
        return src.Assignment(self.store, self.target)


@dataclass
class Candidate:
    binding: naming.Binding
    relation: str  # "direct" | "stored" | "carried"
    located: Located | None = None
    name: str = ""


@dataclass
class Context:
    """One explanation's inputs; holds tensors and frames only while the explanation runs."""

    call: BackwardCall | None
    roots: list
    frames: list
    calls: tuple
    steps: tuple
    _bindings: list | None = field(default=None, repr=False)

    @property
    def previous(self) -> BackwardCall | None:
        return self.calls[-1] if self.calls else None

    def bindings(self) -> list[naming.Binding]:
        if self._bindings is None:
            self._bindings = naming.bindings(self.frames)
        return self._bindings

    def root_nodes(self) -> list:
        return [t.grad_fn for t in self.roots if t.grad_fn is not None]

    def frame_source(self, frame) -> tuple[src.Source | None, ast.AST | None]:
        source = src.load(frame.f_code.co_filename)
        if source is None:
            return None, None
        return source, src.function_for_code(source, frame.f_code.co_name, frame.f_code.co_firstlineno)

    def site_statement(self, filename: str, row: int):
        """(source, scope, statement) for a recorded call site in one of the user's frames."""
        for frame in self.frames:
            if frame.f_code.co_filename == filename:
                source, scope = self.frame_source(frame)
                if source is None:
                    continue
                if hasattr(scope, "lineno") and not (scope.lineno <= row <= scope.end_lineno):
                    continue
                stmt = src.innermost_statement(scope, row)
                if stmt is not None:
                    return source, scope, stmt
        source = src.load(filename)
        if source is None:
            return None, None, None
        stmt = src.innermost_statement(source.tree, row)
        scope = source.tree
        if stmt is not None:
            for ancestor in src.ancestors(stmt):
                if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    scope = ancestor
                    break
        return source, scope, stmt

    def call_site(self, filename: str, row: int) -> CallSite:
        source = src.load(filename)
        if source is None:
            return CallSite(filename, row, "")
        stmt = src.innermost_statement(source.tree, row)
        code = source.segment(stmt) if stmt is not None and stmt.lineno == row else source.line(row).strip()
        return CallSite(filename, row, code)

    def steps_between(self, start_tick: int, end_tick: int) -> list[StepCall]:
        return [s for s in self.steps if start_tick < s.tick < end_tick]

    def locate(self, binding: naming.Binding, before_row: int | None = None,
               from_last_iteration: bool = False) -> Located | None:
        """The statement that made `binding`'s value: preferably one before `before_row`, or,
        `from_last_iteration`, anywhere in the loop around the backward (the value was made
        in the previous pass, possibly after the backward's line: `h = out` at the loop's end)."""
        frame = self.frames[binding.frame_index]
        source, scope = self.frame_source(frame)
        if source is None:
            return None
        if binding.in_sequence:
            container = binding.container_expression
            items = src.item_assignments(scope, container)
            if items:  # `states[i] = cell(x, states[i])`: the element is what is re-assigned
                return self._pick(source, scope, items, src.canonical(items[-1].target), before_row,
                                  from_last_iteration)
            whole = src.assignments(scope, container)
            if whole and not src.appends(scope, container):
                return self._pick(source, scope, whole, container, before_row, from_last_iteration)
            stored = self._locate_stored(binding, source, scope)
            attribute = _container_attribute(binding)
            if stored is None and attribute is not None and binding.owner is not None:
                # `model.hidden[0]`: an LSTM's (h, c) kept on the module, set in its forward.
                return self._locate_attribute(binding.owner, attribute)
            return stored
        expression = binding.expression
        found = self._pick(source, scope, src.assignments(scope, expression), expression, before_row,
                           from_last_iteration)
        if found is None and scope is not source.tree:
            found = self._pick(source, source.tree, src.assignments(source.tree, expression),
                               expression, None)
        if found is None and binding.steps and binding.steps[-1][0] == "attr" and binding.owner is not None:
            found = self._locate_attribute(binding.owner, binding.steps[-1][1])
        attribute = _container_attribute(binding)
        if found is None and attribute is not None and binding.owner is not None:
            found = self._locate_attribute(binding.owner, attribute)  # `self.cache[key] = feat`
        return found

    def _pick(self, source, scope, found, expression, before_row, from_last_iteration=False) -> Located | None:
        if not found:
            return None
        loops = self.backward_loops(source, scope)

        def score(assignment: src.Assignment):
            stmt = assignment.stmt
            in_loop = any(loop.lineno <= stmt.lineno <= loop.end_lineno for loop in loops)
            before = before_row is None or stmt.lineno <= before_row or (from_last_iteration and in_loop)
            return (before, self_referencing(assignment, expression), in_loop, stmt.lineno)

        best = max(found, key=score)
        return Located(source, scope, best.stmt, best.target, source.segment(best.target),
                       self._carried(source, scope, best, expression))

    def backward_loops(self, source, scope) -> list:
        if self.call is None or source.filename != self.call.filename:
            return []
        stmt = src.innermost_statement(scope, self.call.row)
        return src.loops_around(stmt) if stmt is not None else []

    def _carried(self, source, scope, assignment: src.Assignment, expression: str) -> bool:
        if self_referencing(assignment, expression):
            return True
        for loop in src.loops_around(assignment.stmt):
            for stmt in loop.body:
                if stmt.lineno >= assignment.stmt.lineno:
                    break
                if src.reads(stmt, expression):
                    return True
        return False

    def _locate_attribute(self, owner, attribute: str) -> Located | None:
        """Where `owner`'s class assigns `self.<attribute>` (preferably from itself, outside
        `__init__`)."""
        source, class_node = class_source(owner)
        if class_node is None:
            return None
        expression = f"self.{attribute}"
        found = src.assignments(class_node, expression, deep=True) + src.item_assignments(
            class_node, expression, deep=True)
        if not found:
            return None

        def carried(assignment) -> bool:
            if self_referencing(assignment, src.canonical(assignment.target)):
                return True
            # `self.cache[key] = feat` after `feat = feat + self.cache[key]`: read, then replaced.
            method = src.enclosing_function(assignment.stmt)
            return isinstance(assignment.target, ast.Subscript) and method is not None and any(
                read.lineno < assignment.stmt.lineno for read in src.reads(method, expression))

        def score(assignment):
            method = src.enclosing_function(assignment.stmt)
            return (carried(assignment), getattr(method, "name", "") != "__init__", assignment.stmt.lineno)

        best = max(found, key=score)
        method = src.enclosing_function(best.stmt)
        return Located(source, method or class_node, best.stmt, best.target, source.segment(best.target),
                       carried(best), in_init=getattr(method, "name", "") == "__init__", class_node=class_node)

    def _locate_stored(self, binding, source, scope) -> Located | None:
        container = binding.container_expression
        calls = src.appends(scope, container) or src.appends(source.tree, container, deep=True)
        if not calls:
            return None
        return Located(source, scope, calls[-1], calls[-1], container, True)

    def carriers(self, current: graph.Walk, targets: set[int], mark: int) -> list[Candidate]:
        """Bindings that hold stale history (direct), hold it in a container (stored), or are
        current values re-assigned from themselves that reach it (carried), best first."""
        reaching = _reaching(current, targets)
        direct, stored, carried = [], [], []
        for binding in self.bindings():
            grad_fn = binding.value.grad_fn
            if grad_fn is None:
                continue
            key = id(grad_fn)
            if key in targets:
                if binding.in_sequence:
                    stored.append(Candidate(binding, "stored"))
                else:
                    direct.append(Candidate(binding, "direct"))
            elif key in current.nodes:
                if key in reaching and current.seq[key] >= mark:
                    carried.append(Candidate(binding, "carried"))
            elif grad_fn._sequence_nr() >= mark and graph.reaches(grad_fn, targets, mark):
                # e.g. an RNN's final hidden state: made by this step, not used by its loss.
                carried.append(Candidate(binding, "carried"))
        ranked = []
        previous = self.previous
        same_site = (self.call is not None and previous is not None
                     and (previous.filename, previous.row) == (self.call.filename, self.call.row))
        for candidate in direct + stored:
            candidate.located = self.locate(candidate.binding, self.call.row if self.call else None,
                                            from_last_iteration=same_site)
            self._follow_container_alias(candidate)
            ranked.append(candidate)
        carried_located = []
        for candidate in carried:
            candidate.located = self.locate(candidate.binding, self.call.row if self.call else None,
                                            from_last_iteration=same_site)
            if candidate.located is not None and candidate.located.carried:
                carried_located.append(candidate)
        # A carried state re-assigned from itself beats one merely derived from it.
        carried_located.sort(key=lambda c: not _self_ref(c))
        ranked.extend(carried_located)
        for candidate in ranked:
            candidate.name = candidate.located.target_text if candidate.located else (
                candidate.binding.container_expression if candidate.relation == "stored" else candidate.binding.expression)
        return ranked

    def _follow_container_alias(self, candidate: Candidate) -> None:
        """`prev = cache.get("prev")`: the culprit is `cache["prev"] = ...`, where it is kept."""
        located = candidate.located
        value = src.value_of(located.store) if located is not None else None
        key = None
        if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
            container, key = value.value, value.slice
        elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
              and value.func.attr in ("get", "pop") and value.args and isinstance(value.args[0], ast.Constant)):
            container, key = value.func.value, value.args[0]
        if key is None:
            return
        expression = f"{src.canonical(container)}[{key.value!r}]"
        stores = src.assignments(located.scope, expression)
        if not stores:
            return
        store = stores[-1]
        alias = Located(located.source, located.scope, store.stmt, store.target,
                        located.source.segment(store.target), True)
        candidate.located, candidate.relation = alias, "stored"

    def tensors_in_container(self, binding: naming.Binding) -> list:
        """The tensors held by the list, tuple or dict that `binding` is an element of (two
        levels deep: a list of tuples), read from its frame again."""
        frame = self.frames[binding.frame_index]
        scope = frame.f_locals if binding.base in frame.f_locals else frame.f_globals
        value = scope.get(binding.base)
        steps = binding.steps
        while steps and steps[-1][0] == "item":
            steps = steps[:-1]
        for kind, key in steps:
            try:
                value = getattr(value, key) if kind == "attr" else value[key]
            except Exception:  # noqa: BLE001 - the user's object may have changed shape since
                return []
        return list(_tensors_in(value, 2))

    def made_history(self, stmt: ast.stmt) -> bool:
        """Whether a tensor that `stmt` assigned still has autograd history in the user's frames."""
        targets = {src.canonical(t) for t in src.targets_of(stmt)}
        return any(b.expression in targets and b.value.grad_fn is not None for b in self.bindings())

    def lookup(self, expression: str, filename: str):
        """The value of a dotted name (`opt_d`, `self.optimizer`) in the innermost user frame
        running `filename`; None if it is not there or reading an attribute fails (a property
        of the user's may raise anything)."""
        parts = expression.split(".")
        if not all(part.isidentifier() for part in parts):
            return None
        for frame in self.frames:
            if frame.f_code.co_filename != filename:
                continue
            scope = frame.f_locals if parts[0] in frame.f_locals else frame.f_globals
            if parts[0] not in scope:
                return None
            value = scope[parts[0]]
            for part in parts[1:]:
                try:
                    value = getattr(value, part, None)
                except Exception:  # noqa: BLE001
                    return None
            return value
        return None

    def failing_statement(self):
        if self.call is None:
            return None, None, None
        return self.site_statement(self.call.filename, self.call.row)

    def freed_by(self, previous: BackwardCall, repeat: str = "iteration") -> str:
        """`loss.backward()` (line 14) freed / `loss.backward()` in the previous iteration freed
        (`repeat`: what the loop's turns are called, "pass" for a loop over models)."""
        code = self.call_site(previous.filename, previous.row).code
        if self.call is not None and (previous.filename, previous.row) == (self.call.filename, self.call.row):
            return f"`{code}` in the previous {repeat} freed"
        return f"`{code}` (line {previous.row}) freed"

    def culprit(self, candidate: Candidate, role: str) -> Culprit:
        located = candidate.located
        if located is None:
            frame = self.frames[candidate.binding.frame_index]
            return Culprit(candidate.name, frame.f_code.co_filename, Location(frame.f_lineno, 1), role)
        return Culprit(candidate.name, located.source.filename, located.location, role,
                       located.source.line(located.row).strip())


def _container_attribute(binding: naming.Binding) -> str | None:
    """`hidden` for `model.hidden[0]`: the attribute that holds the sequence."""
    steps = binding.steps
    while steps and steps[-1][0] == "item":
        steps = steps[:-1]
    return steps[-1][1] if steps and steps[-1][0] == "attr" else None


def _tensors_in(value, depth: int):
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, (list, tuple)) or depth < 0:
        return
    for item in value[: naming.MAX_ITEMS * 4]:
        if hasattr(item, "grad_fn"):
            yield item
        else:
            yield from _tensors_in(item, depth - 1)


def _self_ref(candidate: Candidate) -> bool:
    located = candidate.located
    if located is None or not isinstance(located.store, ast.stmt):
        return False
    return self_referencing(located.assignment,
                                     src.canonical(located.target_text))


def _reaching(walk: graph.Walk, targets: set[int]) -> set[int]:
    """Nodes of `walk` from which one of `targets` can be reached (targets included)."""
    found = {t for t in targets if t in walk.nodes}
    stack = list(found)
    while stack:
        key = stack.pop()
        for consumer in walk.consumers.get(key, ()):
            if consumer not in found:
                found.add(consumer)
                stack.append(consumer)
    return found


def _shares_history(grad_fn, other: graph.Walk) -> bool:
    """Whether `grad_fn`'s history meets a non-leaf node of `other`."""
    mine = graph.walk([grad_fn])
    return any(key in other.nodes for key, seq in mine.seq.items() if seq != graph.LEAF_SEQ)


def _call_in(stmt, method: str) -> ast.Call | None:
    if stmt is None:
        return None
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call):
            func = node.func
            last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if last == method:
                return node
    return None


def class_source(owner) -> tuple[src.Source | None, ast.ClassDef | None]:
    """The source file and class definition of a user object's class."""
    code = _method_code(type(owner))
    source = src.load(code.co_filename) if code is not None else None
    if source is None:
        return None, None
    return source, src.class_named(source, type(owner).__name__, code.co_firstlineno)


def _method_code(cls):
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch"):
            break
        for value in vars(klass).values():
            code = getattr(value, "__code__", None)
            if code is not None:
                return code
    return None


def self_referencing(assignment: src.Assignment, expression: str) -> bool:
    """`x = f(x)` or `x += y`: the new value is made from the old one."""
    if isinstance(assignment.stmt, ast.AugAssign):
        return True
    value = src.value_of(assignment.stmt)
    return value is not None and bool(src.reads(value, expression))
