"""inplace-modified: a tensor the graph saved was changed in place before the backward that
needed it: a parameter by an optimizer step (or a hand-written update) after the graph was built
(BX007), or your own code's `h += 1` (BX011; inside a model's forward: inplace_in_module)."""
from __future__ import annotations

import ast
import inspect
import math
import re
import textwrap
from dataclasses import replace

import torch

from ...fixes import graph_options, out_of_place, recompute_forward, reorder_updates, rerun_forward, split_loss
from ...fixes.edits import (
    delete_lines,
    insert_lines_after,
    insert_lines_before,
    node_start,
    statement_text,
)
from ...fixes.edits import replace as replace_node
from ...model import CallSite, Culprit, Evidence, Finding, Fix, Location
from ...reading import source as src
from ...reading.training import (
    UPDATE_CALLS,
    helper_called,
    next_in_its_loop,
    only_updates,
    passed_arguments,
    runs_backward,
    step_after,
    update_moved_after,
    update_moved_to_the_end,
    update_receiver,
    whole_update,
)
from .. import graph, hooks, naming
from ..errors import InplaceDetail, version_facts
from ..records import StepCall
from .context import Context
from .evidence import culprit, culprit_at, finding, made_at
from .inplace_in_module import explain_inplace_in_module
from .loaded import explain_load, load_that_changed
from .locate import (
    Candidate,
    Located,
    callers_name,
    class_source,
    element_of_iterated,
    locate,
    name_of,
    reaching,
    source_of_class,
    step_row_in,
    through_plain_alias,
)
from .made_from import Scope, made_by_calling, runtime_value
from .trained import (
    held_optimizers,
    left_unused,
    optimizer_parameters,
    parameters_under,
    reads_on_the_way,
    trained_by,
)


def explain_inplace(ctx: Context, detail: InplaceDetail | None) -> Finding | None:
    roots = ctx.root_nodes()
    if not roots:
        return None
    full = graph.walk(roots)
    failing_key, saved_name = _failing_saved(full)
    parameter = _modified_parameter(full, failing_key, detail)
    failing_seq = full.seq.get(failing_key, 0) if failing_key is not None else 0
    steps = [s for s in ctx.steps if s.mark > failing_seq and (ctx.call is None or s.tick < ctx.call.tick)]
    step = _step_for(steps, parameter)
    parameter_name = _parameter_name(ctx, parameter, step) if parameter is not None else None
    load = load_that_changed(ctx, failing_seq, parameter, step)
    if load is not None:
        # `target.load_state_dict(...)` wrote into the parameter after the graph saved it.
        loaded = explain_load(ctx, full, failing_key, load, parameter_name or _unnamed(detail), detail)
        if loaded is not None:
            return loaded
    source, scope, failing = ctx.failing_statement()
    if saved_name == "saved_tensors":
        # A custom Function saved it with `ctx.save_for_backward`: its own backward may write into it.
        changed = _changed_by_its_backward(ctx, full.nodes[failing_key], detail)
        if changed is not None:
            return changed
    if step is None and parameter is None:
        changed = _changed_by_user(ctx, source, scope, failing, failing_key, detail) \
            or explain_inplace_in_module(ctx, full, failing_key, detail)
        if changed is not None:
            return changed
    elif step is None:
        step = _manual_update(ctx, source, scope, failing, parameter, parameter_name)
    # The tensor built before the step whose graph this backward reuses.
    upstream = reaching(full, {failing_key}) if failing_key is not None else set()
    built_before = [b for b in ctx.bindings() if b.value.grad_fn is not None
                    and id(b.value.grad_fn) in upstream
                    and (step is None or full.seq.get(id(b.value.grad_fn), 0) < step.mark)]
    # The first made, by a statement of the user's (not `conv.weight`, which spectral_norm's
    # hook computes from `weight_orig` at each call) and named as such (`g_fake` before the `_`
    # unpacked beside it).
    built_before.sort(key=lambda b: (b.base.startswith("_"), full.seq.get(id(b.value.grad_fn), 0)))
    carrier = None
    for binding in built_before[:8]:
        candidate = Candidate(binding, "direct")
        candidate.binding = callers_name(ctx, element_of_iterated(ctx, candidate.binding))
        frame = ctx.frames[candidate.binding.frame_index]
        row = frame.f_lineno if candidate.binding.frame_index else ctx.call.row if ctx.call else None
        candidate.located = through_plain_alias(ctx, locate(ctx, candidate.binding, row))
        candidate.name = name_of(candidate)
        carrier = carrier or candidate
        if candidate.located is not None:
            carrier = candidate
            break
    step_site = ctx.call_site(step.filename, step.row, step.column) if step else None
    name = parameter_name or _unnamed(detail)
    fixes: list[Fix | None] = []
    helper = _through_a_helper(ctx, carrier, step, parameter)
    if helper is not None:
        # The loss was built by the caller of the helper that steps and back-propagates
        # (`update_params(opt, net, loss)`): move it after the call that stepped.
        stepped_row, failing_here, built = helper
        located = carrier.located
        fixes.append(recompute_forward.move_before_use(
            located.source, located.scope, located.store, stepped_row, failing_here,
            f"Compute `{carrier.name}` after line {stepped_row}, which steps the optimizer: this backward then "
            f"goes through a graph built with the updated weights"))
        fixes.append(_drop_shared_term(ctx.frames[carrier.binding.frame_index].f_locals, located, stepped_row,
                                       failing_here, step))
        culprits = [culprit_at(name, built[0].source, built[0].location) if built is not None
                    else culprit_at(name, located.source, _module_call_at(located, name)), culprit(ctx, carrier)]
        evidence = Evidence(name, made_at(ctx, built[0] if built is not None else located), ctx.backward_site(),
                            steps=(step_site,), advice="after-step",
                            facts=(("built", built[0].target_text if built is not None else carrier.name), ("manual", False),
                                   *version_facts(detail)))
        return finding("BX007", "run-step", "inplace-modified", evidence, culprits, fixes, "certain")
    # Where the model that holds the parameter ran, when a function the carrier's statement calls ran it.
    callee = _built_in_a_callee(ctx, carrier, parameter, step) if carrier is not None and carrier.located is not None \
        else None
    if carrier is not None and carrier.located is not None and step is not None and failing is not None:
        located = carrier.located
        step_row = step_row_in(located, step, failing)
        needed_again = _made_stale(ctx, optimizer_parameters(steps))
        if step_row is not None and step_row != step.row:  # the user's call of the wrapper that stepped
            step_site = ctx.call_site(located.source.filename, step_row)
        recompute = recompute_forward.recompute_before_use(
            located.source, located.scope, located.store, step_row, failing,
            f"Recompute `{carrier.name}` after `{step_site.code}` (line {step_row}), so this "
            f"backward goes through a graph built with the updated weights", upstream=needed_again) \
            if step_row is not None else None
        if recompute is None and step_row is not None and step_row > failing.lineno:
            recompute = recompute_forward.recompute_in_loop(
                located.source, located.scope, located.store, step_row, failing)
        step_stmt = src.statement_at(located.scope, step_row, step.column if step_row == step.row else None) \
            if located.source is source and step_row is not None else None
        if recompute is None and step_stmt is not None and step_row is not None and step_row > located.store.lineno:
            recompute = recompute_forward.move_past_the_step(located.source, located.store, step_stmt)
        stale = _stale_reads(ctx, recompute, optimizer_parameters(steps)) if recompute is not None else []
        if stale:
            # The loss also reads values made by other stepped models (both critics' Q values):
            # recompute those with it, where each was made in the same block.
            made = [src.last_assignment(located.scope, b.base, failing.lineno) for b in stale]
            if all(m is not None and src.parent(m.stmt) is src.parent(located.store) for m in made):
                others = " and ".join(dict.fromkeys(f"`{located.source.segment(m.target)}`" for m in made))
                wider = recompute_forward.recompute_before_use(
                    located.source, located.scope, located.store, step_row, failing,
                    f"Recompute `{carrier.name}`, and {others} that this loss reads too, after "
                    f"`{step_site.code}` (line {step_row}): their models stepped, and this backward needs "
                    f"graphs built with the updated weights", upstream=needed_again, also=[m.stmt for m in made])
                if wider is not None and not _stale_reads(ctx, wider, optimizer_parameters(steps)):
                    recompute = wider
        if recompute is not None:
            edits = recompute.edits
            previous = ctx.previous
            if previous is not None and previous.retain_graph and not _reads_history(ctx, located) \
                    and not _recompute_reads_history(ctx, recompute):
                _, _, previous_stmt = ctx.site_statement(previous.filename, previous.row)
                call = src.call_named(previous_stmt, "backward")
                drop = graph_options.drop_keyword(located.source, call, "retain_graph") if call else None
                if drop is not None:
                    edits = edits + (drop,)
            stale = _stale_reads(ctx, recompute, optimizer_parameters(steps))
            fixes.append(Fix(recompute.message, edits,
                             "unsafe" if stale or recompute.applicability == "unsafe" else "safe"))
        fixes.append(_update_before_the_forward(ctx, source, located, step, steps, failing, full)
                     or _update_before_the_forward_in_its_method(
                         ctx, source, scope, located, callee, step, steps,
                         failing, optimizer_parameters(steps)))
        fixes.append(_own_update_first_through_helper(ctx, carrier, steps))
        fixes.insert(0, _split_loss(ctx, source, scope, step, failing))
        # The same optimizer steps again right after this backward: one step over both losses,
        # as Anomaly-Transformer's maintainers did. Unsafe, so after a recompute proven safe
        # (two updates, each on its own loss, as the code has them); first where none is.
        safe_recompute = next((i for i, fix in enumerate(fixes) if recompute is not None and fix is not None
                               and fix.message == recompute.message and fix.applicability == "safe"), None)
        fixes.insert(0 if safe_recompute is None else safe_recompute + 1,
                     _drop_repeated_step(ctx, source, scope, step, failing))
        fixes.insert(0, _keep_to_own(ctx, source, step, failing, steps))
        after = _update_after(ctx, source, scope, step, failing, steps)
        if after is not None and (_ascends_what_it_descended(ctx) or _kept_for_this_loss(ctx, scope, step, failing)):
            # One objective, two players, or a graph kept for a loss made before the step: each
            # takes its gradient at the weights the graph was built with.
            fixes.insert(0, after)
        else:
            fixes.append(after or _reorder_step(ctx, source, scope, step, failing)
                         or _step_after_the_loop(source, scope, step, failing))
        last = _update_last(ctx, source, scope, step, step_row, failing, steps) if after is None else None
        if last is not None:
            # One forward made both losses: each update takes its gradient where the forward ran.
            fixes.insert(0 if _made_with_the_moved_loss(ctx, scope, failing) else len(fixes), last)
        # Its own update first, the other way to order the updates: after a recompute (as
        # FiredUp's DDPG, toshikwa's SAC and Spinning Up do it), before it where none is offered
        # or where this graph's forward ran before those of the losses that stepped (rlkit's SAC).
        first, forward_first = _own_update_first(ctx, source, located, steps, failing)
        recomputed = next((i for i, fix in enumerate(fixes) if recompute is not None and fix is not None
                           and fix.message == recompute.message and fix.applicability == "safe"), None)
        fixes.insert(0 if recomputed is None or forward_first else recomputed + 1, first)
        fixes.append(_run_the_maker_again(ctx, located, step))
        fixes.append(_detach_stale_term(ctx, source, scope, step, failing))
    located = carrier.located if carrier is not None else None
    culprits = []
    built_name = carrier.name if carrier is not None else ""
    if located is not None:
        built = callee if not _calls_a_holder(located, name) else None
        if built is not None:
            # Where the model ran, as the helper path above names it.
            name = _as_read_in(built, name)
            culprits = [culprit_at(name, built.source, built.location), culprit(ctx, carrier)]
            located, built_name = built, built.target_text
        else:
            culprits = [culprit_at(name, located.source, _module_call_at(located, name)), culprit(ctx, carrier)]
    elif step_site is not None:
        culprits = [Culprit(name, step_site.filename, Location(step_site.row, 1), "", step_site.code)]
    # With no step found, no step is why retain_graph would not help: the graph still exists.
    evidence = Evidence(name, made_at(ctx, located), ctx.backward_site(), steps=(step_site,) if step_site else (),
                        advice="after-step" if step is not None else "not-the-cause", facts=(
                            ("built", built_name),
                            ("manual", step is not None and step.optimizer() is None), *version_facts(detail)))
    if step is None:
        code, variant = "BX011", "run-unknown"
    else:
        code, variant = "BX007", "run-step" if located is not None else "run-step-site"
    return finding(code, variant, "inplace-modified", evidence, culprits, fixes,
                   "certain" if parameter_name and step_site else "likely")


