"""What the rules share: which loops train (call backward), and which values carry autograd
history, read from the AST alone."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from . import jedi_types
from . import source as src

# Calls whose result never carries autograd history.
CUTS = {"detach", "detach_", "item", "tolist", "numpy", "float", "int", "bool", "len", "str", "range",
        "repackage_hidden", "zeros", "zeros_like", "ones", "ones_like", "empty", "randn", "rand", "tensor",
        # sampling and indices: a distribution's `sample()` runs without grad (`rsample()` keeps it)
        "sample", "argmax", "argmin", "multinomial", "randint", "randperm", "randn_like", "rand_like",
        "arange", "full", "eye", "empty_like", "full_like", "randint_like", "linspace", "logspace",
        "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "bernoulli"}
BACKWARD_CALLS = {"backward", "grad"}
_FLOAT_CASTS = frozenset({"float", "double", "half", "bfloat16"})


def is_backward_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name == "backward":
        return True
    return name == "grad" and isinstance(func, ast.Attribute) and src.canonical(func.value).endswith("autograd")


@dataclass(frozen=True)
class Backward:
    """One `x.backward(...)`, `torch.autograd.backward(x)` or `torch.autograd.grad(x, ...)`."""

    call: ast.Call
    root: ast.expr
    api: str  # "backward" or "grad"

    @property
    def line(self) -> int:
        return self.call.lineno

    @property
    def statement(self) -> ast.stmt:
        return src.statement_of(self.call)

    def keyword(self, name: str) -> ast.keyword | None:
        return next((k for k in self.call.keywords if k.arg == name), None)

    def frees_graph(self) -> bool:
        """Neither retain_graph nor create_graph is passed, or both are a literal False."""
        for name in _KEEPS_GRAPH:
            keyword = self.keyword(name)
            if keyword is not None and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is False):
                return False
        positional = 2 if self.api == "backward" else 3  # (gradient, retain_graph) / (outputs, inputs, grad_outputs, retain_graph)
        return len(self.call.args) <= positional

    def stops_at(self, expression: str) -> bool:
        """`expression` is among the inputs the gradients are taken for (`autograd.grad(loss,
        fast_weights)`, `loss.backward(inputs=[w])`): the call does not go into its history."""
        inputs = self.inputs()
        return inputs is not None and bool(src.reads(inputs, expression))

    def inputs(self) -> ast.expr | None:
        """What the gradients are taken for (`autograd.grad(loss, fast_weights)`, `inputs=`)."""
        keyword = self.keyword("inputs")
        return keyword.value if keyword is not None else \
            (self.call.args[1] if self.api == "grad" and len(self.call.args) > 1 else None)

    def retains_graph(self) -> bool:
        """retain_graph=True or create_graph=True, literally."""
        return any(isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in self.call.keywords if k.arg in _KEEPS_GRAPH)


# `retain_variables` is retain_graph's name before PyTorch 0.4, still in old tutorials: the
# author meant to keep the graph, and the bug to report is what happens after that.
RETAIN_KEYWORDS = ("retain_graph", "retain_variables")
_KEEPS_GRAPH = (*RETAIN_KEYWORDS, "create_graph")


def backward_calls(scope: ast.AST) -> tuple[Backward, ...]:
    """The backward calls in `scope` (not in nested defs), in source order."""
    return src.cached(scope, "_backward_calls", lambda: tuple(_backward_calls(scope)), subtree_only=True)


def _backward_calls(scope: ast.AST) -> list[Backward]:
    found = [b for node in src.own_nodes(scope) if (b := as_backward(node)) is not None]
    found.sort(key=lambda b: (b.call.lineno, b.call.col_offset))
    return found


def as_backward(node: ast.AST) -> Backward | None:
    """`node` read as a backward call, or None where it is none."""
    if not is_backward_call(node):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id
    through_autograd = isinstance(func, ast.Attribute) and src.canonical(func.value).endswith("autograd")
    if name == "backward" and isinstance(func, ast.Attribute) and not through_autograd:
        return Backward(node, func.value, "backward")
    if node.args:  # `torch.autograd.grad(y, x)`, `backward(loss)` (from torch.autograd import backward)
        return Backward(node, node.args[0], "grad" if name == "grad" else "backward")
    return None


@dataclass(frozen=True)
class TrainingLoop:
    loop: ast.stmt
    scope: ast.AST


def scopes(tree: ast.Module) -> tuple[ast.AST, ...]:
    """The module and every function in it."""
    return src.cached(tree, "_scopes", lambda: (tree, *src.nodes_of(tree, (ast.FunctionDef, ast.AsyncFunctionDef))))


def training_loops(tree: ast.Module) -> tuple[TrainingLoop, ...]:
    """Loops (for/while, not crossing a def) whose body calls backward or autograd.grad, itself or
    through a function of this file."""
    def find() -> tuple[TrainingLoop, ...]:
        if not any(_mentions_backward(statement) for statement in tree.body):
            return ()
        return tuple(TrainingLoop(loop, scope) for scope in scopes(tree) for loop in loops(scope)
                     if any(runs_backward(n) for n in src.own_nodes(loop)))

    return src.cached(tree, "_training_loops", find)


def _mentions_backward(statement: ast.stmt) -> bool:
    return src.cached(statement, "_mentions_backward",
                      lambda: any(is_backward_call(n) for n in src.statement_nodes(statement)), subtree_only=True)


def loops(scope: ast.AST) -> tuple[ast.stmt, ...]:
    """The for and while loops of `scope` (not in nested defs)."""
    return src.cached(scope, "_loops", lambda: tuple(n for n in src.own_nodes(scope)
                                                     if isinstance(n, (ast.For, ast.AsyncFor, ast.While))),
                      subtree_only=True)


def defines_forward(cls: ast.ClassDef) -> ast.FunctionDef | None:
    """The class's own `forward`: the source's sign of an nn.Module."""
    return src.method_of(cls, "forward")


def running_total(stmt: ast.AST) -> ast.expr | None:
    """The term `loss` of a running total, `total = total + loss` or `total += loss`: a named
    value (`y = y + w * x` is a recurrence, not a total)."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) \
            and isinstance(stmt.target, (ast.Name, ast.Attribute)):
        term = stmt.value
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.BinOp) \
            and isinstance(stmt.value.op, ast.Add) and src.canonical(stmt.value.left) == src.canonical(stmt.targets[0]):
        term = stmt.value.right
    else:
        return None
    return term if isinstance(term, (ast.Name, ast.Attribute)) else None


def records_no_graph(expression: ast.AST) -> bool:
    """`torch.no_grad()`, `torch.inference_mode()` (as a context or a decorator)."""
    text = src.canonical(expression)
    return "no_grad" in text or "inference_mode" in text


def no_grad_decorator(function: ast.AST) -> ast.expr | None:
    """`@torch.no_grad()` / `@torch.inference_mode()` on a def: every call of it records no graph."""
    return next((d for d in getattr(function, "decorator_list", ()) if records_no_graph(d)), None)


def switches_grad_off(stmt: ast.stmt) -> ast.Call | None:
    """The call of `torch.set_grad_enabled(False)` written as a statement, not a `with` block:
    autograd stays off after it, in every function that runs later, until something turns it
    back on."""
    return _grad_switch(stmt, False)


def switches_grad_on(stmt: ast.stmt) -> bool:
    """`torch.set_grad_enabled(True)` written as a statement: autograd is on after it."""
    return _grad_switch(stmt, True) is not None


def _grad_switch(stmt: ast.stmt, mode: bool) -> ast.Call | None:
    call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
    return call if call is not None and src.called_name(call) in ("set_grad_enabled", "_set_grad_enabled") \
        and _mode_is(call, mode) else None


def leaving_grad_off(tree: ast.Module) -> dict[str, tuple[ast.stmt, ast.Call]]:
    """The functions of the file, by name, after which autograd stays off, with the
    `torch.set_grad_enabled(False)` statement that turned it off: the last of their own
    statements that switches it is that one, or a call of another such function (face-alignment's
    `get_landmarks` calls `get_landmarks_from_image`, which switches it off and never back on)."""
    def find() -> dict[str, tuple[ast.stmt, ast.Call]]:
        functions = src.nodes_of(tree, (ast.FunctionDef, ast.AsyncFunctionDef))
        if not any(switches_grad_off(n) for f in functions for n in src.own_nodes(f) if isinstance(n, ast.stmt)):
            return {}
        leaving: dict[str, tuple[ast.stmt, ast.Call]] = {}
        for _ in range(8):  # calls of calls, to a fixed point
            before = len(leaving)
            for function in functions:
                if function.name not in leaving:
                    last = last_grad_switch(function, leaving, function.end_lineno + 1)
                    if last is not None and last[1] is not None:
                        leaving[function.name] = last[1]
            if len(leaving) == before:
                break
        return leaving

    return src.cached(tree, "_leaving_grad_off", find)


