"""The explainer never makes a failure worse: the exception keeps its type, args and frames,
only a note is added; an internal failure is one short line; nothing is retained."""
from __future__ import annotations

import dataclasses
import gc
import inspect
import sys
import threading
import traceback
import weakref

import pytest
import torch

import explainer
from conftest import without_and_with_hooks
from explainer import notes
from explainer.render.text import RULE
from explainer.runtime import hooks, journal


@pytest.fixture
def installed():
    explainer.install()
    yield
    explainer.uninstall()


def carried_state_error(sentinels: list | None = None):
    """The canonical bug: `hidden` carried across iterations without detach."""
    rnn = torch.nn.RNN(2, 3)
    hidden = torch.zeros(1, 1, 3)
    for _ in range(2):
        out, hidden = rnn(torch.randn(4, 1, 2), hidden)
        loss = out.sum()
        if sentinels is not None:
            sentinels.extend([weakref.ref(out), weakref.ref(hidden), weakref.ref(loss)])
        loss.backward()


def capture(function, *args):
    try:
        function(*args)
    except BaseException as error:  # noqa: BLE001
        return error
    raise AssertionError("expected an error")


def user_frames(error: BaseException) -> list[tuple[str, str, int]]:
    return [(f.filename, f.name, f.lineno) for f in traceback.extract_tb(error.__traceback__)
            if "/explainer/" not in f.filename]


def test_explained_error_keeps_type_args_and_frames_and_gains_one_note(installed):
    explainer.uninstall()
    plain = capture(carried_state_error)
    explainer.install()
    explained = capture(carried_state_error)
    assert type(explained) is type(plain)
    assert explained.args == plain.args
    assert user_frames(explained) == user_frames(plain)
    assert (explained.__cause__, explained.__context__) == (plain.__cause__, plain.__context__)
    assert not hasattr(plain, "__notes__")
    (note,) = explained.__notes__
    assert note.startswith(RULE) and "`hidden`" in note


def test_the_frames_added_are_hidden_from_tracebacks(installed):
    error = capture(carried_state_error)
    added = [frame for frame, _ in traceback.walk_tb(error.__traceback__)
             if "/explainer/" in frame.f_code.co_filename]
    # `loss.backward()` passes the Tensor.backward hook, then autograd.backward's, which only
    # forwards the call.
    assert len(added) == 2 and all(f.f_locals.get("__tracebackhide__") is True for f in added)


def test_an_analysis_that_cannot_be_imported_is_one_short_line(installed, monkeypatch):
    """The analysis modules load on the first error; if they cannot (a broken install), the
    user's error still stands, with one line saying why it is not explained."""
    import explainer.runtime

    explainer.uninstall()
    plain = capture(carried_state_error)
    explainer.install()
    monkeypatch.delattr(explainer.runtime, "analysis")
    monkeypatch.setitem(sys.modules, "explainer.runtime.analysis", None)
    error = capture(carried_state_error)
    assert (type(error), error.args) == (type(plain), plain.args)
    assert error.__context__ is None and user_frames(error) == user_frames(plain)
    notes = getattr(error, "__notes__", [])
    assert len(notes) == 1 and notes[0].startswith("[explainer] could not explain this error (ModuleNotFoundError")


@pytest.mark.parametrize("stage", [
    "explainer.runtime.graph.walk",
    "explainer.runtime.naming.bindings",
    "explainer.reading.source.load",
    "explainer.fixes.detach_carried.detach_where_read",
    "explainer.render.text.render_note",
])
def test_an_internal_failure_is_one_short_line(installed, monkeypatch, stage):
    def broken(*args, **kwargs):
        raise ValueError("injected")

    monkeypatch.setattr(stage, broken)
    explainer.uninstall()
    plain = capture(carried_state_error)
    explainer.install()
    error = capture(carried_state_error)
    assert (type(error), error.args) == (type(plain), plain.args)
    assert user_frames(error) == user_frames(plain)
    notes = getattr(error, "__notes__", [])
    if stage.endswith("detach_where_read"):
        # a failing fix builder only costs that fix: the explanation still names the carrier
        assert len(notes) == 1
        return
    assert len(notes) == 1 and "\n" not in notes[0]
    assert notes[0].startswith("[explainer] could not explain this error (ValueError: injected)")


def test_errors_we_do_not_explain_are_untouched(installed):
    leaf = torch.ones(2, requires_grad=True)
    y = leaf * 2
    y.register_hook(lambda grad: (_ for _ in ()).throw(RuntimeError("from a hook")))
    error = capture(y.sum().backward)
    assert error.args == ("from a hook",)
    assert not hasattr(error, "__notes__")
    zero = capture(lambda: 1 / 0)
    assert not hasattr(zero, "__notes__")


