"""Turn an autograd error (or a growing retained graph) into a Finding.

The steps: split the graph reachable from the failing backward into nodes created since the
previous backward (current) and before it (stale); find where stale history enters; name the
tensor that carries it by looking through the user's frames; read the source to find the line
that made it; build the fixes. Everything that holds tensors, nodes or frames lives in local
variables of these functions and is gone when they return.
"""
from __future__ import annotations

import ast
import math
import os
import warnings
from dataclasses import dataclass, field

import torch

from .. import source as src
from ..fixes import accumulate_item, detach_carried, detach_for_first_consumer, graph_options
from ..fixes import move_into_loop, no_grad_update, recompute_forward, sum_losses, undo_cut
from ..fixes.edits import delete_lines, insert_lines_before, statement_text
from ..model import CallSite, Culprit, Finding, Fix, Location
from . import graph, journal, naming
from .errors import InplaceDetail, inplace_detail, kind_of
from .hooks import BackwardCall, StepCall

NOTE_PREFIX = "[explainer]"

RETAIN_GRAPH_GROWS = (
    "Don't add retain_graph=True: it would keep every earlier iteration's graph alive, so each "
    "backward goes through all of them (time and memory grow every iteration), and after "
    "optimizer.step() the old graph fails with 'modified by an inplace operation'."
)
RETAIN_GRAPH_AFTER_STEP = (
    "retain_graph=True is wrong here: the optimizer step between the two backward calls changed "
    "weights that the old graph saved, so reusing it raises 'modified by an inplace operation' "
    "(before PyTorch 1.5 it silently gave wrong gradients)."
)


class GraphGrowthWarning(UserWarning):
    """A graph kept alive with retain_graph=True reaches back into earlier iterations."""


# ---------------------------------------------------------------------------------------------
# Entry points called by the hooks


def explain_and_note(error, call, roots, caller, calls, steps) -> None:
    frames = []
    try:
        frames = naming.user_frames(caller)
        finding = explain(error, call, roots, frames, calls, steps)
        if finding is not None:
            journal.record_error(error, finding)
            from ..render.text import render_note

            error.add_note(render_note(finding))
    except Exception as internal:  # the user's error must stand, whatever happens here
        error.add_note(f"{NOTE_PREFIX} could not explain this error ({type(internal).__name__}: "
                       f"{internal}); the error above is PyTorch's own.")
    finally:
        frames.clear()


def warn_if_graph_grows(call, roots, caller, calls, steps) -> bool:
    frames = []
    try:
        frames = naming.user_frames(caller)
        finding = explain_growth(call, roots, frames, calls, steps)
        if finding is None:
            return False
        journal.record_warning(finding)
        from ..render.text import render_note

        warnings.warn_explicit(GraphGrowthWarning(render_note(finding)), GraphGrowthWarning,
                               call.filename, call.row)
        return True
    except Exception:
        return False
    finally:
        frames.clear()


def explain(error, call: BackwardCall | None, roots, frames, calls, steps) -> Finding | None:
    kind = kind_of(error)
    if kind is None:
        return None
    graph.reset_budget()
    context = Context(call, _as_tensors(roots), frames, tuple(calls), tuple(steps))
    if kind == "second-backward":
        return context.second_backward()
    if kind == "inplace-modified":
        return context.inplace_modified(inplace_detail(error))
    return context.no_grad()


def explain_growth(call, roots, frames, calls, steps) -> Finding | None:
    graph.reset_budget()
    context = Context(call, _as_tensors(roots), frames, tuple(calls), tuple(steps))
    return context.graph_growth()


def _as_tensors(roots) -> list:
    if isinstance(roots, torch.Tensor):
        return [roots]
    try:
        return [t for t in roots if isinstance(t, torch.Tensor)]
    except TypeError:
        return []


# ---------------------------------------------------------------------------------------------
# Where a tensor came from in the source


@dataclass
class Located:
    """The statement that made a binding's current value, as the user wrote it."""

    source: src.Source
    scope: ast.AST
    store: ast.AST  # an assignment statement or a `container.append(...)` call
    target_text: str
    carried: bool
    in_init: bool = False
    class_node: ast.ClassDef | None = None

    @property
    def row(self) -> int:
        return self.store.lineno

    @property
    def location(self) -> Location:
        target = getattr(self, "_target_node", None)
        node = target if target is not None else self.store
        return Location(node.lineno, self.source.column(node.lineno, node.col_offset))


@dataclass
class Candidate:
    binding: naming.Binding
    relation: str  # "direct" | "stored" | "carried"
    located: Located | None = None
    name: str = ""