def _run_the_maker_again(ctx: Context, located: Located, step: StepCall) -> Fix | None:
    """The graph was built by a method of the object that keeps what it makes on `self` and takes
    and returns nothing (DRIT's `forward()`, run by `update_D`), and the step ran in a method of
    the same object (`update_EG`) that then calls what back-propagates (`backward_G_alone()`):
    run the maker again between the two. None where the maker reads arguments or returns a
    value, or where no frame of that object stands after the step in the function that stepped."""
    maker = located.scope
    if not isinstance(maker, ast.FunctionDef) or [a.arg for a in maker.args.args] != ["self"] \
            or maker.args.vararg or maker.args.kwarg or maker.args.kwonlyargs \
            or any(isinstance(n, ast.Return) and n.value is not None for n in src.own_nodes(maker)) \
            or not all(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                       for t in src.targets_of(located.store)):
        return None
    for frame in ctx.frames:
        source, scope = ctx.frame_source(frame)
        owner = frame.f_locals.get("self")
        method = getattr(getattr(type(owner), maker.name, None), "__code__", None)
        if source is None or not isinstance(scope, ast.FunctionDef) or scope is maker or source.filename != step.filename \
                or not scope.lineno <= step.row < frame.f_lineno <= scope.end_lineno or method is None \
                or (method.co_filename, method.co_firstlineno) != (located.source.filename, maker.lineno):
            continue
        caller = src.innermost_statement(scope, frame.f_lineno)
        if caller is None:
            return None
        # `self.loss_G = self.compute_G_loss()`, then `self.loss_G.backward()` (joliGEN): the loss
        # is built from what the maker kept before the backward runs, so the maker runs before that.
        receiver = src.call_receiver(caller, "backward")
        built = src.last_assignment(scope, src.canonical(receiver), caller.lineno) if receiver is not None else None
        if built is not None and built.stmt.lineno > step.row and src.parent(built.stmt) is src.parent(caller):
            return rerun_forward.call_again(source, maker, built.stmt, source.segment(built.stmt),
                                            "builds the loss from")
        return rerun_forward.call_again(source, maker, caller, source.segment(caller))
    return None


def _module_call_at(located: Located, parameter: str) -> Location:
    """Where the statement that built the graph calls the module that holds `parameter`: the line
    of `self.qf2(obs, new_obs_actions)` inside a `torch.min(...)` spread over several lines, or of
    `new_pi = agent.target_actor.forward(new_states)` where the graph was kept by
    `all_agents_new_actions.append(new_pi)`."""
    modules = _holders(parameter)
    statements = [located.store]
    kept = located.store.args[-1] if isinstance(located.store, ast.Call) and located.store.args else None
    if isinstance(kept, ast.Name):
        made = src.last_assignment(located.scope, kept.id, located.store.lineno)
        statements += [made.stmt] if made is not None else []
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and node.lineno != located.location.row \
                    and _calls_one_of(src.canonical(node.func), modules):
                return node_start(located.source, node)
    return located.location


def _built_in_a_callee(ctx, carrier: Candidate, parameter, step: StepCall | None) -> Located | None:
    """Where the model holding `parameter` ran, when the carrier's statement calls no such model
    but a function of the user's that did: `qf2_pi = self.critic_local_2(state_batch)` inside
    `calculate_actor_loss`, whose loss SAC-Discrete's `learn` binds to `policy_loss`. Where the
    carrier's own statement calls a model that holds it among weights `step` does not update
    (StyleTTS2's SLM loss wrapper, over the frozen WavLM and the discriminator), where a model
    that step updates all of ran inside it (`self.wd(y_rec_embeddings)`)."""
    if parameter is None:
        return None
    located, frame = carrier.located, ctx.frames[carrier.binding.frame_index]
    if located.source.filename != frame.f_code.co_filename or not isinstance(located.store, ast.stmt):
        return None
    values = {**frame.f_globals, **frame.f_locals}

    stepped = trained_by(step.optimizer()) if step is not None else set()
    ran = []  # what each call checked ran: the accepted one last

    def holds(model) -> bool:
        ran.append(model)
        return isinstance(model, torch.nn.Module) and any(p is parameter for p in model.parameters())

    def updated(model) -> bool:
        return holds(model) and all(id(p) in stepped for p in model.parameters())

    start = Scope(located.source, located.scope, values.get("self"), values)
    expression, before = src.canonical(located.target_text), located.store.end_lineno + 1
    found = made_by_calling(start, expression, before, holds)
    if found is not None and found[0].node is located.scope and stepped and not updated(ran[-1]):
        found = made_by_calling(start, expression, before, updated)
    if found is None or found[0].node is located.scope:
        return None  # made in the carrier's own function (tianshou's `obs_result = self(batch)`)
    where, assignment = found
    return Located(where.source, where.node, assignment.stmt, assignment.target,
                   where.source.segment(assignment.target), False)


def _as_read_in(located: Located, parameter: str) -> str:
    """The parameter as the statement that ran its model reads it: `model.reward_model.model[6].weight`
    where Dreamer's `loss` begins with `model = self.agent.model` and calls `model.reward_model(...)`
    (the backward's frame knows it as `self.agent.model.reward_model.model[6].weight`)."""
    for name in sorted(src.names_read(located.store)):
        made = src.last_assignment(located.scope, name, located.row)
        value = made.value if made is not None and isinstance(made.stmt, ast.Assign) else None
        prefix = src.canonical(value) if isinstance(value, ast.Attribute) else ""
        if prefix and parameter[len(prefix):len(prefix) + 1] in (".", "[") and parameter.startswith(prefix):
            return name + parameter[len(prefix):]
    return parameter


def _calls_a_holder(located: Located, parameter: str) -> bool:
    """Whether the carrier's statement itself calls a model that holds `parameter`."""
    modules = _holders(parameter)
    return any(isinstance(node, ast.Call) and _calls_one_of(src.canonical(node.func), modules)
               for node in ast.walk(located.store))


def _holders(parameter: str) -> set[str]:
    """The expressions of the models that hold `parameter`: `self.qf2[2]` and `self.qf2` for
    `self.qf2[2].weight`."""
    return {parameter[:i] for i, c in enumerate(parameter) if c in ".["} - {"self"}


def _calls_one_of(func: str, modules: set[str]) -> bool:
    """`self.qf2` or `self.qf2.forward` for `self.qf2`; `agent.target_actor.forward` for
    `self.agents[0].target_actor`, reached through the loop's `agent`."""
    func = func.removesuffix(".forward")
    _, _, attributes = func.partition(".")
    return func in modules or bool(attributes) and any(m.endswith("." + attributes) for m in modules)


def _unnamed(detail: InplaceDetail | None) -> str:
    return f"a {list(detail.shape)} tensor" if detail is not None else "a saved tensor"


def retained_before_step(found: Finding, warned: Finding) -> Finding:
    """An in-place error at a backward that was first warned of a graph kept across iterations
    (`self.weight` carried, retain_graph=True): the step changed weights that the kept graph
    saved. The carried state is where the graph was built, and its fix is the fix."""
    if not warned.culprits or found.code != "BX007":
        return found
    carrier = warned.culprits[0]
    name = found.culprits[0].name if found.culprits else found.evidence.carrier
    culprits = (replace(carrier, name=name, role=""), replace(carrier, role=""))
    evidence = replace(found.evidence, made_at=warned.evidence.made_at,
                       facts=tuple((k, carrier.name if k == "built" else v) for k, v in found.evidence.facts))
    return finding(found.code, "run-step", found.kind, evidence, culprits, warned.fixes, found.confidence)


def _through_a_helper(ctx, carrier: Candidate | None, step: StepCall | None, parameter):
    """(the row in the carrier's function of the call that stepped, the failing call's statement
    there, (where the graph read `parameter`, name)) when the carrier was built in a caller of the
    helper that ran the step and runs this backward; else None."""
    if carrier is None or carrier.located is None or step is None or step.optimizer() is None \
            or not carrier.binding.frame_index:
        return None
    located, frame = carrier.located, ctx.frames[carrier.binding.frame_index]
    scope = located.scope
    if located.source.filename != frame.f_code.co_filename or step_row_in(located, step, None) is not None:
        return None  # the step is the carrier's scope's own
    failing_here = src.innermost_statement(scope, frame.f_lineno)
    values = {**frame.f_globals, **frame.f_locals}
    start = Scope(located.source, scope, values.get("self"), values)
    optimizer = step.optimizer()
    stepped = [stmt for stmt in src.own_nodes(scope) if isinstance(stmt, ast.stmt)
               and located.store.lineno < stmt.lineno < frame.f_lineno
               and any(isinstance(call, ast.Call) and any(runtime_value(start, a) is optimizer for a in call.args)
                       for call in ast.walk(stmt))]
    if failing_here is None or not stepped:
        return None
    found = made_by_calling(start, src.canonical(located.target_text), frame.f_lineno,
                            lambda model: isinstance(model, torch.nn.Module)
                            and any(p is parameter for p in model.parameters()))
    built = None
    if found is not None:
        where, assignment = found
        built = (Located(where.source, where.node, assignment.stmt, assignment.target,
                         where.source.segment(assignment.target), False), assignment)
    return stepped[-1].lineno, failing_here, built