def last_grad_switch(scope: ast.AST, leaving: dict, before: int) -> tuple[ast.stmt, tuple | None] | None:
    """The last statement of `scope`'s own above line `before` that switches autograd for what
    runs after it, with (the switch statement, its call) where it turns it off (itself, or a call
    of a function in `leaving`) and None where it turns it on; None where none does."""
    found = None
    for stmt in sorted((n for n in src.own_nodes(scope) if isinstance(n, ast.stmt) and n.lineno < before),
                       key=lambda n: n.lineno):
        call = switches_grad_off(stmt)
        if call is not None:
            found = (stmt, (stmt, call))
        elif switches_grad_on(stmt):
            found = (stmt, None)
        else:
            ran = next((leaving[src.called_name(c)] for c in ast.walk(stmt) if isinstance(c, ast.Call)
                        and src.called_name(c) in leaving and not isinstance(stmt, _COMPOUND)), None)
            if ran is not None:
                found = (stmt, ran)
    return found


_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)


def _mode_is(call: ast.Call, value: bool) -> bool:
    """Whether `call` is given `mode` (its first argument) as the constant `value`:
    `set_grad_enabled(False)`, `inference_mode(mode=False)`."""
    mode = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and mode.value is value


def sets_requires_grad(stmt: ast.stmt) -> tuple[str, bool] | None:
    """(the module, the value) where `stmt` sets whether a module's parameters require grad:
    `for p in generator.parameters(): p.requires_grad = False` (or `p.requires_grad_(False)`),
    or `generator.requires_grad_(False)`."""
    if isinstance(stmt, ast.For) and len(stmt.body) == 1 and not stmt.orelse and isinstance(stmt.target, ast.Name) \
            and isinstance(stmt.iter, ast.Call) and isinstance(stmt.iter.func, ast.Attribute) \
            and stmt.iter.func.attr == "parameters" and not stmt.iter.args:
        body, name = stmt.body[0], stmt.target.id
        value = None
        if isinstance(body, ast.Assign) and len(body.targets) == 1 and src.canonical(body.targets[0]) == f"{name}.requires_grad":
            value = body.value
        elif isinstance(body, ast.Expr) and isinstance(body.value, ast.Call) \
                and src.canonical(body.value.func) == f"{name}.requires_grad_":
            value = body.value.args[0] if body.value.args else ast.Constant(True)
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            return src.canonical(stmt.iter.func.value), value.value
        return None
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
            and stmt.value.func.attr == "requires_grad_":
        value = stmt.value.args[0] if stmt.value.args else ast.Constant(True)
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            return src.canonical(stmt.value.func.value), value.value
    return None


def enters_inference_mode(expression: ast.expr, scope: ast.AST) -> ast.Call | None:
    """The `torch.inference_mode()` call a `with` item enters: written there, or returned by a
    function of this file that the item calls (pinns-torch's trainer: `with
    self._evaluation_context():`, which returns `torch.inference_mode() if self.inference_mode
    else torch.no_grad()`). `inference_mode(False)` enters nothing."""
    found = _inference_mode_call(expression)
    if found is not None or not isinstance(expression, ast.Call):
        return found
    helper = helper_called(expression, scope)
    returns = [n.value for n in ast.walk(helper) if isinstance(n, ast.Return) and n.value is not None
               and src.enclosing_function(n) is helper] if helper is not None else []
    return next((call for value in returns if (call := _inference_mode_call(value)) is not None), None)


def _inference_mode_call(expression: ast.AST) -> ast.Call | None:
    for node in ast.walk(expression):
        if isinstance(node, ast.Call) and src.canonical(node.func).split(".")[-1] == "inference_mode" \
                and not _mode_is(node, False):
            return node
    return None


def turns_grad_on(expression: ast.expr) -> bool:
    """`torch.enable_grad()` or `torch.set_grad_enabled(True)`, as a `with` item."""
    if not isinstance(expression, ast.Call):
        return False
    name = src.canonical(expression.func).split(".")[-1]
    return name == "enable_grad" or name == "set_grad_enabled" and _mode_is(expression, True)


def with_blocks(node: ast.AST) -> list[ast.With | ast.AsyncWith]:
    """The `with` blocks around `node` inside its own function, innermost first."""
    blocks = []
    for ancestor in src.ancestors(node):
        if isinstance(ancestor, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
        if isinstance(ancestor, (ast.With, ast.AsyncWith)):
            blocks.append(ancestor)
    return blocks


def no_grad_block(node: ast.AST) -> ast.With | ast.AsyncWith | None:
    """The `with torch.no_grad():` around `node`, inside its own function."""
    return next((block for block in with_blocks(node) if any(records_no_graph(i.context_expr) for i in block.items)),
                None)


def called_without_graph(value: ast.AST, scope: ast.AST) -> tuple[ast.AST, ast.expr] | None:
    """(function, decorator) for a function of this file, decorated so it records no graph,
    that `value` calls (`loss = predict(x).pow(2).mean()`)."""
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            helper = helper_called(node, scope)
            decorator = no_grad_decorator(helper) if helper is not None else None
            if decorator is not None:
                return helper, decorator
    return None


def under_no_grad(node: ast.AST) -> bool:
    """Runs without recording a graph: in a `with torch.no_grad():` block or a decorated def."""
    if no_grad_block(node) is not None:
        return True
    function = src.enclosing_function(node)
    return function is not None and no_grad_decorator(function) is not None


def cuts_history(expression: ast.AST) -> bool:
    """Whether the outermost operation makes a value without history (`x.detach()`, `.item()`)."""
    node = expression
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if isinstance(func, ast.Attribute) and name in _FLOAT_CASTS:
            return False  # `x.float()` keeps the history `float(x)` drops
        if name == "grad" and is_backward_call(node):  # `torch.autograd.grad(loss, w)`: plain tensors,
            return not any(k.arg == "create_graph" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                           for k in node.keywords)  # unless create_graph=True gives them a graph
        return name in CUTS
    if isinstance(node, ast.Attribute) and node.attr == "data":
        return True
    return False


def detached_in(loop: ast.AST, expression: str) -> bool:
    """Whether the loop re-binds `expression` (or the container it is an element of) to a detached
    copy of itself, or detaches it in place."""
    names = {src.canonical(expression)}
    try:
        node = src.parse_tree(expression, mode="eval").body if "[" in expression else None
    except SyntaxError:
        node = None
    while isinstance(node, ast.Subscript):  # `states[i]`: `states = [h.detach() for h in states]`
        node = node.value
        names.add(src.canonical(node))
    for node in src.own_nodes(loop):
        value = src.value_of(node) if isinstance(node, ast.stmt) else None
        for name in names & {src.canonical(t) for t in src.targets_of(node)} if value is not None else ():
            if src.reads(value, name) and not live_reads(value, name):
                return True  # `h = h.detach()`, `h = repackage_hidden(h)`, `h = tuple(x.detach() for x in h)`
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach_":
            receiver = node.func.value
            while isinstance(receiver, ast.Subscript):  # `hidden[0].detach_()` detaches part of `hidden`
                receiver = receiver.value
            if src.canonical(receiver) == src.canonical(expression) or _element_of(receiver, node, expression):
                return True
    return False


def _element_of(receiver: ast.expr, call: ast.Call, expression: str) -> bool:
    """`s` in `for s in state: s.detach_()`: an element of `expression`, detached in place."""
    loop = next((a for a in src.ancestors(call) if isinstance(a, (ast.For, ast.AsyncFor))), None)
    return isinstance(receiver, ast.Name) and loop is not None and isinstance(loop.target, ast.Name) \
        and loop.target.id == receiver.id and src.canonical(loop.iter) == src.canonical(expression)


def live_reads(node: ast.AST, expression: str) -> list[ast.expr]:
    """Reads of `expression` in `node` whose value is not cut on the way (`x.detach()`,
    `tuple(h.detach() for h in x)`)."""
    live = []
    for read in src.reads(node, expression):
        cut = False
        for ancestor in src.ancestors(read):
            if isinstance(ancestor, (ast.Call, ast.Attribute)) and cuts_history(ancestor):
                cut = True  # `x.detach()`, `x.item()`, `x.data`
            if isinstance(ancestor, (ast.GeneratorExp, ast.ListComp)) and cuts_history(ancestor.elt):
                cut = True
            if ancestor is node or cut:
                break
        if not cut:
            live.append(read)
    return live


def comprehension_variables(node: ast.GeneratorExp | ast.ListComp | ast.SetComp) -> frozenset[str]:
    """The names a comprehension's `for` clauses bind."""
    return frozenset(n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name))


@dataclass(frozen=True)
class _Argument:
    """A helper's parameter bound to the caller's argument, with the caller's context."""

    value: ast.expr
    scope: ast.AST
    before: int
    ignore: str
    bindings: dict


def has_history(node: ast.AST, scope: ast.AST, before: int, *, strict: bool = False, ignore: str = "",
                depth: int = 0, bindings: dict | None = None) -> bool:
    """Whether the expression `node` (read at line `before` of `scope`) may carry autograd history,
    not counting `ignore`: a module call, a tensor made with requires_grad=True, a Parameter, or a
    local assigned from one. Function arguments and loop variables count as data. The lenient
    form (a self-referencing state is evidence enough) also takes any unknown call as a possible
    module; the strict form (values reused across iterations) only trusts what the file shows.
    A call to a function of this file is judged by what it returns (`bindings`: its parameters,
    bound to the caller's arguments)."""
    if depth > 8 or node is None:
        return False
    if bindings:
        return _has_history(node, scope, before, strict, ignore, depth, bindings)
    # Without bindings the answer depends only on these: the same assignment reached along many
    # paths (a model's forward re-assigning `x` fifty times) is judged once, not once per path.
    known = src.cached(scope, "_has_history", dict)
    key = (id(node), before, strict, ignore, depth)
    found = known.get(key)
    if found is None:
        found = known[key] = _has_history(node, scope, before, strict, ignore, depth, {})
    return found