def test_no_tensor_or_frame_is_kept_after_explaining(installed):
    sentinels: list = []

    def run():
        error = capture(carried_state_error, sentinels)
        assert error.__notes__
        return journal.finding_for(error)

    finding = run()
    gc.collect()
    assert finding is not None
    assert sentinels and all(ref() is None for ref in sentinels)
    assert _plain_data(finding)


def _plain_data(value) -> bool:
    if dataclasses.is_dataclass(value):
        return all(_plain_data(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, (list, tuple)):
        return all(_plain_data(v) for v in value)
    return isinstance(value, (str, int, float, bool, type(None)))


def test_install_is_idempotent_and_uninstall_restores_torch():
    originals = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad,
                 torch.nn.Module.load_state_dict)
    explainer.install()
    explainer.install()
    assert torch.autograd.backward.__wrapped__ is originals[1]
    assert torch.autograd.grad.__wrapped__ is originals[2]
    assert torch.Tensor.backward.__wrapped__ is originals[0]
    assert torch.nn.Module.load_state_dict.__wrapped__ is originals[3]
    assert [inspect.signature(f) for f in (torch.Tensor.backward, torch.autograd.backward,
                                           torch.autograd.grad)] == [inspect.signature(f) for f in originals[:3]]
    explainer.uninstall()
    explainer.uninstall()
    assert (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad,
            torch.nn.Module.load_state_dict) == originals
    assert not hooks.installed()


def test_load_state_dict_is_recorded_where_the_user_called_it_and_still_loads(installed):
    source, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    row = sys._getframe().f_lineno + 1
    result = target.load_state_dict(source.state_dict())
    assert result == torch.nn.Module.load_state_dict.__wrapped__(target, source.state_dict())
    assert torch.equal(target.weight, source.weight)
    load = hooks.recent_loads()[-1]
    assert (load.module(), load.filename, load.row) == (target, __file__, row)


def test_hooks_pass_every_argument_through_and_record_the_callers_line(installed):
    x = torch.ones(3, requires_grad=True)
    w = torch.ones(3, requires_grad=True)
    rows = [sys._getframe().f_lineno + 1]
    (x * w).sum().backward(inputs=[w])
    assert x.grad is None and torch.equal(w.grad, torch.ones(3))
    rows.append(sys._getframe().f_lineno + 1)
    torch.autograd.backward(tensors=(x * 2).sum(), grad_tensors=torch.tensor(3.0), inputs=x)
    assert torch.equal(x.grad, torch.full((3,), 6.0))
    rows.append(sys._getframe().f_lineno + 1)
    grads = torch.autograd.grad(outputs=(x * x).sum(), inputs=[x, w], allow_unused=True, create_graph=True)
    assert grads[1] is None and grads[0].requires_grad
    calls = hooks.recent_calls()[-3:]
    assert [(c.row, c.api, c.create_graph) for c in calls] == [
        (rows[0], "backward", False), (rows[1], "backward", False), (rows[2], "grad", True)]
    assert all(c.filename == __file__ for c in calls)


def _step_and_backward_elsewhere(optimizer, x) -> list[int]:
    rows = [sys._getframe().f_lineno + 1]
    optimizer.step()
    rows.append(sys._getframe().f_lineno + 1)
    (x * 2).sum().backward()
    return rows


def test_step_and_backward_sites_are_recorded_whichever_code_called_last(installed):
    """The hooks remember the last code object found to be the user's, to skip the file-name test;
    a step before any backward, and calls alternating between two functions, still get their own
    lines."""
    x = torch.ones(3, requires_grad=True)
    x.grad = torch.zeros(3)
    optimizer = torch.optim.SGD([x], lr=0.0)
    rows = [sys._getframe().f_lineno + 1]
    optimizer.step()
    rows += _step_and_backward_elsewhere(optimizer, x)
    rows.append(sys._getframe().f_lineno + 1)
    optimizer.step()
    rows.append(sys._getframe().f_lineno + 1)
    (x * 3).sum().backward()
    steps, calls = hooks.recent_steps()[-3:], hooks.recent_calls()[-2:]
    assert [s.row for s in steps] == [rows[0], rows[1], rows[3]]
    assert [c.row for c in calls] == [rows[2], rows[4]]
    assert all(record.filename == __file__ for record in steps + calls)