@dataclass
class Context:
    call: BackwardCall | None
    roots: list
    frames: list
    calls: tuple
    steps: tuple
    _bindings: list | None = field(default=None, repr=False)

    # -- shared helpers ------------------------------------------------------------------------

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

    # -- locating bindings in source --------------------------------------------------------------

    def locate(self, binding: naming.Binding, before_row: int | None = None) -> Located | None:
        frame = self.frames[binding.frame_index]
        source, scope = self.frame_source(frame)
        if source is None:
            return None
        if binding.in_container and isinstance(binding.steps[-1][1], int):
            container = binding.container_expression
            whole = src.assignments(scope, container)
            if whole and not src.appends(scope, container):
                return self._pick(source, scope, whole, container, before_row)
            return self._locate_stored(binding, source, scope)
        expression = binding.expression
        found = self._pick(source, scope, src.assignments(scope, expression), expression, before_row)
        if found is None and scope is not source.tree:
            found = self._pick(source, source.tree, src.assignments(source.tree, expression),
                               expression, None)
        if found is None and binding.steps and binding.steps[-1][0] == "attr" and binding.owner is not None:
            found = self._locate_attribute(binding)
        return found

    def _pick(self, source, scope, found, expression, before_row) -> Located | None:
        if not found:
            return None
        loops = self._backward_loops(source, scope)

        def score(assignment: src.Assignment):
            stmt = assignment.stmt
            in_loop = any(loop.lineno <= stmt.lineno <= loop.end_lineno for loop in loops)
            before = before_row is None or stmt.lineno <= before_row
            return (before, self._self_referencing(assignment, expression), in_loop, stmt.lineno)

        best = max(found, key=score)
        located = Located(source, scope, best.stmt, source.segment(best.target),
                          self._carried(source, scope, best, expression))
        located._target_node = best.target
        return located

    def _backward_loops(self, source, scope) -> list:
        if self.call is None or source.filename != self.call.filename:
            return []
        stmt = src.innermost_statement(scope, self.call.row)
        return src.loops_around(stmt) if stmt is not None else []

    @staticmethod
    def _self_referencing(assignment: src.Assignment, expression: str) -> bool:
        value = src.value_of(assignment.stmt)
        if isinstance(assignment.stmt, ast.AugAssign):
            return True
        return value is not None and bool(src.reads(value, expression))

    def _carried(self, source, scope, assignment: src.Assignment, expression: str) -> bool:
        if self._self_referencing(assignment, expression):
            return True
        for loop in src.loops_around(assignment.stmt):
            for stmt in loop.body:
                if stmt.lineno >= assignment.stmt.lineno:
                    break
                if src.reads(stmt, expression):
                    return True
        return False

    def _locate_attribute(self, binding: naming.Binding) -> Located | None:
        owner, attribute = binding.owner, binding.steps[-1][1]
        code = _method_code(type(owner))
        if code is None:
            return None
        source = src.load(code.co_filename)
        if source is None:
            return None
        class_node = src.class_named(source, type(owner).__name__, code.co_firstlineno)
        if class_node is None:
            return None
        expression = f"self.{attribute}"
        found = src.assignments(class_node, expression, deep=True)
        if not found:
            return None

        def score(assignment):
            method = _method_of(assignment.stmt)
            return (self._self_referencing(assignment, expression),
                    getattr(method, "name", "") != "__init__", assignment.stmt.lineno)

        best = max(found, key=score)
        method = _method_of(best.stmt)
        located = Located(source, method or class_node, best.stmt, source.segment(best.target),
                          self._self_referencing(best, expression),
                          in_init=getattr(method, "name", "") == "__init__", class_node=class_node)
        located._target_node = best.target
        return located

    def _locate_stored(self, binding, source, scope) -> Located | None:
        container = binding.container_expression
        calls = src.appends(scope, container) or src.appends(source.tree, container, deep=True)
        if not calls:
            return None
        call = calls[-1]
        located = Located(source, scope, call, container, True)
        located._target_node = call
        return located

    # -- naming the carrier of stale history -------------------------------------------------------

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
                (stored if binding.in_container and isinstance(binding.steps[-1][1], int) else direct).append(
                    Candidate(binding, "stored" if binding.in_container and isinstance(binding.steps[-1][1], int) else "direct"))
            elif key in current.nodes:
                if key in reaching and current.seq[key] >= mark:
                    carried.append(Candidate(binding, "carried"))
            elif grad_fn._sequence_nr() >= mark and graph.reaches(grad_fn, targets, mark):
                # e.g. an RNN's final hidden state: made by this step, not used by its loss.
                carried.append(Candidate(binding, "carried"))
        ranked = []
        for candidate in direct + stored:
            candidate.located = self.locate(candidate.binding, self.call.row if self.call else None)
            self._follow_container_alias(candidate)
            ranked.append(candidate)
        carried_located = []
        for candidate in carried:
            candidate.located = self.locate(candidate.binding, self.call.row if self.call else None)
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
        alias = Located(located.source, located.scope, store.stmt, located.source.segment(store.target), True)
        alias._target_node = store.target
        candidate.located, candidate.relation = alias, "stored"

    # -- second-backward ------------------------------------------------------------------------------

    def second_backward(self) -> Finding | None:
        previous = self.previous
        roots = self.root_nodes()
        if not roots:
            return None
        if previous is None:
            return self._unrecorded_second_backward(roots)
        mark = previous.mark
        current = graph.walk(roots, expand=lambda seq: seq >= mark)
        if all(current.seq[id(r)] >= mark for r in roots):
            targets = set(graph.stale_boundary(current, mark))
            if not targets and not current.complete:
                return self._unrecorded_second_backward(roots, current)
        else:
            current, targets = self._shared_with_previous(roots, previous)
            mark = min(current.seq[id(r)] for r in roots)
        if previous.api == "grad" and not previous.retain_graph:
            finding = self._freed_by_grad(current, targets, previous)
            if finding is not None:
                return finding
        candidates = self.carriers(current, targets, mark)
        if not candidates:
            return self._generic_second_backward(previous)
        return self._second_backward_finding(candidates[0], previous, current)

    def _shared_with_previous(self, roots, previous) -> tuple[graph.Walk, set[int]]:
        """Both losses were built before the first backward (one trunk, two heads): where
        this graph meets the one the previous backward went through."""
        previous_roots = [b.value.grad_fn for b in self.bindings()
                          if id(b.value) in previous.root_ids and b.value.grad_fn is not None
                          and b.value.grad_fn._sequence_nr() < previous.mark]
        full = graph.walk(roots, reserve=graph.WRAP_BUDGET // 5 if previous_roots else 0)
        if not previous_roots:
            return full, {id(r) for r in roots}
        before = graph.walk(previous_roots)
        return full, set(graph.shared_top(full, before)) or {id(r) for r in roots}

    def _failing_statement(self):
        if self.call is None:
            return None, None, None
        return self.site_statement(self.call.filename, self.call.row)

    def _second_backward_finding(self, candidate: Candidate, previous: BackwardCall, current) -> Finding:
        located = candidate.located
        name = candidate.name
        source, scope, failing = self._failing_statement()
        backward_site = self.call_site(self.call.filename, self.call.row)
        freed_site = self.call_site(previous.filename, previous.row)
        between = self.steps_between(previous.tick, self.call.tick)
        where = f"{os.path.basename(located.source.filename)}:{located.row}" if located else "an earlier line"
        fixes: list[Fix] = []
        advice = RETAIN_GRAPH_GROWS
        same_iteration = previous.row != self.call.row or previous.filename != self.call.filename

        if candidate.relation == "carried":
            role = "carried across iterations"
            summary = f"`{name}` carries the graph of the previous iteration into this backward."
            detail = (f"`{name}`, re-assigned at {where}, still carries the autograd graph of the "
                      f"previous iteration. {self._freed_by(previous)} that graph, "
                      f"and this backward (line {self.call.row}) tries to go through it again.")
            fixes += self._carried_fixes(candidate, failing)
        elif candidate.relation == "stored":
            role = "stores tensors that keep earlier graphs"
            summary = f"`{name}` keeps tensors whose graphs an earlier backward already freed."
            detail = (f"`{name}` (filled at {where}) holds tensors with the graphs of earlier steps. "
                      f"{self._freed_by(previous)} those graphs, and this "
                      f"backward (line {self.call.row}) reaches them through `{name}`.")
            if located is not None:
                fixes.append(detach_carried.detach_stored_value(located.source, located.store, name))
        else:
            role, summary, detail, more_fixes, advice = self._direct(candidate, previous, between, failing, source, scope)
            fixes += more_fixes
        fixes = [f for f in fixes if f is not None]
        if fixes:
            detail += f" Fix: {fixes[0].message}."
        culprits = [self._culprit(candidate, role)]
        return Finding(
            kind="second-backward", severity="error", summary=summary, message=detail,
            culprits=culprits, fixes=fixes, backward=backward_site, freed_by=freed_site,
            steps=[self.call_site(s.filename, s.row) for s in between], retain_graph_advice=advice,
            confidence="certain" if located is not None else "likely",
        )

    def _freed_by(self, previous: BackwardCall) -> str:
        """`loss.backward()` (line 14) freed / `loss.backward()` in the previous iteration freed."""
        code = self.call_site(previous.filename, previous.row).code
        if self.call is not None and (previous.filename, previous.row) == (self.call.filename, self.call.row):
            return f"`{code}` in the previous iteration freed"
        return f"`{code}` (line {previous.row}) freed"

    def _culprit(self, candidate: Candidate, role: str) -> Culprit:
        located = candidate.located
        if located is None:
            frame = self.frames[candidate.binding.frame_index]
            return Culprit(candidate.name, frame.f_code.co_filename, Location(frame.f_lineno, 1), role)
        return Culprit(candidate.name, located.source.filename, located.location, role,
                       located.source.line(located.row).strip())

    def _carried_fixes(self, candidate: Candidate, failing) -> list[Fix | None]:
        located = candidate.located
        if located is None:
            return []
        source, name = located.source, candidate.name
        value = candidate.binding.value
        is_tuple = False
        stmt = located.store
        fixes: list[Fix | None] = []
        # An LSTM state is a tuple (h, c): the binding found is one element of it.
        target = getattr(located, "_target_node", None)
        if candidate.binding.in_container and isinstance(candidate.binding.steps[-1][1], int):
            container = candidate.binding.container_expression
            if src.assignments(located.scope, container):
                name, is_tuple = container, True
        receiver = src.call_receiver(failing, "backward") if failing is not None else None
        if located.class_node is not None:
            # Module state assigned in a method (forward). A submodule call (`self.gru(x,
            # self.hidden)`) makes the new state from the old one: detach the old one there.
            # Anything else keeps tensors of this step in the state: store it without history.
            value = getattr(stmt, "value", None)
            if isinstance(value, ast.Call) and _is_self_call(value):
                fixes.append(detach_carried.detach_where_read(source, name, src.Assignment(stmt, target), is_tuple))
            elif isinstance(value, ast.Call):
                fixes.append(detach_carried.detach_stored_value(source, stmt, name))
            fixes.append(no_grad_update.update_under_no_grad(source, stmt, name))
            return fixes
        if isinstance(stmt, (ast.Assign, ast.AugAssign)) and receiver is not None \
                and src.canonical(receiver) == src.canonical(name):
            fixes.append(accumulate_item.accumulate_with_item(source, name, src.Assignment(stmt, target), receiver))
        loops = self._backward_loops(source, located.scope)
        loop = loops[-1] if loops else None
        for candidate_loop in loops:
            if any(s is stmt for s in candidate_loop.body):
                loop = candidate_loop
        if loop is not None:
            fixes.append(detach_carried.keep_discarded_detach(source, name, loop, is_tuple))
            if any(s is stmt for s in loop.body):
                fixes.append(detach_carried.detach_where_read(source, name, src.Assignment(stmt, target), is_tuple))
            fixes.append(detach_carried.detach_at_loop_entry(source, name, loop, is_tuple))
        return fixes

    def _direct(self, candidate, previous, between, failing, source, scope):
        """A tensor made once and used by two backward calls: which of the shared-graph
        families is this, and its fixes."""
        located, name = candidate.located, candidate.name
        where = f"{os.path.basename(located.source.filename)}:{located.row}" if located else "an earlier line"
        freed_code = self.call_site(previous.filename, previous.row).code
        fixes: list[Fix | None] = []
        # Made before the loop (or closure) that repeats the backward, or once in __init__.
        if located is not None and located.in_init and located.class_node is not None:
            attribute = located.target_text
            fixes.append(move_into_loop.inline_attribute(located.source, located.class_node, located.store, attribute))
            role = "computed once in __init__"
            summary = f"`{name}` was computed once, in `__init__`, and every call reuses its graph."
            detail = (f"`{name}` is computed once at {where} from parameters, so every forward reuses "
                      f"the same graph. {self._freed_by(previous)} it, and this backward "
                      f"(line {self.call.row}) needs it again.")
            return role, summary, detail, fixes, RETAIN_GRAPH_GROWS
        owner = self._repeating_owner(located, failing, source)
        if owner is not None:
            fixes.append(move_into_loop.move_into_body(located.source, located.store, owner, name))
            kind = "closure" if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)) else "loop"
            role = f"computed once before the {kind}"
            summary = f"`{name}` is computed once, before the {kind}, and every backward reuses its graph."
            detail = (f"`{name}` is computed once at {where}, before the {kind} that calls backward. "
                      f"{self._freed_by(previous)} its graph, and this backward "
                      f"(line {self.call.row}) goes through it again.")
            return role, summary, detail, fixes, RETAIN_GRAPH_GROWS
        # Used by two backward calls of one iteration.
        role = "shared by two backward calls"
        detail = (f"`{name}` (made at {where}) is part of the graphs of two backward calls. "
                  f"`{freed_code}` (line {previous.row}) went through it first and freed its graph; "
                  f"this backward (line {self.call.row}) needs it again.")
        summary = f"`{name}` is shared by two backward calls, and the first one freed its graph."
        _, _, previous_stmt = self.site_statement(previous.filename, previous.row)
        advice = RETAIN_GRAPH_AFTER_STEP
        if located is None or failing is None:
            return role, summary, detail, fixes, advice
        if between:
            stepped = _optimizer_parameters(between)
            produced_by = _parameters_under(candidate.binding.value.grad_fn)
            last_step = max(between, key=lambda s: s.tick)
            if stepped and not (stepped & produced_by):
                fixes.append(detach_for_first_consumer.detach_before(
                    located.source, located.scope, name, located.store.end_lineno, previous.row))
                advice = ("retain_graph=True would make this run, but the first loss would still "
                          "back-propagate into the model that produced "
                          f"`{name}`: detach it for that update instead.")
            fixes.append(recompute_forward.recompute_before_use(
                located.source, located.scope, located.store, last_step.row, failing,
                f"Recompute `{name}` after `{self.call_site(last_step.filename, last_step.row).code}`"
                f" (line {last_step.row}): the step changed the weights its graph was built with"))
        else:
            fixes.append(sum_losses.sum_and_backward_once(source, previous_stmt, failing) if previous_stmt is not None else None)
            call = _call_in(previous_stmt, "backward") if previous_stmt is not None else None
            if call is not None:
                fixes.append(graph_options.add_retain_graph(
                    source, call, "Keep the shared graph for the second backward with "
                    "`retain_graph=True` on the first one (correct here: no step in between)"))
            advice = ("retain_graph=True on the first backward is correct here (no optimizer step "
                      "between the two backward calls), but summing the losses and calling "
                      "backward once is faster and frees the graph.")
        return role, summary, detail, fixes, advice

    def _repeating_owner(self, located: Located | None, failing, source) -> ast.AST | None:
        """The loop or closure that repeats the failing backward while `located` is outside it."""
        if located is None or failing is None or source is None or located.source.filename != source.filename:
            return None
        store = located.store
        for ancestor in src.ancestors(failing):
            if isinstance(ancestor, (ast.For, ast.AsyncFor, ast.While)):
                if not (ancestor.lineno <= store.lineno <= ancestor.end_lineno) and store.lineno < ancestor.lineno:
                    return ancestor
            if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if store.lineno < ancestor.lineno and located.scope is not ancestor:
                    return ancestor
                break
        return None

    def _freed_by_grad(self, current, targets, previous) -> Finding | None:
        _, _, grad_stmt = self.site_statement(previous.filename, previous.row)
        source, _, failing = self._failing_statement()
        if grad_stmt is None or source is None:
            return None
        call = _call_in(grad_stmt, "grad")
        if call is None:
            return None
        freed = call.args[0] if call.args else None
        name = source.segment(freed) if freed is not None else "the graph"
        fix = graph_options.add_create_graph(source, call)
        grad_code = source.segment(call)
        message = (f"`{grad_code}` at line {previous.row} back-propagated through `{name}`'s graph and "
                   f"freed it (no create_graph/retain_graph), and this backward (line {self.call.row}) "
                   f"goes through `{name}` again. Its result feeds a loss, so it must build a graph "
                   f"itself.")
        if fix is not None:
            message += f" Fix: {fix.message}."
        row = grad_stmt.lineno
        targets = src.targets_of(grad_stmt)
        anchor = targets[0] if targets else call
        result = source.segment(targets[0]) if targets else grad_code
        culprit = Culprit(result, source.filename, Location(anchor.lineno, source.column(anchor.lineno, anchor.col_offset)),
                          f"computed without a graph; `{name}`'s graph was freed by it", source.line(row).strip())
        return Finding(
            kind="second-backward", severity="error",
            summary=f"`autograd.grad` freed `{name}`'s graph, and the final backward needs it.",
            message=message, culprits=[culprit], fixes=[fix] if fix else [],
            backward=self.call_site(self.call.filename, self.call.row),
            freed_by=self.call_site(previous.filename, previous.row),
            retain_graph_advice="retain_graph=True alone would run, but the penalty would have no "
                                "gradient: create_graph=True is what makes the gradient differentiable.",
        )

    def _generic_second_backward(self, previous: BackwardCall | None) -> Finding:
        freed = self.call_site(previous.filename, previous.row) if previous else None
        message = ("This backward goes through a graph that an earlier backward already freed"
                   + (f" (`{freed.code}`, line {freed.row})" if freed else "")
                   + ", but no variable in your frames holds the tensor that links them.")
        return Finding(kind="second-backward", severity="error",
                       summary="This backward reaches a graph an earlier backward freed.",
                       message=message, backward=self.call_site(self.call.filename, self.call.row) if self.call else None,
                       freed_by=freed, retain_graph_advice=RETAIN_GRAPH_GROWS, confidence="guess")

    def _unrecorded_second_backward(self, roots, walked: graph.Walk | None = None) -> Finding | None:
        """No mark splits the graph: no earlier backward was recorded (installed late, or
        post-mortem), or the graph is larger than one explanation may walk (`walked`). Rank the
        tensors related to this graph by what the source says about them (carried from itself,
        stored in a container, made before the loop)."""
        full = walked if walked is not None else graph.walk(roots)
        root_keys = {id(r) for r in roots}
        source, _, failing = self._failing_statement()
        best, best_score = None, 0
        for binding in self.bindings():
            grad_fn = binding.value.grad_fn
            if grad_fn is None or id(grad_fn) in root_keys:
                continue
            if id(grad_fn) not in full.nodes and (not graph.budget_left() or not _shares_history(grad_fn, full)):
                continue
            candidate = Candidate(binding, "direct")
            candidate.located = located = self.locate(binding, self.call.row if self.call else None)
            if located is None:
                continue
            if isinstance(located.store, ast.Call):
                candidate.relation, score = "stored", 3
            elif located.carried:
                candidate.relation, score = "carried", 3
            elif located.in_init or self._repeating_owner(located, failing, source) is not None:
                score = 2
            else:
                continue
            if score > best_score:
                best, best_score = candidate, score
        if best is None:
            return None
        located = best.located
        best.name = located.target_text
        where = f"{os.path.basename(located.source.filename)}:{located.row}"
        if best.relation == "carried":
            fixes = self._carried_fixes(best, failing)
            how = f"is re-assigned from itself at {where}, so it carries the graph of the previous iteration"
        elif best.relation == "stored":
            fixes = [detach_carried.detach_stored_value(located.source, located.store, best.name)]
            how = f"is filled at {where} with tensors that keep the graphs of earlier steps"
        elif located.in_init and located.class_node is not None:
            fixes = [move_into_loop.inline_attribute(located.source, located.class_node, located.store, located.target_text)]
            how = f"is computed once at {where}, in `__init__`, so every call reuses its graph"
        else:
            owner = self._repeating_owner(located, failing, source)
            fixes = [move_into_loop.move_into_body(located.source, located.store, owner, best.name)]
            how = f"is computed once at {where}, before the loop, so every backward reuses its graph"
        fixes = [f for f in fixes if f is not None]
        why = (f"The graph is larger than one explanation walks ({len(full.nodes):,} nodes seen)"
               if walked is not None else
               "No earlier backward was recorded (the explainer was not installed yet)")
        message = (f"`{best.name}` {how}; an earlier backward freed that graph and this backward "
                   f"goes through it again. {why}, so this is read from the source and from what "
                   f"the graph shows: likely, not certain.")
        if fixes:
            message += f" Fix: {fixes[0].message}."
        return Finding(
            kind="second-backward", severity="error",
            summary=f"`{best.name}` most likely carries a graph that an earlier backward freed.",
            message=message, culprits=[self._culprit(best, "likely carrier of the freed graph")],
            fixes=fixes, backward=self.call_site(self.call.filename, self.call.row) if self.call else None,
            retain_graph_advice=RETAIN_GRAPH_GROWS, confidence="likely",
        )

    # -- graph-growth --------------------------------------------------------------------------------

    def graph_growth(self) -> Finding | None:
        retained = [c for c in self.calls if c.retain_graph]
        if not retained:
            return None
        previous = self.previous
        roots = self.root_nodes()
        if not roots or previous is None:
            return None
        mark = previous.mark
        current = graph.walk(roots, expand=lambda seq: seq >= mark)
        if not all(current.seq[id(r)] >= mark for r in roots):
            return None
        targets = set(graph.stale_boundary(current, mark))
        if not targets:
            return None
        candidates = self.carriers(current, targets, mark)
        if not candidates or candidates[0].relation == "direct" and not candidates[0].located:
            return None
        candidate = candidates[0]
        located = candidate.located
        _, _, failing = self._failing_statement()
        fixes = [f for f in self._carried_fixes(candidate, failing) if f is not None] if candidate.relation == "carried" else []
        if candidate.relation == "stored" and located is not None:
            fixes = [f for f in [detach_carried.detach_stored_value(located.source, located.store, candidate.name)] if f]
        call = _call_in(failing, "backward") if failing is not None else None
        drop = graph_options.drop_keyword(located.source, call, "retain_graph") if (call is not None and located) else None
        if drop is not None:
            fixes = [Fix(f.message + ", and drop `retain_graph=True`", f.edits + (drop,), f.applicability) for f in fixes]
        where = f"{os.path.basename(located.source.filename)}:{located.row}" if located else "an earlier line"
        name = candidate.name
        return Finding(
            kind="graph-growth", severity="warning",
            summary=f"`{name}` links each iteration's graph to the previous one; retain_graph=True keeps them all.",
            message=(f"`{name}` (re-assigned at {where}) carries autograd history from earlier "
                     f"iterations, and retain_graph=True at line {self.call.row} keeps that history "
                     f"alive: every backward goes through all earlier iterations, so each step gets "
                     f"slower and memory grows." + (f" Fix: {fixes[0].message}." if fixes else "")),
            culprits=[self._culprit(candidate, "carried across iterations")], fixes=fixes,
            backward=self.call_site(self.call.filename, self.call.row),
            retain_graph_advice=RETAIN_GRAPH_GROWS,
        )

    # -- inplace-modified --------------------------------------------------------------------------------

    def inplace_modified(self, detail: InplaceDetail | None) -> Finding | None:
        roots = self.root_nodes()
        if not roots:
            return None
        full = graph.walk(roots)
        failing_key, saved_name = _failing_saved(full)
        parameter = _modified_parameter(full, failing_key, detail)
        parameter_name = self._parameter_name(parameter) if parameter is not None else None
        failing_seq = full.seq.get(failing_key, 0) if failing_key is not None else 0
        steps = [s for s in self.steps if s.mark > failing_seq and (self.call is None or s.tick < self.call.tick)]
        step = _step_for(steps, parameter)
        # The tensor built before the step whose graph this backward reuses.
        reaching = _reaching(full, {failing_key}) if failing_key is not None else set()
        built_before = [b for b in self.bindings() if b.value.grad_fn is not None
                        and id(b.value.grad_fn) in reaching
                        and (step is None or full.seq.get(id(b.value.grad_fn), 0) < step.mark)]
        built_before.sort(key=lambda b: full.seq.get(id(b.value.grad_fn), 0))
        carrier = Candidate(built_before[0], "direct") if built_before else None
        if carrier is not None:
            carrier.located = self.locate(carrier.binding, self.call.row if self.call else None)
            carrier.name = carrier.located.target_text if carrier.located else carrier.binding.expression
        step_site = self.call_site(step.filename, step.row) if step else None
        name = parameter_name or (detail and f"a {list(detail.shape)} tensor") or "a saved tensor"
        source, scope, failing = self._failing_statement()
        fixes: list[Fix | None] = []
        if carrier is not None and carrier.located is not None and step is not None and failing is not None:
            located = carrier.located
            recompute = recompute_forward.recompute_before_use(
                located.source, located.scope, located.store, step.row, failing,
                f"Recompute `{carrier.name}` after `{step_site.code}` (line {step.row}), so this "
                f"backward goes through a graph built with the updated weights")
            if recompute is not None:
                edits = recompute.edits
                previous = self.previous
                if previous is not None and previous.retain_graph and not self._reads_history(located):
                    _, _, previous_stmt = self.site_statement(previous.filename, previous.row)
                    call = _call_in(previous_stmt, "backward") if previous_stmt is not None else None
                    drop = graph_options.drop_keyword(located.source, call, "retain_graph") if call else None
                    if drop is not None:
                        edits = edits + (drop,)
                fixes.append(Fix(recompute.message, edits))
            fixes.append(_reorder_step(source, scope, step, failing))
        fixes = [f for f in fixes if f is not None]
        where = (f"{os.path.basename(carrier.located.source.filename)}:{carrier.located.row}"
                 if carrier is not None and carrier.located else "before the step")
        message = (f"`{name}` was changed in place by `{step_site.code}` (line {step.row}) after the "
                   f"graph that this backward uses was built (`{carrier.name if carrier else 'the forward'}` at {where}). "
                   f"The graph saved the old weights (version {detail.expected_version if detail else '?'}), "
                   f"and they are now at version {detail.version if detail else '?'}."
                   if step_site else
                   f"`{name}` was changed in place after the graph that this backward uses saved it.")
        if fixes:
            message += f" Fix: {fixes[0].message}."
        culprits = []
        if carrier is not None and carrier.located is not None:
            located = carrier.located
            culprits.append(Culprit(name, located.source.filename, located.location,
                                    f"modified in place by {step_site.code if step_site else 'an in-place operation'} after this graph was built",
                                    located.source.line(located.row).strip()))
            culprits.append(self._culprit(carrier, "built before the step, back-propagated after it"))
        elif step_site is not None:
            culprits.append(Culprit(name, step_site.filename, Location(step_site.row, 1), "modified in place by the optimizer step", step_site.code))
        return Finding(
            kind="inplace-modified", severity="error",
            summary=f"`{name}` was updated by the optimizer after this graph was built.",
            message=message, culprits=culprits, fixes=fixes,
            backward=self.call_site(self.call.filename, self.call.row) if self.call else None,
            steps=[step_site] if step_site else [], retain_graph_advice=RETAIN_GRAPH_AFTER_STEP,
            confidence="certain" if parameter_name and step_site else "likely",
        )

    def _reads_history(self, located: Located) -> bool:
        """Whether the statement reads a tensor that has autograd history of its own."""
        value = src.value_of(located.store)
        if value is None:
            return True
        names = src.names_read(value)
        return any(b.base in names and not b.steps and b.value.grad_fn is not None
                   for b in self.bindings())

    def _parameter_name(self, parameter) -> str | None:
        names = []
        for expression, module, index in naming.module_bindings(self.frames):
            for dotted, candidate in module.named_parameters():
                if candidate is parameter:
                    names.append((index, len(expression), naming.parameter_name(expression, dotted)))
        for binding in self.bindings():
            if binding.value is parameter:
                names.append((binding.frame_index, 99, binding.expression))
        return min(names)[2] if names else None

    # -- no-grad -----------------------------------------------------------------------------------------

    def no_grad(self) -> Finding | None:
        source, scope, failing = self._failing_statement()
        if failing is None:
            return None
        receiver = src.call_receiver(failing, "backward")
        if receiver is None:
            call = _call_in(failing, "grad") or _call_in(failing, "backward")
            receiver = call.args[0] if call is not None and call.args else None
        if receiver is None:
            return None
        frame = next((f for f in self.frames if f.f_code.co_filename == source.filename), None)
        values = dict(frame.f_globals) if frame is not None else {}
        if frame is not None:
            values.update(frame.f_locals)
        pending = [(src.canonical(receiver), self.call.row)]
        seen = set()
        while pending:
            expression, before = pending.pop(0)
            if expression in seen or len(seen) > 24:
                continue
            seen.add(expression)
            found = [a for a in src.assignments(scope, expression) if a.stmt.lineno < before]
            if not found:
                continue
            assignment = found[-1]
            cut = _cut_in(assignment.stmt)
            if cut is not None:
                return self._no_grad_finding(source, scope, assignment, cut)
            for name in sorted(src.names_read(assignment.stmt.value) if src.value_of(assignment.stmt) is not None else []):
                value = values.get(name)
                if isinstance(value, torch.Tensor) and not value.requires_grad:
                    pending.append((name, assignment.stmt.lineno))
        return None

    def _no_grad_finding(self, source, scope, assignment, cut) -> Finding:
        name = source.segment(assignment.target)
        stmt = assignment.stmt
        fixes: list[Fix | None] = []
        if isinstance(cut, ast.With):
            how = "`torch.no_grad()`"
            fixes.append(undo_cut.leave_no_grad(source, cut))
        else:
            how = f"`.{cut.func.attr}()`" if isinstance(cut.func, ast.Attribute) else f"`{src.canonical(cut.func)}()`"
            if isinstance(cut.func, ast.Attribute) and cut.func.attr == "detach":
                if src.canonical(cut.func.value) == src.canonical(assignment.target):
                    fixes.append(undo_cut.recompute_instead_of_detach(source, scope, stmt, name))
            fixes.append(undo_cut.remove_detach(source, cut))
        fixes = [f for f in fixes if f is not None]
        row = stmt.lineno
        message = (f"`{name}` was cut from the graph by {how} at "
                   f"{os.path.basename(source.filename)}:{row}, so the loss built from it has no "
                   f"grad_fn and there is nothing to back-propagate (line {self.call.row}).")
        if fixes:
            message += f" Fix: {fixes[0].message}."
        target = assignment.target
        return Finding(
            kind="no-grad", severity="error",
            summary=f"`{name}` was detached from the graph before the loss was built.",
            message=message,
            culprits=[Culprit(name, source.filename, Location(target.lineno, source.column(target.lineno, target.col_offset)),
                              f"cut from the graph by {how}", source.line(row).strip())],
            fixes=fixes, backward=self.call_site(self.call.filename, self.call.row),
            retain_graph_advice="retain_graph has nothing to do with this error: the loss has no graph at all.",
        )


