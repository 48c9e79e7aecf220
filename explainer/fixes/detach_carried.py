"""Detach state that is carried from one iteration (or call) into the next."""
from __future__ import annotations

import ast

from ..model import Edit, Fix
from ..reading.source import (
    Assignment,
    Source,
    all_nodes,
    assignments,
    canonical,
    enclosing_function,
    inside,
    last_assignment,
    loops_around,
    names_read,
    parent,
    reads,
    value_of,
)
from .edits import imports_torch, insert_lines_after, insert_lines_before, replace


def detached(expression: str, is_tuple: bool) -> str:
    if is_tuple:
        return f"tuple(h.detach() for h in {expression})"
    return f"{expression}.detach()"


def detached_list(expression: str) -> str:
    """A list of tensors, kept a list (it may be appended to or indexed as one), each detached."""
    return f"[h.detach() for h in {expression}]"


def detach_where_read(source: Source, carrier: str, assignment: Assignment, is_tuple: bool) -> Fix | None:
    """`out, hidden = model(x, hidden)` -> `model(x, hidden.detach())`."""
    value = getattr(assignment.stmt, "value", None)
    if not isinstance(value, ast.Call):
        return None
    uses = [use for arg in [*value.args, *(k.value for k in value.keywords)] for use in reads(arg, carrier)]
    if not uses:
        return None
    text = source.segment(uses[0])
    edits = tuple(replace(source, use, detached(source.segment(use), is_tuple)) for use in uses)
    return Fix(f"Detach `{text}` where it re-enters the next step, so each backward only sees "
               f"the current step's graph", edits)


def keep_detached(source: Source, carrier: str, stmt: ast.stmt, is_tuple: bool) -> Fix | None:
    """`h = new_h` (or `history = torch.cat([history, pred])`) after the backward ->
    `.detach()` on the whole new value: the next step gets it without the graph that this
    step's backward has just freed (detaching only the old value would keep `pred`'s)."""
    value = getattr(stmt, "value", None)
    if not isinstance(stmt, ast.Assign) or value is None:
        return None
    text = source.segment(value)
    if not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        text = f"({text})"
    return Fix(f"Keep `{source.segment(value)}` for the next step without its graph, which this "
               f"step's backward frees", (replace(source, value, detached(text, is_tuple)),))


def detach_after_backward(source: Source, carrier: str, backward: ast.stmt, is_tuple: bool) -> Fix:
    """`model.recurrent.weight = model.recurrent.weight.detach()` after the backward: a state a
    module updates many times within a pass (an evolving GCN weight, once per snapshot) keeps
    this pass's history for this backward, and the next pass starts from its value alone."""
    line = f"{carrier} = {detached(carrier, is_tuple)}"
    return Fix(f"Detach `{carrier}` after this backward: the next pass starts from its value, without "
               f"the history this backward has just gone through",
               (insert_lines_after(source, backward, [line]),))


def detach_every_module_after_backward(source: Source, root: str, class_name: str, attribute: str,
                                       backward: ast.stmt) -> Fix | None:
    """The same after the backward for every `class_name` module of `root`, each holding its own
    state; a module whose state is not a tensor yet (never run) is left alone."""
    if not imports_torch(source):
        return None
    lines = [f"for module in {root}.modules():",
             f"    if isinstance(module, {class_name}) and isinstance(module.{attribute}, torch.Tensor):",
             f"        module.{attribute} = module.{attribute}.detach()"]
    return Fix(f"Detach the `{attribute}` of every `{class_name}` of `{root}` after this backward: the next "
               f"pass starts from their values, without the history this backward has just gone through",
               (insert_lines_after(source, backward, lines),))


def detach_at_loop_entry(source: Source, carrier: str, loop: ast.stmt, is_tuple: bool,
                         may_be_none: bool = False, holder: str | None = None) -> Fix | None:
    """Insert `carrier = carrier.detach()` before the loop body's first use of the carrier (or
    of the `holder` it is an item or attribute of, handed whole to a helper that reads it);
    guarded by `if carrier is not None:` when the loop starts it as None (`state = None`, as
    nn.LSTM and nn.GRU accept)."""
    for stmt in loop.body:
        if reads(stmt, carrier) or holder is not None and reads(stmt, holder):
            line = f"{carrier} = {detached(carrier, is_tuple)}"
            lines = [f"if {carrier} is not None:", f"    {line}"] if may_be_none else [line]
            return Fix(f"Detach `{carrier}` at the start of each iteration, so the history of the "
                       f"previous iteration is not back-propagated again",
                       (insert_lines_before(source, stmt, lines),))
    return None