def _has_history(node: ast.AST, scope: ast.AST, before: int, strict: bool, ignore: str, depth: int,
                 bindings: dict) -> bool:

    def recurse(child, at=None) -> bool:
        # Only following a name to its assignment counts against the depth: a long expression
        # (`-(ratio * adv).mean()` over `Categorical(logits=policy(s)).log_prob(a)`) is not deep.
        hops = depth if at is None else depth + 1
        return has_history(child, scope, before if at is None else at, strict=strict, ignore=ignore,
                           depth=hops, bindings=bindings)

    if isinstance(node, ast.Call):
        if is_leaf_creation(node):
            return True
        if cuts_history(node):
            return False
        arguments = [*node.args, *(k.value for k in node.keywords)]
        helper = helper_called(node, scope)
        if helper is not None:
            return _returns_history(helper, node, scope, before, strict, ignore, depth, bindings)
        func = node.func
        if src.canonical(func).rsplit(".", 1)[-1][:1].isupper() and is_module(node, scope, before):
            return False  # `nn.ModuleList([...])`, `Net()`: a module is made, nothing is computed yet
        forward = local_forward(func, scope, before)
        if forward is not None and forward_cuts(forward):
            return False  # `model(x)` where Net.forward returns `self.fc(x).argmax(-1)`
        if is_module(func, scope, before):
            return not _parameter_free(func, scope, before) or any(recurse(a) for a in arguments)
        if isinstance(func, ast.Name) and func.id in bindings and src.last_assignment(scope, func.id, before) is None:
            bound = bindings[func.id]  # `def train_step(model, x, h)` called with `rnn`: a module call
            if is_module(bound.value, bound.scope, bound.before) \
                    and not _parameter_free(bound.value, bound.scope, bound.before):
                return True
        if isinstance(func, ast.Attribute):
            receiver = func.value
            if func.attr in _MODULE_BOOKKEEPING and (src.canonical(receiver) == "self"
                                                    or is_module(receiver, scope, before)):
                return False  # `self.register_parameter("beta", None)`, `model.parameters()`
            method = _module_method(func, scope, before)
            if method is not None:  # `actor.get_action(obs)`: judged by what the method returns
                return _returns_history(method, node, scope, before, strict, ignore, depth, bindings)
            if not strict and is_module(receiver, scope, before):
                return True  # `gflownet.loss(env, samples)`: a module's method may use its parameters
            if not strict and _object_made_elsewhere(func, scope, before, ignore):
                return True  # `self.network.q(s, a)`: an object the class made elsewhere, maybe a module
            if isinstance(receiver, ast.Name) and receiver.id in ("torch", "F", "nn", "math", "np", "numpy"):
                return any(recurse(a) for a in arguments)
            if isinstance(receiver, ast.Name) and receiver.id == "self":
                if func.attr.endswith("Tensor"):  # `self.Tensor(n, c)`: a tensor type kept on the object
                    return any(recurse(a) for a in arguments)
                # A submodule, or a method using parameters; strictly, only where the class is a
                # module or sets `self.<name>` to one (a trainer's `self.VAE = FactorVAE(...)`).
                return not strict or _in_module_class(node) or _submodule_of_class(func)
            if func.attr in SHAPED_LIKE:  # `scale.to(float_attr)`: the argument gives a dtype, not history
                return recurse(receiver)
            return recurse(receiver) or any(recurse(a) for a in arguments)
        if isinstance(func, ast.Name) and func.id == "self" and _in_module_class(node):
            return True  # `obs_result = self(batch)` in a policy module's `learn` (tianshou's SAC)
        if isinstance(func, ast.Name) and _iterates_a_module(func, node, scope, before):
            return True  # `for layer in self.V_nn: V = layer(V)` (neural_clbf's CLBF network)
        if isinstance(func, ast.Name) and func.id in _SCALAR_BUILTINS:
            return False  # `float(loss)`, `len(batch)`: a Python value, whatever it was made from
        if isinstance(func, ast.Name) and (func.id in ("tuple", "list", "sum", "max", "min", "abs", "zip", "round")
                                           or func.id[:1].isupper() or func.id in _torch_functions(scope)
                                           or _plain_object(func, scope, before)):
            # Containers, constructors (`OrderedDict(...)`) and torch's functions
            # (`from torch.nn.functional import mse_loss`): history only through arguments.
            return any(recurse(a) for a in arguments)
        # `model(x)`, an unknown callable: maybe a module (lenient), and in any case a function of
        # its arguments.
        return not strict or any(recurse(a) for a in arguments)
    if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
        # `sum(mse_loss(q, target) for q in current_q_values)`: its elements are made from what
        # it iterates over (the loop variable has no assignment of its own to follow).
        # `[m.detach() for m in members]`: only where the element reads a loop variable uncut.
        return recurse(node.elt) or any(live_reads(node.elt, v) for v in comprehension_variables(node)) \
            and any(recurse(generator.iter) or _parameters_of_a_module(generator.iter, scope, before)
                    for generator in node.generators)
    if isinstance(node, ast.BinOp):
        return recurse(node.left) or recurse(node.right)
    if isinstance(node, ast.UnaryOp):
        return recurse(node.operand)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(recurse(e) for e in node.elts)
    if isinstance(node, ast.Subscript):
        return recurse(node.value)
    if isinstance(node, (ast.Name, ast.Attribute)):
        expression = src.canonical(node)
        if expression == ignore or (isinstance(node, ast.Attribute) and node.attr == "data"):
            return False
        last = src.last_assignment(scope, expression, before)
        if last is None and expression in bindings:
            bound = bindings[expression]
            return has_history(bound.value, bound.scope, bound.before, strict=strict, ignore=bound.ignore,
                               depth=depth + 1, bindings=bound.bindings)
        if last is None and isinstance(node, ast.Attribute) and node.attr not in _NO_HISTORY_ATTRIBUTES \
                and not isinstance(node.value, ast.Attribute):
            # `obs_result.act` of `obs_result = policy(batch)`: a field of a result with history.
            return src.canonical(node.value) != "self" and recurse(node.value)
        if last is None and isinstance(node, ast.Attribute) and node.attr in _leaf_attributes(src.module_of(scope)):
            return True  # `self.policy_model.logalpha`, set in its class to `torch.zeros(1, requires_grad=True)`
        if last is None or under_no_grad(last.stmt):
            return False
        value = last.value
        helper = helper_called(value, scope) if isinstance(value, ast.Call) and last.position is not None else None
        if helper is not None:  # `output, loss = train(x)`: only what `train` returns in that place
            return _returns_history(helper, value, scope, last.stmt.lineno, strict, ignore, depth + 1, bindings,
                                    position=last.position)
        if isinstance(value, (ast.List, ast.Dict)) and not (value.elts if isinstance(value, ast.List) else value.keys):
            # `values = []`, then `values.append(value)` in the rollout: what it was filled with.
            filled = [(call.args[-1], call.lineno) for call in src.appends(scope, expression) if call.args] \
                + [(item.value, item.stmt.lineno) for item in src.item_assignments(scope, expression)]
            return any(recurse(item, row) for item, row in filled if item is not None)
        if value is not None and recurse(value, last.stmt.lineno):
            return True
        if isinstance(last.stmt, ast.AugAssign) and recurse(node, last.stmt.lineno):
            return True  # `loss += self._get_regularization_loss()`: the loss keeps the history it had
        # `states = torch.zeros(n, d)`, then `states[h] = state` in a rollout: a tensor written
        # into with a value that has history has it too.
        return any(item.value is not None and last.stmt.lineno < item.stmt.lineno < before
                   and recurse(item.value, item.stmt.lineno) for item in src.item_assignments(scope, expression))
    return False


