"""Where a value comes from within one scope, and what runs between two backward calls: the
shared ancestors of two losses, the optimizer steps in between and the modules they update."""
from __future__ import annotations

import ast
import copy
from bisect import bisect_left
from dataclasses import dataclass

from . import source as src
from .training import (
    SHAPED_LIKE,
    Backward,
    comprehension_variables,
    cuts_history,
    has_history,
    instance_attribute_assignments,
    is_leaf_like,
    is_module,
    under_no_grad,
)

# Receivers whose attributes are library functions, not values (`torch.cat`, `F.relu`).
_LIBRARIES = {"torch", "F", "nn", "np", "numpy", "math", "functional"}


@dataclass(frozen=True)
class Ancestor:
    """An assignment that a value depends on without a cut (`.detach()`, `.item()`) between."""

    expression: str
    stmt: ast.stmt
    target: ast.expr

    @property
    def value(self) -> ast.expr | None:
        return src.Assignment(self.stmt, self.target).value

    @property
    def line(self) -> int:
        return self.stmt.lineno


def dependencies(node: ast.AST) -> list[ast.expr]:
    """The names and attribute chains `node` reads as values, skipping what is called
    (`model(x)` reads `x`, not `model`) and what a cut discards (`h.detach()`)."""
    found: list[ast.expr] = []
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, ast.Call):
            if cuts_history(current):
                continue
            func = current.func
            if isinstance(func, ast.Attribute) and _root_name(func.value) not in _LIBRARIES:
                pending.append(func.value)  # `out.mean()` reads `out`
                if func.attr in SHAPED_LIKE:
                    continue  # `scale.to(float_attr)` reads `float_attr`'s dtype, not its values
            pending.extend(current.args)
            pending.extend(k.value for k in current.keywords)
        elif isinstance(current, (ast.Name, ast.Attribute)) and isinstance(current.ctx, ast.Load):
            if isinstance(current, ast.Attribute) and current.attr == "data":
                continue
            if _root_name(current) not in _LIBRARIES:
                found.append(current)
        elif isinstance(current, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
            # `[m.detach() for m in members]` reads nothing of `members`: what it iterates over
            # counts only where the element reads a loop variable without a cut.
            variables = comprehension_variables(current)
            inner = dependencies(current.elt)
            found.extend(read for read in inner if _root_name(read) not in variables)
            if any(_root_name(read) in variables for read in inner):
                pending.extend(g.iter for g in current.generators)
        elif isinstance(current, ast.Subscript):
            pending.append(current.value)  # `grads[0]` reads `grads`; the index is data
        elif not isinstance(current, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(current))
    return found


def ancestors(value: ast.AST, scope: ast.AST, before: int, totals: bool = True) -> list[Ancestor]:
    """The assignments in `scope` that `value`, read at line `before`, was computed from, nearest
    first: for each name read, the last assignment above the reading line, then its own reads.
    With `totals`, `loss += penalty` reads `loss` too: what it was before (deocclusion's generator
    loss, its adversarial term added first, then each reconstruction term in a loop)."""
    found: dict[tuple[int, str], Ancestor] = {}
    pending = [(value, before)]
    while pending:
        node, at = pending.pop(0)
        for read in dependencies(node):
            assignment = _reaching(scope, read, at)
            if assignment is None:
                continue
            key = (id(assignment.stmt), src.canonical(assignment.target))
            if key in found:
                continue
            found[key] = Ancestor(src.canonical(assignment.target), assignment.stmt, assignment.target)
            assigned = assignment.value
            if assigned is not None:
                pending.append((assigned, assignment.stmt.lineno))
            if totals and isinstance(assignment.stmt, ast.AugAssign):
                pending.append((_read_of(assignment.stmt.target), assignment.stmt.lineno))
    return list(found.values())


def _read_of(target: ast.expr) -> ast.expr:
    """`target`, a store (`loss` of `loss += x`), as the read of it that dependencies follows."""
    read = copy.copy(target)
    read.ctx = ast.Load()
    return read


def root_ancestors(backward: Backward, scope: ast.AST) -> list[Ancestor]:
    """`ancestors` of a backward call's root, computed once per call: rules ask for them for
    every pair of calls (a loop of 400 backward calls took 11 s without this and `_reaching`'s
    bisection). What two calls share is looked for without going back through `+=`: the sums
    before it bring in whatever their terms read, indices included (hanasu's `ids_slice`, a
    module's output that only slices the targets), and would be taken for a shared graph."""
    known = src.cached(scope, "_root_ancestors", dict)
    found = known.get(id(backward.call))
    if found is None:
        found = known[id(backward.call)] = ancestors(backward.root, scope, backward.line, totals=False)
    return found


def ancestor_keys(backward: Backward, scope: ast.AST) -> frozenset[tuple[int, str]]:
    """(statement, expression) of the call's ancestors that carry history: what two calls must
    share for the first to free the second's graph."""
    known = src.cached(scope, "_ancestor_keys", dict)
    found = known.get(id(backward.call))
    if found is None:
        found = known[id(backward.call)] = frozenset(
            (id(a.stmt), a.expression) for a in root_ancestors(backward, scope) if _carries_history(a, scope))
    return found


def shared_ancestor(first: Backward, second: Backward, scope: ast.AST) -> Ancestor | None:
    """The nearest assignment with autograd history that both calls' roots come from: the same
    assignment, not one re-made between the calls."""
    theirs = ancestor_keys(second, scope)
    shared = [a for a in root_ancestors(first, scope) if (id(a.stmt), a.expression) in theirs]
    return max(shared, key=lambda a: (a.line, a.stmt.col_offset)) if shared else None


def _carries_history(ancestor: Ancestor, scope: ast.AST) -> bool:
    known = src.cached(scope, "_carries_history", dict)
    key = (id(ancestor.stmt), ancestor.expression)
    found = known.get(key)
    if found is None:
        found = known[key] = carries_history(ancestor, scope)
    return found


def carries_history(ancestor: Ancestor, scope: ast.AST) -> bool:
    """The source shows the assigned value has a graph of its own: a module call, or a value
    computed from a parameter (made outside `no_grad`; a leaf itself has nothing to free)."""
    value = ancestor.value
    return value is not None and not under_no_grad(ancestor.stmt) and not is_leaf_like(value) \
        and has_history(value, scope, ancestor.line, strict=True)


def _reaching(scope: ast.AST, read: ast.expr, at: int) -> src.Assignment | None:
    """The last assignment above line `at` to `read`, or else to the object it is part of
    (`out.shape` comes from `out`)."""
    while True:
        assigned = src.assignments(scope, read)  # in source order
        before = bisect_left(assigned, at, key=_line_of)
        if before:
            return assigned[before - 1]
        if not isinstance(read, ast.Attribute):
            return None
        read = read.value


def _line_of(assignment: src.Assignment) -> int:
    return assignment.stmt.lineno


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def same_pass(first: ast.AST, second: ast.AST) -> bool:
    """`second` comes after `first` in source and both run in one pass through their common
    block: not in the two branches of one `if`, nor in a `try` and its handler."""
    if (second.lineno, second.col_offset) <= (first.lineno, first.col_offset):
        return False
    first_chain = [first, *src.ancestors(first)]
    second_chain = [second, *src.ancestors(second)]
    common = next((a for a in first_chain if any(a is b for b in second_chain)), None)
    if _conditions(first_chain, common) & {(test, not holds) for test, holds in _conditions(second_chain, common)}:
        return False  # `if not NEW_API: loss.backward()` ... `if NEW_API: loss.backward()`
    if isinstance(common, ast.If):
        return _branch(common, first) == _branch(common, second)
    if isinstance(common, ast.Try):
        return _branch(common, first) == _branch(common, second) or _branch(common, second) == "finalbody"
    return True


def _conditions(chain: list[ast.AST], common: ast.AST | None) -> set[tuple[str, bool]]:
    """The `if` tests a node of `chain` runs under, below `common`: (test, whether it holds),
    with `not X` read as X not holding."""
    found = set()
    for child, owner in zip(chain, chain[1:]):
        if owner is common:
            break
        if isinstance(owner, ast.If) and child is not owner.test:
            test, holds = owner.test, any(child is s for s in owner.body)
            while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, holds = test.operand, not holds
            found.add((ast.dump(test), holds))
    return found


def _branch(owner: ast.AST, node: ast.AST) -> str | None:
    chain = [node, *src.ancestors(node)]
    for field in ("body", "orelse", "handlers", "finalbody"):
        for child in getattr(owner, field, []):
            if any(child is c for c in chain):
                return field
    return None


@dataclass(frozen=True)
class Step:
    """`optimizer.step()` (or `scaler.step(optimizer)`), and the modules whose parameters that
    optimizer updates, when the source shows them (None: unknown). A module's `load_state_dict`,
    or a soft update writing its parameters in place, is one too, updating that module."""

    call: ast.Call
    optimizer: str
    modules: frozenset[str] | None

    @property
    def line(self) -> int:
        return self.call.lineno


def steps(scope: ast.AST) -> tuple[Step, ...]:
    """The optimizer steps in `scope` (not in nested defs), in source order."""
    return src.cached(scope, "_steps", lambda: tuple(_steps(scope)))


def _steps(scope: ast.AST) -> list[Step]:
    found = []
    for node in _calls_that_may_step(scope):
        overwritten = _overwritten_module(node, scope)
        if overwritten is not None:
            found.append(Step(node, overwritten, frozenset({overwritten})))
            continue
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STEPS):
            continue
        receiver = node.func.value
        optimizer = node.args[0] if node.args and "scaler" in src.canonical(receiver).lower() else receiver
        if not _is_optimizer(optimizer, scope, node.lineno):
            continue
        found.append(Step(node, src.canonical(optimizer), _updated_modules(optimizer, scope, node.lineno)))
    found.sort(key=lambda s: (s.call.lineno, s.call.col_offset))
    return found


