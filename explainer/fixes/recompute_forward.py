"""Recompute the forward after an optimizer step, instead of reusing a graph built before it."""
from __future__ import annotations

import ast
from collections.abc import Callable
from typing import NamedTuple

from ..model import Fix
from ..reading.dataflow import ancestors
from ..reading.source import (
    Source,
    canonical,
    enclosing_block,
    inside,
    loops_around,
    names_read,
    own_nodes,
    parent,
    reads,
    targets_of,
)
from ..reading.source import ancestors as ancestors_of
from .edits import delete_lines, insert_lines_after, insert_lines_before, statement_text

_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)


def _simple_statements(scope: ast.AST) -> list[ast.stmt]:
    found = [n for n in own_nodes(scope) if isinstance(n, _SIMPLE)]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return found


def _reads_any(stmt: ast.AST, expressions: set[str]) -> bool:
    return any(reads(stmt, e) for e in expressions)


def _derived_chain(statements: list[ast.stmt], carrier_stmt: ast.stmt, before_row: int) -> list[ast.stmt]:
    """`carrier_stmt` and the assignments after it, before `before_row`, made from what it made."""
    derived = {canonical(t) for t in targets_of(carrier_stmt)}
    chain = [carrier_stmt]
    for stmt in statements:
        if carrier_stmt.lineno < stmt.lineno < before_row and isinstance(stmt, (ast.Assign, ast.AnnAssign)) \
                and _reads_any(stmt.value, derived):
            chain.append(stmt)
            derived |= {canonical(t) for t in targets_of(stmt)}
    return chain


def recompute_in_loop(source: Source, scope: ast.AST, carrier_stmt: ast.stmt, step_row: int,
                      failing_stmt: ast.stmt) -> Fix | None:
    """The loop repeats backward and step over a graph built once before it (several generator
    steps on one `g_loss`): move the statements that build it to the top of the loop's body."""
    if not isinstance(carrier_stmt, (ast.Assign, ast.AnnAssign)):
        return None
    loop = next((loop for loop in reversed(loops_around(failing_stmt))
                 if loop.lineno <= step_row <= loop.end_lineno and not inside(carrier_stmt, loop)), None)
    if loop is None or carrier_stmt.lineno > loop.lineno:
        return None
    if any(not inside(loop, own) for own in loops_around(carrier_stmt)):
        return None  # run once a pass of a loop of its own (a rollout's `values[step] = ...`): moved, it runs once
    chain = _derived_chain(_simple_statements(scope), carrier_stmt, loop.lineno)
    needed = names_read(loop) | {canonical(n) for n in ast.walk(loop) if isinstance(n, (ast.Attribute, ast.Subscript))}
    kept = _needed(chain, carrier_stmt, needed)
    if any(parent(stmt) is not parent(carrier_stmt) for stmt in kept):
        return None  # moving statements out of different blocks could change what runs
    lines = [line for stmt in kept for line in statement_text(source, stmt)]
    names = [f"`{canonical(t)}`" for stmt in kept for t in targets_of(stmt)]
    built = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return Fix(f"Build {built} at the start of each pass of the loop that steps the optimizer, so "
               f"each backward goes through a graph made with the updated weights",
               (*(delete_lines(source, stmt) for stmt in kept), insert_lines_before(source, loop.body[0], lines)))


def _needed(chain: list[ast.stmt], carrier_stmt: ast.stmt, needed: set[str]) -> list[ast.stmt]:
    """The statements of `chain` that `needed` (names read later) depends on, in order."""
    kept = []
    for stmt in reversed(chain):
        if stmt is carrier_stmt or any(canonical(t) in needed for t in targets_of(stmt)):
            kept.append(stmt)
            needed |= names_read(stmt.value)
    kept.reverse()
    return kept


def recompute_before_use(source: Source, scope: ast.AST, carrier_stmt: ast.stmt, after_row: int,
                         failing_stmt: ast.stmt, why: str,
                         upstream: Callable[[ast.stmt], bool] | None = None,
                         also: list[ast.stmt] = ()) -> Fix | None:
    """Re-run `carrier_stmt` (and what was derived from it before `after_row`) just before the
    first statement after `after_row` that uses it; see `recomputed`."""
    plan = recomputed(scope, carrier_stmt, after_row, failing_stmt, upstream, also)
    if plan is None:
        return None
    lines = [*zero_grad_again(scope, after_row, plan.anchor.lineno, failing_stmt),
             *(line for stmt in plan.kept for line in _copy_text(source, stmt, plan.inner))]
    insert = insert_lines_after if plan.after else insert_lines_before
    other = _other_backward_reading(scope, plan, failing_stmt)
    if other is None:
        return Fix(why, (insert(source, plan.anchor, lines),))
    # pg-is-all-you-need's SAC: `vf_loss` is made from `q_pred`, and `vf_loss.backward()` runs
    # after the Q step: recomputed, the V function's own update would take another loss.
    return Fix(f"{why} (this also recomputes what `{source.segment(other).strip()}` (line {other.lineno}) "
               f"back-propagates, so that update changes too)", (insert(source, plan.anchor, lines),), "unsafe")