def _parameters_of_a_module(node: ast.AST, scope: ast.AST, before: int) -> bool:
    """`model.parameters()`: leaves that require grad, iterated over (`[p.clone() for p in
    model.parameters()]`). Passed whole (`Adam(model.parameters())`) it computes nothing."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr == "parameters" and is_module(node.func.value, scope, before)


# Attributes of a tensor that are no tensor, or one without history.
_NO_HISTORY_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "grad",
                                    "grad_fn", "is_leaf", "layout", "names", "data"})


# Builtins whose result is a Python scalar or string: no tensor, so no history (`float(t)` cuts it).
_SCALAR_BUILTINS = frozenset({"float", "int", "bool", "len", "str", "repr", "format", "hash", "id", "isinstance",
                              "callable", "ord", "chr", "range", "enumerate"})


# Methods of nn.Module that compute nothing from its parameters.
_MODULE_BOOKKEEPING = frozenset({
    "register_parameter", "register_buffer", "register_module", "add_module", "apply", "train", "eval",
    "zero_grad", "parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules",
    "children", "named_children", "state_dict", "load_state_dict", "to", "cuda", "cpu", "half", "float", "double",
    "get_submodule", "get_parameter", "get_buffer", "extra_repr", "share_memory", "requires_grad_"})


def _submodule_of_class(attribute: ast.Attribute) -> bool:
    """`self.VAE` is set somewhere in the class to a module (`FactorVAE1(z_dim).to(device)`)."""
    owner = src.enclosing_class(attribute)
    if owner is None:
        return False
    return any(assignment.value is not None
               and is_module(assignment.value, src.enclosing_function(assignment.stmt) or owner,
                             assignment.stmt.lineno + 1)
               for assignment in src.assignments(owner, src.canonical(attribute), deep=True))


def _iterates_a_module(name: ast.Name, call: ast.Call, scope: ast.AST, before: int) -> bool:
    """`name` is the variable of a `for` around `call` over a module's layers: an
    `nn.Sequential` or `nn.ModuleList` (each element is a module), as a name or as a submodule
    the class sets."""
    for loop in src.loops_around(call, stop=scope):
        if isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) and loop.target.id == name.id:
            iterated = loop.iter
            if isinstance(iterated, ast.Attribute) and isinstance(iterated.value, ast.Name) \
                    and iterated.value.id == "self":
                return _submodule_of_class(iterated)
            return is_module(iterated, scope, before)
    return False


def _object_made_elsewhere(func: ast.Attribute, scope: ast.AST, before: int, ignore: str) -> bool:
    """`self.network.q`: a method (not a move like `.to()`) of an attribute that this scope did
    not set, so the source here cannot say what it is."""
    receiver = src.canonical(func.value)
    return isinstance(func.value, ast.Attribute) and receiver.startswith("self.") and receiver != ignore \
        and func.attr not in _MOVES and src.last_assignment(scope, receiver, before) is None


def _plain_object(name: ast.Name, scope: ast.AST, before: int) -> bool:
    """`noise` made by `noise = OUNoise(...)` from a class of this file that is no module (no
    `forward`, no Module base): calling it has no parameters of its own to put history in."""
    last = src.last_assignment(scope, name.id, before)
    made = last.value if last is not None else None
    if not isinstance(made, ast.Call) or not isinstance(made.func, ast.Name):
        return False
    return any(defines_forward(c) is None
               and not any(src.canonical(b).endswith("Module") for b in c.bases)
               for c in _classes(src.module_of(scope)).get(made.func.id, ()))


def forward_cuts(forward: ast.FunctionDef) -> tuple[ast.expr, ...] | None:
    """The cuts a `forward` returns (`.argmax(-1)` of `self.fc(x).argmax(-1).float()`), one per
    return statement, when every one returns a cut value; None otherwise."""
    def find():
        returns = [r.value for r in src.own_nodes(forward) if isinstance(r, ast.Return) and r.value is not None]
        cuts = tuple(cut_in_chain(r) for r in returns)
        return cuts if cuts and None not in cuts else None
    return src.cached(forward, "_forward_cuts", find)


def cut_in_chain(value: ast.AST) -> ast.expr | None:
    """The cut nearest the top of `value`'s chain of calls and attributes, if any."""
    node = value
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(node, (ast.Call, ast.Attribute)) and cuts_history(node):
            return node
        if isinstance(node, ast.Call):
            node = node.func.value if isinstance(node.func, ast.Attribute) else None
        else:
            node = node.value
    return None


def local_forward(func: ast.AST, scope: ast.AST, before: int, *, globals_too: bool = False) -> ast.FunctionDef | None:
    """The `forward` that calling `func` runs, where `func` is a name made from a module class
    of this file (`model = Net().to(device)`) that defines it; with `globals_too`, also a name
    made at module level that `scope` never assigns."""
    made = _class_made(func, scope, before, globals_too=globals_too)
    return defines_forward(made) if made is not None else None


def _module_method(func: ast.Attribute, scope: ast.AST, before: int) -> ast.FunctionDef | None:
    """The method `actor.get_action` runs, where `actor` is made from a module class of this
    file (`Actor(envs).to(device)`) that defines it."""
    made = _class_made(func.value, scope, before)
    if made is None or defines_forward(made) is None:
        return None
    return next((m for m in made.body if isinstance(m, ast.FunctionDef) and m.name == func.attr), None)


def _class_made(name: ast.AST, scope: ast.AST, before: int, *, globals_too: bool = False,
                workspace: bool = False) -> ast.ClassDef | None:
    """The class of this file that the name `name` (read at line `before` of `scope`) was made
    from, through moves (`actor = Actor(envs).to(device)`), when one class has that name. With
    `globals_too`, a name `scope` never assigns is looked for at module level; with `workspace`,
    a class this file imports from the workspace's own files counts too."""
    if not isinstance(name, ast.Name):
        return None
    module = src.module_of(scope)
    last = src.last_assignment(scope, name.id, before)
    if last is None and globals_too and scope is not module and not src.is_local(scope, name.id):
        # A function reads the global when it runs, usually after the module has made it
        # (RN's `train(epoch)` reads `model`, made below the def and before the call); a
        # parameter of the same name is not it (R-Drop's `train_step(self, sample, model, ...)`).
        last = src.last_assignment(module, name.id, module.body[-1].end_lineno + 1)
    return _class_constructed(last.value if last is not None else None, module, workspace)


def _classes(tree: ast.AST) -> dict[str, list[ast.ClassDef]]:
    """The file's classes by name, indexed once per tree."""
    def build() -> dict[str, list[ast.ClassDef]]:
        index: dict[str, list[ast.ClassDef]] = {}
        for node in src.nodes_of(tree, (ast.ClassDef,)):
            index.setdefault(node.name, []).append(node)
        return index
    return src.cached(tree, "_classes_by_name", build)