def _calls_that_may_step(scope: ast.AST) -> tuple[ast.Call, ...]:
    """`x.step(...)`, `x.load_state_dict(...)` and in-place writes in `scope`: what `_steps` reads
    further (most scopes have none)."""
    return src.cached(scope, "_calls_that_may_step", lambda: tuple(
        n for n in src.own_nodes(scope) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        and (n.func.attr in (*_STEPS, "load_state_dict") or n.func.attr in _IN_PLACE_WRITES)), subtree_only=True)


# An optimizer's updates of its parameters: `step()`, and sharpness-aware minimisation's two
# half-steps (`first_step()` moves the weights to the worst point nearby, `second_step()` back and
# on; SAM's, ASAM's and GSAM's optimizers name them so).
_STEPS = frozenset({"step", "first_step", "second_step"})


def _overwritten_module(node: ast.AST, scope: ast.AST) -> str | None:
    """`target_actor.load_state_dict(actor.state_dict())`, or a soft update that writes each
    parameter in place (`for t, p in zip(target.parameters(), net.parameters()): t.copy_(...)`):
    they change the module's parameters as a step does (the target network's forward made before
    cannot be back-propagated after). Returns the module's expression."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if node.func.attr == "load_state_dict" and node.args and not isinstance(node.args[0], ast.Dict):
        module = node.func.value
        return src.canonical(module) if is_module(module, scope, node.lineno) else None
    if node.func.attr in _IN_PLACE_WRITES and isinstance(node.func.value, ast.Name):
        return _parameters_iterated(node.func.value.id, node)
    return None


# In-place writes a soft update makes on a parameter (`t.copy_(...)`, `t.mul_(1 - tau)`); through
# `.data` they bump no version, and the backward does not notice.
_IN_PLACE_WRITES = frozenset({"copy_", "mul_", "add_", "lerp_", "addcmul_", "sub_", "zero_"})


def _parameters_iterated(name: str, write: ast.Call) -> str | None:
    """The module whose `.parameters()` the `for` around `write` binds `name` to, directly or as
    the first of `zip(...)`: `target` in `for t, p in zip(target.parameters(), net.parameters())`."""
    for loop in src.ancestors(write):
        if not isinstance(loop, ast.For):
            continue
        iterated, target = loop.iter, loop.target
        if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Name) and iterated.func.id == "zip" \
                and isinstance(target, ast.Tuple) and len(target.elts) == len(iterated.args):
            pairs = list(zip(target.elts, iterated.args))
        else:
            pairs = [(target, iterated)]
        for bound, source in pairs:
            if isinstance(bound, ast.Name) and bound.id == name and isinstance(source, ast.Call) \
                    and isinstance(source.func, ast.Attribute) and source.func.attr == "parameters":
                return src.canonical(source.func.value)
    return None


def _constructor(node: ast.AST, scope: ast.AST, before: int) -> ast.Call | None:
    """The call that made `node`'s value, following simple assignments in `scope` and the module."""
    for _ in range(4):
        if isinstance(node, ast.Call):
            return node
        if not isinstance(node, (ast.Name, ast.Attribute)):
            return None
        assignment = _reaching(scope, node, before) or _reaching(src.module_of(scope), node, before)
        if assignment is None and isinstance(node, ast.Attribute):
            assignment = _assigned_in_class(node, scope)
        if assignment is None or assignment.value is None:
            return None
        node, before = assignment.value, assignment.stmt.lineno
    return None