def _drop_shared_term(values: dict, located: Located, stepped_row: int, failing_here, step: StepCall) -> Fix | None:
    """FQF's `update_params(self.fraction_optim, fraction_loss + entropy_loss, retain_graph=True)`,
    then `update_params(self.quantile_optim, quantile_loss + entropy_loss)`: the term both losses
    add goes through weights the first update stepped, and the rest of this loss through none of
    them. Leaving it out of this loss is what the maintainers did; it changes what this update
    trains (the term's gradient through the first model), so it is unsafe. `values`: the
    caller's locals, where the terms are named."""
    stepped_stmt = src.innermost_statement(located.scope, stepped_row)
    ours, theirs = _summed_argument(failing_here), _summed_argument(stepped_stmt)
    if ours is None or theirs is None or step.optimizer() is None:
        return None
    expression, terms = ours
    shared = [t for t in terms if isinstance(t, ast.Name) and any(
        isinstance(other, ast.Name) and other.id == t.id for other in theirs[1])]
    changed = trained_by(step.optimizer())

    def reaches_changed(term) -> bool:
        value = values.get(term.id) if isinstance(term, ast.Name) else None
        return isinstance(value, torch.Tensor) and bool(parameters_under(value.grad_fn) & changed)

    kept = [t for t in terms if not any(t is d for d in shared)]
    if len(shared) != 1 or not kept or not reaches_changed(shared[0]) or any(reaches_changed(t) for t in kept) \
            or any(not isinstance(t, ast.Name) for t in kept):
        return None
    source = located.source
    edit = replace_node(source, expression, " + ".join(source.segment(t) for t in kept))
    return Fix(f"Leave `{shared[0].id}` out of `{source.segment(expression)}` (line {expression.lineno}): the "
               f"update at line {stepped_row} already back-propagated it, in `{source.segment(theirs[0])}`, and its "
               f"graph goes through the weights that update stepped (this changes what this update trains)",
               (edit,), "unsafe")


def _detach_stale_term(ctx, source, scope, step: StepCall, failing) -> Fix | None:
    """hanasu's VITS2 loop: `loss_gen_all = loss_gen + loss_fm + loss_mel + loss_kl`, then
    `loss_gen_all += loss_dur_hat`, made from the duration discriminator's output before
    `optim_dur_disc` stepped. The one term whose graph reaches the stepped weights, where no
    other term does, is detached where the loss adds it, as hanasu's maintainer did. Unsafe: this
    update then trains without that term's gradient (recomputing it after the step, as upstream
    VITS2 does, is the other way)."""
    receiver = src.call_receiver(failing, "backward") if failing is not None else None
    optimizer = step.optimizer()
    if receiver is None or optimizer is None or source is None:
        return None
    frame = next((f for f in ctx.frames if f.f_code.co_filename == source.filename), None)
    if frame is None:
        return None
    values, changed = {**frame.f_globals, **frame.f_locals}, trained_by(optimizer)
    # The update this backward is for must be another optimizer's, training none of the stepped
    # weights: where the stepped optimizer steps again (option-critic's one `optim`), the term is
    # that update's own loss, and detaching it would stop what it trains.
    following = _next_optimizer(ctx, source, scope, failing)
    if following is None or following is optimizer or trained_by(following) & changed:
        return None
    for loss in sorted(src.names_read(receiver)):
        terms = []  # (term, the statement that adds it)
        for assignment in src.assignments(scope, loss):
            stmt = assignment.stmt
            if stmt.lineno >= failing.lineno:
                continue
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
                terms.extend((term, stmt) for _, term in split_loss.terms(stmt.value))
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                terms = [(term, stmt) for _, term in split_loss.terms(stmt.value)]
        if len(terms) < 2:
            continue
        reach = [any(isinstance(values.get(name), torch.Tensor) and parameters_under(values[name].grad_fn) & changed
                     for name in src.names_read(term)) for term, _ in terms]
        if reach.count(True) != 1 or not isinstance(terms[reach.index(True)][0], ast.Name):
            continue
        term, stmt = terms[reach.index(True)]
        return Fix(f"Detach `{term.id}` where line {stmt.lineno} adds it to `{loss}`: its graph goes through the "
                   f"weights `{ctx.call_site(step.filename, step.row, step.column).code}` (line {step.row}) "
                   f"stepped after it was built, and no other term of `{loss}` does (this update then trains "
                   f"without that term's gradient)", (replace_node(source, term, f"{term.id}.detach()"),), "unsafe")
    return None


def _next_optimizer(ctx, source, scope, failing):
    """The optimizer of the first `opt.step()` (or `scaler.step(opt)`) after `failing` in `scope`."""
    later = sorted((node for node in src.own_nodes(scope) if isinstance(node, ast.Expr)
                    and node.lineno > failing.end_lineno), key=lambda node: node.lineno)
    for stmt in later:
        call = src.call_named(stmt, "step")
        if call is None or not isinstance(call.func, ast.Attribute):
            continue
        held = ctx.lookup(src.canonical(call.args[0] if len(call.args) == 1 else call.func.value), source.filename)
        return held if isinstance(held, torch.optim.Optimizer) else None
    return None


def _summed_argument(stmt) -> tuple[ast.expr, list[ast.expr]] | None:
    """The one argument of the call `stmt` that is a sum (`quantile_loss + entropy_loss`), and
    its terms."""
    call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
    sums = [a for a in [*call.args, *(k.value for k in call.keywords)]
            if isinstance(a, ast.BinOp) and isinstance(a.op, ast.Add)] if call is not None else []
    parts = split_loss.terms(sums[0]) if len(sums) == 1 else []
    if not parts or any(sign < 0 for sign, _ in parts):
        return None
    return sums[0], [term for _, term in parts]


def _split_loss(ctx, source, scope, step: StepCall, failing) -> Fix | None:
    """`total_loss.backward(retain_graph=True); critic_optim.step(); total_loss.backward()`:
    when the terms of `total_loss` that reach the stepped optimizer's parameters reach none of
    the next optimizer's, and the other terms none of the stepped one's, each backward can take
    its own terms. Proven on the graph, so safe."""
    previous = ctx.previous
    receiver = src.call_receiver(failing, "backward")
    if previous is None or receiver is None or source is None or step.filename != source.filename:
        return None
    _, _, previous_stmt = ctx.site_statement(previous.filename, previous.row)
    first_receiver = src.call_receiver(previous_stmt, "backward") if previous_stmt is not None else None
    loss = src.canonical(receiver)
    if first_receiver is None or src.canonical(first_receiver) != loss or not loss.isidentifier():
        return None
    made = src.last_assignment(scope, loss, previous_stmt.lineno)
    if made is None or not isinstance(made.stmt, ast.Assign) or len(made.stmt.targets) != 1:
        return None
    parts = split_loss.terms(made.stmt.value)
    stepped = step.optimizer()
    following = recompute_forward.next_step_after(scope, failing.lineno)
    after = ctx.lookup(following, source.filename) if following else None
    if len(parts) < 2 or stepped is None or not isinstance(after, torch.optim.Optimizer):
        return None
    first_params, second_params = trained_by(stepped), trained_by(after)
    frame = next((f for f in ctx.frames if f.f_code.co_filename == source.filename), None)
    if frame is None:
        return None
    values = {**frame.f_globals, **frame.f_locals}
    first, second = [], []
    for sign, term in parts:
        reached = set()
        for name in src.names_read(term):
            value = values.get(name)
            if isinstance(value, torch.Tensor):
                reached |= parameters_under(value.grad_fn)
        if reached & first_params and reached & second_params:
            return None  # a term both optimizers train: splitting would change one's gradients
        (first if reached & first_params else second).append((sign, term))
    if not first or not second:
        return None
    optimizer = ctx.call_site(step.filename, step.row, step.column).code.rsplit(".step", 1)[0]
    names = split_loss.part_name(loss, optimizer), split_loss.part_name(loss, following)
    taken = {n.id for n in ast.walk(scope) if isinstance(n, ast.Name)}
    if names[0] == names[1] or taken & set(names):
        return None
    return split_loss.split_backward(source, made.stmt, loss, first, second, *names, first_receiver, receiver)


def _made_stale(ctx, stepped: set[int]):
    """Which statements a recompute must run again with the carrier: those that made a tensor
    whose graph holds weights the steps changed, or whose graph the previous backward freed;
    not a generator's `fake = gen(z)` that the discriminator's backward saw detached (run
    again, it would draw other samples)."""
    previous = ctx.previous
    previous_roots = [b.value.grad_fn for b in ctx.bound_roots(previous)] if previous is not None else []
    freed = None

    def stale(stmt: ast.stmt) -> bool:
        nonlocal freed
        targets = {src.canonical(t) for t in src.targets_of(stmt)}
        made = [b.value.grad_fn for b in ctx.bindings() if b.expression in targets and b.value.grad_fn is not None]
        if not made:
            return False
        if previous is None or not previous.retain_graph and not previous_roots:
            return True  # nothing tells what the previous backward freed
        if any(parameters_under(node) & stepped for node in made):
            return True
        if previous.retain_graph:
            return False
        if freed is None:
            freed = set(graph.walk(previous_roots).nodes)
        return any(id(node) in freed for node in made)
    return stale


def _recompute_reads_history(ctx, recompute: Fix) -> bool:
    """Whether the recomputed statements read a tensor with history that they do not make
    themselves (`total_loss = actor_loss + ...`): that graph still needs the retained one."""
    return bool(_outside_reads(ctx, recompute))


def _stale_reads(ctx, recompute: Fix, stepped: set[int]) -> list:
    """The tensors the recomputed statements read, without making them, whose history reaches a
    parameter the steps changed: recomputing only part of the loss would fail on them next
    (the actor's loss reads both critics' Q values, and both critics stepped)."""
    return [b for b in _outside_reads(ctx, recompute) if stepped & parameters_under(b.value.grad_fn)]


def _outside_reads(ctx, recompute: Fix) -> list:
    """The bindings, with history, of the names the recomputed statements read before they make
    them: `prior_loss = prior_loss / len(prior)` recomputed without the loop that summed
    `prior_loss` reads the old total, and its graph."""
    read, made = set(), set()
    for edit in recompute.edits:
        try:
            tree = src.parse_tree(textwrap.dedent(edit.content))
        except SyntaxError:
            return []
        for stmt in tree.body:
            loaded = src.names_read(stmt) | ({stmt.target.id} if isinstance(stmt, ast.AugAssign)
                                             and isinstance(stmt.target, ast.Name) else set())
            read |= loaded - made
            made |= src.names_bound([stmt])
    return _with_history(ctx, read)


def _with_history(ctx, names: set[str]) -> list:
    """The bindings of the plain names `names` (not an attribute or element of them) whose value
    has history."""
    return [b for b in ctx.bindings() if b.base in names and not b.steps and b.value.grad_fn is not None]


def _reads_history(ctx, located: Located) -> bool:
    """Whether the statement reads a tensor that has autograd history of its own."""
    value = src.value_of(located.store)
    if value is None:
        return True
    names = src.names_read(value)
    return any(b.base in names and not b.steps and b.value.grad_fn is not None
               for b in ctx.bindings())


def _parameter_name(ctx, parameter, step: StepCall | None) -> str | None:
    """The parameter as the innermost frame names it, unless that name comes from an argument
    of its function (`model` of `_optimize_step(self, losses, total_loss, model, opt)`): then
    as the caller named what it passed (`self.model.generator.goal_init`). Of the models a frame
    holds it under, the one `step`'s optimizer trains all of comes first: StyleTTS2's
    `model['wd']`, which `optimizer.step('wd')` updates, not the loss `wl` that also holds the
    frozen WavLM."""
    stepped = trained_by(step.optimizer()) if step is not None else set()
    names = []
    for expression, module, index in naming.module_bindings(ctx.frames):
        for dotted, candidate in module.named_parameters():
            if candidate is parameter:
                updated = bool(stepped) and all(id(p) in stepped for p in module.parameters())
                names.append((_passed_in(ctx, index, expression), index, not updated, len(expression),
                              naming.parameter_name(expression, dotted)))
    for binding in ctx.bindings():
        if binding.value is parameter:
            names.append((_passed_in(ctx, binding.frame_index, binding.expression), binding.frame_index, True, 99,
                          binding.expression))
    if not names:
        return None
    passed, index, _, _, name = min(names)
    return _as_the_caller_names(ctx, index, name) if passed else name