def detach_tree_at_loop_entry(source: Source, carrier: str, loop: ast.stmt) -> Fix | None:
    """A state that is a structure of tensors (titans-pytorch's `NeuralMemState`: a namedtuple of
    an int, dicts of tensors and a tuple of dicts), which has no `.detach()`: every tensor in it
    detached where each pass first reads it, with torch's pytree, as the maintainers' own
    `mem_state_detach` maps it. The structure, and what in it is no tensor (`None` included),
    stay as they are."""
    if not imports_torch(source):
        return None
    for stmt in loop.body:
        if reads(stmt, carrier):
            line = f"{carrier} = torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, {carrier})"
            return Fix(f"Detach every tensor in `{carrier}` at the start of each iteration, so the history of "
                       f"the previous iteration is not back-propagated again", (insert_lines_before(source, stmt, [line]),))
    return None


def restart_each_pass(source: Source, carrier: str, stmt: ast.stmt, loop: ast.stmt, scope: ast.AST,
                      made_from_weights: bool = False) -> Fix | None:
    """`Yest = Yest + w * X` unrolled in an inner loop, inside an outer loop whose passes repeat
    the same computation (its own variable is never read): each pass should unroll from the
    value made before the outer loop, as the first pass does. Detaching instead would start
    each pass from where the last one ended, and train something else. A first value made from
    the weights (MAML's `fast = [w.clone() for w in ...]`) is made again in each pass instead:
    the value before the loop holds the weights as they were before any step."""
    if not carrier.isidentifier() or any(s is stmt for s in loop.body):
        return None
    inner = loops_around(stmt, stop=loop)
    if not inner:
        return None
    start = last_assignment(scope, carrier, loop.lineno)
    loop_names = {n.id for n in ast.walk(getattr(loop, "target", ast.Pass())) if isinstance(n, ast.Name)}
    if start is None:
        return None
    # Passes that read their loop variable differ (chunks of one sequence): the state may be
    # meant to continue, unless it starts from the weights, which a detach would stop training.
    if not made_from_weights and loop_names & set().union(*(names_read(s) for s in loop.body)):
        return None
    if any(inside(a.stmt, loop) and not any(inside(a.stmt, i) for i in inner) for a in assignments(scope, carrier)):
        return None
    first_read = next((s for s in loop.body if reads(s, carrier)), None)
    if first_read is None:
        return None
    if made_from_weights:
        if not isinstance(start.stmt, (ast.Assign, ast.AnnAssign)) or start.stmt.end_lineno != start.stmt.lineno:
            return None
        return Fix(f"Make `{carrier}` again at the start of every pass, from the weights as they are then, "
                   f"as before the loop: its first value is made from weights the optimizer steps, so every "
                   f"pass must start from the current ones, and carrying the last pass's `{carrier}` reaches "
                   f"its freed graph",
                   (insert_lines_before(source, first_read, [source.segment(start.stmt)]),))
    saved = f"{carrier}_start"
    if saved in names_read(scope) or assignments(scope, saved):
        return None
    return Fix(f"Start every pass from `{carrier}`'s value before the loop, as the first pass does: "
               f"each pass unrolls the same recurrence again, and carrying the last pass's "
               f"`{carrier}` into the next one reaches its freed graph",
               (insert_lines_before(source, loop, [f"{saved} = {carrier}"]),
                insert_lines_before(source, first_read, [f"{carrier} = {saved}"])))


def detach_elements_at_loop_entry(source: Source, container: str, loop: ast.stmt, made_as: ast.AST | None) -> Fix | None:
    """`states[i] = cell(x, states[i])` in an inner loop over layers: detach every element of
    `states` at the start of each pass of the outer loop, keeping the container's kind."""
    if isinstance(made_as, (ast.Dict, ast.DictComp)):
        value = f"{{key: value.detach() for key, value in {container}.items()}}"
    elif isinstance(made_as, (ast.List, ast.ListComp)):
        value = f"[h.detach() for h in {container}]"
    else:
        return None
    for stmt in loop.body:
        if reads(stmt, container):
            return Fix(f"Detach every element of `{container}` at the start of each iteration, so "
                       f"the history of the previous iteration is not back-propagated again",
                       (insert_lines_before(source, stmt, [f"{container} = {value}"]),))
    return None