def test_any_signature_is_wrapped_faithfully():
    def original(self, first, /, second=2, *rest, retain_graph=None, create_graph=False, **extra):
        return (self, first, second, rest, retain_graph, create_graph, extra)

    wrapped = hooks._make_wrapper("test", "backward", "self", original)
    assert inspect.signature(wrapped) == inspect.signature(original)
    assert wrapped(1, 2, 3, 4, 5, create_graph=True, other=6) == (1, 2, 3, (4, 5), None, True, {"other": 6})
    assert wrapped(1, 2) == original(1, 2)


def test_an_unknown_signature_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.autograd, "grad", lambda outputs, inputs: None)
    assert notes.install_or_say_why_not() is False
    assert not hooks.installed()
    assert not hasattr(torch.autograd.backward, "__wrapped__") and not hasattr(torch.Tensor.backward, "__wrapped__")
    err = capsys.readouterr().err
    assert err.startswith("[explainer] not installed: unexpected signature") and err.count("\n") == 1


def test_hooks_step_aside_while_a_compile_session_runs_code(installed):
    """AOTAutograd calls autograd.grad itself while torch.compile compiles: those calls are not
    the user's and are not recorded (nor explained); once the session ends, recording resumes."""
    session = getattr(torch.compiler, "_compile_session_context", None)
    if session is None:
        pytest.skip("this torch has no compile-session flag")
    x = torch.ones(3, requires_grad=True)
    optimizer = torch.optim.SGD([x], lr=0.1)
    before = (len(hooks.recent_calls()), len(hooks.recent_steps()))
    with session():
        (x * 2).sum().backward()
        torch.autograd.grad((x * x).sum(), x)
        optimizer.step()
    assert (len(hooks.recent_calls()), len(hooks.recent_steps())) == before
    (x * 2).sum().backward()
    optimizer.step()
    assert (len(hooks.recent_calls()), len(hooks.recent_steps())) == (before[0] + 1, before[1] + 1)


def test_hooked_backward_returns_what_torch_returns(installed):
    x = torch.ones(3, requires_grad=True)
    (gx,) = torch.autograd.grad((x * x).sum(), x)
    assert torch.equal(gx, 2 * x.detach())
    assert (x * 3).sum().backward() is None
    torch.autograd.backward([(x * 2).sum()])
    assert torch.equal(x.grad, torch.full((3,), 5.0))


def test_threads_each_get_their_own_explanation(installed):
    errors = []

    def worker():
        errors.append(capture(carried_state_error))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 4
    assert all(len(e.__notes__) == 1 and "`hidden`" in e.__notes__[0] for e in errors)


def test_legitimate_retain_graph_gives_no_growth_warning(installed, recwarn):
    lin = torch.nn.Linear(3, 3)
    for _ in range(4):
        features = lin(torch.randn(2, 3))
        loss1, loss2 = features.sum(), features.pow(2).sum()
        loss1.backward(retain_graph=True)
        loss2.backward()
    assert not [w for w in recwarn if issubclass(w.category, notes.GraphGrowthWarning)]


def _one_sample_per_kind() -> list:
    import manifest

    chosen = {}
    for sample in manifest.samples():
        if sample.kind not in ("none", "graph-growth"):
            chosen.setdefault(sample.kind, sample)
    return list(chosen.values())


@pytest.mark.parametrize("sample", _one_sample_per_kind(), ids=lambda s: s.kind)
def test_every_kind_keeps_type_args_frames_cause_and_context(sample):
    """The real samples, run in this process without and with the hooks."""
    import runpy

    plain, explained = without_and_with_hooks(lambda: runpy.run_path(str(sample.path), run_name="__main__"))
    assert (type(explained), explained.args) == (type(plain), plain.args)
    assert user_frames(explained) == user_frames(plain)
    assert (repr(explained.__cause__), repr(explained.__context__)) == (repr(plain.__cause__), repr(plain.__context__))
    assert explained.__suppress_context__ == plain.__suppress_context__
    assert not hasattr(plain, "__notes__")
    (note,) = explained.__notes__
    from _device import DEVICE

    assert sample.kind in note and f"`{sample.culprit_on(DEVICE.type)}`" in note


def test_graph_growth_is_only_a_warning_and_changes_nothing_else():
    import runpy

    import manifest

    (sample,) = [s for s in manifest.samples() if s.kind == "graph-growth"]
    sys.path.insert(0, str(sample.path.parent))
    try:
        explainer.install()
        with pytest.warns(UserWarning, match="graph-growth") as caught:
            runpy.run_path(str(sample.path), run_name="__main__")
    finally:
        explainer.uninstall()
        sys.path.remove(str(sample.path.parent))
    assert [w for w in caught if "graph-growth" in str(w.message)]


