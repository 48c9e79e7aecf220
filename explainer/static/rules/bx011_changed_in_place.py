"""BX011 changed-in-place, found in source: the cause and its docs are explainer/causes/bx011_changed_in_place.py.

The checker sees the plainest form: the output of an operation that saves its output for the
gradient (`F.relu`, `torch.sigmoid`, a module attribute made as `nn.ReLU()`, an `nn.Sequential`
ending in one), changed in place further down the same function (`out += residual`) before any
backward there. An operation that saves its input instead (a convolution, a batch norm) leaves
its output free to change, which is why torchvision's `out = self.bn2(out); out += identity` is
correct. The other forms (a tensor saved as another operation's input, state written in a method,
`load_state_dict`) are told by a run."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx011_changed_in_place import CAUSE
from ...fixes import out_of_place
from ...model import Finding
from ...reading import source as src
from ...reading.training import defines_forward, has_history, runs_backward, scopes, under_no_grad
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code

# Functions and tensor methods whose backward reads their own output (ReluBackward0 saves
# `result`, as do those of sigmoid, tanh, exp, sqrt, rsqrt, softmax and log_softmax).
_SAVE_RESULT = {"relu", "sigmoid", "tanh", "exp", "sqrt", "rsqrt", "softmax", "log_softmax"}
# The module classes that run one of them.
_SAVE_RESULT_MODULES = {"ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax"}
# Receivers whose `exp`, `sqrt` or `tanh` are not torch's.
_NOT_TORCH = ("np", "numpy", "math", "jnp", "jax", "scipy", "cmath")
# Tensor methods ending in `_` that do not write into the tensor's values.
_NOT_WRITES = {"requires_grad_", "share_memory_", "record_stream_", "detach_"}


def check(module: CheckedModule) -> Iterator[Finding]:
    for scope in scopes(module.tree):
        for stmt in src.own_nodes(scope):
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                continue
            op = _saving_result(stmt.value, scope)
            if op is None or under_no_grad(stmt) or not has_history(stmt.value, scope, stmt.lineno, strict=True):
                continue
            name = stmt.targets[0].id
            change = _changed_in_place(scope, stmt, name)
            if change is None:
                continue
            fix = out_of_place.out_of_place(module.source, change, name)
            yield module.finding(CODE, "saved-result", stmt.targets[0], fix, carrier=name, made_at=change,
                                 saver=module.source.segment(op.func), change=module.source.segment(change).splitlines()[0])


def _saving_result(value: ast.expr, scope, depth: int = 0) -> ast.Call | None:
    """The call that makes `value` where its backward saves what it returns: `F.relu(...)`,
    `x.sigmoid()`, `self.relu(...)` of an `nn.ReLU()`, `self.block(...)` of an `nn.Sequential`
    whose last layer is one, or of a module class of this file whose `forward` returns only such
    values (cdc's `Block`)."""
    if not isinstance(value, ast.Call) or depth > 3:
        return None
    func = value.func
    if isinstance(func, ast.Attribute) and func.attr in _SAVE_RESULT:
        root = src.canonical(func.value).split(".")[0]
        if root not in ("self", *_NOT_TORCH):
            return value  # `F.relu(x)`, `torch.sigmoid(x)`, `x.exp()`
    if isinstance(func, ast.Name) and func.id in _SAVE_RESULT:
        return value
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        made = _made_in_init(scope, func.attr)
        if made is not None and _module_saves_result(made, src.module_of(scope), depth):
            return value
    return None


def _made_in_init(scope, attribute: str) -> ast.expr | None:
    """What `self.<attribute>` is assigned in the `__init__` of the class `scope` is a method of."""
    owner = src.enclosing_class(scope)
    init = src.method_of(owner, "__init__") if owner is not None else None
    if init is None:
        return None
    made = [a.value for a in src.assignments(init, f"self.{attribute}")]
    return made[0] if len(made) == 1 else None


def _module_saves_result(made: ast.expr, tree, depth: int) -> bool:
    """`nn.ReLU(inplace=True)`, `nn.Sigmoid()`, an `nn.Sequential(...)` whose last layer is one,
    or a module class of this file whose `forward` returns only what such an operation made."""
    if not isinstance(made, ast.Call):
        return False
    kind = src.canonical(made.func).split(".")[-1]
    if kind in _SAVE_RESULT_MODULES:
        return True
    if kind == "Sequential":
        return bool(made.args) and not isinstance(made.args[-1], ast.Starred) \
            and _module_saves_result(made.args[-1], tree, depth)
    classes = [c for c in src.nodes_of(tree, (ast.ClassDef,)) if c.name == kind]
    forward = defines_forward(classes[0]) if len(classes) == 1 else None
    returned = [n.value for n in src.own_nodes(forward) if isinstance(n, ast.Return)] if forward is not None else []
    return bool(returned) and all(r is not None and _saving_result(r, forward, depth + 1) is not None for r in returned)


def _changed_in_place(scope, made: ast.Assign, name: str) -> ast.stmt | None:
    """The first statement after `made`, in its function, that writes into `name` in place
    (`name += x`, `name.add_(x)`, `name[i] = x`) before `name` is bound again or a backward runs."""
    later = sorted((n for n in src.own_nodes(scope) if isinstance(n, ast.stmt) and n.lineno > made.end_lineno),
                   key=lambda n: (n.lineno, n.col_offset))
    for stmt in later:
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
            return stmt
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Subscript) and src.canonical(t.value) == name
                                                for t in stmt.targets):
            return stmt
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _writes_into(stmt.value, name):
            return stmt
        if name in {src.canonical(t) for t in src.targets_of(stmt)} or isinstance(stmt, ast.Return) \
                or any(runs_backward(n) for n in ast.walk(stmt) if isinstance(n, ast.Call)):
            return None
    return None


