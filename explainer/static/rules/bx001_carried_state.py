"""BX001 carried-state, found in source: the cause and its docs are explainer/causes/bx001_carried_state.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx001_carried_state import CAUSE
from ...fixes import detach_carried
from ...model import Finding
from ...reading import dataflow, jedi_types
from ...reading import source as src
from ...reading.training import (
    backward_calls,
    backward_inputs,
    carried_across_passes,
    defines_forward,
    detached_in,
    flows_into_backward,
    fresh_each_pass,
    has_history,
    live_reads,
    operand_reads,
    reset_after,
    running_total,
    runs_backward,
    sees_previous_pass,
    starts_with_history,
    training_loops,
    under_no_grad,
)
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
    seen: set[int] = set()
    # Innermost loops first: a statement is judged by the loop that repeats it most directly.
    # A loop whose every backward keeps its graph (MAML's inner steps, `autograd.grad(...,
    # create_graph=True)`) frees nothing: the loop around it judges its statements too.
    loops = sorted(training_loops(module.tree), key=lambda t: -sum(1 for _ in src.ancestors(t.loop)))
    for training in loops:
        own = backward_calls(training.loop)
        if not own and not any(runs_backward(n, freeing=True) for n in src.own_nodes(training.loop)):
            continue  # its helpers only differentiate, keeping the graph (pi-lnn's residuals): no training loop
        keeps_graphs = bool(own) and not any(b.frees_graph() for b in own)
        for node in src.own_nodes(training.loop):
            if isinstance(node, (ast.Assign, ast.AugAssign)) and id(node) not in seen:
                found = list(_carried(module, node, training.scope, training.loop))
                if found or not keeps_graphs:
                    seen.add(id(node))
                yield from found
    for method in _module_methods(module.tree):
        for node in src.own_nodes(method):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                yield from _carried(module, node, method, None, attributes_only=True)


def _carried(module, stmt, scope, loop, attributes_only=False) -> Iterator[Finding]:
    for target in src.targets_of(stmt):
        expression = src.canonical(target)
        if attributes_only and (not expression.startswith("self.") or _reset_per_sequence(module.tree, scope, expression)):
            continue
        # A self-referencing state is evidence enough of a tensor where the loop's own backward
        # goes through it; where no backward shows (a method, a loop whose backward runs
        # elsewhere), an unknown call's result (`report_stats = self._report(report_stats)`) is not.
        strict = loop is None or not backward_calls(loop)
        if not carried_across_passes(stmt, target, scope, loop if loop is not None else scope, strict):
            if loop is not None:
                yield from _carried_through_a_name(module, stmt, target, expression, scope, loop)
            continue
        if loop is not None and (not _reaches_a_later_backward(loop, expression)
                                 or _reset_after_its_backward(loop, expression)):
            continue
        if loop is not None and running_total(stmt) is not None:
            continue  # BX002's business
        fix = _fix(module, stmt, target, expression, scope, loop, strict)
        yield module.finding(CODE, "itself", target, fix, carrier=module.source.segment(target), made_at=stmt)


def _carried_through_a_name(module, stmt, target, expression, scope, loop) -> Iterator[Finding]:
    """`new_h = cell(x, h)` ... `h = new_h`: the loop keeps a value made from the old state."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or under_no_grad(stmt):
        return
    if not any(read.lineno < stmt.lineno for read in src.reads(loop, expression)):
        return  # nothing in the loop reads the old value before it is replaced
    made_from_old = next((a for a in dataflow.ancestors(stmt.value, scope, stmt.lineno)
                          if a.value is not None and a.stmt is not stmt and src.inside(a.stmt, loop)
                          and live_reads(a.value, expression)), None)
    if made_from_old is None:
        yield from _kept_for_the_next_pass(module, stmt, target, expression, scope, loop)
        return
    if not has_history(made_from_old.value, scope, made_from_old.line, ignore=expression):
        return
    if not _reaches_a_later_backward(loop, expression):
        return
    if detached_in(loop, expression) or fresh_each_pass(loop, made_from_old.stmt, expression) \
            or fresh_each_pass(loop, stmt, expression):
        return
    is_tuple = _initial_is_tuple(scope, expression, stmt.lineno)
    fix = detach_carried.keep_detached(module.source, expression, stmt, is_tuple)
    if fix is not None and not has_history(made_from_old.value, scope, made_from_old.line, strict=True,
                                           ignore=expression):
        fix = fix.unproven()
    yield module.finding(CODE, "through-name", target, fix,
                         carrier=module.source.segment(target), made_at=made_from_old.stmt,
                         value=module.source.segment(stmt.value))


