"""`%load_ext explainer` in a real ipykernel, driven through jupyter_client."""
from __future__ import annotations

import re

import pytest

from explainer import editor, handoff
from kernel_session import Kernel, explained_notebook, strip_ansi

pytestmark = pytest.mark.kernel

RNN_CELL = """
import torch
torch.manual_seed(0)
model = torch.nn.GRU(3, 5, batch_first=True)
head = torch.nn.Linear(5, 1)
opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
hidden = torch.zeros(1, 2, 5)
for step in range(3):
    out, hidden = model(torch.randn(2, 4, 3), hidden)
    loss = head(out).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def kernel():
    session = Kernel()
    yield session
    session.close()


def _normalise(traceback: list[str]) -> list[str]:
    return [re.sub(r"(Cell In\[)\d+(\])", r"\1N\2", strip_ansi(line)) for line in traceback]


def test_extension_explains_a_buggy_cell_and_leaves_other_errors_alone(kernel):
    before = kernel.run("1/0").of_type("error")[0]

    assert kernel.run("%load_ext explainer").status == "ok"
    buggy = kernel.run(RNN_CELL)
    assert buggy.status == "error"  # Run All still stops here
    assert buggy.reply["content"]["ename"] == "RuntimeError"
    # The error stays an error output, as IPython shows it, and the explanation follows it.
    assert [o["msg_type"] for o in buggy.outputs] == ["error", "display_data"]
    (error,) = buggy.of_type("error")
    assert error["ename"] == "RuntimeError" and "Trying to backward through the graph a second time" in error["evalue"]
    rows = {line.strip(): row for row, line in enumerate(RNN_CELL.lstrip("\n").splitlines(), 1)}
    shown = strip_ansi("\n".join(error["traceback"]))
    assert f"Cell In[{buggy.reply['content']['execution_count']}], line {rows['loss.backward()']}" in shown
    html = buggy.html()
    # The headline in plain words; the kind and the cause as tags.
    assert "<p><b><code>hidden</code> carries the graph of the previous iteration into this backward.</b></p>" in html
    assert '<span class="tag">second-backward</span> <span class="tag">BX001 carried-state</span>' in html
    # The marks are text too, for an untrusted notebook that drops the <style> block.
    culprit, backward = rows["out, hidden = model(torch.randn(2, 4, 3), hidden)"], rows["loss.backward()"]
    assert f'<span class="mark culprit">  hidden ▶ {culprit:>3}     out, hidden = model' in html, html
    assert f'<span class="mark call">backward ▶ {backward:>3}     loss.backward()' in html, html
    assert "hidden.detach()" in html  # the fix, as a diff
    assert "%explain --apply" in html
    assert "Traceback" not in html  # it is the error output's

    after = kernel.run("1/0").of_type("error")[0]
    assert (after["ename"], after["evalue"]) == (before["ename"], before["evalue"])
    assert _normalise(after["traceback"]) == _normalise(before["traceback"])

    unrelated = kernel.run("raise RuntimeError('not autograd')")
    assert unrelated.of_type("error")[0]["evalue"] == "not autograd"
    assert unrelated.html() == ""


def test_tb_and_explain_magics_after_an_explained_error(kernel):
    kernel.run("%load_ext explainer")
    kernel.run(RNN_CELL)
    tb = kernel.run("%tb")
    assert "Trying to backward through the graph a second time" in tb.text()

    again = kernel.run("%explain")
    assert "<code>hidden</code>" in again.html()

    applied = kernel.run("%explain --apply")
    payloads = applied.reply["content"].get("payload", [])
    next_inputs = [p["text"] for p in payloads if p.get("source") == "set_next_input"]
    assert next_inputs and "model(torch.randn(2, 4, 3), hidden.detach())" in next_inputs[0]


def test_the_explanation_names_cells_as_ipython_does(kernel):
    """`Cell In[5], line 8`, as IPython's traceback says, where the cell's file name
    (`4101939383.py:8`) once showed."""
    kernel.run("%load_ext explainer")
    buggy = kernel.run(RNN_CELL)
    count = buggy.reply["content"]["execution_count"]
    html = buggy.html()
    # IPython drops the cell's leading blank lines before numbering it, as its traceback does.
    row = next(i for i, line in enumerate(RNN_CELL.lstrip("\n").splitlines(), 1) if "out, hidden = model(" in line)
    assert f"<div>Cell In[{count}]</div>" in html, html
    assert f"re-assigned at Cell In[{count}], line {row}" in html, html  # the message
    assert f"Cell In[{count}], line {row}\n" in html, html  # the fix's diff
    assert not re.search(r"\b\d{6,}\.py", html)


def test_explain_after_an_unrelated_error_says_so_before_the_earlier_explanation(kernel):
    """`%explain` after a NameError once showed the last autograd explanation as if it were the
    NameError's."""
    kernel.run("%load_ext explainer")
    kernel.run(RNN_CELL)
    kernel.run("undefined_name")
    shown = kernel.run("%explain")
    assert "[explainer] the last error (NameError: name 'undefined_name' is not defined) is not an autograd " \
           "error this tool explains; the explanation of an earlier one follows." in shown.text()
    assert "<code>hidden</code>" in shown.html()


