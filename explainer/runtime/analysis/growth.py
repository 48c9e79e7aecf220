"""graph-growth: retain_graph=True keeps alive a graph whose history reaches into earlier
iterations, so every backward goes through all of them (BX008); or, with no retain_graph and no
error, a tensor the user keeps chains the graphs of earlier iterations that no backward goes
through again (a running total, BX002; a value stored for the next iteration, BX005)."""
from __future__ import annotations

import ast
import bisect
from typing import NamedTuple

from ...fixes import accumulate_item, detach_carried, graph_options, no_grad_update
from ...fixes.edits import node_start, overlapping
from ...model import Evidence, Finding, Fix
from ...reading import source as src
from .. import graph, journal, naming
from .carried import carried_fixes
from .context import Context
from .evidence import culprit, culprit_at, finding, made_at
from .locate import carriers, held, self_referencing, self_referencing_carrier

# Nodes one check for kept graphs may wrap: it runs in the first iterations of every script, on
# graphs that are not failing, so it looks at a small part of them and says nothing when that
# is not enough.
_KEPT_BUDGET = 10_000


def _with_every_carrier(ctx: Context, first: Fix, candidate, others, failing) -> Fix:
    """`first` and the matching fix of each other state that is re-assigned from itself (a
    different name, its own statement); unsafe when one of them has no such fix."""
    edits, names = list(first.edits), [candidate.name]
    for other in others:
        if other.relation != "carried" or other.name in names or not self_referencing_carrier(other):
            continue
        same = [f for f in carried_fixes(ctx, other, failing) if f is not None]
        if not same or overlapping(edits, same[0].edits):
            return Fix(first.message, first.edits, "unsafe")
        edits.extend(same[0].edits)
        names.append(other.name)
    return _also_for(first, edits, names, ("carries history", "carry history"))


def explain_graph_growth(ctx: Context) -> Finding | None:
    if ctx.call is not None and not ctx.call.retain_graph:
        return _kept_graph(ctx)
    retained = [c for c in ctx.calls if c.retain_graph]
    if not retained:
        return None
    previous = ctx.previous
    roots = ctx.root_nodes()
    if not roots or previous is None:
        return None
    mark = previous.mark
    current = graph.walk(roots, expand=lambda seq: seq >= mark)
    if not all(current.seq[id(r)] >= mark for r in roots):
        return None
    targets = set(graph.stale_boundary(current, mark))
    if not targets or graph.freed_below([current.node(t) for t in targets]):
        # A backward already freed that history: this graph does not keep it alive, and the
        # backward will fail on it (explained then), not grow.
        return None
    candidates = carriers(ctx, current, targets, mark)
    if not candidates or candidates[0].relation == "direct":
        # A tensor made before the previous backward of this pass and used again (two critics'
        # losses on one forward, with retain_graph=True on the first) is shared, not grown:
        # growth needs a value carried or stored from one iteration into the next.
        return None
    candidate = candidates[0]
    located = candidate.located
    _, _, failing = ctx.failing_statement()
    fixes = [f for f in carried_fixes(ctx, candidate, failing) if f is not None] if candidate.relation == "carried" else []
    if fixes and candidate.relation == "carried":
        # Dropping retain_graph is only right once every carried state is cut (Infini-attention
        # keeps `self.memory` and `self.norm_term`): one fix for each, made as the first one is.
        fixes = [_with_every_carrier(ctx, fixes[0], candidate, candidates[1:], failing)] + fixes[1:]
    if candidate.relation == "stored" and located is not None:
        fixes = [f for f in [detach_carried.detach_stored_value(located.source, located.store, candidate.name)] if f]
    call = src.call_named(failing, "backward")
    drop = graph_options.drop_keyword(located.source, call, "retain_graph") if (call is not None and located) else None
    if drop is not None:
        fixes = [Fix(f.message + ", and drop `retain_graph=True`", f.edits + (drop,), f.applicability) for f in fixes]
    evidence = Evidence(candidate.name, made_at(ctx, located), ctx.backward_site(), advice="grows")
    return finding("BX008", "run-growth", "graph-growth", evidence, [culprit(ctx, candidate)], fixes)