def starts_as_number(scope: ast.AST, carrier: str, loop: ast.stmt) -> bool:
    """Whether `carrier` is set to a plain number before the loop (`total = 0`): `.detach()` at
    the loop's entry would fail on the first pass."""
    before = last_assignment(scope, carrier, loop.lineno)
    value = getattr(before.stmt, "value", None) if before is not None else None
    return isinstance(value, ast.Constant) and isinstance(value.value, (int, float)) and not isinstance(value.value, bool)


def starts_as_none(scope: ast.AST, carrier: str, loop: ast.stmt) -> bool:
    """Whether `carrier` is set to None before the loop (the first pass has no state yet)."""
    for assignment in assignments(scope, carrier):
        value = assignment.value  # `memory, norm_term = None, None` too
        if assignment.stmt.lineno < loop.lineno and isinstance(value, ast.Constant) and value.value is None:
            return True
    return False


def keep_discarded_detach(source: Source, carrier: str, loop: ast.stmt, is_tuple: bool) -> Fix | None:
    """`hidden.detach()` as a bare statement does nothing: assign its result. `for s in state:
    s.detach()` neither: assign `state` its elements detached. Every such discard in the loop is
    fixed (d2l's GRU branch and LSTM branch); a tuple state is the one a loop over it discarded,
    since a tuple has no `.detach()`."""
    edits, discarded = [], []
    for node in ast.walk(loop):
        if discarded_per_element(node) and canonical(node.iter) == canonical(carrier):
            edits.append(assign_detached_elements(source, node, is_tuple))
            # the discard that ran on a tuple state comes first in the message
            discarded.insert(0 if is_tuple else len(discarded), source.segment(node.body[0].value))
        elif _discarded_detach(node, carrier) or (_discarded_detach(node) and reads(node.value.func.value, carrier)):
            bare = canonical(node.value.func.value) == canonical(carrier)
            if node.value.func.attr == "detach_" and not is_tuple:
                continue
            target = source.segment(node.value.func.value)
            edits.append(replace(source, node, f"{target} = {detached(target, is_tuple and not bare)}"))
            discarded.append(source.segment(node.value))
    if not edits:
        return None
    return Fix(f"`{discarded[0]}` throws its result away: assign it back to `{carrier}`", tuple(edits))


def discarded_per_element(node: ast.AST) -> bool:
    """`for s in state: s.detach()`: each element's detached copy thrown away (`s.detach_()`
    does detach each)."""
    return isinstance(node, ast.For) and isinstance(node.target, ast.Name) and len(node.body) == 1 \
        and _discarded_detach(node.body[0], node.target.id) and node.body[0].value.func.attr == "detach"


def assign_detached_elements(source: Source, loop: ast.For, is_tuple: bool) -> Edit:
    """`for s in state: s.detach()` -> `state = tuple(s.detach() for s in state)` (a list where
    the state is one)."""
    element, container = loop.target.id, source.segment(loop.iter)
    rebuilt = f"tuple({element}.detach() for {element} in {container})" if is_tuple \
        else f"[{element}.detach() for {element} in {container}]"
    return replace(source, loop, f"{container} = {rebuilt}")


def _discarded_detach(node: ast.AST, receiver: str | None = None) -> bool:
    """`x.detach()` (or `.detach_()`) as a statement of its own, on `receiver` when given."""
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not node.value.args
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr in ("detach", "detach_")
            and (receiver is None or canonical(node.value.func.value) == canonical(receiver)))


def detach_stored_value(source: Source, store: ast.AST, container: str, is_tuple: bool = False,
                        is_list: bool = False) -> Fix | None:
    """`memory.append(h)` -> `memory.append(h.detach())`; `cache["prev"] = out` -> `out.detach()`;
    a tuple of tensors (`states.append(hh)`) or a list of them stored whole (AIJack's
    `received_gradient = self.uploaded_gradients[i]`) element by element."""
    value = _stored(store)
    if value is None:
        return None
    edit = replace(source, value, detached_list(source.segment(value))) if is_list else _detach(source, value, is_tuple)
    return Fix(f"Store `{source.segment(value)}` detached in `{container}`: a stored tensor "
               f"keeps the graph of the step that made it, and the next step would back-propagate "
               f"into it", (edit,))