def _writes_into(call: ast.Call, name: str) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and src.canonical(func.value) == name and func.attr.endswith("_") \
        and not func.attr.endswith("__") and func.attr not in _NOT_WRITES


# A residual block (`{body}` its forward after the convolution), then its training.
RESIDUAL = """
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(4, 4, 3, padding=1)
                self.bn = nn.BatchNorm2d(4)
                self.relu = nn.ReLU(inplace=True)
                self.head = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())

            def forward(self, x):
                residual = x
{body}
                return out

        model = Block()
        for x in batches:
            loss = model(x).sum()
            loss.backward()
"""

# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("a residual added in place to a ReLU's output (csnet's ResEncoder)", RESIDUAL.format(body="""
                out = F.relu(self.bn(self.conv(x)))
                out += residual
    """)),
    Invalid("the ReLU is a module of the block", RESIDUAL.format(body="""
                out = self.relu(self.bn(self.conv(x)))
                if residual is not None:
                    out += residual
    """)),
    Invalid("a Sequential that ends in a ReLU (microbial's HRNet block)", RESIDUAL.format(body="""
                out = self.head(x)
                out.add_(residual)
    """)),
    Invalid("a block of this file whose forward ends in a ReLU, its output given a time embedding in place "
            "(cdc's ResnetBlock)", """
        class Block(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.block = nn.Sequential(nn.Conv2d(dim, dim, 3, padding=1), nn.ReLU())

            def forward(self, x):
                return self.block(x)

        class ResnetBlock(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.block1 = Block(dim)
                self.mlp = nn.Linear(8, dim)

            def forward(self, x, time_emb):
                h = self.block1(x)
                h += self.mlp(time_emb)[:, :, None, None]
                return h + x
    """),
    Invalid("a ReLU of what a network's layers made one by one, masked in place (neural_clbf's descent "
            "violation)", """
        class CLBF(nn.Module):
            def __init__(self):
                super().__init__()
                self.V_nn = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

            def V(self, x):
                V = x
                for layer in self.V_nn:
                    V = layer(V)
                return V

            def forward(self, x, x_next, active):
                violation = F.relu(self.V(x_next) - self.V(x))
                violation *= active
                return violation.mean()
    """),
]
VALID: list[Valid] = [
    Valid("torchvision's BasicBlock: the residual added to the batch norm's output, which saved its input",
          RESIDUAL.format(body="""
                out = self.bn(self.conv(x))
                out += residual
                out = self.relu(out)
    """)),
    Valid("the residual added out of place", RESIDUAL.format(body="""
                out = F.relu(self.bn(self.conv(x)))
                out = out + residual
    """)),
    Valid("a ReLU of what layers iterated from a plain list of functions made, masked in place", """
        for x, active in batches:
            v = x
            for step in steps:
                v = step(v)
            violation = F.relu(v)
            violation *= active
            violation.mean().backward()
    """),
    Valid("the output bound again before the in-place change", RESIDUAL.format(body="""
                out = torch.sigmoid(self.conv(x))
                out = self.bn(out)
                out += residual
    """)),
]