def helper_called(call: ast.Call, scope: ast.AST) -> ast.FunctionDef | None:
    """The function of this file that `call` runs: `train_step(...)` for a module-level def,
    `self.step(...)` for a method of the enclosing class."""
    func = call.func
    if isinstance(func, ast.Name):
        return _module_functions(src.module_of(scope)).get(func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        owner = src.enclosing_class(call) if func.value.id == "self" else _instance_of(func.value, call)
        if owner is not None:
            return next((m for m in owner.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and m.name == func.attr), None)
    return None


def instance_class(receiver: ast.expr, at: ast.AST) -> ast.ClassDef | None:
    """The class `receiver` (a name, or `self.x`) was made from, read at `at`: `meter =
    AverageMeter()` in the function or at module level, or `self.meter = AverageMeter()` in a
    method of the class; a class of this file, or of the workspace's own files that this file
    imports (read through jedi, never imported)."""
    module = src.module_of(at)
    if isinstance(receiver, ast.Name):
        return _class_made(receiver, src.enclosing_function(at) or module, at.lineno, globals_too=True, workspace=True)
    if isinstance(receiver, ast.Attribute) and src.canonical(receiver).count(".") == 1 \
            and isinstance(receiver.value, ast.Name) and receiver.value.id == "self":
        owner = src.enclosing_class(at)
        made = [a.value for a in src.assignments(owner, src.canonical(receiver), deep=True)] if owner else []
        return _class_constructed(made[0], module, workspace=True) if len(made) == 1 else None
    return None


def _class_constructed(value: ast.AST | None, module: ast.Module, workspace: bool) -> ast.ClassDef | None:
    """The class `value` (`Actor(envs).to(device)`) constructs: the one class of this file by
    that name, or with `workspace`, one this file imports from the workspace (jedi)."""
    value = unmoved(value)
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return None
    classes = _classes(module).get(value.func.id, ())
    if classes or not workspace:
        return classes[0] if len(classes) == 1 else None
    return jedi_types.imported_class(module, value.func)


def _instance_of(name: ast.Name, at: ast.AST, workspace: bool = False) -> ast.ClassDef | None:
    """The class of this file that `name`, read at `at`, was made from in the enclosing function
    or at module level: `agent = Agent(...)`, for `agent.learn(loss)` and `agent.net`; with
    `workspace`, also a class the file imports from the workspace's own files."""
    return _class_made(name, src.enclosing_function(at) or src.module_of(at), at.lineno, globals_too=True,
                       workspace=workspace)


def instance_attribute_assignments(node: ast.AST, workspace: bool = False) -> list[src.Assignment]:
    """For `agent.net`, where `agent = Agent(...)`: the assignments of `self.net` in that class's
    methods (as `_instance_of` finds the class, `workspace` with it); none where `node` is no
    such attribute or the class is not known."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id != "self"):
        return []
    owner = _instance_of(node.value, node, workspace)
    return src.assignments(owner, f"self.{node.attr}", deep=True) if owner is not None else []


def runs_backward(node: ast.AST, depth: int = 0, freeing: bool = False) -> bool:
    """A backward call, or a call to a function of this file that runs one (helpers followed
    three calls deep); with `freeing`, one that frees its graph (not `autograd.grad(...,
    create_graph=True)` in pi-lnn's residuals)."""
    if is_backward_call(node):
        return not freeing or (backward := as_backward(node)) is not None and backward.frees_graph()
    if depth >= 3 or not isinstance(node, ast.Call):
        return False
    helper = helper_called(node, node)
    if helper is None:
        return False
    return src.cached(helper, "_runs_freeing_backward" if freeing else "_runs_backward",
                      lambda: any(runs_backward(n, depth + 1, freeing) for n in src.own_nodes(helper)))


def passed_arguments(helper: ast.FunctionDef, call: ast.Call) -> dict[str, ast.expr]:
    """What `call` passes to each of `helper`'s parameters, by name (`self` left out of a method
    called on an object)."""
    parameters = [a.arg for a in (*helper.args.posonlyargs, *helper.args.args)]
    if parameters[:1] == ["self"] and isinstance(call.func, ast.Attribute):
        parameters = parameters[1:]
    bound = dict(zip(parameters, call.args))
    bound.update({k.arg: k.value for k in call.keywords if k.arg})
    return bound


def whole_update(helper: ast.FunctionDef) -> tuple[str, str] | None:
    """(the loss parameter, the optimizer parameter) of a helper that runs a whole update on
    what it is given: `opt.zero_grad()`, then `loss.backward()`, then `opt.step()` (spirl's
    `_perform_update(loss, opt, network)`)."""
    calls = [n.value for n in src.own_nodes(helper) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
             and isinstance(n.value.func, ast.Attribute) and isinstance(n.value.func.value, ast.Name)]
    parameters = {a.arg for a in (*helper.args.posonlyargs, *helper.args.args, *helper.args.kwonlyargs)}

    def rows(method: str) -> dict[str, int]:
        return {c.func.value.id: c.lineno for c in calls if c.func.attr == method and c.func.value.id in parameters}
    zeroed, stepped, backward = rows("zero_grad"), rows("step"), rows("backward")
    found = [(loss, opt) for loss, row in backward.items() for opt in stepped
             if zeroed.get(opt, row) < row < stepped[opt]]
    return found[0] if len(found) == 1 and len(backward) == 1 else None


def _returns_history(helper, call: ast.Call, scope, before, strict, ignore, depth, bindings,
                     position: int | None = None) -> bool:
    bound = {name: _Argument(value, scope, before, ignore, bindings)
             for name, value in passed_arguments(helper, call).items()}
    returns = [n for n in src.own_nodes(helper) if isinstance(n, ast.Return) and n.value is not None
               and not under_no_grad(n)]
    return any(has_history(_returned_at(r.value, position), helper, r.lineno + 1, strict=strict, depth=depth + 1,
                           bindings=bound)
               for r in returns)


def _returned_at(value: ast.expr, position: int | None) -> ast.expr:
    """The element of `return a, b` that a caller unpacking it gets at `position`."""
    if position is None or not isinstance(value, ast.Tuple) or position >= len(value.elts) \
            or any(isinstance(e, ast.Starred) for e in value.elts):
        return value
    return value.elts[position]


def _module_functions(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    return src.cached(tree, "_module_functions", lambda: {
        n.name: n for n in getattr(tree, "body", []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})


def operand_reads(node: ast.AST, expression: str) -> list[ast.expr]:
    """Reads of `expression` as a value (`x @ w_hat`, `loss_fn(pred, y)`), not as the thing
    called (`model(x)`) or whose method is called (`optimizer.step()`)."""
    found = []
    for read in src.reads(node, expression):
        parent = src.parent(read)
        if isinstance(parent, ast.Call) and parent.func is read:
            continue
        if isinstance(parent, ast.Attribute) and isinstance(src.parent(parent), ast.Call) \
                and src.parent(parent).func is parent:
            continue
        found.append(read)
    return found


def sees_previous_pass(read: ast.expr, expression: str, loop: ast.AST) -> bool:
    """Whether `read` of `expression`, inside `loop`, may see the value the previous pass left:
    no earlier statement on its way up to the loop re-binds the name first (`output =
    model(data)` just above `criterion(output, target)` hides the last pass's `output`)."""
    statement = next((a for a in src.ancestors(read) if isinstance(a, ast.stmt)), None) \
        if not isinstance(read, ast.stmt) else read
    while statement is not None and statement is not loop:
        for earlier in src.enclosing_block(statement):
            if earlier is statement:
                break
            if isinstance(earlier, (ast.Assign, ast.AnnAssign)) and earlier.value is not None and any(
                    src.canonical(t) == expression for t in src.targets_of(earlier)):
                return False
        statement = src.parent(statement)
        if not isinstance(statement, ast.stmt):
            return True  # `read` is not inside `loop`
    return True


def flows_into_backward(body_owner: ast.AST, expression: str, reads=None, freeing: bool = False) -> bool:
    """Whether `expression` is an operand of something back-propagated in `body_owner`, directly
    or through the body's own assignments. `reads` finds the uses that count (operands). A call
    that stops at `expression` (`torch.autograd.grad(loss, fast_weights)`) does not go through it;
    with `freeing`, only calls that free the graph count (not `backward(retain_graph=True)`)."""
    reads = reads or operand_reads
    return any(reads(node, expression) for backward in backward_calls(body_owner)
               if not backward.stops_at(expression) and (not freeing or backward.frees_graph())
               and not _beside_the_inputs(body_owner, backward, expression)
               for node in backward_inputs(body_owner, backward.call, backward.root))


def _beside_the_inputs(body_owner: ast.AST, backward: Backward, expression: str) -> bool:
    """A call that takes the gradients for given inputs only walks the paths to them: a value
    neither made from them nor making them is not gone through (E3BM's `embedding_shot`, read
    with the fast weights that `autograd.grad(loss, fast_weights)` differentiates). Told by what
    each is computed from in the function around, as far as the source shows."""
    inputs = backward.inputs()
    if inputs is None:
        return False
    scope = src.enclosing_function(body_owner) or src.module_of(body_owner)
    value = _computed_from(scope, [ast.Name(expression, ast.Load())]) if expression.isidentifier() else None
    return value is not None and not value & _computed_from(scope, [inputs])


def _computed_from(scope: ast.AST, nodes: list[ast.AST]) -> set[str]:
    """The names and `self.` attributes `nodes` read, and what every assignment in `scope` of
    each name read was computed from, transitively; a value without history adds nothing."""
    found: set[str] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if cuts_history(node):
            continue
        found |= {src.canonical(a) for a in ast.walk(node) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Load)
                  and src.canonical(a).startswith("self.")}
        for name in src.names_read(node) - found - {"self"}:
            found.add(name)
            pending.extend(a.value for a in src.assignments(scope, name) if a.value is not None)
    return found


def backward_inputs(body_owner: ast.AST, call: ast.Call, root: ast.expr):
    """`root`, then the values of the body's assignments it is computed from, transitively (the
    last assignment above the backward call for each name read)."""
    pending, seen = [root], set()
    while pending:
        node = pending.pop()
        yield node
        for name in src.names_read(node) - seen:
            seen.add(name)
            last = src.last_assignment(body_owner, name, call.lineno + 1)
            if last is not None and last.value is not None:
                pending.append(last.value)


_MODULE_PREFIXES = ("nn.", "torch.nn.")


def is_module(node: ast.AST, scope: ast.AST, before: int, depth: int = 0) -> bool:
    """Whether `node` is statically an nn.Module: `nn.Linear(...)`, `Net(...)` for a class in
    this file that defines `forward`, `.to(...)`/`.cuda()` of one, or a name assigned from one."""
    if depth > 6:
        return False
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("to", "cuda", "cpu", "train", "eval", "double", "float", "half"):
            return is_module(node.func.value, scope, before, depth + 1)
        name = src.canonical(node.func)
        if name.startswith(_MODULE_PREFIXES) and not name.startswith(("nn.functional", "torch.nn.functional")) \
                and name not in ("nn.Parameter", "torch.nn.Parameter"):
            return name.rsplit(".", 1)[-1][:1].isupper()
        root = src.module_of(scope)
        if isinstance(node.func, ast.Name):
            name = node.func.id
            if name in _imported_classes(root):
                # `from models import Generator`; unless jedi, following it into the workspace,
                # finds a class that is no module (stable-baselines3's `FloatSchedule`).
                return jedi_types.call_gives_module(root, node.func) is not False
            if any(c.name == name and defines_forward(c) is not None for c in src.nodes_of(root, (ast.ClassDef,))):
                return True
        helper = helper_called(node, scope)
        if helper is not None:  # `gflownet = init_gflownet(args)`: what the helper of this file returns
            return any(is_module(r.value, helper, r.lineno + 1, depth + 1) for r in src.own_nodes(helper)
                       if isinstance(r, ast.Return) and r.value is not None)
        # `build_model()` imported from the workspace: jedi follows it there.
        return jedi_types.call_gives_module(root, node.func) is True
    if isinstance(node, ast.Name):
        last = src.last_assignment(scope, node.id, before)
        if last is None and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and not src.is_local(scope, node.id):  # a global of the module: `model = nn.GRU(...)` at the top
            module = src.module_of(scope)
            return any(a.value is not None and is_module(a.value, module, a.stmt.lineno, depth + 1)
                       for a in src.assignments(module, node.id))
        if last is None:
            # A parameter: `train(train_loader, model, criterion, optimizer)` calling `model.train()`
            # (SAM's example) or `Adam(model.parameters())`.
            return node.id in src.parameter_names(scope) and node.id in _parameters_taken(scope) | _mode_switched(scope)
        return last.value is not None and is_module(last.value, scope, last.stmt.lineno, depth + 1)
    if isinstance(node, (ast.Name, ast.Attribute)) and src.canonical(node) in _parameters_taken(scope):
        return True  # `main.q` where `Adam(main.q.parameters())`: only a module has parameters()
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        # rlkit's `self.qf1`, given to the trainer's `__init__`, which makes its optimizer from
        # `self.qf1.parameters()`
        owner = src.enclosing_class(scope)
        return owner is not None and src.canonical(node) in _parameters_taken_in_class(owner)
    # `agent.net`, where `agent = Agent()` and Agent's methods set `self.net = nn.GRU(...)`
    return any(a.value is not None and is_module(a.value, src.enclosing_function(a.stmt) or src.enclosing_class(a.stmt),
                                                 a.stmt.lineno + 1, depth + 1)
               for a in instance_attribute_assignments(node))


def _parameters_taken(scope: ast.AST) -> frozenset[str]:
    """What `scope` calls `.parameters()` or `.named_parameters()` of (`main.q`), indexed once."""
    return src.cached(scope, "_parameters_taken", lambda: frozenset(
        src.canonical(n.func.value) for n in src.own_nodes(scope)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("parameters", "named_parameters") and not n.args))


def _parameters_taken_in_class(owner: ast.ClassDef) -> frozenset[str]:
    """`_parameters_taken` of every method of the class (`self.qf1` of `Adam(self.qf1.parameters())`
    in `__init__`)."""
    return src.cached(owner, "_parameters_taken_in_class", lambda: frozenset().union(
        *(_parameters_taken(m) for m in owner.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))))


def _mode_switched(scope: ast.AST) -> frozenset[str]:
    """What `scope` calls `.train()`, `.train(False)` or `.eval()` of: nn.Module's switches of
    training mode (a trainer's `.train(dataset)` takes what it trains on, and is left out)."""
    def switched(n: ast.AST) -> bool:
        return isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and not n.keywords \
            and (n.func.attr == "eval" and not n.args
                 or n.func.attr == "train" and (not n.args or len(n.args) == 1 and isinstance(n.args[0], ast.Constant)
                                                and isinstance(n.args[0].value, bool)))
    return src.cached(scope, "_mode_switched", lambda: frozenset(
        src.canonical(n.func.value) for n in src.own_nodes(scope) if switched(n)))


# Module classes without parameters (`nn.MSELoss()`, `nn.ReLU()`): calling one adds history
# only through its arguments.
_PARAMETER_FREE = ("Loss", "ReLU", "Tanh", "Sigmoid", "Softmax", "Softmin", "Dropout", "Identity",
                   "Flatten", "GELU", "SiLU", "ELU", "Pool", "Softplus", "Hardtanh", "Mish")


def _parameter_free(node: ast.AST, scope: ast.AST, before: int) -> bool:
    for _ in range(6):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("to", "cuda", "cpu"):
                node = node.func.value
                continue
            class_name = src.canonical(node.func).rsplit(".", 1)[-1]
            return any(part in class_name for part in _PARAMETER_FREE)
        if not isinstance(node, ast.Name):
            return False
        last = src.last_assignment(scope, node.id, before)
        if last is None or last.value is None:
            return False
        node, before = last.value, last.stmt.lineno
    return False


def _torch_functions(scope: ast.AST) -> frozenset[str]:
    """Lower-case names imported from torch (`from torch.nn.functional import mse_loss`)."""
    return _imported(src.module_of(scope), "_torch_functions",
                     lambda module, name: module == "torch" and name[:1].islower())


_NOT_MODEL_PACKAGES = ("torch", "typing", "collections", "dataclasses", "enum", "pathlib")


def _imported_classes(tree: ast.Module) -> frozenset[str]:
    """Capitalized names imported from modules other than torch's (`from models import Net`)."""
    return _imported(tree, "_imported_classes", lambda module, name: module not in _NOT_MODEL_PACKAGES
                     and name[:1].isupper() and not name.isupper())


def _imported(tree: ast.Module, key: str, wanted) -> frozenset[str]:
    """Names bound by `from X import name` where `wanted(top package of X, name)`."""
    return src.cached(tree, key, lambda: frozenset(
        alias.asname or alias.name for node in src.nodes_of(tree, (ast.ImportFrom,))
        for alias in node.names if wanted((node.module or "").split(".")[0], alias.asname or alias.name)))


# Methods whose arguments give only a dtype, device or shape: the result's history is the receiver's.
SHAPED_LIKE = frozenset({*("to", "cuda", "cpu", "type", "type_as", "view_as", "reshape_as", "expand_as"),
                         *("view", "reshape", "expand", "permute", "transpose", "repeat", "flatten", "squeeze")})


# Conversions whose backward saves no tensor: a leaf moved or cast stays as good as a leaf.
_MOVES = ("to", "cuda", "cpu", "type", "float", "double", "half", "bfloat16", "contiguous", "clone")


def unmoved(value: ast.AST | None) -> ast.AST | None:
    """What `value` is before it is moved or cast: `Actor(envs)` in `Actor(envs).to(device)`,
    `torch.tensor(0)` in `torch.tensor(0).to(device)`."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES:
        value = value.func.value
    return value


def is_leaf_like(value: ast.AST) -> bool:
    """A leaf (`torch.randn(..., requires_grad=True)`, a Parameter), possibly moved or cast
    (`.cuda()`, `.to(device)`): its graph has nothing a backward could free."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES \
            and not is_leaf_creation(value):
        value = value.func.value
    return is_leaf_creation(value)


def made_as_leaf(assignment: src.Assignment, scope: ast.AST, depth: int = 0) -> bool:
    """The assigned value is a leaf (`is_leaf_like`), also where a helper of this file returns it:
    `model, log_z, optimizer = setup()` with `log_z = nn.Parameter(...)` in `setup`."""
    value = assignment.value
    if is_leaf_like(value):
        return True
    helper = helper_called(value, scope) if isinstance(value, ast.Call) and depth < 3 else None
    if helper is None:
        return False
    for returned in (n for n in src.own_nodes(helper) if isinstance(n, ast.Return) and n.value is not None):
        element = _returned_at(returned.value, assignment.position)
        if isinstance(element, ast.Name):
            last = src.last_assignment(helper, element.id, returned.lineno)
            if last is None or not made_as_leaf(last, helper, depth + 1):
                return False
        elif not is_leaf_like(element):
            return False
    return True


def is_leaf_creation(value: ast.AST) -> bool:
    """`torch.randn(..., requires_grad=True)`, `nn.Parameter(...)` (a `ParameterList` of them),
    `.requires_grad_()`: a leaf, no graph."""
    if not isinstance(value, ast.Call):
        return False
    name = src.called_name(value)
    if name == "requires_grad_":
        return not (value.args and isinstance(value.args[0], ast.Constant) and value.args[0].value is False)
    # A ParameterList or ParameterDict makes each tensor it is given a Parameter.
    return name in ("Parameter", "ParameterList", "ParameterDict") or any(
        k.arg == "requires_grad" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
        for k in value.keywords)


def _leaf_attributes(module: ast.AST) -> frozenset[str]:
    """The attributes the file's classes set to a tensor that trains, made as a leaf
    (`self.logalpha = torch.zeros(1, requires_grad=True)`): read through another object
    (`self.policy_model.logalpha`), such an attribute has history, whatever holds it."""
    def compute() -> frozenset[str]:
        return frozenset(target.attr for cls in src.nodes_of(module, (ast.ClassDef,)) for stmt in src.all_nodes(cls)
                         if isinstance(stmt, ast.Assign) and is_leaf_like(stmt.value)
                         for target in stmt.targets if isinstance(target, ast.Attribute)
                         and isinstance(target.value, ast.Name) and target.value.id == "self")
    return src.cached(module, "_leaf_attributes", compute)


def _in_module_class(node: ast.AST) -> bool:
    """Inside a class that defines `forward` (an nn.Module, as far as the source shows)."""
    cls = src.enclosing_class(node)
    return cls is not None and defines_forward(cls) is not None


def carried_across_passes(stmt: ast.stmt, target: ast.expr, scope: ast.AST, container: ast.AST,
                          strict: bool = False) -> bool:
    """`target` is re-assigned by `stmt` from itself, with autograd history, and `container` (a
    loop, or a method called again and again) neither detaches nor resets it: each pass's value
    hangs on the previous pass's graph. `strict`: the history must be shown (see has_history)."""
    value = src.value_of(stmt)
    if value is None or under_no_grad(stmt):
        return False
    expression = src.canonical(target)
    reads = live_reads(value, expression) if not isinstance(stmt, ast.AugAssign) else [target]
    if not reads or not (has_history(value, scope, stmt.lineno, strict=strict, ignore=expression)
                         or starts_with_history(scope, expression, container)):
        return False
    return not detached_in(container, expression) and not fresh_each_pass(container, stmt, expression)


def starts_with_history(scope: ast.AST, expression: str, loop: ast.AST) -> bool:
    """`expression` holds history the file shows before `loop` starts (`fast = [p.clone() for p in
    model.parameters()]`): re-assigned from itself alone (`fast = [w - lr * g for ...]`), each
    pass's value still hangs on the previous pass's graph."""
    if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
        return False
    first = src.last_assignment(scope, expression, loop.lineno)
    return first is not None and not under_no_grad(first.stmt) \
        and has_history(first.value, scope, first.stmt.lineno, strict=True)


def fresh_each_pass(container, stmt, expression) -> bool:
    """Every pass through `container` that runs `stmt` gives `expression` a value not made from
    the previous pass's: reset before `stmt` or after it, or bound by a `for` around it."""
    return reset_before(container, stmt, expression) or reset_after(container, stmt, expression) \
        or _loop_target(container, stmt, expression)


def reset_after(container, stmt, expression) -> bool:
    """Set to a value without history after `stmt` on every pass that runs it (`minibatch_loss = 0`
    after its backward, in the same `if`): what the next pass reads is not made from this one."""
    return any(isinstance(node, ast.stmt) and node.lineno > stmt.end_lineno and _on_every_pass_with(node, stmt, container)
               and any(src.canonical(t) == expression for t in src.targets_of(node))
               and _without_history(src.value_of(node), container) for node in src.own_nodes(container))


def _without_history(value, container) -> bool:
    """A constant, or a value made only of cut ones (`torch.cat([x[:, 1:].detach(), pred.detach()])`)."""
    return _constant(value) or value is not None and not has_history(value, container, value.lineno)


def _constant(value) -> bool:
    """`0`, `None`, `[]`: a value that is made from nothing."""
    return isinstance(value, ast.Constant) or isinstance(value, (ast.List, ast.Tuple, ast.Dict)) \
        and not (value.keys if isinstance(value, ast.Dict) else value.elts)


def _loop_target(container, stmt, expression) -> bool:
    """Bound afresh by a `for` between `container` and `stmt` (`for i, self.state.batch in
    enumerate(microbatches)`)."""
    for ancestor in src.ancestors(stmt):
        if isinstance(ancestor, (ast.For, ast.AsyncFor)) and any(
                src.canonical(t) == expression for t in ast.walk(ancestor.target) if isinstance(t, (ast.Name, ast.Attribute))):
            return True
        if ancestor is container:
            return False
    return False


def reset_before(container, stmt, expression, after_row: int = 0) -> bool:
    """A fresh value each iteration (`hidden = model.init_hidden()` at the top) is not carried.
    Only resets below `after_row` count."""
    reset = last_reset(container, stmt, expression)
    return reset is not None and reset.lineno > after_row


def last_reset(container, stmt, expression) -> ast.stmt | None:
    """The last statement before `stmt` that gives `expression` a fresh value (not made from
    itself) on every pass through `container`."""
    found = None
    for node in src.own_nodes(container):
        if isinstance(node, ast.stmt) and node.lineno < stmt.lineno and node is not stmt \
                and (_unconditional_in(node, container) or _on_every_pass_with(node, stmt, container)):
            for target in src.targets_of(node):
                value = src.value_of(node)
                if src.canonical(target) == expression and value is not None and not src.reads(value, expression) \
                        and (found is None or node.lineno > found.lineno):
                    found = node
    return found


def _on_every_pass_with(node, stmt, container) -> bool:
    """`node` runs on every pass through `container` that runs `stmt`: both sit in one block
    (`if step <= window: y = fresh(); ...; y = torch.cat((y, extra))`), with `node` not under a
    condition or loop of its own there."""
    stmt_chain = [stmt, *src.ancestors(stmt)]
    child = node
    for owner in src.ancestors(node):
        if any(owner is a for a in stmt_chain):  # the nearest block holding both
            block = next((b for b in (getattr(owner, f, None) for f in ("body", "orelse", "finalbody"))
                          if isinstance(b, list) and any(child is s for s in b)), [])
            top = next((s for s in block for a in stmt_chain if s is a), None)
            return top is not None and (_unconditional_in(node, owner) or _same_condition(node, child, top, stmt_chain))
        if owner is container:
            return False
        child = owner
    return False


def _same_condition(node, first: ast.stmt, second: ast.stmt, stmt_chain) -> bool:
    """`if C: y = fresh()` ... `if C: y = model(y, x)`: two `if`s of one block testing the same
    thing, `node` in the first's body (and not under more conditions there), the statement in the
    second's."""
    return isinstance(first, ast.If) and isinstance(second, ast.If) and first is not second \
        and ast.dump(first.test) == ast.dump(second.test) \
        and any(s is a for s in first.body for a in [node, *src.ancestors(node)]) \
        and any(s is a for s in second.body for a in stmt_chain) and _unconditional_in(node, first)


def _unconditional_in(node, container) -> bool:
    """Runs on every pass through `container`: not under an inner loop, nor under an `if` whose
    other branch leaves the name alone (`try` bodies and `with` blocks run)."""
    child = node
    for ancestor in src.ancestors(node):
        if ancestor is container:
            return True
        if isinstance(ancestor, ast.If):
            other = ancestor.orelse if any(child is s for s in ancestor.body) else ancestor.body
            names = {src.canonical(t) for t in src.targets_of(node)}
            if not any(src.canonical(t) in names for s in other for n in ast.walk(s) for t in src.targets_of(n)):
                return False
        elif not isinstance(ancestor, (ast.With, ast.AsyncWith, ast.Try)):
            return False
        child = ancestor
    return False


def update_receiver(stmt: ast.stmt, method: str) -> str | None:
    """`opt` (canonical) where `stmt` is the expression statement `opt.<method>(...)`: how the
    reorderings read a block of updates (`zero_grad`, `backward`, `step`)."""
    found = src.call_receiver(stmt, method) if isinstance(stmt, ast.Expr) else None
    return src.canonical(found) if found is not None else None


# Calls that change gradients or weights, never a tensor a graph saved.
UPDATE_CALLS = frozenset({"backward", "step", "zero_grad", "clip_grad_norm_", "clip_grad_value_"})


def only_updates(statements) -> bool:
    """Whether `statements` only make new values and update (backward, clip, step): nothing in
    them writes into a tensor in place that a moved backward's graph could have saved."""
    for stmt in statements:
        if isinstance(stmt, ast.AugAssign) or any(not isinstance(t, ast.Name) for t in src.targets_of(stmt)):
            return False
        for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
            name = src.called_name(call)
            if name.endswith("_") and not name.endswith("__") and name not in UPDATE_CALLS:
                return False
        if not isinstance(stmt, (ast.Assign, ast.Expr)):
            return False
    return True


def update_moved_after(block: list[ast.stmt], step_stmt: ast.stmt, failing: ast.stmt) \
        -> tuple[list, ast.stmt, ast.stmt] | None:
    """The update that `step_stmt` (`opt.step()`) ends, from `opt`'s last `zero_grad()` before it,
    the first `step()` at or after `failing` in `block`, and the statement the update moves after
    (that step, or the `if update_policy:` holding `failing` and its update), where that update
    can move: only updates in between (nothing written in place), and nothing in between reads
    what the moved statements bind. Each of the moved update's ends may be a loop over an
    ensemble's optimizers (REDQ's `for q_i in range(n): self.q_optimizer_list[q_i].step()`).
    How both readings of "update it after the next one" (the runtime's and the checker's) find
    what they move."""
    step_unit = _one_statement_loop(step_stmt) or step_stmt
    if not any(stmt is step_unit for stmt in block):
        guard = src.parent(failing)
        block = src.enclosing_block(step_unit)
        if not isinstance(guard, ast.If) or guard.orelse or not isinstance(guard.test, ast.Name) \
                or not any(stmt is guard for stmt in block):
            return None
    else:
        guard = None
    at = {id(stmt): index for index, stmt in enumerate(block)}
    stepped = update_receiver(step_stmt, "step")
    failing_unit = guard or failing
    if stepped is None or id(step_unit) not in at or id(failing_unit) not in at \
            or at[id(step_unit)] >= at[id(failing_unit)]:
        return None
    last = at[id(step_unit)]
    zeroed = [i for i in range(last) if _unit_receiver(block[i], "zero_grad", step_unit) == stepped]
    own_block = guard.body if guard is not None else block
    start = next(i for i, stmt in enumerate(own_block) if stmt is failing)
    end = next((stmt for stmt in own_block[start:] if update_receiver(stmt, "step") is not None), None)
    if not zeroed or end is None or update_receiver(end, "step") == stepped:
        # The next step is the same optimizer's: moved after it, this update fails the same way
        # on the weights that step changed.
        return None
    anchor = guard or end
    moved, between = block[zeroed[-1]:last + 1], block[last + 1:at[id(anchor)] + 1]
    if guard is not None:
        between = [*between[:-1], *guard.body]
    if not only_updates(between) or src.names_bound(moved) & {n for stmt in between for n in src.names_read(stmt)}:
        return None
    return moved, end, anchor


# Calls the statements after an update may make and still only read, scale and add to gradients
# and step: reading a model's parameters or a tensor's norm, clipping, back-propagating, stepping.
_GRADIENT_WORK_CALLS = frozenset({
    "backward", "step", "zero_grad", "clip_grad_norm_", "clip_grad_value_", "parameters", "named_parameters", "keys",
    "values", "items", "item", "norm", "detach", "append", "len", "range", "print", "float", "int", "min",
    "max", "sum", "abs", "enumerate", "zip", "list", "dict", "isinstance", "sqrt", "pow"})


def update_moved_to_the_end(block: list[ast.stmt], step_stmt: ast.stmt, failing: ast.stmt) \
        -> tuple[list[ast.stmt], ast.stmt | None] | None:
    """StyleTTS2's `if d_loss_slm != 0: optimizer.zero_grad(); d_loss_slm.backward();
    optimizer.step('wd')`, then `optimizer.zero_grad(); loss_gen_lm.backward()`, whose graph
    the discriminator's step changed, and the generator's update runs to the end of the loop's
    pass (gradient norms, scaling, its steps): (the statements that move to the end of the pass,
    as the maintainers moved them; the `zero_grad()` to copy before them, or None). Those are the
    update `step_stmt` ends, from its optimizer's `zero_grad()` (or the `if` whose body is that
    update alone, its test calling nothing), or from its backward where the forward separates the
    two (Dreamer's world model, whose `zero_grad()` opens the pass: a copy goes with it), where
    `block` is a loop's body holding it and `failing`; only `zero_grad()` calls and plain
    assignments between them, and after `failing` only statements that read or scale gradients
    and step (`_GRADIENT_WORK_CALLS`, in-place writes only into a `.grad`, no `break`, `continue`
    or `return`); neither side reads what the other binds; and the pass begins by clearing what
    the moved `zero_grad()` clears (the same `zero_grad()` call, before its first backward or step
    and any `.grad` read), so clearing it again at the end of the pass leaves the next pass's
    gradients as they were. Backward calls after `failing` are the runtime's to check (what
    their graphs share with the moved one's)."""
    loop = src.parent(failing)
    if not isinstance(loop, (ast.For, ast.While)) or loop.body is not block:
        return None
    stepped = update_receiver(step_stmt, "step")
    holder = src.parent(step_stmt)
    unit = step_stmt if any(stmt is step_stmt for stmt in block) else holder
    at = {id(stmt): index for index, stmt in enumerate(block)}
    if stepped is None or id(unit) not in at or id(failing) not in at or at[id(unit)] >= at[id(failing)]:
        return None
    prepended = None
    if unit is holder:
        if not isinstance(holder, ast.If) or holder.orelse or any(isinstance(n, ast.Call) for n in ast.walk(holder.test)):
            return None
        own = holder.body
        moved = [holder]
    else:
        backward = next((i for i in range(at[id(unit)] - 1, -1, -1)
                         if src.call_named(block[i], "backward") is not None), None)
        zeroed = [i for i in range(backward or 0) if update_receiver(block[i], "zero_grad") == stepped]
        if backward is None or not zeroed:
            return None
        if all(update_receiver(stmt, "zero_grad") is not None for stmt in block[zeroed[-1]:backward]):
            own = moved = block[zeroed[-1]:at[id(unit)] + 1]
        elif any(map(_backward_or_step, block[zeroed[-1] + 1:backward])):
            return None
        else:
            # Dreamer: the pass opens with the world model's `zero_grad()`, then the forward: its
            # backward to its step moves, a copy of that `zero_grad()` before them.
            own = moved = block[backward:at[id(unit)] + 1]
            prepended = block[zeroed[-1]]
    zeroing = prepended or next((stmt for stmt in own if update_receiver(stmt, "zero_grad") == stepped), None)
    if zeroing is None or own[-1] is not step_stmt or not only_updates(own) \
            or sum(src.call_named(stmt, "backward") is not None for stmt in own) != 1:
        return None
    between = block[at[id(moved[-1])] + 1:at[id(failing)]]
    rest = block[at[id(failing)] + 1:]
    if not only_updates(between) or any(map(_backward_or_step, between)) \
            or not any(update_receiver(stmt, "step") is not None for stmt in rest) or not _gradient_work(rest):
        return None
    others = [*between, failing, *rest]
    if _bound_in(moved) & set().union(*map(src.names_read, others)) \
            or _bound_in(others) & set().union(*map(src.names_read, moved)):
        return None
    opening = []  # the pass's statements before its first backward or step
    for stmt in block[:at[id(moved[0])]]:
        if _backward_or_step(stmt):
            break
        opening.append(stmt)
    clears = next((i for i, stmt in enumerate(opening) if isinstance(stmt, ast.Expr)
                   and src.canonical(stmt.value) == src.canonical(zeroing.value)), None)
    reads_gradients = clears is not None and any(
        isinstance(node, ast.Attribute) and node.attr == "grad" for stmt in opening[:clears] for node in ast.walk(stmt))
    return (moved, prepended) if clears is not None and not reads_gradients else None


def _backward_or_step(stmt: ast.stmt) -> bool:
    return src.call_named(stmt, "backward") is not None or src.call_named(stmt, "step") is not None


def _bound_in(statements) -> set[str]:
    """Every name the statements bind, in nested blocks and loops' targets too."""
    return {n.id for stmt in statements for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _gradient_work(statements) -> bool:
    """Whether the statements only read, scale and add to gradients and step (see update_moved_to_the_end):
    they write in place only into a `.grad` or into a container they made (`total_norm = {}`)."""
    made = _made_containers(statements)
    for node in (n for stmt in statements for n in ast.walk(stmt)):
        if isinstance(node, (ast.Return, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom, ast.Raise, ast.With,
                             ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Delete, ast.Global,
                             ast.Nonlocal, ast.Await)):
            return False
        if isinstance(node, ast.Call):
            name = src.called_name(node)
            if name not in _GRADIENT_WORK_CALLS and not (name.endswith("_") and _into_a_gradient(node.func)):
                return False
        targets = [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) \
            else node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            written = isinstance(node, ast.AugAssign) or not isinstance(target, (ast.Name, ast.Tuple, ast.List))
            base = target
            while isinstance(base, ast.Subscript):
                base = base.value
            if written and not (isinstance(base, ast.Attribute) and base.attr == "grad"
                                or isinstance(base, ast.Name) and base.id in made):
                return False
    return True


def _made_containers(statements) -> set[str]:
    """The names the statements bind only to a literal or a display they make (`total_norm = {}`,
    `total_norm[key] = 0`): what they write into is theirs, never a tensor a graph saved."""
    fresh, other = set(), set()
    for node in (n for stmt in statements for n in ast.walk(stmt)):
        for target in node.targets if isinstance(node, ast.Assign) else []:
            if isinstance(target, ast.Name):
                (fresh if isinstance(node.value, (ast.Constant, ast.Dict, ast.List, ast.Set, ast.Tuple, ast.DictComp,
                                                  ast.ListComp, ast.SetComp)) else other).add(target.id)
        if isinstance(node, (ast.For, ast.comprehension)):
            other |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            other.add(node.target.id)
    return fresh - other


def _into_a_gradient(func: ast.expr) -> bool:
    """`p.grad.mul_` : an in-place method called on a `.grad`."""
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and func.value.attr == "grad"


def _one_statement_loop(stmt: ast.stmt) -> ast.For | None:
    """The `for` loop around `stmt` whose whole body `stmt` is (`for q_i in range(n):
    opts[q_i].step()`): one update of an ensemble."""
    loop = src.parent(stmt)
    return loop if isinstance(loop, ast.For) and not loop.orelse and len(loop.body) == 1 \
        and loop.body[0] is stmt else None


def _unit_receiver(stmt: ast.stmt, method: str, like: ast.stmt) -> str | None:
    """`update_receiver` of `stmt`, or of the one statement of a loop that `like` (the moved
    update's step, itself such a loop or not) also is, over the same range."""
    if isinstance(like, ast.For):
        if not (isinstance(stmt, ast.For) and not stmt.orelse and len(stmt.body) == 1
                and src.canonical(stmt.target) == src.canonical(like.target)
                and src.canonical(stmt.iter) == src.canonical(like.iter)):
            return None
        stmt = stmt.body[0]
    return update_receiver(stmt, method)


def zeroed_before_use(statements: list[ast.stmt], optimizer: str) -> bool:
    """Whether `optimizer.zero_grad()` comes in `statements` before its `step()` and before any
    `.grad` is read."""
    for stmt in statements:
        if update_receiver(stmt, "zero_grad") == optimizer:
            return True
        if any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(stmt)) \
                or any(update_receiver(n, "step") == optimizer for n in ast.walk(stmt) if isinstance(n, ast.stmt)):
            return False
    return False


def step_after(stmt: ast.stmt) -> str | None:
    """The optimizer (canonical) whose `opt.step()` is the first such statement after `stmt` in
    its block: the update `stmt`'s backward belongs to."""
    block = src.enclosing_block(stmt)
    at = next((i for i, own in enumerate(block) if own is stmt), None)
    return None if at is None else next(
        (name for name in (update_receiver(later, "step") for later in block[at + 1:]) if name is not None), None)


def next_in_its_loop(stmt: ast.stmt) -> list[ast.stmt] | None:
    """The statements of the innermost loop's body that run after `stmt` and before it runs
    again (the rest of this pass, then the start of the next), where `stmt` is one of that
    body's own statements; None where it is not."""
    loop = next(iter(src.loops_around(stmt)), None)
    at = next((i for i, own in enumerate(loop.body) if own is stmt), None) if loop is not None else None
    return None if at is None else loop.body[at + 1:] + loop.body[:at]