def _other_backward_reading(scope: ast.AST, plan: Plan, failing_stmt: ast.stmt) -> ast.stmt | None:
    """The first statement from where the plan puts its copy to `failing_stmt`, that one left
    out, that back-propagates a value the copy makes again: another update whose loss the
    recompute changes."""
    made = {canonical(t) for stmt in copied_assignments(plan) for t in targets_of(stmt)}
    start = plan.anchor.end_lineno + 1 if plan.after else plan.anchor.lineno
    return next((stmt for stmt in _simple_statements(scope)
                 if start <= stmt.lineno < failing_stmt.lineno and _backpropagates(stmt) and _reads_any(stmt, made)),
                None)


def _backpropagates(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("backward", "grad")
               for n in ast.walk(stmt))


class Plan(NamedTuple):
    """What a recompute runs again and where: the statements of the carrier's block in `kept`,
    in order, an `if` among them copied with only its tests and the assignments in `inner`
    (each branch of `if losstype == "gan": ... elif ...` assigns part of the loss); before
    `anchor`, or after it where `after`."""

    kept: list[ast.stmt]
    anchor: ast.stmt
    after: bool = False
    inner: tuple[ast.stmt, ...] = ()


def copied_assignments(plan: Plan) -> list[ast.stmt]:
    """The assignments a plan runs again, those in a copied `if` included, in source order."""
    return sorted([s for s in plan.kept if not isinstance(s, ast.If)] + list(plan.inner),
                  key=lambda n: (n.lineno, n.col_offset))


def _copy_text(source: Source, stmt: ast.stmt, inner: tuple[ast.stmt, ...]) -> list[str]:
    """`stmt`'s lines; an `if`'s with only its tests and the statements of `inner` (`pass` in a
    branch left without any)."""
    if not isinstance(stmt, ast.If):
        return statement_text(source, stmt)
    wanted = {id(s) for s in inner}

    def branch(statements: list[ast.stmt]) -> list[str]:
        lines = [line for s in statements for line in (
            _copy_text(source, s, inner) if isinstance(s, ast.If) else
            statement_text(source, s) if id(s) in wanted else [])]
        return ["    " + line for line in lines] or ["    pass"]

    lines, node, keyword = [], stmt, "if"
    while True:
        lines += [f"{keyword} {source.segment(node.test)}:", *branch(node.body)]
        orelse = node.orelse
        if len(orelse) == 1 and isinstance(orelse[0], ast.If) \
                and source.line(orelse[0].lineno).lstrip().startswith("elif"):
            node, keyword = orelse[0], "elif"
            continue
        if orelse:
            lines += ["else:", *branch(orelse)]
        return lines