def _hook_raising_from_a_cause():
    leaf = torch.ones(2, requires_grad=True)
    y = leaf * 2

    def hook(grad):
        try:
            {}["missing"]
        except KeyError as key_error:
            raise ValueError("clipping failed") from key_error

    y.register_hook(hook)
    y.sum().backward()


def _hook_raising_during_another_error():
    leaf = torch.ones(2, requires_grad=True)
    y = leaf * 2

    def hook(grad):
        try:
            raise OSError("disk full")
        except OSError:
            raise RuntimeError("while logging the gradient")  # noqa: B904 - implicit __context__

    y.register_hook(hook)
    y.sum().backward()


@pytest.mark.parametrize("scenario", [_hook_raising_from_a_cause, _hook_raising_during_another_error])
def test_errors_raised_inside_backward_hooks_are_untouched(scenario):
    plain, hooked = without_and_with_hooks(scenario)
    assert (type(hooked), hooked.args) == (type(plain), plain.args)
    assert user_frames(hooked) == user_frames(plain)
    assert (type(hooked.__cause__), getattr(hooked.__cause__, "args", None)) == \
        (type(plain.__cause__), getattr(plain.__cause__, "args", None))
    assert (type(hooked.__context__), hooked.__context__.args) == (type(plain.__context__), plain.__context__.args)
    assert hooked.__suppress_context__ == plain.__suppress_context__
    assert not hasattr(hooked, "__notes__")


def test_naming_reads_a_dict_only_as_far_as_its_first_entries():
    """A 10^7-entry vocabulary in the globals cost a second per explanation when its items were
    copied before the first MAX_ITEMS were taken."""
    from explainer.runtime import naming

    class Counted(dict):
        read = 0

        def items(self):
            for pair in super().items():
                Counted.read += 1
                yield pair

    table = Counted({i: 0.0 for i in range(10 * naming.MAX_ITEMS)})
    table[0] = torch.ones(1, requires_grad=True) * 2
    found = naming.bindings([sys._getframe()])
    assert any(b.expression == "table[0]" for b in found)
    assert Counted.read <= naming.MAX_ITEMS


def test_a_leaf_numbered_when_first_used_is_no_history_of_that_iteration():
    """torch 2.13 numbers a leaf's AccumulateGrad 2**64 - 1; a build that numbers it when the
    weight is first used would put it in the first iteration, and every graph that reaches the
    weights would seem to reach back there. The walk reads it as a leaf whatever its number, so
    the only stale history found is the node made before the mark."""
    from explainer.runtime import graph

    class AccumulateGrad:  # torch's node type is known by its name
        next_functions = ()

        def _sequence_nr(self):
            return 0

    class MulBackward0:
        def __init__(self, seq, *inputs):
            self.seq, self.next_functions = seq, tuple((node, 0) for node in inputs)

        def _sequence_nr(self):
            return self.seq

    weight = AccumulateGrad()
    old = MulBackward0(3, weight)
    new = MulBackward0(12, weight, old)
    graph.reset_budget()
    walked = graph.walk([new])
    assert graph.sequence(weight) == walked.seq[id(weight)] == graph.LEAF_SEQ
    assert graph.stale_boundary(walked, 10) == [id(old)]


def test_a_tensor_at_a_freed_roots_address_is_not_that_calls_root():
    """A call records its roots' ids. Pearl's critic `loss` was freed when its helper returned,
    and the actor's `q` took its address in some runs (PYTHONHASHSEED chose): `q` was read as
    the critic's loss and a shared `feat` (an int) named as the carrier. A root was made before
    its call; what was made after is not one, whatever its id."""
    from explainer.runtime.analysis.context import Context
    from explainer.runtime.records import BackwardCall

    weight = torch.ones(2, requires_grad=True)
    loss = (weight * 2).sum()
    mark = hooks._peek_sequence_nr()
    q = (weight * 3).sum()  # made after the call: at a freed root's address, it is no root

    def call(*tensors):
        return BackwardCall(1, mark, tuple(map(id, tensors)), __file__, 1, False, False, "backward")

    ctx = Context(None, [], [sys._getframe()], (), ())
    assert [b.expression for b in ctx.bound_roots(call(loss, q))] == ["loss"]
    assert ctx.bound_roots(call(q)) == []