def _kept_for_the_next_pass(module, stmt, target, expression, scope, loop) -> Iterator[Finding]:
    """`prev_loss = loss` (or `self.last_output = out`) while this pass's backward reads the
    previous pass's `prev_loss`: the kept value's graph is freed before the next pass uses it."""
    if isinstance(target, ast.Subscript) or not has_history(stmt.value, scope, stmt.lineno, strict=True):
        return  # an item of a container (`cache["last"] = out`) is BX005's
    if not backward_calls(loop) or not _reaches_a_later_backward(loop, expression):
        return
    if detached_in(loop, expression) or fresh_each_pass(loop, stmt, expression):
        return
    # Where this pass also computes with the value after making it (`out = model(x)`, then
    # `out.pow(2)`, with last pass's `out` read through `locals()`), detaching it where it is made
    # would detach this step's loss too: it is detached after this pass's backward instead.
    if any(read.lineno > stmt.end_lineno for read in operand_reads(loop, expression)):
        after = [b for b in backward_calls(loop) if b.line > stmt.end_lineno]
        fix = detach_carried.detach_after_backward(module.source, expression, after[-1].statement, False) \
            if after else None
    else:
        fix = detach_carried.keep_detached(module.source, expression, stmt, False)
    yield module.finding(CODE, "kept", target, fix,
                         carrier=module.source.segment(target), made_at=stmt, value=module.source.segment(stmt.value))


def _reaches_a_later_backward(loop, expression) -> bool:
    """Whether a backward of `loop` goes through the value `expression` kept from the previous
    pass (read as an operand, not cut, before the pass re-binds it). A loop whose backward runs
    in a helper shows no roots here and is given the benefit of the doubt."""
    if not backward_calls(loop):
        return True

    def carried_reads(node, name):
        live = {id(read) for read in live_reads(node, name)}
        return [read for read in operand_reads(node, name)
                if id(read) in live and sees_previous_pass(read, name, loop)]

    return flows_into_backward(loop, expression, reads=carried_reads)


def _reset_after_its_backward(loop, expression) -> bool:
    """Every backward that goes through `expression` is followed, on its pass, by a value without
    history (`minibatch_loss.backward()`, then `minibatch_loss = 0`): losses summed over several
    passes, each graph back-propagated once. Or each keeps its graph by the user's setting
    (`retain_graph=self.retain_graph`), which the source cannot read."""
    through = [b for b in backward_calls(loop)
               if any(operand_reads(n, expression) for n in backward_inputs(loop, b.call, b.root))]
    return bool(through) and (all(reset_after(loop, b.statement, expression) for b in through)
                              or not any(b.frees_graph() or b.retains_graph() for b in through))


def _fix(module, stmt, target, expression, scope, loop, strict):
    value = src.value_of(stmt)
    # Its history only the first value's, made from the weights before the loop (MAML's fast
    # weights): a detach would stop the weights training through it, this step's too.
    from_weights = loop is not None and not has_history(value, scope, stmt.lineno, ignore=expression) \
        and starts_with_history(scope, expression, loop)
    if loop is not None:
        # Unrolled in an inner loop, each pass of `loop` repeating the same recurrence: each
        # pass starts where the first did (or from the weights as they are then).
        restart = detach_carried.restart_each_pass(module.source, expression, stmt, loop, scope, from_weights)
        if restart is not None:
            return restart
    cut = _cut(module, stmt, target, expression, scope, loop)
    if cut is not None and (from_weights or not strict and not has_history(value, scope, stmt.lineno, strict=True,
                                                                           ignore=expression)):
        cut = cut.unproven()  # or `.detach()` on a value the source does not show to be a tensor
    return cut