def recomputed(scope: ast.AST, carrier_stmt: ast.stmt, after_row: int, failing_stmt: ast.stmt,
               upstream: Callable[[ast.stmt], bool] | None = None,
               also: list[ast.stmt] = ()) -> Plan | None:
    """The statements to run again and where: `carrier_stmt` and what was derived from it
    before `after_row`, where the first statement after `after_row` that uses it needs them.
    `upstream` says which of the statements it was computed from, in the same block, made
    tensors with history: the first backward freed their graphs too (`advantage = returns -
    value` needs `value = critic(s)` again). `also`: more statements to recompute with it (the
    other critic's forward, stepped too). Where that first use is in another block than the
    carrier (a branch of a later `if`), they go right after the step instead, when the step is
    a statement of the carrier's own block: before every use, whichever branch runs."""
    if not isinstance(carrier_stmt, (ast.Assign, ast.AnnAssign)):
        return None
    statements = _simple_statements(scope)
    chain = _derived_chain(statements, carrier_stmt, after_row)
    for extra in also:
        chain += [s for s in _derived_chain(statements, extra, after_row) if s not in chain]
    if upstream is not None:
        earlier = [a.stmt for made in [carrier_stmt, *also] for a in ancestors(made.value, scope, made.lineno)
                   if parent(a.stmt) is parent(carrier_stmt) and upstream(a.stmt)]
        chain = sorted({id(s): s for s in earlier}.values(), key=lambda s: s.lineno) + chain
    chain = sorted({id(s): s for s in chain}.values(), key=lambda s: s.lineno)
    derived = {canonical(t) for stmt in chain for t in targets_of(stmt)}
    insertion = next((s for s in statements
                      if after_row < s.lineno <= failing_stmt.lineno and _reads_any(s, derived)), None)
    if insertion is None:
        return None
    needed = set()
    for stmt in statements:
        if insertion.lineno <= stmt.lineno <= failing_stmt.lineno:
            needed |= names_read(stmt) | {canonical(n) for n in ast.walk(stmt) if isinstance(n, (ast.Attribute, ast.Subscript))}
    plan = _lifted(_needed(chain, carrier_stmt, needed), carrier_stmt)
    if plan is None:
        return None  # statements of an if's two branches cannot be copied one after the other
    kept, inner = plan
    written = _written_into(scope, failing_stmt.lineno, [*kept, *inner])
    if any(row > stmt.lineno for stmt in [*kept, *inner] if not isinstance(stmt, ast.If) for t in targets_of(stmt)
           for row in written.get(canonical(t), ())):
        return None  # `states = torch.zeros(...)`, then `states[h] = ...` in a loop: a copy would be zeros
    block = enclosing_block(carrier_stmt)
    if not any(s is insertion for s in block):
        step = next((s for s in block if s.lineno <= after_row <= s.end_lineno and isinstance(s, ast.Expr)), None)
        return Plan(kept, step, True, inner) if step is not None else None
    return Plan(kept, insertion, False, inner)


def _lifted(kept: list[ast.stmt], carrier_stmt: ast.stmt) -> tuple[list[ast.stmt], tuple[ast.stmt, ...]] | None:
    """(the statements of the carrier's block to copy, the assignments to keep inside those
    that are an `if`): a statement of `kept` in a branch of an `if` of the carrier's block
    (`gen_loss` assigned in each branch of `if losstype == "gan": ... elif ...`) is copied with
    that `if`'s tests, when they call nothing. None where a statement cannot be copied so."""
    block = enclosing_block(carrier_stmt)
    lifted: list[ast.stmt] = []
    inner: list[ast.stmt] = []
    for stmt in kept:
        top = stmt
        while not any(s is top for s in block):
            top = parent(top)
            if not isinstance(top, ast.If) or any(isinstance(c, ast.Call) for c in ast.walk(top.test)):
                return None
        if top is not stmt:
            inner.append(stmt)
        if not any(t is top for t in lifted):
            lifted.append(top)
    return sorted(lifted, key=lambda s: s.lineno), tuple(inner)


def move_before_use(source: Source, scope: ast.AST, carrier_stmt: ast.stmt, after_row: int,
                    failing_stmt: ast.stmt, why: str) -> Fix | None:
    """Move `carrier_stmt` down to just before the first statement after `after_row` that reads
    what it assigns, when nothing in between reads that or changes what it reads: the same
    computation, run once, on the weights the step produced (a copy would draw its random
    numbers twice and train on other samples)."""
    if not isinstance(carrier_stmt, (ast.Assign, ast.AnnAssign)):
        return None
    statements = _simple_statements(scope)
    made = {canonical(t) for t in targets_of(carrier_stmt)}
    insertion = next((s for s in statements if after_row < s.lineno <= failing_stmt.lineno and _reads_any(s, made)),
                     None)
    if insertion is None or parent(insertion) is not parent(carrier_stmt):
        return None
    read = names_read(carrier_stmt.value)
    for stmt in statements:
        if carrier_stmt.lineno < stmt.lineno < insertion.lineno:
            written = {canonical(t) for t in targets_of(stmt)}
            if _reads_any(stmt, made) or written & (read | made):
                return None
    return Fix(why, (delete_lines(source, carrier_stmt),
                     insert_lines_before(source, insertion, statement_text(source, carrier_stmt))))


def _written_into(scope: ast.AST, before_row: int, copied: list[ast.stmt]) -> dict[str, list[int]]:
    """The rows, before `before_row` and outside `copied`, where a name is written into without
    being re-bound (`states[h] = s`, `states += x`, `states.add_(x)`), by name."""
    found: dict[str, list[int]] = {}
    skip = {id(c) for c in copied}
    for node in ast.walk(scope):
        if not isinstance(node, ast.stmt) or node.lineno >= before_row or id(node) in skip:
            continue
        names = []
        if isinstance(node, ast.Assign):
            names = [canonical(t.value) for t in node.targets if isinstance(t, ast.Subscript)]
        elif isinstance(node, ast.AugAssign):
            names = [canonical(node.target)]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr.endswith("_") \
                and not node.value.func.attr.endswith("__"):
            names = [canonical(node.value.func.value)]
        for name in names:
            found.setdefault(name, []).append(node.lineno)
    return found


