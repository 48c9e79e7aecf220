"""BX001 carried-state, found in source: the cause and its docs are explainer/causes/bx001_carried_state.py."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from ...causes.bx001_carried_state import CAUSE
from ...fixes import detach_carried
from ...model import Finding
from ...reading import dataflow
from ...reading import source as src
from ...reading.training import (
    backward_calls,
    carried_across_passes,
    defines_forward,
    detached_in,
    flows_into_backward,
    has_history,
    live_reads,
    operand_reads,
    reset_before,
    running_total,
    sees_previous_pass,
    training_loops,
    under_no_grad,
)
from ..cases import Invalid, Valid
from ..module import CheckedModule

CODE = CAUSE.code


def check(module: CheckedModule) -> Iterator[Finding]:
    seen: set[int] = set()
    # Innermost loops first: a statement is judged by the loop that repeats it most directly.
    loops = sorted(training_loops(module.tree), key=lambda t: -sum(1 for _ in src.ancestors(t.loop)))
    for training in loops:
        for node in src.own_nodes(training.loop):
            if isinstance(node, (ast.Assign, ast.AugAssign)) and id(node) not in seen:
                seen.add(id(node))
                yield from _carried(module, node, training.scope, training.loop)
    for method in _module_methods(module.tree):
        for node in src.own_nodes(method):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                yield from _carried(module, node, method, None, attributes_only=True)


def _carried(module, stmt, scope, loop, attributes_only=False) -> Iterator[Finding]:
    for target in src.targets_of(stmt):
        expression = src.canonical(target)
        if attributes_only and not expression.startswith("self."):
            continue
        if not carried_across_passes(stmt, target, scope, loop if loop is not None else scope):
            if loop is not None:
                yield from _carried_through_a_name(module, stmt, target, expression, scope, loop)
            continue
        if loop is not None and not _reaches_a_later_backward(loop, expression):
            continue
        if loop is not None and running_total(stmt) is not None:
            continue  # BX002's business
        fix = _fix(module, stmt, target, expression, scope, loop)
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
    if detached_in(loop, expression) or reset_before(loop, made_from_old.stmt, expression):
        return
    is_tuple = _initial_is_tuple(scope, expression, stmt.lineno)
    yield module.finding(CODE, "through-name", target,
                         detach_carried.keep_detached(module.source, expression, stmt, is_tuple),
                         carrier=module.source.segment(target), made_at=made_from_old.stmt,
                         value=module.source.segment(stmt.value))


def _kept_for_the_next_pass(module, stmt, target, expression, scope, loop) -> Iterator[Finding]:
    """`prev_loss = loss` (or `self.last_output = out`) while this pass's backward reads the
    previous pass's `prev_loss`: the kept value's graph is freed before the next pass uses it."""
    if not has_history(stmt.value, scope, stmt.lineno, strict=True):
        return
    if not backward_calls(loop) or not _reaches_a_later_backward(loop, expression):
        return
    if detached_in(loop, expression) or reset_before(loop, stmt, expression):
        return
    yield module.finding(CODE, "kept", target, detach_carried.keep_detached(module.source, expression, stmt, False),
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


def _fix(module, stmt, target, expression, scope, loop):
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
    return bool(earlier) and isinstance(src.value_of(earlier[0].stmt), ast.Tuple)


def _module_methods(tree):
    """`forward` of classes that define one: state re-assigned there lives across calls."""
    for node in src.all_nodes(tree):
        forward = defines_forward(node) if isinstance(node, ast.ClassDef) else None
        if forward is not None:
            yield forward


# Beyond the cause's Example and Use instead: bugs this rule must flag, and correct code it must
# leave alone (tests/test_causes.py runs both).
INVALID: list[Invalid] = [
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
]
VALID: list[Valid] = [
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
]