def _as_the_caller_names(ctx, index: int, expression: str) -> str:
    """`model.manager.weight`, where `model` is an argument of frame `index`'s function: the
    same path from the name a caller holds that object under (`self.model`), if one does."""
    root = expression.split(".")[0].split("[")[0]
    if root not in ctx.frames[index].f_locals:
        return expression
    value = ctx.frames[index].f_locals[root]
    for frame in ctx.frames[index + 1:]:
        for name, held in list(frame.f_locals.items()):
            if held is value:
                return name + expression[len(root):]
            if naming.is_user_object(held) and not isinstance(held, type):
                held_by = {**vars(held), **(held._modules if isinstance(held, torch.nn.Module) else {})}
                attribute = next((a for a, v in held_by.items() if v is value and not a.startswith("_")), None)
                if attribute is not None:
                    return f"{name}.{attribute}{expression[len(root):]}"
    return expression


def _passed_in(ctx, index: int, expression: str) -> bool:
    """Whether `expression` starts at an argument of frame `index`'s function other than `self`,
    with a caller's frame above it."""
    root = expression.split(".")[0].split("[")[0]
    return index + 1 < len(ctx.frames) and root not in ("self", "cls") and naming.is_argument(ctx.frames[index], root)


def _failing_saved(walk: graph.Walk) -> tuple[int | None, str | None]:
    """The node whose saved tensor fails the version check, in the engine's order."""
    order = sorted((k for k, s in walk.seq.items() if s != graph.LEAF_SEQ), key=lambda k: -walk.seq[k])
    for key in order:
        attribute = graph.changed_saved(walk.nodes[key])
        if attribute is not None:
            return key, attribute
    return None, None


def _intact_storages(node) -> set[int]:
    """The storages of the tensors `node` saved that still pass the version check."""
    intact = set()
    for attribute in graph.saved_attributes(node):
        try:
            value = getattr(node, attribute)
        except Exception:
            continue
        if isinstance(value, torch.Tensor):
            intact.add(value.untyped_storage().data_ptr())
    return intact


def _modified_parameter(walk: graph.Walk, failing_key: int | None, detail: InplaceDetail | None):
    numel = math.prod(detail.shape) if detail else None

    def matches(variable) -> bool:
        if variable is None:
            return False
        if detail is None:
            return True
        return variable._version == detail.version and variable.numel() == numel

    if failing_key is not None:
        node = walk.nodes[failing_key]
        found = [v for v in graph.input_leaves(node) if matches(v)]
        if len(found) > 1:
            # Both of `mm`'s inputs are [4, 8] at version 1 (one set so by its init): the one
            # whose saved tensor still reads back was not changed since.
            intact = _intact_storages(node)
            found = [v for v in found if v.untyped_storage().data_ptr() not in intact] or found
        return found[0] if found else None
    for node in walk.nodes.values():
        if graph.is_leaf(node) and matches(graph.leaf_variable(node)):
            return graph.leaf_variable(node)
    return None


def _step_for(steps, parameter) -> StepCall | None:
    if not steps:
        return None
    if parameter is not None:
        for step in reversed(steps):
            optimizer = step.optimizer()
            if optimizer is not None and any(p is parameter for g in optimizer.param_groups for p in g["params"]):
                return step
    return steps[-1]


def _reorder_step(ctx, source, scope, step: StepCall, failing) -> Fix | None:
    if source is None or failing is None or step.filename != source.filename:
        return None
    step_stmt = src.innermost_statement(scope, step.row)
    if step_stmt is None or not isinstance(step_stmt, ast.Expr) or step_stmt.lineno >= failing.lineno:
        return None
    if src.parent(step_stmt) is not src.parent(failing):
        return None
    edits = (delete_lines(source, step_stmt), insert_lines_after(source, failing, statement_text(source, step_stmt)))
    if _sees_the_same_gradients(ctx, source, step, step_stmt, failing):
        return Fix(f"Move `{source.segment(step_stmt)}` after this backward, the last one that needs the old "
                   f"weights: nothing between the two places gives its parameters gradients or clears them, so "
                   f"it steps with the same gradients", edits, "safe")
    return Fix(f"Move `{source.segment(step_stmt)}` after this backward, the last one that needs the "
               f"old weights (changes which gradients that step sees)", edits, "unsafe")


def _sees_the_same_gradients(ctx, source, step: StepCall, step_stmt, failing) -> bool:
    """joliGEN: `backward_f_s(); optimizer_f_s.step(); set_requires_grad(netf_s, False)`, then
    `loss_G.backward()` through the semantic net's old weights. Moved after that backward, the
    step applies what it applied where it was when no backward ran in between (the record), none
    of the calls recorded between zeroed its parameters' gradients, the failing backward gives
    none of them a gradient (those it reaches no longer require one: a parameter's gradient is
    accumulated only while it does), and no statement in between touches a `.grad`."""
    optimizer = step.optimizer()
    if not isinstance(optimizer, torch.optim.Optimizer) or ctx.zeroings is None or ctx.call is None \
            or not hooks.zeroings_recorded(optimizer):
        return False
    if any(step.tick < call.tick < ctx.call.tick for call in ctx.calls):
        return False
    if len(ctx.zeroings) >= hooks.ZEROINGS_KEPT and ctx.zeroings[0].tick > step.tick:
        return False  # the record may have lost a zeroing made since the step
    own = trained_by(optimizer)
    for zeroing in ctx.zeroings:
        owner = zeroing.owner()
        if step.tick < zeroing.tick < ctx.call.tick and (owner is None or not hooks.zeroings_recorded(owner) or (
                trained_by(owner) if isinstance(owner, torch.optim.Optimizer) else
                {id(p) for p in owner.parameters()}) & own):
            return False
    walked = graph.walk(ctx.root_nodes())
    if not walked.complete or any(graph.is_leaf(node) and id(graph.leaf_variable(node)) in own
                                  and graph.leaf_variable(node).requires_grad for node in walked.nodes.values()):
        return False
    block = src.enclosing_block(failing)
    at = {id(stmt): index for index, stmt in enumerate(block)}
    between = block[at[id(step_stmt)] + 1:at[id(failing)] + 1] if id(step_stmt) in at and id(failing) in at else None
    return between is not None and not any(isinstance(node, ast.Attribute) and node.attr == "grad"
                                           for stmt in between for node in ast.walk(stmt))