def _method_call(stmt: ast.stmt, method: str) -> str | None:
    """`opt` for the statement `opt.<method>()`."""
    call = getattr(stmt, "value", None) if isinstance(stmt, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == method:
        return canonical(call.func.value)
    return None


def next_step_after(scope: ast.AST, row: int) -> str | None:
    """`opt` for the first `opt.step()` statement of `scope` after `row`."""
    return next((_method_call(s, "step") for s in _simple_statements(scope) if s.lineno > row
                 and _method_call(s, "step")), None)


def last_step_before(scope: ast.AST, row: int) -> int | None:
    """The row of the last `opt.step()` statement of `scope` before `row`."""
    rows = [s.lineno for s in _simple_statements(scope) if s.lineno < row and _method_call(s, "step")]
    return rows[-1] if rows else None


def zero_grad_again(scope: ast.AST, step_row: int, insertion_row: int, after: ast.stmt) -> list[str]:
    """`opt.zero_grad()`, to go before a forward recomputed at `insertion_row` after `opt.step()`
    (at `step_row`), when the same optimizer steps again after `after` and the user zeroes it
    before the first backward: without it, the second step would apply the first loss's
    gradient a second time."""
    statements = _simple_statements(scope)
    stepped = next((_method_call(s, "step") for s in statements if s.lineno == step_row), None)
    if stepped is None:
        return []
    loop = next(iter(reversed(loops_around(after))), None)
    end = loop.end_lineno if loop is not None else after.end_lineno
    start = loop.lineno if loop is not None else 0
    steps_again = any(_method_call(s, "step") == stepped for s in statements if after.end_lineno < s.lineno <= end)
    zeroed_before = any(_method_call(s, "zero_grad") == stepped for s in statements if start < s.lineno < step_row)
    zeroed_since = any(_method_call(s, "zero_grad") for s in statements if step_row < s.lineno < insertion_row)
    return [f"{stepped}.zero_grad()"] if steps_again and zeroed_before and not zeroed_since else []


def move_past_the_step(source: Source, carrier_stmt: ast.stmt, step_stmt: ast.stmt) -> Fix | None:
    """The loop makes the next pass's input before its own update (option-critic's `state =
    option_critic.get_state(next_obs)` above `optim.step()`), and the next pass builds its loss
    on it: move it, and what this pass derives from it, below the statement that steps, as the
    maintainers did ("Fix biased gradient"). Only where nothing between reads what is moved or
    re-binds what it reads; this pass's loss then is what it was."""
    block = parent(carrier_stmt)
    stepping = next((a for a in (step_stmt, *ancestors_of(step_stmt)) if parent(a) is block), None)
    body = next((getattr(block, field) for field in ("body", "orelse", "finalbody")
                 if any(s is carrier_stmt for s in getattr(block, field, []))), None)
    if stepping is None or body is None or not isinstance(carrier_stmt, (ast.Assign, ast.AnnAssign)):
        return None
    start, end = _index_in(body, carrier_stmt), _index_in(body, stepping)
    if start is None or end is None or start >= end:
        return None
    moved, made = [carrier_stmt], {canonical(t) for t in targets_of(carrier_stmt)}
    for stmt in body[start + 1:end]:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _reads_any(stmt.value, made):
            moved.append(stmt)
            made |= {canonical(t) for t in targets_of(stmt)}
    kept = [s for s in body[start + 1:end + 1] if not any(s is m for m in moved)]
    rebound = {canonical(t) for s in kept for n in ast.walk(s) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for t in targets_of(n)}
    if any(_reads_any(s, made) for s in kept) or any(names_read(m) & rebound for m in moved):
        return None
    names = [f"`{canonical(t)}`" for stmt in moved for t in targets_of(stmt)]
    built = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    lines = [line for stmt in moved for line in statement_text(source, stmt)]
    return Fix(f"Compute {built} after the update (line {stepping.lineno}), not before it: the next pass "
               f"builds its loss on {names[0]}, and needs it made with the weights this step produces",
               (*(delete_lines(source, stmt) for stmt in moved),
                insert_lines_after(source, stepping, lines, source.indent_of(carrier_stmt.lineno))))


def _index_in(body: list[ast.stmt], stmt: ast.stmt) -> int | None:
    return next((i for i, s in enumerate(body) if s is stmt), None)