class _Look(NamedTuple):
    """What one backward call saw of a kept tensor, for the next call to compare with."""

    top: int  # the sequence number of its graph's top
    count: int  # how many earlier iterations its graph spans
    calls: int  # how many calls of the site had run before
    grew_from_last: bool  # a new value, spanning more, made from the one the call before saw
    under_views: int  # what its top is a view of (`_under_views`)


def _kept_graph(ctx: Context) -> Finding | None:
    """No retain_graph=True and no error: a tensor bound in the user's frames (labelmodels'
    `running_loss += loss`, ml-agents' critic memory filed per agent) holds history made in at
    least two earlier iterations, a new value spanning more than the one the previous call
    looked at, and this backward does not go through it.

    Iterations are told apart by this call's own line (a GAN's previous generator loss, made
    across the discriminator's and the generator's backward calls, is one iteration's value). A
    value that spans as many each time does not grow (toshikwa's `policy_loss`, reading the
    `self.alpha` of the pass before, through a helper that runs every backward), nor does the
    same value seen again (spd's loss of the last step, at every PGD step's `autograd.grad`).
    A graph a backward already freed can never be back-propagated again; one no backward went
    through is only taken for a leak when it spans three, or when three looks in a row each
    found a new value made from the one before (GroMo's statistic, added up after each backward:
    seen spanning two at the fourth). Detaching it changes no gradient of this step, whose graph
    does not reach it: the fix is safe.

    The second call of the site only looks, so that the third can compare. What it saw spans one
    iteration at most, as any value then does, and a value spanning more at the third may only
    have reached its usual span (toshikwa's): there, growth needs the new value to be made from
    the one seen before (fairseq's meter, `self.sum = self.sum + val * n`, read by three calls)."""
    if ctx.call is None:
        return None
    site = (ctx.call.filename, ctx.call.row)
    marks = [c.mark for c in ctx.calls if (c.filename, c.row) == site]
    if not marks:
        return None
    graph.reset_budget(_KEPT_BUDGET)
    bindings = [b for b in ctx.bindings() if b.value.grad_fn is not None and id(b.value) not in ctx.call.root_ids]
    spans = _stale_spans([b.value.grad_fn for b in bindings], marks)
    grown, renewed, chained = [], {}, set()
    for i, binding in enumerate(bindings):
        grad_fn = binding.value.grad_fn
        top, count = grad_fn._sequence_nr(), bin(spans.get(id(grad_fn), 0)).count("1")
        frame = ctx.frames[binding.frame_index]
        key = (frame.f_code.co_filename, frame.f_code.co_name, binding.expression)
        before = journal.spans_seen(key)
        # A new value, spanning more: the same value seen again only has its last span counted now.
        new = before is not None and before.top != top
        spans_more = new and count > before.count
        made_from_it = spans_more and _made_from(grad_fn, before.under_views)
        journal.remember_spans(key, _Look(top, count, len(marks), made_from_it, _under_views(grad_fn)))
        if count >= 2 and spans_more and (before.calls >= 2 or made_from_it):
            grown.append((-count, i))
            if made_from_it and before.grew_from_last:
                chained.add(i)
        elif count >= 1 and new:
            renewed[i] = before.top
    if len(marks) < 2:
        return None
    current = None
    kept = []
    for count, i in sorted(grown):
        count = -count
        grad_fn = bindings[i].value.grad_fn
        stale = [child for child, _ in graph.children(grad_fn) if child is not None and graph.sequence(child) < marks[-1]]
        if count < 3 and not graph.holds_freed(stale or [grad_fn]) and i not in chained:
            continue
        if current is None:
            current = graph.walk(ctx.root_nodes(), expand=lambda seq: seq >= marks[-1])
        if not current.complete:
            return None  # too big to tell whether this backward goes through it
        if id(grad_fn) in current.nodes:
            continue  # this backward goes through it
        kept.append((held(ctx, bindings[i]), count))
    # Totals kept the same way, an iteration behind (ImVisible's `running_norm`, added up after
    # the step, beside `running_loss`): each new value made from the one an earlier call saw, and
    # outside this backward's graph. One leak, one fix: the fixed script must not warn about them next.
    behind = [held(ctx, bindings[i]) for i, earlier in renewed.items()
              if kept and id(bindings[i].value.grad_fn) not in current.nodes
              and _made_from(bindings[i].value.grad_fn, earlier)]
    # Values chained the same way whose last value the earlier call saw under another name only
    # (gflownet's `loss_flow_ema` and `loss_term_ema`, both first set to the same loss): spanning
    # two iterations or more, outside this backward's graph.
    alike = [held(ctx, binding) for i, binding in enumerate(bindings)
             if kept and i not in renewed and bin(spans.get(id(binding.value.grad_fn), 0)).count("1") >= 2
             and id(binding.value.grad_fn) not in current.nodes]
    for k, (candidate, count) in enumerate(kept):
        found = _kept_finding(ctx, candidate, count, [other for other, _ in kept[k + 1:]] + behind, alike)
        if found is not None:
            return found
    return _kept_each_iteration(ctx, bindings, spans, marks, current)


