"""A fix the engine offers must run: `soundness.runs` refuses edits that break the file or read a
name where it is not bound, and the runtime drops such fixes before the user sees them. The
graph tells freed history from history merely made before the last backward."""
from __future__ import annotations

import ast
import textwrap

import pytest
import torch

from explainer.fixes.soundness import runs, unbound_reads
from explainer.model import Edit, Fix, Location
from explainer.reading import source as src
from explainer.runtime import graph

SCRIPT = textwrap.dedent("""\
    import torch

    class Frame:
        def __init__(self, feat, y):
            self.feat, self.y = feat, y

        def __getitem__(self, index):
            return Frame(self.feat[index], self.y[index])

    def train(model, data):
        for x in data:
            out = model(x)
            out.sum().backward()
    """)


def _file(tmp_path, text=SCRIPT):
    path = tmp_path / "script.py"
    path.write_text(text)
    return str(path)


def _insert(filename, row, text):
    return Fix("insert", (Edit(filename, text, Location(row, 1), Location(row, 1)),))


def _replace_line(filename, row, text):
    return Fix("replace", (Edit(filename, text, Location(row, 1), Location(row + 1, 1)),))


def test_a_fix_that_reads_names_it_has_in_scope_runs(tmp_path):
    filename = _file(tmp_path)
    assert runs(_replace_line(filename, 12, "        out = model(x.detach())\n"))


def test_a_detach_inserted_before_the_name_exists_does_not_run(tmp_path):
    """`out = out.detach()` at the top of the loop body: `out` is first bound below it."""
    filename = _file(tmp_path)
    assert not runs(_insert(filename, 12, "        out = out.detach()\n"))


def test_an_expression_moved_where_its_names_are_not_bound_does_not_run(tmp_path):
    """`feat` and `y` are `__init__`'s parameters, unknown in `__getitem__`."""
    filename = _file(tmp_path)
    assert not runs(_replace_line(filename, 8, "        return Frame((feat, y)[0][index], y[index])\n"))


def test_a_method_left_without_a_body_does_not_run(tmp_path):
    filename = _file(tmp_path)
    assert not runs(Fix("delete", (Edit(filename, "", Location(5, 1), Location(6, 1)),)))


NESTED = textwrap.dedent("""\
    import torch

    scale = 2.0

    def train(model, data):
        total = 0.0

        def step(x):
            return model(x).sum() * scale + total

        for x in data:
            step(x).backward()
    """)


@pytest.mark.parametrize("row, text, ok", [
    (6, "", False),  # `total` goes from `train`, and `step`, defined in it, reads it
    (6, "    total = 0.0\n    unused = 1\n", True),
    (3, "", False),  # a module-level `scale` goes, which a function reads
    (12, "        step(x.detach()).backward()\n", True),
])
def test_only_the_reads_an_edit_can_change_are_looked_at_and_all_of_them_are(row, text, ok, tmp_path):
    """An edit inside a function can only change the reads of that function and of those it
    defines, so only those are compared (a long file's other methods are not walked again for
    every fix); an edit of the module's own statements can change any function's."""
    filename = _file(tmp_path, NESTED)
    assert runs(_replace_line(filename, row, text)) is ok


def test_a_fix_for_a_file_that_cannot_be_read_does_not_run(tmp_path):
    assert not runs(_insert(str(tmp_path / "gone.py"), 1, "x = 1\n"))


@pytest.mark.parametrize("code", [
    "total = sum(x * x for x in range(3))\nprint(total)\n",
    "f = lambda a, *b, c=1, **d: (a, b, c, d)\n",
    "def outer():\n    y = 1\n    def inner():\n        return y + z\n    return inner\nz = 2\n",
    "try:\n    import numpy as np\nexcept ImportError as error:\n    print(error)\n",
    "with open(__file__) as handle:\n    text = handle.read()\n",
    "if (n := 3) > 2:\n    print(n)\n",
    "class A:\n    size = 3\n    def method(self):\n        return self.size\n",
    "def f():\n    global counter\n    counter += 1\n",
])
def test_valid_python_has_no_unbound_reads(code):
    assert unbound_reads(src.parse("<case>", code).tree) == set()


def test_a_read_bound_only_later_in_the_loop_counts_in_the_file_itself():
    """Only the reads a fix adds count against it (the difference with the file's own), so the
    file's own loop-carried read is found, and a fix that leaves it alone is not blamed for it."""
    code = "for i in range(3):\n    if i:\n        print(previous)\n    previous = i\n"
    assert unbound_reads(src.parse("<case>", code).tree) == {("", "previous")}


def test_the_graph_tells_freed_history_from_history_that_is_only_older():
    weight = torch.randn(3, requires_grad=True)
    kept = (weight * 2).sin()
    freed = (weight * 3).sin()
    assert graph.freed(freed.grad_fn) is False
    freed.sum().backward()
    assert graph.freed(freed.grad_fn) is True
    assert graph.freed(kept.grad_fn) is False
    assert graph.freed_below([kept.sum().grad_fn]) is False
    # An addition saves no tensor: nothing to tell by, so the walk asks what is below it.
    assert graph.freed((weight + 1).grad_fn) is None
    assert graph.freed_below([(freed + 1).grad_fn]) is True
    # A weight stepped since the graph saved it fails the version check, but the graph is whole.
    matrix = torch.randn(3, 3, requires_grad=True)
    product = weight.unsqueeze(0) @ matrix
    with torch.no_grad():
        matrix += 1
    assert graph.freed(product.grad_fn) is False and graph.holds_freed([product.grad_fn]) is False
    assert graph.changed_saved(product.grad_fn) is not None


RECOMPUTED = textwrap.dedent("""\
    import torch

    def update(model, value_model, value_opt, x):
        states = torch.zeros(3, 2)
        for h in range(3):
            states[h] = model(x)
        values = value_model(states)
        values.sum().backward(retain_graph=True)
        value_opt.step()
        (values * 2).sum().backward()
    """)


@pytest.mark.parametrize("filled", [True, False], ids=["filled-by-a-loop", "made-whole"])
def test_a_recompute_never_copies_a_buffer_that_a_loop_filled(tmp_path, filled):
    """Recomputing `values` after the step needs `states` again: copying `states =
    torch.zeros(...)` without the loop that fills it would train on zeros (Dreamer's imagined
    states), so no recompute is offered then; made whole by one statement, it is."""
    from explainer.fixes.recompute_forward import recompute_before_use

    text = RECOMPUTED if filled else RECOMPUTED.replace(
        "    states = torch.zeros(3, 2)\n    for h in range(3):\n        states[h] = model(x)\n",
        "    states = model(x)\n")
    source = src.load(_file(tmp_path, text))
    function = next(n for n in source.tree.body if isinstance(n, ast.FunctionDef))
    carrier = next(s for s in function.body if isinstance(s, ast.Assign) and src.canonical(s.targets[0]) == "values")
    step_row = next(s.lineno for s in function.body if "value_opt.step" in source.segment(s))
    fix = recompute_before_use(source, function, carrier, step_row, function.body[-1], "recompute",
                               upstream=lambda stmt: True)
    assert (fix is None) == filled
    if not filled:
        assert "states = model(x)" in "".join(e.content for e in fix.edits)