def _is_optimizer(node: ast.AST, scope: ast.AST, before: int) -> bool:
    made = _constructor(node, scope, before)
    if made is not None:
        made_by = spelled_in_full(made.func, src.module_of(scope))
        return ("optim" in made_by or made_by.rsplit(".", 1)[-1] in _OPTIMIZER_CLASSES) and "lr_scheduler" not in made_by
    name = src.canonical(node).lower()
    return "opt" in name and "sched" not in name


# Optimizer classes by the names other packages export them under too (`from transformers import
# AdamW`, `from lion_pytorch import Lion`).
_OPTIMIZER_CLASSES = frozenset({
    "SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD", "NAdam", "RAdam",
    "LBFGS", "SparseAdam", "Adafactor", "Lion", "LAMB", "Lamb", "AdaBelief", "Lookahead", "SAM"})


def spelled_in_full(func: ast.AST, tree: ast.AST) -> str:
    """What a called name is, through the file's imports: `torch.optim.Adam` for `Adam` after
    `from torch.optim import Adam`, or for `O.Adam` after `import torch.optim as O`; the name as
    written when no import binds it."""
    text = src.canonical(func)
    head, _, rest = text.partition(".")
    for node in src.nodes_of(tree, (ast.Import, ast.ImportFrom)):
        if isinstance(node, ast.ImportFrom) and node.module:
            bound = [a.name for a in node.names if (a.asname or a.name) == head]
            if bound:
                return ".".join(part for part in (node.module, bound[0], rest) if part)
        elif isinstance(node, ast.Import):
            bound = [a.name for a in node.names if a.asname == head]
            if bound:
                return ".".join(part for part in (bound[0], rest) if part)
    return text


