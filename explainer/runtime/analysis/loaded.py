"""inplace-modified by `load_state_dict`: loading copies the values into the module's own
parameters and buffers in place, so a graph that saved one of them before the load fails its
backward as it would after an optimizer step (a soft update of a target network, a state
"restored" after a trial step)."""
from __future__ import annotations

import ast

import torch

from ...fixes import remove_statement
from ...fixes.edits import node_start
from ...model import CallSite, Evidence, Finding, Fix
from ...reading import source as src
from ...reading.training import under_no_grad
from ..errors import InplaceDetail, version_facts
from ..records import LoadCall, StepCall
from .context import Context
from .evidence import culprit_at, finding
from .locate import callers_name, locate, reaching
from .made_from import Scope, made_by_calling


def load_that_changed(ctx: Context, failing_seq: int, parameter, step: StepCall | None) -> LoadCall | None:
    """The last `load_state_dict` into a module holding `parameter` after the graph saved it and
    before this backward, unless an optimizer step of `parameter` came later still."""
    if parameter is None:
        return None
    for load in reversed(ctx.loads):
        module = load.module()
        if load.mark <= failing_seq or ctx.call is not None and load.tick > ctx.call.tick \
                or not isinstance(module, torch.nn.Module) or not _holds(module, parameter):
            continue
        optimizer = step.optimizer() if step is not None else None
        if optimizer is not None and step.tick > load.tick \
                and any(p is parameter for group in optimizer.param_groups for p in group["params"]):
            return None
        return load
    return None


def explain_load(ctx: Context, walk, failing_key: int, load: LoadCall, name: str,
                 detail: InplaceDetail | None) -> Finding | None:
    source, scope, load_stmt = ctx.site_statement(load.filename, load.row)
    module = load.module()
    if load_stmt is None or module is None:
        return None
    # The load ran in a function whose frame is gone (a helper the training loop called).
    scope = src.enclosing_function(load_stmt) or scope
    code = source.segment(load_stmt)
    read = _graph_read_at(ctx, walk, failing_key, load, module) or _run_in_loop(source, load_stmt)
    culprits = [culprit_at(name, source, node_start(source, load_stmt))]
    facts = (("change", code), *version_facts(detail))
    variant = "run-load"
    if read is not None:
        where, stmt = read
        culprits.insert(0, culprit_at(name, where, node_start(where, stmt)))
        facts += (("read", stmt.lineno),)
        variant = "run-load-read"
    evidence = Evidence(name, CallSite(source.filename, load_stmt.lineno, code), ctx.backward_site(),
                        advice="not-the-cause", facts=facts)
    return finding("BX011", variant, "inplace-modified", evidence, culprits,
                   [_restores_nothing(source, scope, load_stmt, module)], "certain" if detail is not None else "likely")


def _holds(module: torch.nn.Module, tensor) -> bool:
    return any(p is tensor for p in module.parameters()) or any(b is tensor for b in module.buffers())


def _graph_read_at(ctx: Context, walk, failing_key: int, load: LoadCall, module) -> tuple | None:
    """(source, statement) where the earliest tensor bound in the user's frames that this
    backward goes through, made before the load, was made by a model of the loaded one's class
    (`new_pi = agent.target_actor(new_states)`, a pass of the loop before the soft update)."""
    upstream = reaching(walk, {failing_key})
    made_before = sorted((b for b in ctx.bindings() if b.value.grad_fn is not None
                          and id(b.value.grad_fn) in upstream
                          and walk.seq.get(id(b.value.grad_fn), 0) < load.mark),
                         key=lambda b: walk.seq.get(id(b.value.grad_fn), 0))
    if not made_before:
        return None
    binding = callers_name(ctx, made_before[0])
    frame = ctx.frames[binding.frame_index]
    located = locate(ctx, binding, frame.f_lineno)
    if located is None:
        return None
    values = {**frame.f_globals, **frame.f_locals}
    start = Scope(located.source, located.scope, values.get("self"), values)
    expression, before = src.canonical(located.target_text), located.row + 1
    if isinstance(located.store, ast.Call) and len(located.store.args) == 1:
        # `all_agents_new_actions.append(new_pi)`: what was appended.
        expression, before = src.canonical(located.store.args[0]), located.row
    # `agent.target_actor.forward` is a method of the model: the model is its `__self__`.
    found = made_by_calling(start, expression, before,
                            lambda called: type(getattr(called, "__self__", called)) is type(module))
    return (found[0].source, found[1].stmt) if found is not None else None