def _drop_repeated_step(ctx, source, scope, step: StepCall, failing) -> Fix | None:
    """Anomaly-Transformer's minimax: `loss1.backward(retain_graph=True); optimizer.step();
    loss2.backward(); optimizer.step()`. The second step can take loss1's gradients with loss2's:
    the first one goes, as the maintainers did, and one step follows both backward calls. The
    first step may be a helper's, called from here with the same `self` (3FabRec's
    `update_encoding(z)` steps `self.optimizer_E`, which the caller steps again after
    `loss.backward()`); a `zero_grad()` between the two backward calls that clears only the
    stepped optimizer's parameters goes too (3FabRec's `self.saae.Q.zero_grad()`), one that
    clears some of them and other weights as well leaves no such fix. Unsafe: the weights take
    one step, not two."""
    if source is None or failing is None or step.filename != source.filename or not isinstance(
            scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        return None
    step_stmt = src.innermost_statement(source.tree, step.row)
    stepped = update_receiver(step_stmt, "step") if step_stmt is not None else None
    optimizer = step.optimizer()
    if stepped is None or optimizer is None:
        return None
    where = _at_the_backward(ctx, source, scope) or Scope(source, scope, None, {})
    helper = src.enclosing_function(step_stmt)
    between = []  # the statements the first step's update runs through to the failing backward
    if helper is scope or helper is None and scope is source.tree:
        entry = step_stmt
    else:
        calls = [n for n in src.own_nodes(scope) if isinstance(n, ast.Call) and n.lineno < failing.lineno
                 and helper_called(n, scope) is helper]
        if helper is None or len(calls) != 1 or not stepped.startswith("self.") \
                or not isinstance(calls[0].func, ast.Attribute):
            return None  # only the same `self`'s optimizer is known to be the caller's too
        entry = src.innermost_statement(scope, calls[0].lineno)
        between = [n for n in src.own_nodes(helper) if isinstance(n, ast.stmt) and n.lineno > step_stmt.end_lineno]
    if entry is None or entry.end_lineno >= failing.lineno or not src.inside(failing, scope) \
            or src.loops_around(entry, scope) != src.loops_around(failing, scope):
        return None
    own = [n for n in src.own_nodes(scope) if isinstance(n, ast.stmt)]
    # The same optimizer's next step, known by the object it steps (`scaler.step(opt_d)` and
    # `scaler.step(opt_g)` share a receiver, not an optimizer).
    later = next((n for n in sorted(own, key=lambda n: n.lineno) if n.lineno > failing.end_lineno
                  and update_receiver(n, "step") == stepped and _stepped_optimizer(where, n) is optimizer), None)
    if later is None or src.loops_around(later, scope) != src.loops_around(failing, scope):
        return None
    between += [n for n in own if entry.end_lineno < n.lineno < failing.lineno]
    after = [n for n in own if failing.end_lineno < n.lineno < later.lineno]
    trained = trained_by(optimizer)
    dropped = []
    for stmt, drop in [*((n, True) for n in between), *((n, False) for n in after)]:
        receiver = update_receiver(stmt, "zero_grad")
        if receiver is None:
            continue
        cleared = _parameters_of(runtime_value(where, src.call_receiver(stmt, "zero_grad")))
        if receiver != stepped and cleared is not None and not cleared & trained:
            continue  # another model's gradients
        if not drop or receiver != stepped and (cleared is None or not cleared <= trained):
            return None  # it clears the gradients the one step needs, or other weights' too
        dropped.append(stmt)
    drops = "".join(f" and `{source.segment(z)}` (line {z.lineno})" for z in dropped)
    return Fix(f"Drop `{source.segment(step_stmt)}` (line {step_stmt.lineno}){drops}: `{stepped}` steps again after "
               f"this backward (line {later.lineno}), and that step then takes both losses' gradients in one update "
               f"(the weights take one step, not two)",
               (delete_lines(source, step_stmt), *(delete_lines(source, z) for z in dropped)), "unsafe")


def _stepped_optimizer(where: Scope, stmt: ast.stmt):
    """The optimizer `opt.step()` or `scaler.step(opt)` steps, as `where`'s values tell."""
    call = src.call_named(stmt, "step")
    if call is None or not isinstance(call.func, ast.Attribute):
        return None
    value = runtime_value(where, call.func.value)
    if not isinstance(value, torch.optim.Optimizer) and call.args:
        value = runtime_value(where, call.args[0])
    return value if isinstance(value, torch.optim.Optimizer) else None


def _parameters_of(value) -> set[int] | None:
    """The ids of the parameters whose gradients `value.zero_grad()` clears, an optimizer's or a
    module's; None where `value` is neither (or not known)."""
    if isinstance(value, torch.optim.Optimizer):
        return trained_by(value)
    if isinstance(value, torch.nn.Module):
        return {id(p) for p in value.parameters()}
    return None


def _step_after_the_loop(source, scope, step: StepCall, failing) -> Fix | None:
    """TextBox's `for i, (o, loss) in enumerate(zip(opt, losses)): o.zero_grad();
    loss.backward(retain_graph=...); o.step()`: the step of one pass changed weights the next
    loss's graph holds. Each optimizer steps after the loop instead, once every loss is
    back-propagated (`for o in opt: o.step()`), as TextBox did: it changes which gradients each
    step sees, so it is unsafe."""
    if source is None or failing is None or step.filename != source.filename:
        return None
    step_stmt = src.statement_at(scope, step.row, step.column)
    loop = next(iter(reversed(src.loops_around(failing))), None)
    optimizer = src.call_receiver(step_stmt, "step") if isinstance(step_stmt, ast.Expr) else None
    if loop is None or not isinstance(loop, ast.For) or not isinstance(optimizer, ast.Name) or loop.orelse \
            or not loop.body or loop.body[-1] is not step_stmt or failing.lineno >= step_stmt.lineno:
        return None
    optimizers = src.iterated_by(loop.target, loop.iter, optimizer.id)
    if optimizers is None:
        return None
    stepping = [f"for {optimizer.id} in {optimizers.id}:", *("    " + line for line in statement_text(source, step_stmt))]
    return Fix(f"Step the optimizers after the loop, once every loss is back-propagated: move "
               f"`{source.segment(step_stmt)}` (line {step_stmt.lineno}) into `for {optimizer.id} in "
               f"{optimizers.id}` after it (changes which gradients each step sees)",
               (delete_lines(source, step_stmt), insert_lines_after(source, loop, stepping)), "unsafe")


def _update_after(ctx, source, scope, step: StepCall, failing, steps) -> Fix | None:
    """`value_opt.zero_grad(); value_loss.backward(retain_graph=True); value_opt.step()`, then
    `action_loss.backward()` through the graph that step changed: the whole update of
    `value_opt`, from its `zero_grad()` to its `step()`, moves after the update this backward
    belongs to (after the next step), and this backward keeps the graph for it. Both gradients
    are then taken at the weights the graph was built with, each from its own loss (the moved
    `zero_grad()` clears what this backward left in `value_opt`'s parameters): each optimizer
    steps with the gradients the code meant it to, so the fix is safe where nothing between the
    two places writes in place and the moved backward needs no weight the other step changes.
    Where the moved loss reaches parameters of the optimizer that now steps first (the
    imagination the value model reads, made by the action model), its backward is kept to its
    own optimizer's parameters with `inputs=`."""
    if source is None or failing is None or step.filename != source.filename:
        return None
    step_stmt = src.innermost_statement(scope, step.row)
    call = src.call_named(failing, "backward")
    found = update_moved_after(src.enclosing_block(failing), step_stmt, failing) if call is not None else None
    if found is None:
        return None
    moved, end, anchor = found
    stepped = src.call_receiver(step_stmt, "step")
    backward = [c for stmt in moved for c in [src.call_named(stmt, "backward")] if c is not None]
    loss = _backward_loss(ctx, source, backward[0]) if len(backward) == 1 else None
    if loss is None:
        return None
    first_stepping = ctx.lookup(update_receiver(end, "step"), source.filename) if end is not failing else None
    if not isinstance(first_stepping, torch.optim.Optimizer) or step.optimizer() is None:
        return None
    # The moved update's steps: its own, or each of an ensemble's at the same row (REDQ's Q nets).
    moved_steps = [s for s in steps if (s.filename, s.row, s.column) == (step.filename, step.row, step.column)] \
        if isinstance(moved[-1], ast.For) else [step]
    if _stepped_elsewhere(ctx, moved_steps, steps):
        return None
    own, changed = optimizer_parameters(moved_steps), trained_by(first_stepping)
    if reads_on_the_way(loss.grad_fn, own, changed):
        return None  # the moved backward would still need weights the other step changed
    return reorder_updates.update_after(source, moved, end, call, stepped, backward[0],
                                        keep_to_own=bool(parameters_under(loss.grad_fn) & changed), anchor=anchor)


def _stepped_elsewhere(ctx, moved_steps: list[StepCall], steps) -> bool:
    """Whether a step other than `moved_steps` (another call, of another optimizer or of the same
    one) also changed weights this backward needs, since its graph was built: another critic's,
    or pranz24's SAC, which steps the critic once for each Q head's loss before the policy's
    backward goes through both heads. Moving one update alone would leave that step before the
    backward, and the error with it."""
    reached = set().union(*(parameters_under(root.grad_fn) for root in ctx.roots))
    moved_sites = {(s.filename, s.row, s.column) for s in moved_steps}
    return any((other.filename, other.row, other.column) not in moved_sites
               and trained_by(other.optimizer()) & reached for other in steps)


def _update_last(ctx, source, scope, step: StepCall, step_row: int | None, failing, steps) -> Fix | None:
    """StyleTTS2: the SLM discriminator's update (`optimizer.zero_grad(); d_loss_slm.backward();
    optimizer.step('wd')`) runs between the forward that made both of its losses and the
    generator's `loss_gen_lm.backward()`, which then fails on the discriminator's weights. The
    discriminator's update moves to the end of the loop's pass, after the generator's, as the
    maintainers moved it (`update_moved_to_the_end` reads which statements move and past
    what). Each backward then goes through the weights its graph was built with. Safe where the
    moved backward reaches only what its own optimizer trains, and none of the weights any other
    optimizer the program holds steps in the meantime; where the two graphs share no node (the
    generator's backward frees its own); and where what the moved backward left in gradients was
    cleared (a recorded zero_grad()) before this backward ran, or nothing after this backward
    reads those gradients (Dreamer's world model, whose update moves after the actor's and the
    value model's, each stepping its own weights), so every step sees the gradients it saw
    before. `step_row` is the row of `scope` that stepped (the user's
    `optimizer.step('wd')`, where the step itself ran in MultiOptimizer.step)."""
    if source is None or failing is None or step_row is None or step.filename != source.filename \
            or ctx.call is None or ctx.zeroings is None:
        return None
    step_stmt = src.statement_at(scope, step_row, step.column if step_row == step.row else None)
    block = src.enclosing_block(failing)
    found = update_moved_to_the_end(block, step_stmt, failing) if step_stmt is not None else None
    optimizer = step.optimizer()
    if found is None or not isinstance(optimizer, torch.optim.Optimizer) or _stepped_elsewhere(ctx, [step], steps):
        return None
    moved, prepended = found
    backward_calls = [node for stmt in moved for node in ast.walk(stmt)
                      if isinstance(node, ast.Call) and src.called_name(node) == "backward"]
    loss = _backward_loss(ctx, source, backward_calls[0])
    if loss is None or loss.grad_fn is None:
        return None
    reached, own = parameters_under(loss.grad_fn), trained_by(optimizer)
    others = set().union(*(trained_by(o) for o in held_optimizers(ctx.frames) if o is not optimizer))
    if not reached or not reached <= own or reads_on_the_way(loss.grad_fn, reached, others):
        return None
    rest = block[next(i for i, stmt in enumerate(block) if stmt is failing) + 1:]
    later = [_backward_loss(ctx, source, call) for stmt in rest for call in ast.walk(stmt)
             if isinstance(call, ast.Call) and src.called_name(call) == "backward"]
    if any(later_loss is None or later_loss.grad_fn is None for later_loss in later):
        return None
    theirs = graph.walk([loss.grad_fn])
    for roots in [ctx.root_nodes(), *([later_loss.grad_fn] for later_loss in later)]:
        # Neither this backward nor one after it may free a node of the moved one's graph.
        walked = graph.walk(roots)
        if not theirs.complete or not walked.complete or any(
                key in walked.nodes and not graph.is_leaf(node) for key, node in theirs.nodes.items()):
            return None
    if len(ctx.zeroings) >= hooks.ZEROINGS_KEPT and ctx.zeroings[0].tick > step.tick:
        return None  # the record may have lost a zeroing made since the step
    cleared: set[int] = set()
    for zeroing in ctx.zeroings:
        owner = zeroing.owner()
        if step.tick < zeroing.tick < ctx.call.tick and owner is not None and hooks.zeroings_recorded(owner):
            cleared |= _parameters_of(owner) or set()
    step_call = src.call_named(step_stmt, "step")
    if any(isinstance(node, ast.Call) and ast.dump(node) == ast.dump(step_call) for stmt in rest for node in ast.walk(stmt)):
        return None  # the same step again: moved after it, the two steps would run the other way round
    if not reached <= cleared and not _reads_no_gradient_of(ctx, source, scope, rest, reached - cleared, others):
        return None
    first, final = moved[0].lineno, moved[-1].end_lineno
    edits = reorder_updates.move_lines(source, moved, block[-1], after=True, lead=prepended)
    copied = f", with a copy of `{source.segment(prepended)}` before it" if prepended is not None else ""
    return Fix(f"Run the update that `{source.segment(step_stmt)}` ends (lines {first}-{final}) last in the loop's "
               f"pass{copied}, after line {block[-1].end_lineno}: this backward and the moved one then each go "
               f"through the weights their graph was built with, and every step sees the gradients it saw before",
               edits, "safe")


def _reads_no_gradient_of(ctx, source, scope, statements, parameters: set[int], others: set[int]) -> bool:
    """Whether `statements` (run after this backward) never read the gradients of `parameters`,
    which the moved update's backward left there (Dreamer's world model, whose update no
    `zero_grad()` follows): no `.grad` in them, their clips are of other tensors (as the frame
    holds them now: a list, or a generator already spent, which clips nothing), and no other
    optimizer trains them."""
    where = _at_the_backward(ctx, source, scope)
    if parameters & others or where is None:
        return False
    for node in (n for stmt in statements for n in ast.walk(stmt)):
        if isinstance(node, ast.Attribute) and node.attr == "grad":
            return False
        if isinstance(node, ast.Call) and src.called_name(node) in ("clip_grad_norm_", "clip_grad_value_"):
            clipped = _tensors_of(where, node.args[0]) if node.args else None
            if clipped is None or clipped & parameters:
                return False
    return True


def _at_the_backward(ctx, source, scope) -> Scope | None:
    """`scope` as the frame of `source` that runs the failing backward holds its values (its
    locals, globals and `self`); None where no such frame stands."""
    frame = next((f for f in ctx.frames if f.f_code.co_filename == source.filename
                  and ctx.call is not None and f.f_lineno == ctx.call.row), None)
    if frame is None:
        return None
    values = {**frame.f_globals, **frame.f_locals}
    return Scope(source, scope, values.get("self"), values)


def _tensors_of(where: Scope, expression: ast.expr) -> set[int] | None:
    """The ids of the tensors `expression` gives a clip, as `where`'s values hold them: a tensor,
    a list or tuple of them, `model.parameters()`, or a generator already spent (none); None
    where that cannot be told without running anything."""
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute) \
            and expression.func.attr == "parameters" and not expression.args and not expression.keywords:
        model = runtime_value(where, expression.func.value)
        return {id(p) for p in model.parameters()} if isinstance(model, torch.nn.Module) else None
    value = runtime_value(where, expression)
    if isinstance(value, torch.Tensor):
        return {id(value)}
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        return {id(v) for v in value}
    if inspect.isgenerator(value) and inspect.getgeneratorstate(value) == inspect.GEN_CLOSED:
        return set()
    return None