@pytest.mark.parametrize("broken", ["explainer.runtime.journal.finding_for", "explainer.ipython._show_explanation"])
def test_a_failing_handler_shows_the_error_and_stays_registered(kernel, broken):
    module, name = broken.rsplit(".", 1)
    kernel.run("%load_ext explainer")
    kernel.run(f"import {module} as patched\noriginal = patched.{name}\n"
               f"def failing(*args, **kwargs):\n    raise ValueError('injected')\npatched.{name} = failing")
    try:
        for _ in range(2):  # IPython drops a handler after its first failure: the second run shows it
            result = kernel.run(RNN_CELL)
            assert result.status == "error" and result.reply["content"]["ename"] == "RuntimeError"
            (error,) = result.of_type("error")
            assert "Trying to backward through the graph a second time" in error["evalue"]
            assert "[explainer] could not display the explanation (ValueError: injected)" in result.text()
            assert "unregistering" not in result.text() + "".join(error["traceback"])
        assert kernel.run("print(get_ipython().custom_exceptions)").text().strip() == "(<class 'RuntimeError'>,)"
    finally:
        kernel.run(f"patched.{name} = original")


def test_unload_restores_the_previous_handler(kernel):
    kernel.run("%load_ext explainer")
    kernel.run("%unload_ext explainer")
    state = kernel.run(
        "import torch\n"
        "print(get_ipython().custom_exceptions, torch.autograd.backward.__module__)"
    )
    assert state.text().strip() == "() torch.autograd"
    plain = kernel.run(RNN_CELL)
    assert plain.of_type("error") and plain.html() == ""
    assert "[explainer]" not in plain.text()


def test_post_mortem_explain_after_loading_late():
    session = Kernel()
    try:
        failed = session.run(RNN_CELL)
        assert failed.of_type("error")
        session.run("%load_ext explainer")
        late = session.run("%explain")
        html = late.html()
        assert "<code>hidden</code>" in html
        assert "likely" in html
    finally:
        session.close()


def test_a_cell_explained_in_the_kernel_reaches_the_editor_and_clears_once_fixed(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'notebooks'\n")
    kernel = Kernel(cwd=tmp_path, env={"EXPLAINER_HANDOFF": "1"})
    try:
        _hand_off_and_clear(kernel, tmp_path / ".explainer" / "findings.json")
    finally:
        kernel.close()


def _hand_off_and_clear(kernel, findings):
    assert kernel.run("%load_ext explainer").status == "ok"
    pid = int(kernel.run("import os; print(os.getpid())").text().strip())
    assert kernel.run(RNN_CELL).status == "error"
    (entry,) = [e for e in handoff.read(findings) if e.run == f"ipython:{pid}"]
    (cell_source,) = entry.cells.values()
    assert cell_source.strip() == RNN_CELL.strip()
    # The editor's notebook has that cell (and another); the finding lands on its culprit line.
    other = "import math"
    per_cell = editor.runtime_cell_findings([entry], [other, RNN_CELL], "notebook.ipynb")
    assert per_cell[0] == []
    (diagnostic,) = per_cell[1]
    culprit_row = RNN_CELL.splitlines().index("    out, hidden = model(torch.randn(2, 4, 3), hidden)") + 1
    assert (diagnostic.code, diagnostic.kind, diagnostic.cell, diagnostic.location.row) == \
        ("BX001", "second-backward", 2, culprit_row)
    # Its hover draws the boundary in the editor cell's rows (IPython ran the cell without its
    # leading blank line, one row up).
    backward_row = RNN_CELL.splitlines().index("    loss.backward()") + 1
    hover = " ".join(editor.hover_markdown(diagnostic).split())
    assert f"earlier ┊ {culprit_row} out, hidden = model(torch.randn(2, 4, 3), hidden) makes `hidden`" in hover
    assert f"now ┊ {backward_row} loss.backward() needs it" in hover
    # Edited in the editor: the finding no longer matches its line.
    edited = RNN_CELL.replace("model(torch.randn(2, 4, 3), hidden)", "model(torch.randn(2, 4, 3), hidden.detach())")
    assert editor.runtime_cell_findings([entry], [edited], "notebook.ipynb") == [[]]
    # Run clean in the kernel: the entry is gone.
    assert kernel.run(edited).status == "ok"
    assert not [e for e in handoff.read(findings) if e.run == f"ipython:{pid}"]


def test_a_saved_notebook_keeps_the_error_output_followed_by_the_explanation(tmp_path):
    """Saved as Jupyter saves it, the explained cell's output is an `error` (what nbconvert,
    GitHub and Run All read), then the explanation, which names the cell as IPython does."""
    nbformat = pytest.importorskip("nbformat")
    explained_notebook(tmp_path / "explained.ipynb")
    notebook = nbformat.read(str(tmp_path / "explained.ipynb"), as_version=4)
    nbformat.validate(notebook)
    loop = notebook.cells[-1]
    assert [o.output_type for o in loop.outputs] == ["error", "display_data"]
    error, explanation = loop.outputs
    assert error.ename == "RuntimeError" and "backward through the graph a second time" in error.evalue
    assert f"Cell In[{loop.execution_count}], line 5" in strip_ansi("\n".join(error.traceback))
    html = explanation.data["text/html"]
    assert f"<code>hidden</code>, re-assigned at Cell In[{loop.execution_count}], line 2," in html, html
    assert explanation.data["text/plain"].startswith("─")
    assert all(not cell.get("outputs") or cell is loop for cell in notebook.cells)
