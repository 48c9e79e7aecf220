"""What the rules share: which loops train (call backward), and which values carry autograd
history, read from the AST alone."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from .. import source as src

# Calls whose result never carries autograd history.
CUTS = {"detach", "detach_", "item", "tolist", "numpy", "float", "int", "bool", "len", "str", "range",
        "repackage_hidden", "zeros", "zeros_like", "ones", "ones_like", "empty", "randn", "rand", "tensor"}
BACKWARD_CALLS = {"backward", "grad"}


def is_backward_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name == "backward":
        return True
    return name == "grad" and isinstance(func, ast.Attribute) and src.canonical(func.value).endswith("autograd")


@dataclass(frozen=True)
class TrainingLoop:
    loop: ast.stmt
    scope: ast.AST


def training_loops(tree: ast.Module) -> list[TrainingLoop]:
    """Loops (for/while, not crossing a def) whose body calls backward or autograd.grad."""
    found = []
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        for node in src.own_nodes(scope):
            if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and any(
                is_backward_call(n) for n in src.own_nodes(node)
            ):
                found.append(TrainingLoop(node, scope))
    return found


def under_no_grad(node: ast.AST) -> bool:
    for ancestor in src.ancestors(node):
        if isinstance(ancestor, (ast.With, ast.AsyncWith)) and any(
            any(word in src.canonical(item.context_expr) for word in ("no_grad", "inference_mode"))
            for item in ancestor.items
        ):
            return True
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return any("no_grad" in src.canonical(d) or "inference_mode" in src.canonical(d)
                       for d in ancestor.decorator_list)
    return False


def cuts_history(expression: ast.AST) -> bool:
    """Whether the outermost operation makes a value without history (`x.detach()`, `.item()`)."""
    node = expression
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        return name in CUTS
    if isinstance(node, ast.Attribute) and node.attr == "data":
        return True
    return False


def detached_in(loop: ast.AST, expression: str) -> bool:
    """Whether the loop re-binds `expression` to a detached copy of itself, or detaches it in place."""
    for node in src.own_nodes(loop):
        value = src.value_of(node) if isinstance(node, ast.stmt) else None
        if value is not None and any(src.canonical(t) == src.canonical(expression) for t in src.targets_of(node)) \
                and src.reads(value, expression) and not live_reads(value, expression):
            return True  # `h = h.detach()`, `h = repackage_hidden(h)`, `h = tuple(x.detach() for x in h)`
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach_":
            receiver = node.func.value
            while isinstance(receiver, ast.Subscript):  # `hidden[0].detach_()` detaches part of `hidden`
                receiver = receiver.value
            if src.canonical(receiver) == src.canonical(expression):
                return True
    return False


def live_reads(node: ast.AST, expression: str) -> list[ast.expr]:
    """Reads of `expression` in `node` whose value is not cut on the way (`x.detach()`,
    `tuple(h.detach() for h in x)`)."""
    live = []
    for read in src.reads(node, expression):
        cut = False
        for ancestor in src.ancestors(read):
            if isinstance(ancestor, ast.Call) and cuts_history(ancestor):
                cut = True
            if isinstance(ancestor, (ast.GeneratorExp, ast.ListComp)) and cuts_history(ancestor.elt):
                cut = True
            if ancestor is node or cut:
                break
        if not cut:
            live.append(read)
    return live


def carries_history(node: ast.AST, scope: ast.AST, before: int, ignore: str = "", depth: int = 0) -> bool:
    """Whether `node` (an expression) may carry autograd history, not counting `ignore`: a call of a
    module or an unknown function, a tensor made with requires_grad=True, or a local assigned from
    one. Function arguments and loop variables count as data."""
    if depth > 8 or node is None:
        return False
    if isinstance(node, ast.Call):
        if any(k.arg == "requires_grad" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords):
            return True
        if cuts_history(node):
            return False
        func = node.func
        arguments = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(func, ast.Attribute):
            receiver = func.value
            if isinstance(receiver, ast.Name) and receiver.id in ("torch", "F", "nn", "math", "np", "numpy"):
                return any(carries_history(a, scope, before, ignore, depth + 1) for a in arguments)
            if isinstance(receiver, ast.Name) and receiver.id == "self":
                return True  # a submodule (or a method using parameters)
            return carries_history(receiver, scope, before, ignore, depth + 1) or any(
                carries_history(a, scope, before, ignore, depth + 1) for a in arguments)
        if isinstance(func, ast.Name) and (func.id in ("tuple", "list", "sum", "max", "min", "abs", "zip")
                                           or func.id[:1].isupper()):
            # Containers, and constructors (`OrderedDict(...)`): history only through arguments.
            return any(carries_history(a, scope, before, ignore, depth + 1) for a in arguments)
        return True  # model(x), an unknown callable: assume it may use parameters
    if isinstance(node, (ast.BinOp,)):
        return carries_history(node.left, scope, before, ignore, depth + 1) or carries_history(
            node.right, scope, before, ignore, depth + 1)
    if isinstance(node, ast.UnaryOp):
        return carries_history(node.operand, scope, before, ignore, depth + 1)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(carries_history(e, scope, before, ignore, depth + 1) for e in node.elts)
    if isinstance(node, ast.Subscript):
        return carries_history(node.value, scope, before, ignore, depth + 1)
    if isinstance(node, (ast.Name, ast.Attribute)):
        expression = src.canonical(node)
        if expression == ignore or (isinstance(node, ast.Attribute) and node.attr == "data"):
            return False
        earlier = [a for a in src.assignments(scope, expression) if a.stmt.lineno < before]
        if not earlier:
            return False
        value = src.value_of(earlier[-1].stmt)
        return value is not None and carries_history(value, scope, earlier[-1].stmt.lineno, ignore, depth + 1)
    return False