def _kept_each_iteration(ctx: Context, bindings, spans: dict[int, int], marks: list[int], current) -> Finding | None:
    """RecBole's `losses_list.append(losses)` and packnet-sfm's `outputs.append(output)` after each
    batch's backward: no value spans two iterations, but a list in the loop keeps one graph of
    each, which its backward freed (nothing can back-propagate it again), and holds more of them
    at every backward, until the epoch ends. Found where the items of one list (the same key of
    each: `outputs[i]['loss']`) come from as many earlier iterations as there are items, two at
    least and more than any earlier backward saw there, and this backward reaches none of them.
    Graphs no backward went through count only in a local list its function never reads back
    (udacity's epoch `samples`, only appended to: BX005 run-kept-unread).
    `current`: this backward's graph as `_kept_graph` walked it, or None where it did not."""
    groups: dict[tuple, list] = {}
    for binding in bindings:
        at = next((i for i, (kind, key) in enumerate(binding.steps) if kind == "item" and isinstance(key, int)), None)
        if at is not None:
            groups.setdefault((binding.frame_index, binding.base, binding.steps[:at], binding.steps[at + 1:]), []) \
                .append(binding)
    for (frame_index, base, head, tail), found in groups.items():
        # Every item, also one the walk reached by another name first (udacity's `samples_z`, the
        # epoch's sample still bound after it was appended).
        members = _items(ctx, found[0], head, tail) or [m.value.grad_fn for m in found]
        bits = {spans.get(id(m), 0) for m in members}
        if len(members) < 2 or len(bits) < len(members) or any(b & (b - 1) or not b for b in bits):
            continue
        freed = [graph.holds_freed([m]) for m in members]
        # A graph no backward went through may still be back-propagated later (an episode's
        # `log_probs`, summed at its end, or MAML's query losses between two `autograd.grad`
        # calls): only a local list that its function never reads back (udacity's epoch
        # `samples`, only appended to) is known to keep them for nothing.
        if not all(freed) and (any(freed) or head or ctx.call.api != "backward" or ctx.call.retain_graph
                               or ctx.call.create_graph):
            continue
        container = naming.Binding(frame_index, base, head, None, None).expression
        frame = ctx.frames[frame_index]
        key = (frame.f_code.co_filename, frame.f_code.co_name, container + str(tail))
        before = journal.spans_before(key, (0, len(members)))
        if before is not None and before[1] >= len(members):
            continue  # seen as long before: a window that slides, or a list the next epoch refills
        if current is None:
            current = graph.walk(ctx.root_nodes(), expand=lambda seq: seq >= marks[-1])
        if not current.complete or any(id(m) in current.nodes for m in members):
            continue
        source, scope = ctx.frame_source(frame)
        appends = [node for node in src.own_nodes(scope) if isinstance(node, ast.Call)
                   and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
                   and src.canonical(node.func.value) == container] if scope is not None else []
        # neural-network-lyapunov's line search: a list made in advance, filled by index in the loop
        # (`losses[iter_count], ... = optimizer.step(...)`), each loss back-propagated the next pass.
        loops = ctx.backward_loops(source, scope) if scope is not None and not appends else []
        filled = [a.stmt for a in src.item_assignments(scope, container)
                  if any(src.inside(a.stmt, loop) for loop in loops)] if loops else []
        stores = appends or filled
        if len(stores) != 1 or not (all(freed) or (appends and _only_filled(scope, container))):
            continue
        store = stores[0]
        _, _, backward = ctx.failing_statement()
        receiver = src.call_receiver(backward, "backward") if backward is not None else None
        if isinstance(receiver, ast.Subscript) and src.canonical(receiver.value) == container \
                and not ctx.call.retain_graph and not tail:
            # Back-propagated after it is stored: detached once its backward has run.
            fix = detach_carried.detach_item_after_backward(source, backward, receiver, container)
        elif appends:
            item = tail[0][1] if len(tail) == 1 and tail[0][0] == "item" and isinstance(tail[0][1], str) else None
            fix = detach_carried.append_detached(source, store, container, item, all(freed)) \
                if not tail or item is not None else None
        else:
            fix = None
        evidence = Evidence(container, ctx.call_site(source.filename, store.lineno), ctx.backward_site(),
                            facts=(("iterations", len(members)), ("kept_aside", True)))
        return finding("BX005", "run-kept-each" if all(freed) else "run-kept-unread", "graph-growth", evidence,
                       [culprit_at(container, source, node_start(source, store))], [fix])
    return None