def _updated_modules(optimizer: ast.AST, scope: ast.AST, before: int) -> frozenset[str] | None:
    made = _constructor(optimizer, scope, before)
    if made is None:
        found = _made_by_its_class(optimizer)
        if found is None:
            return None
        made, init, receiver = found
        inside = _updated_modules_of(made, init, made.lineno)
        return frozenset(receiver + m[len("self"):] if m.startswith("self.") else m for m in inside) \
            if inside else None
    return _updated_modules_of(made, scope, before)


def _made_by_its_class(optimizer: ast.AST) -> tuple[ast.Call, ast.AST, str] | None:
    """RN's `model.dis_optimizer`, where `model = InpaintingModel(...)` and its `__init__` makes
    `self.dis_optimizer = optim.Adam(params=self.discriminator.parameters())`: that call, the
    method it is made in, and the receiver (`model`) its `self.` stands for."""
    made = instance_attribute_assignments(optimizer, workspace=True)
    if len(made) != 1 or not isinstance(made[0].value, ast.Call):
        return None
    method = src.enclosing_function(made[0].stmt)
    return (made[0].value, method, optimizer.value.id) if method is not None else None


def _updated_modules_of(made: ast.Call, scope: ast.AST, before: int) -> frozenset[str] | None:
    """The modules whose parameters the optimizer `made` is given (`Adam(net.parameters())`, or
    `params=` by keyword)."""
    given = made.args[0] if made.args else next((k.value for k in made.keywords if k.arg == "params"), None)
    if given is None:
        return None
    modules: set[str] = set()
    pending = [given]
    for _ in range(16):
        if not pending:
            break
        node = pending.pop()
        if isinstance(node, (ast.List, ast.Tuple)):
            # `optim.Adam([self.log_alpha])`: a leaf tensor is updated, and no module with it
            leaves = [e for e in node.elts if isinstance(e, (ast.Name, ast.Attribute))
                      and is_leaf_like(_constructor(e, scope, before))]
            modules.update(src.canonical(e) for e in leaves)
            pending.extend(e for e in node.elts if not any(e is leaf for leaf in leaves))
            continue
        for call in src.calls_named(node, "parameters", "named_parameters"):
            if isinstance(call.func, ast.Attribute):
                modules.add(src.canonical(call.func.value))
        for name in src.names_read(node):
            assignment = _reaching(scope, ast.Name(name, ast.Load()), before) \
                or _reaching(src.module_of(scope), ast.Name(name, ast.Load()), before)
            if assignment is not None and assignment.value is not None:
                pending.append(assignment.value)
    return frozenset(modules) or None


def modules_called(value: ast.AST, scope: ast.AST, before: int) -> set[str]:
    """Modules called in `value` itself (`critic(torch.cat([s, actor(s)]))`: critic and actor),
    as spelled there; `.to()`/`.cuda()` spellings resolve to the module."""
    called = set()
    for call in ast.walk(value):
        if isinstance(call, ast.Call) and isinstance(call.func, (ast.Name, ast.Attribute)) \
                and is_module(call.func, scope, before):
            called.add(src.canonical(call.func))
        elif isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.value is not None \
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "self" \
                and _assigned_in_class(call.func, scope) is not None:
            called.add(src.canonical(call.func))  # `self.encoder(x)`, a submodule set in __init__
    return called


def _assigned_in_class(attribute: ast.Attribute, scope: ast.AST) -> src.Assignment | None:
    """`self.x = ...` anywhere in the class around `scope` (usually `__init__`)."""
    if not (isinstance(attribute.value, ast.Name) and attribute.value.id == "self"):
        return None
    owner = src.enclosing_class(scope)
    if owner is None:
        return None
    found = src.assignments(owner, attribute, deep=True)
    return found[0] if found else None