def _made_with_the_moved_loss(ctx, scope, failing) -> bool:
    """Whether this backward's loss and the one the previous backward went through were bound by
    one statement (StyleTTS2's `d_loss_slm, loss_gen_lm, y_pred = slm_out`): one forward made
    both, and the code means both gradients at the weights it ran with."""
    previous = ctx.previous
    call = src.call_named(failing, "backward")
    _, _, previous_stmt = ctx.site_statement(previous.filename, previous.row) if previous is not None \
        else (None, None, None)
    before = src.call_named(previous_stmt, "backward") if previous_stmt is not None else None
    if call is None or before is None or not isinstance(call.func, ast.Attribute) \
            or not isinstance(before.func, ast.Attribute):
        return False
    mine = src.last_assignment(scope, src.canonical(call.func.value), failing.lineno)
    theirs = src.last_assignment(scope, src.canonical(before.func.value), previous_stmt.lineno)
    return mine is not None and theirs is not None and mine.stmt is theirs.stmt


def _keep_to_own(ctx, source, step: StepCall, failing, steps) -> Fix | None:
    """InfoMax-VAE: `vae_loss.backward(retain_graph=True); optim_VAE.step()`, then the critic's
    `optim_D.zero_grad(); info_loss.backward(); optim_D.step()` fails on the encoder's weights.
    The critic's backward only has to reach the critic: kept to `optim_D`'s parameters
    (`inputs=`), as the maintainer did, it no longer needs the weights the step changed, and
    the critic's gradient is the one the code computed. Safe where the path to those parameters
    reads none of the weights that changed, and the gradients it no longer leaves in the other
    parameters were never used: each is trained by an optimizer of the loop that zeroes them
    before it steps them again, with no `.grad` read in between."""
    if source is None or failing is None or step.filename != source.filename:
        return None
    call = src.call_named(failing, "backward")
    if call is None or any(k.arg == "inputs" for k in call.keywords):
        return None
    own = step_after(failing)
    optimizer = ctx.lookup(own, source.filename) if own is not None else None
    loss = _backward_loss(ctx, source, call)
    if not isinstance(optimizer, torch.optim.Optimizer) or loss is None or loss.grad_fn is None:
        return None
    reached, stepped, changed = parameters_under(loss.grad_fn), trained_by(optimizer), optimizer_parameters(steps)
    if not reached & stepped or stepped & changed or reads_on_the_way(loss.grad_fn, stepped, changed):
        return None
    after = next_in_its_loop(failing)
    left = left_unused(ctx, after, source.filename, reached, own) if after is not None else None
    if left is None or left - stepped:
        return None  # gradients used later, or of tensors no optimizer of the loop zeroes
    return Fix(f"Keep `{source.segment(call)}` to the parameters `{own}` steps (`inputs=`), so it no longer goes "
               f"back through the weights `{ctx.call_site(step.filename, step.row, step.column).code}` "
               f"(line {step.row}) changed. The gradients it no longer leaves in other parameters were zeroed before "
               f"their next step: this optimizer's gradients are the ones the code computed",
               (graph_options.insert_keyword(source, call, graph_options.optimizers_inputs(own)),), "safe")


def _own_update_first(ctx, source, located: Located, steps, failing) -> tuple[Fix | None, bool]:
    """rlkit's SAC: the policy's loss is built, qf1 and qf2 step, then the policy's backward
    fails on the weights they changed. The policy's whole update (its `zero_grad()`, this
    backward, its `step()`) moves before the first of those updates, as rlkit did: its gradient
    is taken at the weights its graph was built with, as the code meant. Safe where the updates
    it moves past back-propagate losses that need none of the weights it steps, and each of them
    zeroes its optimizer's gradients before its backward (clearing what this backward left in
    their parameters). With it, whether this graph's forward ran before the forwards of every
    loss the moved-past updates back-propagate: the code built this loss first, and moving its
    update up keeps the order the forwards ran in (rlkit's fix), where a recompute would change
    what this loss is taken on."""
    if source is None or failing is None or located.source is not source:
        return None, False
    block = src.enclosing_block(located.store)
    at = {id(stmt): index for index, stmt in enumerate(block)}
    holder = _holding_if(failing, block)
    built, failed = at.get(id(located.store)), at.get(id(holder))
    if built is None or failed is None:
        return None, False

    def receiver(index: int, method: str) -> str | None:
        return update_receiver(block[index], method)

    if holder is failing:
        end = next((i for i in range(failed + 1, len(block)) if receiver(i, "step") is not None), None)
        own = receiver(end, "step") if end is not None else None
        start = next((i for i in range(failed - 1, built, -1) if receiver(i, "zero_grad") == own), None)
    else:
        # pg-is-all-you-need's SAC: the actor's whole update is an `if` (a delayed policy
        # update, its soft target update with it): the `if` moves, as the maintainers moved it.
        inner = src.enclosing_block(failing)
        own = step_after(failing)
        zeroes = any(update_receiver(stmt, "zero_grad") == own for stmt in inner if stmt.lineno < failing.lineno)
        end, start = failed, failed if own is not None and zeroes and only_updates(_branches(holder)) else None
    stepping = [i for i in range(built + 1, start or built) if receiver(i, "step") is not None]
    if own is None or start is None or not stepping \
            or {(step.filename, step.row) for step in steps} != {(source.filename, block[i].lineno) for i in stepping}:
        return None, False
    insert = next((i for i in range(built + 1, stepping[0]) if receiver(i, "zero_grad") == receiver(stepping[0], "step")),
                  None)
    moved, between = block[start:end + 1], block[insert:start] if insert is not None else []
    if insert is None or not only_updates(moved if holder is failing else []):
        return None, False
    bound_between, bound_moved = src.names_bound(between), src.names_bound(moved)
    if bound_between & {n for stmt in moved for n in src.names_read(stmt)} \
            or bound_moved & {n for stmt in between for n in src.names_read(stmt)}:
        return None, False
    stepped = trained_by(ctx.lookup(own, source.filename))
    if not stepped:
        return None, False
    # A moved `if` may also write weights no optimizer trains (a soft target update): the
    # losses it moves past may then reach only weights their own optimizers step.
    trained_between = set().union(*(trained_by(ctx.lookup(receiver(i, "step"), source.filename)) for i in stepping))
    zeroed, losses = set(), []
    for stmt in between:
        if update_receiver(stmt, "zero_grad") is not None:
            zeroed.add(update_receiver(stmt, "zero_grad"))
        call = src.call_named(stmt, "backward")
        if call is not None:
            loss = _backward_loss(ctx, source, call)
            later_step = next((receiver(i, "step") for i in stepping if block[i].lineno > stmt.lineno), None)
            if loss is None or loss.grad_fn is None \
                    or parameters_under(loss.grad_fn) & stepped or later_step not in zeroed \
                    or (holder is not failing and not parameters_under(loss.grad_fn) <= trained_between):
                return None, False
            losses.append(loss)
    first, final = moved[0].lineno, moved[-1].end_lineno
    edits = reorder_updates.move_lines(source, moved, block[insert])
    return Fix(f"Update `{own}` first: move its update (lines {first}-{final}) before "
               f"`{source.segment(block[insert])}` (line {block[insert].lineno}), so this backward takes its "
               f"gradient at the weights its graph was built with, before the other optimizers step them",
               edits, "safe"), _forward_ran_first(ctx, located, losses, failing.lineno)


def _holding_if(failing: ast.stmt, block: list[ast.stmt]) -> ast.stmt:
    """`failing` where it is a statement of `block`; else the `if` of `block` whose branches hold
    it as one of their own statements (not in a loop or a nested block); else `failing`."""
    holder = src.parent(failing)
    if isinstance(holder, ast.If) and any(stmt is holder for stmt in block) \
            and any(stmt is failing for stmt in _branches(holder)):
        return holder
    return failing


def _branches(statement: ast.If) -> list[ast.stmt]:
    return [*statement.body, *statement.orelse]


def _forward_ran_first(ctx, located: Located, losses: list, before: int) -> bool:
    """Whether every tensor bound in the carrier's scope that the `losses`' histories reach was
    assigned after the carrier's own statement (`q1_pred = self.qf1(obs, actions)` after
    `q_new_actions = torch.min(...)`). One forward shared by both (FiredUp's
    `_, q, q_pi = main(obs1, acts)`), or none found, is not."""
    reached: set[int] = set()
    for loss in losses:
        reached |= set(graph.walk([loss.grad_fn]).nodes)
    lines = []
    for binding in ctx.bindings():
        if binding.steps or binding.value.grad_fn is None or id(binding.value.grad_fn) not in reached \
                or ctx.frame_source(ctx.frames[binding.frame_index])[1] is not located.scope:
            continue
        made = src.last_assignment(located.scope, binding.base, before)
        if made is not None:
            lines.append(made.stmt.lineno)
    return bool(lines) and min(lines) > located.store.end_lineno


def _update_before_the_forward(ctx, source, located: Located, step: StepCall, steps, failing,
                               full: graph.Walk) -> Fix | None:
    """RN's inpainting GAN builds both losses, then runs `d_loss.backward();
    dis_optimizer.step(); dis_optimizer.zero_grad()`, and `g_loss.backward()` fails on the
    discriminator's weights that `g_fake = model.discriminator(prediction)` saved. The
    discriminator's update moves up, before that forward, as RN's maintainers did: the
    generator's loss is then built with the stepped discriminator, as after a recompute, and
    nothing runs twice. Safe where the moved statements read nothing made after the forward,
    the statements they move past run no update and read no gradient, and nothing those read
    that was made before the forward brings weights the step changes into this backward's graph
    (`full`)."""
    if source is None or failing is None or located.source is not source:
        return None
    block = src.enclosing_block(failing)
    at = {id(stmt): index for index, stmt in enumerate(block)}
    step_stmt = src.innermost_statement(located.scope, step.row)
    forward, stepped, failed = at.get(id(located.store)), at.get(id(step_stmt)), at.get(id(failing))
    if forward is None or stepped is None or failed is None or not forward < stepped < failed \
            or {(s.filename, s.row) for s in steps} != {(source.filename, step_stmt.lineno)}:
        return None
    own = update_receiver(step_stmt, "step")
    start, end = stepped, stepped
    while start - 1 > forward and only_updates([block[start - 1]]) and any(
            src.call_named(block[start - 1], name) is not None for name in UPDATE_CALLS):
        start -= 1
    while end + 1 < failed and update_receiver(block[end + 1], "zero_grad") == own:
        end += 1
    moved, between = block[start:end + 1], block[forward:start]
    if own is None or not any(src.call_named(stmt, "backward") is not None for stmt in moved):
        return None
    made_between = src.names_bound(between)
    if made_between & {n for stmt in moved for n in src.names_read(stmt)}:
        return None
    if _updates_or_reads_gradients(between):
        return None
    stepped_weights = trained_by(ctx.lookup(own, source.filename))
    read_between = {n for stmt in between for n in src.names_read(stmt)} - made_between
    if not stepped_weights or any(id(b.value.grad_fn) in full.nodes and parameters_under(b.value.grad_fn) & stepped_weights
                                  for b in _with_history(ctx, read_between)):
        return None
    first, final = moved[0].lineno, moved[-1].end_lineno
    edits = reorder_updates.move_lines(source, moved, located.store)
    return Fix(f"Update `{own}` before `{located.target_text}` is built: move its update (lines {first}-{final}) "
               f"before line {located.store.lineno}, so this backward goes through the weights that step made, "
               f"as after a recompute, with nothing run twice", edits, "safe")