def _items(ctx: Context, binding: naming.Binding, head: tuple, tail: tuple) -> list:
    """The grad_fn of each item of the list that `head` leads to from `binding`'s base (of what
    the item holds at `tail`), read from the frame again; empty where that is no list, or an
    item has no history."""
    container = ctx.reach(binding, head)
    if not isinstance(container, list) or len(container) > naming.MAX_ITEMS:
        return []
    found = []
    for i in range(len(container)):
        value = ctx.reach(binding, (*head, ("item", i), *tail))
        grad_fn = getattr(value, "grad_fn", None)
        if grad_fn is None:
            return []
        found.append(grad_fn)
    return found


def _only_filled(scope: ast.AST, container: str) -> bool:
    """Whether `scope` (nested functions included) reads the local list `container` only to
    append to it: nothing there can back-propagate what it holds, and the list is not returned."""
    if container in src.parameter_names(scope) or not src.is_local(scope, container):
        return False
    for read in src.reads(scope, container):
        method = src.parent(read)
        if not (isinstance(method, ast.Attribute) and method.attr == "append"
                and isinstance(src.parent(method), ast.Call) and src.parent(method).func is method):
            return False
    return True


def _kept_finding(ctx: Context, candidate, iterations: int, others: list, alike: list) -> Finding | None:
    located = candidate.located
    if located is None:
        return None
    # A total kept in an item of a list (SpareNet's meter, `self._sum[idx] += v`) adds up the same way.
    fix = accumulate_item.add_detached(located.source, candidate.name, located.assignment) \
        if candidate.relation == "direct" or isinstance(located.store, ast.AugAssign) else None
    if fix is not None:
        code, variant = "BX002", "run-kept-total"
        fix = _with_every_total(fix, candidate, others)
    elif isinstance(located.store, ast.Expr):
        # Written in place (nflows' `self.running_mean.mul_(...).add_(...)`): every such write of
        # the state kept the same way, in the same file, goes under no_grad (its `running_var` too).
        code, variant = "BX005", "run-kept-stored"
        same = [other for other in [candidate, *others] if other.located is not None
                and isinstance(other.located.store, ast.Expr) and other.located.source is located.source]
        fix = no_grad_update.write_in_place_under_no_grad(located.source, [o.located.store for o in same],
                                                          [o.name for o in same])
    else:
        code, variant = "BX005", "run-kept-stored"
        fix = _with_every_store(_store_without_chaining(candidate), candidate, others + alike)
    evidence = Evidence(candidate.name, made_at(ctx, located), ctx.backward_site(),
                        facts=(("iterations", iterations), ("kept_aside", True)))
    return finding(code, variant, "graph-growth", evidence, [culprit(ctx, candidate)], [fix])


