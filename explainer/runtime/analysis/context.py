"""One explanation's inputs: the failing call, the recorded calls and steps, the user's frames
and the tensors bound in them, and the source of the calls they made. Tensors and frames are
held only while the explanation runs."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ...model import CallSite
from ...reading import source as src
from .. import graph, naming
from ..records import BackwardCall, StepCall


@dataclass
class Context:
    call: BackwardCall | None
    roots: list
    frames: list
    calls: tuple
    steps: tuple
    loads: tuple = ()  # LoadCall: `load_state_dict` calls, which write into parameters like a step
    # ZeroingCall: the `zero_grad()` calls, where they were recorded (None post-mortem)
    zeroings: tuple | None = None
    _bindings: list | None = field(default=None, repr=False)
    _freeing: tuple | None = field(default=None, repr=False)

    @property
    def previous(self) -> BackwardCall | None:
        return self.calls[-1] if self.calls else None

    @property
    def freeing(self) -> BackwardCall | None:
        """The last recorded call that could have freed a graph: a call that retained its graph
        freed nothing (the gradient penalty's `autograd.grad(..., retain_graph=True)` just
        before the backward that fails on the previous pass's graph). The last call when every
        call retained. When the roots of that call are still bound and their graph shares
        nothing with this one, or are gone, an earlier call whose bound roots' graph does share
        with it freed it (`class_loss.backward()` over the encoder, then the loss of each
        decoder shard, made from detached copies, then the encoder's backward)."""
        if self._freeing is None:
            last = next((c for c in reversed(self.calls) if not c.retain_graph), self.previous)
            self._freeing = (last if last is None or self._shares_graph(last)
                             else next((c for c in reversed(self.calls) if c is not last and not c.retain_graph
                                        and self._shares_graph(c)), last),)
        return self._freeing[0]

    def _shares_graph(self, call: BackwardCall) -> bool:
        """Whether the graph of `call`'s roots, where they are still bound, shares a node other
        than a leaf with this backward's graph."""
        roots = [b.value.grad_fn for b in self.bound_roots(call)]
        if not roots or not self.root_nodes():
            return False
        theirs = graph.walk(roots)
        ours = graph.walk(self.root_nodes())
        return any(key in theirs.nodes and seq != graph.LEAF_SEQ for key, seq in ours.seq.items())

    def bound_roots(self, call: BackwardCall) -> list[naming.Binding]:
        """The bindings in the user's frames of the tensors `call` back-propagated, with a graph.
        A call records its roots' ids only, and a root freed since may have left its id to a
        tensor made later (Pearl's actor `q`, at the address of the critic's freed `loss`): a
        root's graph was made before the call."""
        return [b for b in self.bindings() if id(b.value) in call.root_ids and b.value.grad_fn is not None
                and b.value.grad_fn._sequence_nr() < call.mark]

    def bindings(self) -> list[naming.Binding]:
        if self._bindings is None:
            self._bindings = naming.bindings(self.frames)
        return self._bindings

    def root_nodes(self) -> list:
        return [t.grad_fn for t in self.roots if t.grad_fn is not None]

    def frame_source(self, frame) -> tuple[src.Source | None, ast.AST | None]:
        """The source file a frame runs, and the function (or module) it runs in it."""
        source = src.load(frame.f_code.co_filename)
        if source is None:
            return None, None
        return source, src.function_for_code(source, frame.f_code.co_name, frame.f_code.co_firstlineno)

    def site_statement(self, filename: str, row: int, column: int | None = None):
        """(source, scope, statement) for a recorded call site in one of the user's frames (the
        statement at `column` where several share the row)."""
        for frame in self.frames:
            if frame.f_code.co_filename == filename:
                source, scope = self.frame_source(frame)
                if source is None:
                    continue
                if hasattr(scope, "lineno") and not (scope.lineno <= row <= scope.end_lineno):
                    continue
                stmt = src.statement_at(scope, row, column)
                if stmt is not None:
                    return source, scope, stmt
        source = src.load(filename)
        if source is None:
            return None, None, None
        stmt = src.statement_at(source.tree, row, column)
        scope = source.tree
        if stmt is not None:
            scope = src.enclosing_function(stmt) or source.tree
        return source, scope, stmt

    def failing_statement(self):
        """(source, scope, statement) of the failing call."""
        if self.call is None:
            return None, None, None
        return self.site_statement(self.call.filename, self.call.row, self.call.column)

    def call_site(self, filename: str, row: int, column: int | None = None) -> CallSite:
        """The statement at `row` (the one at `column` where several share the row), as the
        user wrote it."""
        source = src.load(filename)
        return CallSite(filename, row, src.statement_code(source, row, column) if source is not None else "")

    def backward_site(self) -> CallSite | None:
        return self.call_site(self.call.filename, self.call.row, self.call.column) if self.call is not None else None

    def steps_between(self, start_tick: int, end_tick: int) -> list[StepCall]:
        return [s for s in self.steps if start_tick < s.tick < end_tick]

    def backward_loops(self, source, scope) -> list:
        """The loops around the failing call, when it is in `source`."""
        if self.call is None or source.filename != self.call.filename:
            return []
        stmt = src.innermost_statement(scope, self.call.row)
        return src.loops_around(stmt) if stmt is not None else []

    def tensors_in_container(self, binding: naming.Binding) -> list:
        """The tensors held by the list, tuple or dict that `binding` is an element of (two
        levels deep: a list of tuples), read from its frame again."""
        steps = binding.steps
        while steps and steps[-1][0] == "item":
            steps = steps[:-1]
        return list(_tensors_in(self.reach(binding, steps), 2))

    def reach(self, binding: naming.Binding, steps) -> object:
        """What `binding`'s frame reaches by `steps` from its base now; None where it no longer can."""
        frame = self.frames[binding.frame_index]
        scope = frame.f_locals if binding.base in frame.f_locals else frame.f_globals
        value = scope.get(binding.base)
        for kind, key in steps:
            try:
                value = getattr(value, key) if kind == "attr" else value[key]
            except Exception:  # noqa: BLE001 - the user's object may have changed shape since
                return None
        return value

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