def _updates_or_reads_gradients(statements) -> bool:
    """Whether `statements` run an update call (backward, step, zero_grad, clipping) or read a
    `.grad`: an update moved past them would change what they see."""
    return any(src.call_named(stmt, name) is not None for stmt in statements for name in UPDATE_CALLS) \
        or any(isinstance(n, ast.Attribute) and n.attr == "grad" for stmt in statements for n in ast.walk(stmt))


def _update_before_the_forward_in_its_method(ctx, source, scope, made: Located, built: Located | None,
                                             step: StepCall, steps, failing, stepped: set[int]) -> Fix | None:
    """BPPNet's DU_Net: `unet_loss, dis_loss, ... = DUNet.process(...)` (`made`) builds both
    losses, the unet's through the discriminator (`built`: `unet_fake = self.discriminator(outputs)`),
    then `DUNet.backward(unet_loss, dis_loss)` opens with `dis_loss.backward(retain_graph=True);
    self.dis_optimizer.step()`, and `unet_loss.backward()` fails on the discriminator's weights.
    The discriminator's update moves into `process`, before that forward, as BPPNet's
    maintainer did (`_update_before_the_forward` across the two methods of one object). Safe
    where the update opens the method and the caller calls that method right after the other,
    on the same object, each once in the file; the update reads only `self`, the module's names
    and parameters the caller passes from what `process` returns; and what `process` runs from
    the forward on updates nothing, reads no gradient, and reads no value made before it by a
    call of anything but a module whose weights the step leaves alone."""
    if built is None or source is None or built.source is not source or made.source is not source or not stepped \
            or not isinstance(scope, ast.FunctionDef) or not isinstance(built.scope, ast.FunctionDef) \
            or scope is built.scope or src.parent(scope) is not src.parent(built.scope) \
            or not isinstance(src.parent(scope), ast.ClassDef):
        return None
    maker, body = built.scope, scope.body
    step_stmt = src.innermost_statement(scope, step.row)
    if step_stmt not in body or failing not in body or src.enclosing_block(built.store) is not maker.body \
            or {(s.filename, s.row) for s in steps} != {(source.filename, step_stmt.lineno)}:
        return None
    stepped_at, end = body.index(step_stmt), body.index(step_stmt)
    own = update_receiver(step_stmt, "step")
    while end + 1 < body.index(failing) and update_receiver(body[end + 1], "zero_grad") == own:
        end += 1
    opens = 1 if src.is_docstring(body[0]) else 0  # the method's docstring stays where it is
    moved = body[opens:end + 1]
    if own is None or not only_updates(moved) or not any(src.call_named(s, "backward") for s in body[opens:stepped_at]) \
            or not all(any(src.call_named(s, name) for name in UPDATE_CALLS) for s in moved):
        return None
    # The caller: `a, b = obj.<maker>(...)`, then `obj.<this method>(...)`, the only calls of each.
    index = next((i for i, f in enumerate(ctx.frames) if f.f_code.co_name == scope.name
                  and f.f_code.co_firstlineno == scope.lineno and f.f_code.co_filename == source.filename), None)
    if index is None or index + 1 >= len(ctx.frames) or ctx.frames[index + 1].f_code.co_filename != source.filename:
        return None
    caller_frame = ctx.frames[index + 1]
    block = src.enclosing_block(made.store) if isinstance(made.store, ast.stmt) else []
    following = block[block.index(made.store) + 1] if made.store in block[:-1] else None
    call = following.value if isinstance(following, ast.Expr) else None
    assigned = made.store
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute) or call.func.attr != scope.name \
            or not following.lineno <= caller_frame.f_lineno <= following.end_lineno \
            or not isinstance(assigned, ast.Assign) or len(assigned.targets) != 1 \
            or not isinstance(assigned.targets[0], ast.Tuple) or not isinstance(assigned.value, ast.Call) \
            or not isinstance(assigned.value.func, ast.Attribute) or assigned.value.func.attr != maker.name \
            or src.canonical(assigned.value.func.value) != src.canonical(call.func.value):
        return None
    receiver = src.canonical(call.func.value)
    for method in (maker.name, scope.name):
        calls = [c for c in src.all_nodes(source.tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                 and c.func.attr == method and src.canonical(c.func.value) in (receiver, "self")]
        if len(calls) != 1:
            return None
    returns = [n for n in ast.walk(maker) if isinstance(n, ast.Return)]
    if len(returns) != 1 or returns[0] is not maker.body[-1] or not isinstance(returns[0].value, ast.Tuple):
        return None
    returned, unpacked = returns[0].value.elts, [src.canonical(t) for t in assigned.targets[0].elts]
    # Each parameter the update reads, as `process` names what it returns in its place.
    renamed = {}
    parameters = src.parameter_names(scope) - {"self"}
    for name in {n for stmt in moved for n in src.names_read(stmt)} & parameters:
        argument = src.argument_for(scope, call, name)
        while isinstance(argument, ast.Call) and isinstance(argument.func, ast.Attribute) \
                and argument.func.attr in ("to", "cuda", "cpu"):
            argument = argument.func.value  # moves the tensor, and passes its gradient back unchanged
        position = unpacked.index(argument.id) if isinstance(argument, ast.Name) and argument.id in unpacked else None
        if position is None or len(returned) != len(unpacked) or not isinstance(returned[position], ast.Name):
            return None
        renamed[name] = returned[position].id
    if any(n.split(".")[0] != "self" and src.is_local(scope, n.split(".")[0]) and n not in renamed
           for stmt in moved for n in src.names_read(stmt)):
        return None
    forward = maker.body.index(built.store)
    after = maker.body[forward:]
    if src.names_bound(after) & set(renamed.values()) \
            or _updates_or_reads_gradients(after):
        return None
    # What the forward and the statements after it read that was made before it, all the way
    # back: only modules whose weights the step leaves alone may have made it.
    ran = Scope(source, maker, ctx.frames[index].f_locals.get("self"))
    needed = {n.split(".")[0] for stmt in after for n in src.names_read(stmt)} - set(renamed.values())
    before = maker.body[:forward]
    for stmt in reversed(before):
        if not src.names_bound([stmt]) & needed:
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and not _leaves_alone(ran, node.func, stepped):
                return None
        needed |= {n.split(".")[0] for n in src.names_read(stmt)}
    lines = []
    for stmt in moved:
        for line in statement_text(source, stmt):
            for name, new in renamed.items():
                line = re.sub(rf"(?<![\w.]){re.escape(name)}(?!\w)", new, line)
            lines.append(line)
    edits = (*(delete_lines(source, stmt) for stmt in moved), insert_lines_before(source, built.store, lines))
    first, final = moved[0].lineno, moved[-1].end_lineno
    return Fix(f"Update `{own}` in `{maker.name}`, before `{built.target_text}` is built: move its update (lines "
               f"{first}-{final} of `{scope.name}`) before line {built.store.lineno}, so this backward goes "
               f"through the weights that step made, as after a recompute, with nothing run twice", edits, "safe")


def _leaves_alone(where: Scope, func: ast.expr, stepped: set[int]) -> bool:
    """Whether calling `func` can bring none of the `stepped` weights into a graph: a module
    with none of them, a value that is no Python function (torch's own, a class), or a tensor's
    method on a local of a function that has run (whose value is gone)."""
    value = runtime_value(where, func)
    if value is None:
        # `outputs.to(DEVICE)`; a local called itself may be a model.
        return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            and src.is_local(where.node, func.value.id) and hasattr(torch.Tensor, func.attr)
    if isinstance(value, torch.nn.Module):
        return not {id(p) for p in value.parameters()} & stepped
    return not (callable(value) and hasattr(value, "__code__") or hasattr(value, "__func__"))


def _own_update_first_through_helper(ctx, carrier: Candidate, steps) -> Fix | None:
    """spirl's SAC agent: `policy_loss = self._compute_policy_loss(...)`, the critics updated by
    `[self._perform_update(loss, opt, critic) for ... in zip(...)]`, then
    `self._perform_update(policy_loss, self.policy_opt, self.policy)` fails on the critics'
    weights its graph saved. The helper zeroes, back-propagates and steps: the policy's call
    moves before the first statement after its loss that runs a backward, as spirl did (its own
    update first, as `_own_update_first` does for an update written out). Safe where what the
    statements it moves past read needs none of the weights it steps, they do not name its
    optimizer or what it reads, and each backward among them runs through such a helper, which
    zeroes what this backward leaves in their parameters first."""
    located = carrier.located
    if located is None or not carrier.binding.frame_index:
        return None
    frame, source, scope = ctx.frames[carrier.binding.frame_index], located.source, located.scope
    moved = src.innermost_statement(scope, frame.f_lineno)
    if frame.f_code.co_filename != source.filename or not isinstance(moved, ast.Expr) \
            or not isinstance(moved.value, ast.Call):
        return None
    helper = helper_called(moved.value, scope)
    roles = whole_update(helper) if helper is not None else None
    if roles is None:
        return None
    optimizer = passed_arguments(helper, moved.value).get(roles[1])
    own = ctx.lookup(src.canonical(optimizer), source.filename) if optimizer is not None else None
    block = src.enclosing_block(moved)
    at = {id(stmt): index for index, stmt in enumerate(block)}
    built, failed = at.get(id(located.store)), at.get(id(moved))
    if not isinstance(own, torch.optim.Optimizer) or built is None or failed is None \
            or any(s.optimizer() is own for s in steps):
        return None
    insert = next((i for i in range(built + 1, failed) if any(runs_backward(n) for n in ast.walk(block[i]))), None)
    if insert is None:
        return None
    between = block[insert:failed]
    for node in (n for stmt in between for n in ast.walk(stmt)):
        if isinstance(node, ast.Call) and runs_backward(node):
            inner = helper_called(node, scope)
            if inner is None or whole_update(inner) is None:
                return None  # a backward that does not zero its optimizer's gradients first
    made_between = src.names_bound(between)
    named = {src.canonical(a) for a in moved.value.args} | {src.canonical(k.value) for k in moved.value.keywords}
    text = "\n".join(source.segment(stmt) for stmt in between)
    if src.names_read(moved) & made_between \
            or any(name and re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) for name in named):
        return None
    stepped = trained_by(own)
    read_between = {n for stmt in between for n in src.names_read(stmt)}
    if any(b.frame_index == carrier.binding.frame_index and parameters_under(b.value.grad_fn) & stepped
           for b in _with_history(ctx, read_between)):
        return None
    edits = (delete_lines(source, moved), insert_lines_before(source, block[insert], statement_text(source, moved)))
    return Fix(f"Update with `{source.segment(moved.value.func)}(...)` first: move `{source.segment(moved)}` "
               f"(line {moved.lineno}) before line {block[insert].lineno}, so this backward takes its gradient at "
               f"the weights its graph was built with, before the other updates step them", edits, "safe")