def _run_in_loop(source: src.Source, load_stmt: ast.stmt) -> tuple | None:
    """(source, statement): the one statement of the loop around the load that runs the loaded
    module with gradients on (calls it, or passes it to a call), where an earlier pass built the
    graph that the load then changed."""
    receiver = src.call_receiver(load_stmt, "load_state_dict")
    loops = src.loops_around(load_stmt)
    if receiver is None or not loops:
        return None
    module = src.canonical(receiver)
    runs = []
    for stmt in ast.walk(loops[0]):
        if not isinstance(stmt, ast.stmt) or stmt is load_stmt or hasattr(stmt, "body") or under_no_grad(stmt):
            continue
        calls = [c for c in ast.walk(stmt) if isinstance(c, ast.Call)]
        if any(src.canonical(c.func) == module or any(src.canonical(a) == module for a in c.args)
               for c in calls):
            runs.append(stmt)
    return (source, runs[0]) if len(runs) == 1 else None


def _restores_nothing(source: src.Source, scope: ast.AST, load_stmt: ast.stmt, module) -> Fix | None:
    """`state0 = self.func.state_dict()` ... `self.func.load_state_dict(state0)`: `state_dict()`
    returns the module's own tensors, not copies (checked on the module), so loading them back
    restores nothing; it only bumps their versions. Removing both lines changes no value."""
    call = src.call_named(load_stmt, "load_state_dict")
    receiver = src.call_receiver(load_stmt, "load_state_dict")
    if not isinstance(load_stmt, ast.Expr) or call is None or len(call.args) != 1 or call.keywords \
            or not isinstance(call.args[0], ast.Name):
        return None
    state = call.args[0].id
    taken = src.last_assignment(scope, state, load_stmt.lineno)
    value = taken.value if taken is not None else None
    if taken is None or not isinstance(taken.stmt, ast.Assign) or len(taken.stmt.targets) != 1 \
            or not isinstance(value, ast.Call) or value.args or value.keywords \
            or src.canonical(value.func) != f"{src.canonical(receiver)}.state_dict":
        return None
    # The dict is read nowhere else (nothing could change it), and nothing in between re-binds
    # an attribute of the module (the loaded tensors would then not be its own).
    uses = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == state]
    if len(uses) != 2 or any(isinstance(t, ast.Attribute) and src.canonical(t.value).startswith(src.canonical(receiver))
                             for stmt in src.own_nodes(scope) if isinstance(stmt, (ast.Assign, ast.AugAssign))
                             and taken.stmt.lineno < stmt.lineno < load_stmt.lineno
                             for t in src.targets_of(stmt)):
        return None
    if not _state_is_its_own(module):
        return None
    edits = remove_statement.without(source, [taken.stmt, load_stmt])
    return Fix(f"Remove `{source.segment(load_stmt)}` and the `{state} = {source.segment(value)}` it loads: "
               f"`state_dict()` returns the module's own tensors, not a copy, so loading them back restores "
               f"nothing and only marks them changed in place", edits, "safe")


def _state_is_its_own(module: torch.nn.Module) -> bool:
    """Whether every tensor of `module.state_dict()` is one of its parameters or buffers (the same
    memory), as for every built-in module."""
    own = {name: t for name, t in (*module.named_parameters(), *module.named_buffers())}
    try:
        state = module.state_dict()
    except Exception:  # a user's override may raise anything
        return False
    return all(isinstance(t, torch.Tensor) and name in own and t.data_ptr() == own[name].data_ptr()
               and t.shape == own[name].shape for name, t in state.items())