def store_without_chaining(source: Source, store: ast.AST, container: str, is_tuple: bool) -> Fix | None:
    """As `detach_stored_value`, for a value no backward goes through: what is stored each
    iteration is made from what the previous one stored, so its graph hangs on to all of theirs.
    A tuple written out (`(h, c)`) is detached element by element where it is written."""
    value = _stored(store)
    if value is None:
        return None
    if isinstance(value, ast.Tuple) and value.elts and not any(isinstance(e, ast.Starred) for e in value.elts):
        edits = tuple(_detach(source, element, False) for element in value.elts)
    else:
        edits = (_detach(source, value, is_tuple),)
    return Fix(f"Store `{source.segment(value)}` detached in `{container}`, so each iteration's graph is "
               f"freed instead of chained onto the next", edits)


def append_detached(source: Source, store: ast.Call, container: str, key: str | None, freed: bool = True) -> Fix | None:
    """`losses_list.append(losses)` -> `losses_list.append(losses.detach())`; with `key`, the
    dict appended keeps that item detached (`outputs.append({**output, 'loss':
    output['loss'].detach()})`), the dict the loop goes on with untouched. The graphs kept were
    freed by their backward (`freed`), or the list is only ever appended to, so nothing
    back-propagates them: no gradient changes, safe."""
    value = store.args[0] if isinstance(store.func, ast.Attribute) and store.func.attr == "append" \
        and len(store.args) == 1 and not store.keywords else None
    if not isinstance(value, (ast.Name, ast.Attribute)):
        return None
    text = source.segment(value)
    if key is None:
        stored, what = detached(text, False), f"`{text}`"
    else:
        stored, what = f"{{**{text}, {key!r}: {detached(f'{text}[{key!r}]', False)}}}", f"`{text}[{key!r}]`"
    why = "its backward already ran" if freed else "nothing back-propagates it"
    return Fix(f"Keep {what} detached in `{container}`: {why}, and what the list keeps of its "
               f"graph only holds memory until the list is dropped", (replace(source, value, stored),))


def detach_item_after_backward(source: Source, backward: ast.stmt, item: ast.expr, container: str) -> Fix:
    """`losses[iter_count-1].backward()`, where `losses` keeps every iteration's loss, stored
    before it is back-propagated (neural-network-lyapunov's line search): the item is detached
    right after its backward. Its graph is freed then, and nothing can back-propagate it again, so
    no gradient changes: safe."""
    text = source.segment(item)
    return Fix(f"Keep `{text}` detached once it is back-propagated: its graph is freed then, and what "
               f"`{container}` keeps of it only holds memory", (insert_lines_after(source, backward, [f"{text} = {text}.detach()"]),))


def _stored(store: ast.AST) -> ast.expr | None:
    if isinstance(store, ast.Call) and store.args:
        return store.args[-1]
    if isinstance(store, (ast.Assign, ast.AnnAssign)) and store.value is not None:
        return store.value
    return None


def _detach(source: Source, value: ast.expr, is_tuple: bool) -> Edit:
    text = source.segment(value)
    if not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        text = f"({text})"
    return replace(source, value, detached(text, is_tuple))


def fixes_for_module_state(source: Source, assignment: Assignment, name: str, is_tuple: bool,
                           class_node: ast.ClassDef | None = None, used_now: bool = False) -> list[Fix | None]:
    """State kept on a module and re-assigned in a method. A submodule call (`self.gru(x,
    self.hidden)`) makes the new state from the old one: detach the old one there (first checking
    for None when the state starts as None, as nn.LSTM and nn.GRU accept). Anything else keeps
    this step's tensors in the state: store it without history, or under no_grad; unsafe when
    the state's new value is `used_now` by this step's loss (a spiking neuron's membrane, read
    again within the step), which those fixes would cut from it."""
    from .no_grad_update import update_every_branch_under_no_grad

    stmt = assignment.stmt
    value = getattr(stmt, "value", None)
    may_be_none = False
    if class_node is not None:
        tuple_state, may_be_none = module_state_shape(class_node, stmt, name)
        is_tuple = is_tuple or tuple_state
    fixes: list[Fix | None] = []
    # `self.cache_k[:, :n] = self.wk(x)` writes a new value into the state; it is not made from it.
    if isinstance(value, ast.Call) and _is_self_call(value) and not isinstance(assignment.target, ast.Subscript):
        first = _first_read_before(stmt, name)
        if first is not None:  # read earlier in the method too (Infini-attention's retrieval)
            fix = detach_before_first_read(source, name, first, is_tuple, may_be_none)
        else:
            fix = detach_if_set(source, name, stmt, is_tuple) if may_be_none \
                else detach_where_read(source, name, assignment, is_tuple)
        fixes.append(Fix(fix.message, fix.edits, "unsafe") if fix is not None and used_now else fix)
    else:
        cutting = []
        if isinstance(value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)):
            cutting.append(detach_stored_value(source, stmt, name))
        cutting.append(update_every_branch_under_no_grad(source, stmt, name))
        fixes.extend(Fix(f.message, f.edits, "unsafe") if f is not None and used_now else f for f in cutting)
        return fixes
    fixes.append(update_every_branch_under_no_grad(source, stmt, name))
    return fixes