def _backward_loss(ctx, source, call: ast.Call) -> torch.Tensor | None:
    """The tensor that `call`, `loss.backward(...)`, back-propagates, as the frames hold `loss`."""
    if not isinstance(call.func, ast.Attribute):
        return None
    loss = ctx.lookup(src.canonical(call.func.value), source.filename)
    return loss if isinstance(loss, torch.Tensor) else None


def _kept_for_this_loss(ctx, scope, step: StepCall, failing) -> bool:
    """MorvanZhou's GAN: `D_loss` and `G_loss` are both made from one forward before
    `opt_D.step()`, and `D_loss.backward(retain_graph=True)` keeps the graph for `G_loss`: the
    code means both gradients at the weights the forward ran with (the maintainer's fix updates
    G first). A loss made after the step (SRGAN's `g_loss`, Dreamer's `action_loss`) means the
    stepped weights, and a recompute stays first there."""
    previous = ctx.previous
    call = src.call_named(failing, "backward")
    if previous is None or not previous.retain_graph or call is None or not isinstance(call.func, ast.Attribute) \
            or step.row >= failing.lineno:
        return False
    made = src.last_assignment(scope, src.canonical(call.func.value), failing.lineno)
    return made is not None and made.stmt.lineno < step.row


def _ascends_what_it_descended(ctx) -> bool:
    """`loss += loss_ood` back-propagated for the model, then `loss_w = -loss_ood` for the
    resampling weights: this backward's loss is the negation (or a multiple) of a term of the
    loss the previous backward went through. Two players of one objective, each meant to get
    its gradient at the same point, not the second at the weights the first one's step made."""
    previous = ctx.previous
    if previous is None or len(ctx.roots) != 1 or ctx.roots[0].grad_fn is None:
        return False
    node = ctx.roots[0].grad_fn
    inputs = [child for child, _ in graph.children(node) if child is not None]
    if type(node).__name__ not in ("NegBackward0", "MulBackward0") or len(inputs) != 1:
        return False
    frontier = [b.value.grad_fn for b in ctx.bound_roots(previous)]
    seen: set[int] = set()
    while frontier:
        sums = frontier.pop()
        if sums is inputs[0]:
            return True
        if type(sums).__name__ in ("AddBackward0", "SubBackward0") and id(sums) not in seen:
            seen.add(id(sums))
            frontier.extend(child for child, _ in graph.children(sums) if child is not None)
    return False


def _manual_update(ctx, source, scope, failing, parameter, parameter_name: str | None) -> StepCall | None:
    """A parameter updated by hand (`w -= lr * w.grad` under no_grad), read as a step at that line."""
    if source is None or failing is None:
        return None
    names = [b.expression for b in ctx.bindings() if b.value is parameter]
    for name in names + ([parameter_name] if parameter_name else []):
        change = _last_inplace_change(scope, name, failing.lineno)
        if change is not None:
            return StepCall(0, graph.LEAF_SEQ, lambda: None, source.filename, change.lineno)
    return None


def _changed_by_user(ctx, source, scope, failing, failing_key, detail: InplaceDetail | None) -> Finding | None:
    """No optimizer step explains the new version, and it is not a parameter: the user's own
    code changed the saved tensor in place (`h += 1`, `h.clamp_(0, 1)`, `h[mask] = 0`)."""
    if source is None or failing is None:
        return None
    for binding in _modified_bindings(ctx, failing_key, detail):
        if binding.frame_index != 0 and ctx.frames[binding.frame_index].f_code.co_filename != source.filename:
            continue
        name, where = binding.expression, source
        change = _last_inplace_change(scope, name, failing.lineno)
        fix = out_of_place.out_of_place(source, change, name) if change is not None else None
        read = None
        fixes = [fix]
        if change is None:
            # Module state written into in place in a method (`self.bank[idx] = feats` in forward).
            where, change, name, reads = _change_in_class(binding)
            if change is None:
                continue
            fixes = [out_of_place.replace_state(where, change, name)]
            read = _read_saved(reads, binding.value.numel() > math.prod(detail.shape)) if reads else None
            if read is not None and not binding.value.requires_grad:
                # MoCo's queue: the graph gets a copy where it reads the state, as upstream does.
                fixes.insert(0, out_of_place.copy_where_read(where, reads, name))
        code = where.segment(change)
        anchor = change.target if isinstance(change, ast.AugAssign) else change
        culprits = [culprit_at(name, where, node_start(where, anchor))]
        facts = (("change", code), *version_facts(detail))
        variant = "run-user"
        if read is not None:
            culprits.insert(0, culprit_at(name, where, node_start(where, read)))
            facts += (("read", read.lineno),)
            variant = "run-user-read"
        evidence = Evidence(name, CallSite(where.filename, change.lineno, code), ctx.backward_site(),
                            advice="not-the-cause", facts=facts)
        return finding("BX011", variant, "inplace-modified", evidence, culprits, fixes,
                       "certain" if detail is not None else "likely")
    return None


def _changed_by_its_backward(ctx, node, detail: InplaceDetail | None) -> Finding | None:
    """`(px_grad, py_grad) = ctx.saved_tensors`, then `px_grad *= ans_grad` in a custom
    Function's backward: the first backward changed what it saved, and a second one through the
    same graph (retain_graph=True) finds it changed. Scaling out of place keeps what was saved."""
    source, class_node = source_of_class(node._forward_cls)
    if class_node is None:
        return None
    methods = {m.name: m for m in class_node.body if isinstance(m, ast.FunctionDef)}
    backward, forward = methods.get("backward"), methods.get("forward")
    if backward is None or forward is None:
        return None
    saved = [src.canonical(t) for stmt in src.own_nodes(backward) if isinstance(stmt, ast.Assign)
             and src.canonical(stmt.value).endswith(".saved_tensors") for t in src.targets_of(stmt)]
    changes = [(stmt, name) for stmt in src.own_nodes(backward) if isinstance(stmt, ast.stmt)
               for name in saved if _writes_into(stmt, name)]
    save = next((call for call in ast.walk(forward) if isinstance(call, ast.Call)
                 and isinstance(call.func, ast.Attribute) and call.func.attr == "save_for_backward"), None)
    if not changes or save is None:
        return None
    first, name = changes[0]
    read = next((a for a in save.args if src.canonical(a) == name), save)
    code = source.segment(first)
    evidence = Evidence(name, CallSite(source.filename, first.lineno, code), ctx.backward_site(),
                        advice="not-the-cause", facts=(("change", code), ("read", save.lineno),
                                                       *version_facts(detail)))
    fixes = [out_of_place.out_of_place(source, stmt, changed) for stmt, changed in changes]
    fix = Fix(f"Scale {', '.join(f'`{n}`' for _, n in changes)} out of place in `{class_node.name}.backward`: "
              f"what `save_for_backward` saved stays as it was, for every backward through this graph",
              tuple(edit for f in fixes if f is not None for edit in f.edits)) if all(fixes) else None
    return finding("BX011", "run-user-read", "inplace-modified", evidence,
                   [culprit_at(name, source, node_start(source, read)), culprit_at(name, source, node_start(source, first))],
                   [fix], "certain" if detail is not None else "likely")


def _change_in_class(binding) -> tuple:
    """(source, statement, `self.<attribute>`, the statements that read it) where the class of
    the object holding `binding` writes into that attribute in place, or four Nones. The reads
    are those of one other method (not `__init__`), when only one reads it: the graph saved
    what it read there."""
    if binding.owner is None or not binding.steps or binding.steps[-1][0] != "attr":
        return None, None, None, None
    source, class_node = class_source(binding.owner)
    if class_node is None:
        return None, None, None, None
    name = f"self.{binding.steps[-1][1]}"
    methods = [m for m in class_node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    writes = [(method, node) for method in methods for node in src.own_nodes(method)
              if isinstance(node, ast.stmt) and _writes_into(node, name)]
    if not writes:
        return None, None, None, None
    writer, change = writes[-1]
    reads = {id(stmt): (method, stmt) for method in methods if method is not writer and method.name != "__init__"
             for read in src.reads(method, name)
             for stmt in [src.innermost_statement(method, read.lineno)]
             if stmt is not None and not _writes_into(stmt, name)}
    if len({id(method) for method, _ in reads.values()}) != 1:
        return source, change, name, []
    return source, change, name, sorted((stmt for _, stmt in reads.values()), key=lambda s: s.lineno)


def _read_saved(reads: list[ast.stmt], part: bool) -> ast.stmt | None:
    """Of the statements that read the state, the one whose value the graph saved: the only one,
    or, where the graph saved only `part` of the state, the only one that slices it
    (`self._embeddings[: self._pointer]`, not the whole buffer returned once it is full)."""
    if len(reads) == 1:
        return reads[0]
    if not part:
        return None
    sliced = [stmt for stmt in reads if any(isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                                            and isinstance(node.value, ast.Attribute) for node in ast.walk(stmt))]
    return sliced[0] if len(sliced) == 1 else None


def _modified_bindings(ctx, failing_key, detail: InplaceDetail | None) -> list:
    """The user's non-leaf tensors at the version the error reports, the shape it names: first
    the one the in-place op re-based onto the failing node (its grad_fn consumes that node)."""
    if detail is None:
        return []
    numel = math.prod(detail.shape)
    found = [b for b in ctx.bindings() if b.value._version == detail.version and b.value.numel() == numel
             and not (b.value.is_leaf and b.value.requires_grad)]
    if not found:
        # The graph saved a view of it, which shares its version (Quaterion's ring buffer, its
        # slice transposed by a matmul).
        found = [b for b in ctx.bindings() if b.value._version == detail.version and b.value.numel() > numel
                 and _may_view(b.value.shape, detail.shape) and not (b.value.is_leaf and b.value.requires_grad)]

    def rebased(binding) -> bool:
        grad_fn = binding.value.grad_fn
        if grad_fn is None or failing_key is None:
            return False
        return any(child is not None and id(child) == failing_key for child, _ in graph.children(grad_fn))

    return sorted(found, key=lambda b: not rebased(b))


def _may_view(shape, part) -> bool:
    """Whether a view of a tensor of `shape` can have the shape `part`: as many dimensions, each
    no longer than one of its own (a slice, then a transpose)."""
    return len(shape) == len(part) and all(a <= b for a, b in zip(sorted(part), sorted(shape)))


def _last_inplace_change(scope: ast.AST, name: str, before: int) -> ast.stmt | None:
    """The last statement above line `before` that writes into `name` without re-binding it."""
    found = None
    for node in src.own_nodes(scope):
        if not isinstance(node, ast.stmt) or node.lineno >= before:
            continue
        if _writes_into(node, name) and (found is None or node.lineno > found.lineno):
            found = node
    return found


def _writes_into(stmt: ast.stmt, name: str) -> bool:
    target = src.canonical(name)
    if isinstance(stmt, ast.AugAssign):
        return src.canonical(stmt.target) == target
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Subscript) and src.canonical(t.value) == target for t in stmt.targets)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        return (isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.endswith("__")
                and func.attr != "requires_grad_" and src.canonical(func.value) == target)
    return False