# ---------------------------------------------------------------------------------------------
# Small helpers


def _self_ref(candidate: Candidate) -> bool:
    located = candidate.located
    if located is None or not isinstance(located.store, ast.stmt):
        return False
    return Context._self_referencing(src.Assignment(located.store, getattr(located, "_target_node", located.store)),
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


_SAVED_BY_TYPE: dict[type, tuple[str, ...]] = {}


def _saved_attributes(node) -> tuple[str, ...]:
    kind = type(node)
    names = _SAVED_BY_TYPE.get(kind)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_saved_"))
        _SAVED_BY_TYPE[kind] = names
    return names


def _failing_saved(walk: graph.Walk) -> tuple[int | None, str | None]:
    """The node whose saved tensor fails the version check, in the engine's order."""
    order = sorted((k for k, s in walk.seq.items() if s != graph.LEAF_SEQ), key=lambda k: -walk.seq[k])
    for key in order:
        node = walk.nodes[key]
        for attribute in _saved_attributes(node):
            try:
                getattr(node, attribute)
            except RuntimeError as error:
                if "inplace operation" in str(error):
                    return key, attribute
            except Exception:
                continue
    return None, None


def _modified_parameter(walk: graph.Walk, failing_key: int | None, detail: InplaceDetail | None):
    numel = math.prod(detail.shape) if detail else None

    def matches(variable) -> bool:
        if variable is None:
            return False
        if detail is None:
            return True
        return variable._version == detail.version and variable.numel() == numel

    if failing_key is not None:
        frontier, seen = [walk.nodes[failing_key]], set()
        for _ in range(4):
            next_frontier = []
            for node in frontier:
                for child, _ in node.next_functions:
                    if child is None or id(child) in seen:
                        continue
                    seen.add(id(child))
                    if graph.is_leaf(child) and matches(graph.leaf_variable(child)):
                        return graph.leaf_variable(child)
                    next_frontier.append(child)
            frontier = next_frontier
    for node in walk.nodes.values():
        if graph.is_leaf(node) and matches(graph.leaf_variable(node)):
            return graph.leaf_variable(node)
    return None


def _optimizer_parameters(steps) -> set[int]:
    ids = set()
    for step in steps:
        optimizer = step.optimizer()
        if optimizer is not None:
            ids |= {id(p) for group in optimizer.param_groups for p in group["params"]}
    return ids


def _parameters_under(grad_fn) -> set[int]:
    if grad_fn is None:
        return set()
    result = graph.walk([grad_fn])
    return {id(graph.leaf_variable(n)) for n in result.nodes.values() if graph.is_leaf(n)}


def _step_for(steps, parameter) -> StepCall | None:
    if not steps:
        return None
    if parameter is not None:
        for step in reversed(steps):
            optimizer = step.optimizer()
            if optimizer is not None and any(p is parameter for g in optimizer.param_groups for p in g["params"]):
                return step
    return steps[-1]


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


def _cut_in(stmt: ast.stmt):
    """What cut the graph in this assignment: a `.detach()`-like call, or an enclosing
    `with torch.no_grad()`."""
    value = src.value_of(stmt)
    if value is not None:
        calls = src.calls_named(value, "detach", "item", "numpy", "tolist", "float")
        if calls:
            return calls[0]
    for ancestor in src.ancestors(stmt):
        if isinstance(ancestor, ast.With) and any(
            "no_grad" in src.canonical(item.context_expr) or "inference_mode" in src.canonical(item.context_expr)
            for item in ancestor.items
        ):
            return ancestor
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
    return None


def _reorder_step(source, scope, step: StepCall, failing) -> Fix | None:
    if source is None or failing is None or step.filename != source.filename:
        return None
    step_stmt = src.innermost_statement(scope, step.row)
    if step_stmt is None or not isinstance(step_stmt, ast.Expr) or step_stmt.lineno >= failing.lineno:
        return None
    if src.parent(step_stmt) is not src.parent(failing):
        return None
    lines = statement_text(source, step_stmt)
    after = failing.end_lineno + 1
    edits = (delete_lines(source, step_stmt),
             _insert_at_row(source, after, [source.indent_of(failing.lineno) + line for line in lines]))
    return Fix(f"Move `{source.segment(step_stmt)}` after this backward, the last one that needs the "
               f"old weights (changes which gradients that step sees)", edits, "unsafe")


def _insert_at_row(source, row: int, lines: list[str]):
    from ..model import Edit

    at = Location(row, 1)
    return Edit(source.filename, "".join(line + "\n" for line in lines), at, at)


def _method_code(cls):
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch"):
            break
        for value in vars(klass).values():
            code = getattr(value, "__code__", None)
            if code is not None:
                return code
    return None


def _is_self_call(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"


def _method_of(node: ast.AST):
    for ancestor in src.ancestors(node):
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return ancestor
    return None