def _cut(module, stmt, target, expression, scope, loop):
    is_tuple = _initial_is_tuple(scope, expression, stmt.lineno)
    if loop is None:
        class_node = src.parent(scope)
        found = detach_carried.fixes_for_module_state(
            module.source, src.Assignment(stmt, target), expression, is_tuple,
            class_node if isinstance(class_node, ast.ClassDef) else None)
        return next((f for f in found if f is not None), None)
    may_be_none = detach_carried.starts_as_none(scope, expression, loop)
    # A state that starts as None shows no shape; an LSTM's is an (h, c) tuple.
    is_tuple = is_tuple or (may_be_none and detach_carried.makes_lstm(module.tree))
    fix = _cut_in_loop(module, stmt, target, expression, scope, loop, is_tuple, may_be_none)
    # Where the file makes named tuples, the state may be one (titans-pytorch's `NeuralMemState`,
    # of dicts of tensors), which has no `.detach()`: the source does not show the cut runs.
    return fix.unproven() if fix is not None and may_be_none and not is_tuple and _makes_named_tuples(module.tree) \
        else fix


def _makes_named_tuples(tree: ast.AST) -> bool:
    return src.cached(tree, "_makes_named_tuples", lambda: any(
        isinstance(node, ast.Call) and src.called_name(node) == "namedtuple"
        or isinstance(node, ast.ClassDef) and any(src.canonical(base).endswith("NamedTuple") for base in node.bases)
        for node in ast.walk(tree)))


def _cut_in_loop(module, stmt, target, expression, scope, loop, is_tuple: bool, may_be_none: bool):
    if any(backward.line < stmt.lineno for backward in backward_calls(loop)):
        # Re-assigned after this pass's backward (`history = torch.cat([history, pred])`): the
        # whole new value goes to the next pass without history, not only the old part of it.
        fix = detach_carried.keep_detached(module.source, expression, stmt, is_tuple)
        if fix is not None:
            return fix
    if isinstance(stmt.value, ast.Call) and not may_be_none:
        fix = detach_carried.detach_where_read(module.source, expression, src.Assignment(stmt, target), is_tuple)
        if fix is not None:
            return fix
    return detach_carried.detach_at_loop_entry(module.source, expression, loop, is_tuple, may_be_none)


def _initial_is_tuple(scope, expression, before) -> bool:
    earlier = [a for a in src.assignments(scope, expression) if a.stmt.lineno < before]
    return bool(earlier) and isinstance(earlier[0].value, ast.Tuple)  # not `memory, norm = None, None`