def _with_every_total(first: Fix, candidate, others: list) -> Fix:
    """`first` and the same detach for each other total kept the same way in the same source
    (ImVisible adds up `loss`, `MSE` and `cross_entropy`, each in its own total): one leak, one
    fix, so the fixed script does not warn again about the next total."""
    def same(other) -> Fix | None:
        located = other.located
        if other.relation != "direct" or located.source is not candidate.located.source:
            return None
        return accumulate_item.add_detached(located.source, other.name, located.assignment)

    return _with_each_alike(first, candidate, others, same)


def _store_without_chaining(candidate) -> Fix | None:
    """The detach of the value `candidate` stores, made from the one stored before."""
    # `self.memory[agent] = state`, a tuple: the binding is one of its elements.
    steps = candidate.binding.steps
    element = bool(steps) and steps[-1][0] == "item" and isinstance(steps[-1][1], int)
    located = candidate.located
    return detach_carried.store_without_chaining(located.source, located.store, candidate.name, element)


def _with_every_store(first: Fix | None, candidate, others: list) -> Fix | None:
    """`first` and the same detach for each other value stored the same way, by an assignment
    of the same function that makes it from its own last value (gflownet's two moving averages
    of the loss, `loss_term_ema` and `loss_flow_ema`): one leak, one fix."""
    def same(other) -> Fix | None:
        located = other.located
        if not isinstance(located.store, ast.Assign) or located.scope is not candidate.located.scope \
                or not self_referencing(located.assignment, located.target_text):
            return None
        return _store_without_chaining(other)

    return _with_each_alike(first, candidate, others, same) if first is not None else None


def _with_each_alike(first: Fix, candidate, others: list, same) -> Fix:
    """`first` with the edits `same(other)` gives for each other candidate placed somewhere (None
    where it is not kept the same way), each named once, none overlapping an edit taken before."""
    edits, names = list(first.edits), [candidate.name]
    for other in others:
        if other.located is None or other.name in names:
            continue
        fix = same(other)
        if fix is None or overlapping(edits, fix.edits):
            continue
        edits.extend(fix.edits)
        names.append(other.name)
    return _also_for(first, edits, names, ("keeps graphs", "keep graphs"))


def _also_for(first: Fix, edits: list, names: list[str], which: tuple[str, str]) -> Fix:
    """`first` with `edits`, the same fix for each of `names` after the first, its message saying
    so (`which`: what the others do, said of one and of several); `first` where there is none."""
    more = names[1:]
    if not more:
        return first
    listed = ", ".join(f"`{n}`" for n in more[:-1]) + (" and " if len(more) > 1 else "") + f"`{more[-1]}`"
    return Fix(f"{first.message} (and the same for {listed}, which {which[len(more) > 1]} too)", tuple(edits),
               first.applicability)


def _under_views(grad_fn) -> int:
    """The sequence number of what `grad_fn` is a view of, through views of views (itself where it
    is no view's): a total written in place (`self._tensor += update`, `update` an einsum's view)
    is rebased on that, and the view's own node leaves its graph. A weight's view is its own."""
    node = grad_fn
    while graph.is_view(node):
        inputs = [child for child, _ in graph.children(node) if child is not None]
        if len(inputs) != 1 or graph.is_leaf(inputs[0]):
            break
        node = inputs[0]
    return graph.sequence(node)


def _made_from(top, earlier: int) -> bool:
    """Whether the graph under `top` holds the node numbered `earlier` (a value made from the
    one whose graph that node topped). Within the budget."""
    reached = graph.walk([top], expand=lambda seq: seq > earlier)
    return earlier in reached.seq.values()


def _stale_spans(tops, marks: list[int]) -> dict[int, int]:
    """For each node reached from `tops` (by id), a bit per span between earlier backward calls
    (before the first mark, between the first and the second, ...) in which a node at or below
    it was made, the last span, since the previous backward, left out. Within the budget: what
    it cannot afford to wrap counts for nothing."""
    spans: dict[int, int] = {}
    entered: set[int] = set()
    stack = [(top, False) for top in tops]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            seq = graph.sequence(node)
            bits = 1 << bisect.bisect_right(marks, seq) if seq < marks[-1] else 0
            for child, _ in graph.children(node):
                if child is not None:
                    bits |= spans.get(id(child), 0)
            spans[key] = bits
            continue
        if key in entered:
            continue
        entered.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child, _ in graph.children(node)
                     if child is not None and id(child) not in entered)
    return spans