def _first_read_before(stmt: ast.stmt, name: str) -> ast.stmt | None:
    """The statement of the method's body (at its top level) holding the first read of `name`
    above `stmt`'s line, when there is one."""
    function = enclosing_function(stmt)
    if function is None:
        return None
    earlier = [r for r in reads(function, name) if r.lineno < stmt.lineno and not _tests_for_none(r)]
    if not earlier:
        return None
    node = min(earlier, key=lambda r: (r.lineno, r.col_offset))
    while parent(node) is not function:
        node = parent(node)
    return node if isinstance(node, ast.stmt) else None


def _tests_for_none(read: ast.expr) -> bool:
    """`self.hidden is None`: asks whether there is a state, does not use it."""
    test = parent(read)
    return isinstance(test, ast.Compare) and test.left is read and all(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops) \
        and all(isinstance(c, ast.Constant) and c.value is None for c in test.comparators)


def detach_before_first_read(source: Source, carrier: str, first: ast.stmt, is_tuple: bool,
                             may_be_none: bool) -> Fix:
    """`self.M = self.M.detach()` before the method first reads the state: every read this step
    (the retrieval as well as the update) sees it without the previous step's graph."""
    line = f"{carrier} = {detached(carrier, is_tuple)}"
    lines = [f"if {carrier} is not None:", f"    {line}"] if may_be_none else [line]
    return Fix(f"Detach `{carrier}` before this step first reads it, so each backward only sees the current "
               f"step's graph", (insert_lines_before(source, first, lines),))


def detach_if_set(source: Source, carrier: str, stmt: ast.stmt, is_tuple: bool) -> Fix:
    """`if self.hidden is not None: self.hidden = self.hidden.detach()` before the statement that
    feeds it back: the first call has no state yet."""
    lines = [f"if {carrier} is not None:", f"    {carrier} = {detached(carrier, is_tuple)}"]
    return Fix(f"Detach `{carrier}` before it re-enters the next step (the first call has no state "
               f"yet), so each backward only sees the current step's graph",
               (insert_lines_before(source, stmt, lines),))


def module_state_shape(class_node: ast.ClassDef, stmt: ast.stmt, attribute: str) -> tuple[bool, bool]:
    """(is_tuple, may_be_none) for a module's state attribute where `stmt` feeds it back: a tuple
    when the class ever assigns it a tuple, or when it starts as None and the class makes an LSTM
    (whose state is `(h, c)`); None when some method sets it to None and `stmt`'s own method
    does not set it first (`if self.hidden is None: self.hidden = torch.zeros(...)`)."""
    method = enclosing_function(stmt)
    others = [a for a in assignments(class_node, attribute, deep=True) if a.stmt is not stmt]
    values = [value_of(a.stmt) for a in others]
    is_tuple = any(isinstance(v, ast.Tuple) for v in values)
    set_first = any(a.stmt.lineno < stmt.lineno and method is not None and inside(a.stmt, method)
                    and not _is_none(value_of(a.stmt)) for a in others)
    may_be_none = any(_is_none(v) for v in values) and not set_first
    if may_be_none and not is_tuple:
        is_tuple = makes_lstm(class_node)
    return is_tuple, may_be_none


def makes_lstm(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.Call) and canonical(node.func).split(".")[-1] in ("LSTM", "LSTMCell")
               for node in all_nodes(tree))


def _is_none(value) -> bool:
    return isinstance(value, ast.Constant) and value.value is None


def _is_self_call(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