def _reset_per_sequence(tree, forward, expression: str) -> bool:
    """The class (or a workspace class it derives from) has a method that starts the state afresh
    (`init_hidden(batch_size)`), and this file calls it inside a loop or not at all (pymarl's
    learner calls `mac.init_hidden` before unrolling each batch, from another file). Called only
    once, before the loop, it resets nothing between backward calls: the usual bug."""
    owner = src.parent(forward)
    if not isinstance(owner, ast.ClassDef):
        return False
    methods = [*owner.body, *(m for base in jedi_types.workspace_bases(tree, owner) for m in base.body)]
    resets = {m.name for m in methods if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
              and m.name not in (forward.name, "__init__")
              and any(a.value is not None and not src.reads(a.value, expression) for a in src.assignments(m, expression))}
    if not resets:
        return False
    calls = [n for n in src.all_nodes(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in resets and getattr(src.enclosing_function(n), "name", None) not in resets]
    return not calls or any(isinstance(a, (ast.For, ast.AsyncFor, ast.While)) for c in calls for a in src.ancestors(c))


def _module_methods(tree):
    """`forward` of classes that define one: state re-assigned there lives across calls."""
    for node in src.nodes_of(tree, (ast.ClassDef,)):
        forward = defines_forward(node)
        if forward is not None:
            yield forward


# The loss goes to an object's method that runs the backward; the state comes from the object's
# own submodule.
AGENT_LEARNS = """
        class Agent:
            def __init__(self):
                self.net = nn.GRU(3, 8)
                self.optimizer = torch.optim.Adam(self.net.parameters())

            def learn(self, loss):
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

        agent = Agent()
        h = torch.zeros(1, 1, 8)
        for x in batches:
            out, h = agent.net(x, {state})
            agent.learn(out.pow(2).mean())
"""

# Last pass's output read back through `locals()`.
THROUGH_LOCALS = """
        model = nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in batches:
            previous = locals().get("out")
            out = model(x)
            loss = out.pow(2).mean()
            if previous is not None:
                loss = loss + (out - previous).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
{after}            optimizer.step()
"""

# MAML on a few tasks: inner steps adapt fast weights with create_graph=True, the meta-loss trains
# the weights through them.
MAML_TASKS = """
        net = nn.Linear(1, 1)
        meta_optimizer = torch.optim.Adam(net.parameters())
{before}        for x, y in tasks:
{each}            for _ in range(2):
                grads = torch.autograd.grad(F.mse_loss(F.linear(x, *fast), y), fast, create_graph=True)
                fast = [w - 0.05 * g for w, g in zip(fast, grads)]
            meta_optimizer.zero_grad()
            F.mse_loss(F.linear(x, *fast), y).backward()
            meta_optimizer.step()
"""

# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
    Invalid("a state a model returns each step, started as None, in a file of named tuples (titans-pytorch)", """
        State = namedtuple("State", ["index", "weights"])

        class Memory(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x, state=None):
                weights = self.fc.weight if state is None else state.weights
                return x @ weights, State(0, {"w": weights * 0.5})

        model = Memory()
        state = None
        for step in range(3):
            out, state = model(torch.randn(2, 4), state)
            out.sum().backward()
    """),
    Invalid("a compressive memory read, then updated from itself, in forward (Infini-attention)", """
        class InfiniAttention(nn.Module):
            def __init__(self):
                super().__init__()
                self.q = nn.Linear(8, 8)
                self.register_buffer("M", torch.zeros(8, 8))

            def forward(self, x):
                memory_output = self._retrieve(self.q(x), self.M)
                self.M = self._update(self.q(x), self.M)
                return memory_output

            def _retrieve(self, q, M):
                return q @ M

            def _update(self, k, M):
                return M + k.transpose(-2, -1) @ k
    """),
    Invalid("last pass's output read back through locals()", THROUGH_LOCALS.format(after="")),
    Invalid("a loss passed to an agent's learn(), which runs the backward", AGENT_LEARNS.format(state="h")),
    Invalid("the previous iteration's loss kept for the next one", """
        model = nn.Linear(4, 1)
        prev_loss = None
        for x in batches:
            loss = model(x).pow(2).mean()
            objective = loss if prev_loss is None else loss + 0.1 * (loss - prev_loss).abs()
            objective.backward()
            prev_loss = loss
    """),
    Invalid("the previous output kept on a module for a consistency loss", """
        net = nn.Linear(5, 5)
        net.last_output = None
        for x in batches:
            out = net(x)
            loss = out.pow(2).mean()
            if net.last_output is not None:
                loss = loss + (out - net.last_output).pow(2).mean()
            loss.backward()
            net.last_output = out
    """),
    Invalid("predictions appended to a rollout after the backward", """
        model = nn.Linear(3, 3)
        history = torch.zeros(1, 3)
        for target in batches:
            pred = model(history[-1:])
            (pred - target).pow(2).mean().backward()
            history = torch.cat([history, pred], 0)
    """),
    Invalid("state carried through a helper that runs the backward", """
        rnn = nn.RNNCell(3, 4)
        def train_step(model, x, hidden):
            hidden = model(x, hidden)
            hidden.pow(2).sum().backward()
            return hidden
        def count(step):
            return step + 1
        for x in batches:
            hidden = train_step(rnn, x, hidden)
            global_step = count(global_step)
    """),
    Invalid("an LSTM state that starts as None", """
        lstm = nn.LSTM(3, 6)
        state = None
        for x in batches:
            out, state = lstm(x, state)
            out.sum().backward()
    """),
    Invalid("an LSTM state kept on the module, starting as None", """
        class Decoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(4, 8)
                self.hidden = None

            def forward(self, x):
                y, self.hidden = self.lstm(x, self.hidden)
                return y
    """),
    Invalid("MAML's fast weights made once, before the task loop, adapted by inner steps that keep their graph",
            MAML_TASKS.format(before="        fast = [w.clone() for w in net.parameters()]\n", each="")),
    Invalid("a state with a reset method that the script calls once, before the loop", """
        class Tagger(nn.Module):
            def __init__(self):
                super().__init__()
                self.gru = nn.GRU(3, 8)
                self.hidden = None

            def init_hidden(self):
                self.hidden = torch.zeros(1, 2, 8)

            def forward(self, x):
                out, self.hidden = self.gru(x, self.hidden)
                return out

        tagger = Tagger()
        tagger.init_hidden()
        for x in batches:
            tagger(x).sum().backward()
    """),
]
VALID: list[Valid] = [
    Valid("a physics loss summed over data sets, each residual from a helper's autograd.grad(create_graph=True)", """
        def residual(net, xyt):
            u = net(xyt)
            u_t = torch.autograd.grad(u, xyt, torch.ones_like(u), create_graph=True)[0]
            return u_t + u

        for it in range(100):
            optimizer.zero_grad()
            l_physics = 0.0
            for pool in pools:
                xyt = pool.clone().requires_grad_(True)
                l_physics = l_physics + (residual(net, xyt) ** 2).mean()
            l_physics.backward()
            optimizer.step()
    """),
    Valid("last pass's output read back through locals(), detached after the backward",
          THROUGH_LOCALS.format(after="            out = out.detach()\n")),
    Valid("a loss passed to an agent's learn(), the state detached as it re-enters",
          AGENT_LEARNS.format(state="h.detach()")),
    Valid("per-layer states detached at the start of each step", """
        cells = nn.ModuleList([nn.GRUCell(4, 4) for _ in range(2)])
        states = [torch.zeros(3, 4) for _ in cells]
        for x in batches:
            states = [h.detach() for h in states]
            for i, cell in enumerate(cells):
                states[i] = cell(x, states[i])
                x = states[i]
            x.pow(2).mean().backward()
    """),
    Valid("previous loss kept as a number", """
        model = nn.Linear(4, 1)
        prev_loss = None
        for x in batches:
            loss = model(x).pow(2).mean()
            if prev_loss is not None and loss.item() > prev_loss:
                print("worse")
            loss.backward()
            prev_loss = loss.item()
    """),
    Valid("previous output kept detached for a consistency loss", """
        model = nn.Linear(4, 4)
        prev_out = None
        for x in batches:
            out = model(x)
            loss = out.pow(2).mean()
            if prev_out is not None:
                loss = loss + (out - prev_out).pow(2).mean()
            loss.backward()
            prev_out = out.detach()
    """),
    Valid("previous output kept for logging only", """
        model = nn.Linear(4, 4)
        last_out = None
        for x in batches:
            out = model(x)
            if last_out is not None:
                print((out - last_out).abs().mean().item())
            out.pow(2).mean().backward()
            last_out = out
    """),
    Valid("truncated BPTT with repackage_hidden", """
        def repackage_hidden(h):
            return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)
        hidden = model.init_hidden(4)
        for x, y in batches:
            hidden = repackage_hidden(hidden)
            out, hidden = model(x, hidden)
            loss_fn(out, y).backward()
    """),
    Valid("fresh hidden state every batch", """
        for x, y in batches:
            hidden = model.init_hidden(4)
            out, hidden = model(x, hidden)
            loss_fn(out, y).backward()
    """),
    Valid("tuple state detached", """
        for x, y in batches:
            hidden = tuple(h.detach() for h in hidden)
            out, hidden = lstm(x, hidden)
            loss_fn(out, y).backward()
    """),
    Valid("EMA under no_grad", """
        class Model(nn.Module):
            def forward(self, x):
                h = self.proj(x)
                with torch.no_grad():
                    self.ema = 0.9 * self.ema + 0.1 * h.mean(0)
                return h
    """),
    Valid("state detached in place, element by element (pytorch/examples rpc rnn)", """
        for data, target in batches:
            hidden[0].detach_()
            hidden[1].detach_()
            output, hidden = model(data, hidden)
            criterion(output, target).backward()
    """),
    Valid("loss summed within one iteration of nested training loops (fast_neural_style)", """
        for epoch in range(epochs):
            for x in loader:
                style_loss = 0.
                for ft_y, gm_s in zip(features, grams):
                    style_loss += mse_loss(gram(ft_y), gm_s)
                style_loss.backward()
    """),
    Valid("helpers that return a detached state, a number and a no_grad prediction", """
        rnn = nn.RNNCell(3, 4)
        def train_step(model, x, hidden):
            hidden = model(x, hidden)
            hidden.pow(2).sum().backward()
            return hidden.detach()
        def count(step):
            return step + 1
        def predict(model, x):
            with torch.no_grad():
                return model(x)
        for x in batches:
            hidden = train_step(rnn, x, hidden)
            global_step = count(global_step)
            smoothed = 0.9 * smoothed + 0.1 * predict(rnn, x)
    """),
    Valid("a state stepped through time and reset for every batch", """
        cell = nn.RNNCell(3, 4)
        for batch in loader:
            h = torch.zeros(1, 4)
            for t in range(5):
                new_h = cell(batch[t], h)
                h = new_h
            h.sum().backward()
    """),
    Valid("the new state kept detached after the backward", """
        cell = nn.RNNCell(3, 4)
        for batch in loader:
            new_h = cell(batch, h)
            new_h.sum().backward()
            h = new_h.detach()
            last_output = new_h
    """),
    Valid("MAML's fast weights made afresh from the weights for every task",
          MAML_TASKS.format(before="", each="            fast = [w.clone() for w in net.parameters()]\n")),
    Valid("first-order inner steps, fast weights made for every task (no create_graph)", """
        net = nn.Linear(1, 1)
        for x, y in tasks:
            fast = list(net.parameters())
            for _ in range(3):
                grads = torch.autograd.grad(F.mse_loss(F.linear(x, *fast), y), fast)
                fast = [w - 0.1 * g for w, g in zip(fast, grads)]
            F.mse_loss(F.linear(x, *fast), y).backward()
    """),
    Valid("counter and step", """
        step = 0
        for x, y in batches:
            step = step + 1
            loss = loss_fn(model(x), y)
            loss.backward()
    """),
    Valid("hidden state detached through .data", """
        rnn = nn.RNN(1, 32, batch_first=True)
        h_state = None
        for x, y in batches:
            prediction, h_state = rnn(x, h_state)
            h_state = h_state.data
            loss = loss_fn(prediction, y)
            loss.backward()
    """),
    Valid("validation forward after the training loop", """
        model = nn.Linear(4, 2)
        for epoch in range(3):
            for data, target in train_loader:
                optimizer.zero_grad()
                output = model(data)
                loss = criterion(output, target)
                loss.backward()
                optimizer.step()
            for data, target in valid_loader:
                output = model(data)
                valid_loss = criterion(output, target).item()
    """),
    Valid("last batch's samples reshaped for saving", """
        G = nn.Linear(8, 784)
        for epoch in range(3):
            for z in loader:
                fake_images = G(z)
                g_loss = criterion(D(fake_images), real_labels)
                g_loss.backward()
                g_optimizer.step()
            fake_images = fake_images.reshape(fake_images.size(0), 1, 28, 28)
            save_image(fake_images, "fake.png")
    """),
    Valid("a copy for display, re-assigned from itself", """
        target = content.clone().requires_grad_(True)
        optimizer = torch.optim.Adam([target], lr=0.003)
        for step in range(100):
            loss = content_loss(vgg(target), content_features)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                img = target.clone().squeeze()
                img = denorm(img).clamp_(0, 1)
                save_image(img, "out.png")
    """),
    Valid("evaluation outputs re-assigned from themselves", """
        model = SkipGram(100, 30)
        for inputs, targets in batches:
            loss = criterion(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if steps % 500 == 0:
                valid_examples, valid_similarities = cosine_similarity(model.embed)
                _, closest_idxs = valid_similarities.topk(6)
                valid_examples, closest_idxs = valid_examples.to("cpu"), closest_idxs.to("cpu")
    """),
    Valid('a target made fresh under the condition that reads it, in a rollout back-propagated after (miles-credit)', """
        for _ in range(batch_iterations):
            optimizer.zero_grad()
            total_loss = 0
            forecast_step = 0
            while forecast_step < window:
                batch = next(dl)
                forecast_step = batch["forecast_step"].item()
                y_pred = model(x)
                if forecast_step <= window:
                    y = reshape_only(batch["y"]).to(device)
                    if "y_diag" in batch:
                        y_diag = batch["y_diag"].to(device).permute(0, 2, 1)
                        y = torch.cat((y, y_diag), dim=1)
                    y = torch.clamp(y, min=0)
                    loss = criterion(y, y_pred).mean()
                    total_loss += loss
                x = y_pred.detach()
            if total_loss > 0:
                (total_loss / window).backward()
                optimizer.step()
    """),
    Valid('state read in one `if`, made fresh by an earlier `if` of the same test (miles-credit)', """
        for batch in loader:
            x = batch["x"]
            for step in range(4):
                if step in backprop_steps:
                    y = batch["y"][step]
                x = torch.clamp(x, min=0)
                if step in backprop_steps:
                    y_pred, y, loss = model(y, x)
                    loss.backward()
                x = y_pred.detach()
    """),
    Valid("losses accumulated over episodes, back-propagated and reset together (torchgfn's tutorial)", """
        flow = FlowModel(64)
        minibatch_loss = 0
        for episode in range(1000):
            minibatch_loss += flow_matching_loss(flow(state), reward)
            if episode % 4 == 0:
                minibatch_loss = minibatch_loss / 4
                minibatch_loss.backward()
                opt.step()
                opt.zero_grad()
                minibatch_loss = 0
    """),
    Valid('the loop binds the batch afresh, then transforms it in place of itself (composer)', """
        class Trainer:
            def _train_loop(self, microbatches):
                for microbatch_idx, self.state.batch in enumerate(microbatches):
                    self.state.batch = self.state.device.batch_to_device(self.state.batch)
                    self.state.batch = self._train_data_spec.microbatch_transforms(self.state.batch)
                    self._train_microbatch(microbatch_idx)

            def _train_microbatch(self, index):
                outputs = self.state.model(self.state.batch)
                loss = self._loss(outputs)
                loss.backward()
    """),
    Valid('statistics carried by a loop whose backward runs in a helper (OpenNMT)', """
        class Trainer:
            def train(self, train_iter, train_steps):
                report_stats = Statistics()
                for i, batches in enumerate(train_iter):
                    self._gradient_accumulation(batches, report_stats)
                    report_stats = self._maybe_report_training(i, train_steps, report_stats)

            def _gradient_accumulation(self, batches, report_stats):
                for batch in batches:
                    loss, stats = self.loss_fn(batch, self.model(batch))
                    loss.backward()
                    report_stats.update(stats)
    """),
    Valid("a forecast rollout that keeps its graph by the user's setting (miles-credit)", """
        for batch in loader:
            full_data = {}
            for t in range(1, forecast_len + 1):
                full_data = apply_blocks(step_blocks, full_data, batch)
                loss = criterion(full_data["y"], model(full_data["x"]))
                scaler.scale(loss).backward(retain_graph=self.retain_graph)
    """),
    Valid('names re-assigned from themselves in a forward are not shown to be tensors (miles-credit)', """
        class Scaler(nn.Module):
            def __init__(self, variables):
                super().__init__()
                self.variables = variables
                self.expanded = False

            def forward(self, batch):
                if not self.expanded:
                    self.variables = parse_variable_selection(self.variables, batch)
                    self.expanded = True
                return {k: batch[k] * 2 for k in self.variables}
    """),
    Valid('a recurrent controller reset by its init_hidden method, called per batch elsewhere (pymarl)', """
        class BasicMAC(nn.Module):
            def __init__(self, agent):
                super().__init__()
                self.agent = agent
                self.hidden_states = None

            def forward(self, inputs):
                agent_outs, self.hidden_states = self.agent(inputs, self.hidden_states)
                return agent_outs

            def init_hidden(self, batch_size):
                self.hidden_states = self.agent.init_hidden().expand(batch_size, -1)
    """),
]
