"""The language server's incremental parsing (explainer/reading/reparse.py) gives, edit after
edit, the tree and the findings a full parse gives.

Each file of samples/ (ours, their twins and the real-world cases) is edited at random, 12 times
(seeded): lines inserted (plain, indented, an unclosed bracket, a backslash, `else:`, two
statements on one line...), deleted, changed or copied elsewhere. After each edit the text is
parsed whole and by the file's Reparser; the two trees must match node for node (fields and
positions, ast.walk order, parents, owning scopes, each scope's own nodes) and `check_text` must
find the same diagnostics either way. Edits that do not parse must fail both ways.
"""
from __future__ import annotations

import ast
import random

import pytest

from conftest import ROOT
from explainer.reading import linking
from explainer.reading import source as src
from explainer.reading.reparse import Reparser
from explainer.static.check import check_text

FILES = sorted((ROOT / "samples").glob("*.py")) + sorted((ROOT / "samples" / "real").glob("*.py"))
EDITS_PER_FILE = 12
INSERTED = ["\n", "x = 1\n", "    y = 2\n", "# note\n", "def g():\n", "    return h(a)\n", "else:\n", "z = (\n",
            ")\n", "a = 1; b = 2\n", "v = w \\\n", '"""\n', "@decorator\n", "class K:\n", "        loss.backward()\n",
            "    hidden = hidden.detach()\n"]


def edited(rng: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True)
    at = rng.randrange(len(lines) + 1)
    kind = rng.random()
    if kind < 0.25 and lines:
        del lines[at:at + rng.randint(1, 3)]
    elif kind < 0.55:
        lines.insert(at, rng.choice(INSERTED))
    elif kind < 0.8 and at < len(lines):
        lines[at] = lines[at].rstrip("\r\n") + rng.choice(["  # typed", " + 1", ")", ":", ""]) + "\n"
    elif lines:
        lines.insert(at, lines[rng.randrange(len(lines))])
    return "".join(lines)


def shape(tree: ast.Module) -> list[tuple]:
    """Everything linking gives a tree, node by node in all_nodes order, with other nodes named
    by their place in that order."""
    place = {id(node): i for i, node in enumerate(tree._nodes)}
    rows = [ast.dump(tree, include_attributes=True)]
    for node in tree._nodes:
        own = node.__dict__.get("_own_nodes") if isinstance(node, (ast.Module, *linking.SCOPES)) else None
        rows.append((type(node).__name__, getattr(node, "lineno", None), getattr(node, "col_offset", None),
                     place.get(id(getattr(node, "_parent", None))), place.get(id(node._owner)),
                     None if own is None else tuple(place[id(n)] for n in own)))
    rows.append(tuple(place[id(n)] for n in tree._indexed))
    return rows


def parsed_whole(path: str, text: str):
    try:
        return src.parse(path, text)
    except (SyntaxError, ValueError):
        return None


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT / "samples").as_posix())
def test_edit_after_edit_the_tree_and_findings_are_a_full_parse_s(path):
    rng = random.Random(path.name)
    text = path.read_text()
    reparser = Reparser()
    reused = 0
    try:
        reparser.parse(str(path), text)
        for _ in range(EDITS_PER_FILE):
            typed = edited(rng, text)
            whole = parsed_whole(str(path), typed)
            try:
                again = reparser.parse(str(path), typed)
            except (SyntaxError, ValueError):
                again = None
            assert (whole is None) == (again is None), typed
            if whole is None:
                continue  # the next edit starts again from the last text that parsed, as a user fixes a typo
            text = typed
            reused += reparser.last.startswith("reused")
            try:
                assert shape(again.tree) == shape(whole.tree), text
            finally:
                src.dispose(whole.tree)
            assert check_text(text, str(path), reparser=reparser) == check_text(text, str(path)), text
            assert not any("_remembered" in node.__dict__ for node in again.tree._nodes), "forgotten after the check"
    finally:
        reparser.close()
    assert reused, "no edit re-used the statements around it"


def test_an_edit_reparses_only_the_statement_it_is_in():
    lines = ["import torch\n", "\n"] + [f"def f{i}(x):\n    return x * {i}\n\n" for i in range(50)]
    text = "".join(lines)
    reparser = Reparser()
    first = reparser.parse("f.py", text)
    untouched = lambda tree: [s for s in tree.body if getattr(s, "name", "") != "f25"]  # noqa: E731
    kept = untouched(first.tree)
    inside = text.replace("return x * 25\n", "return x * 25 + 1\n")
    second = reparser.parse("f.py", inside)
    assert reparser.last == "reused 50 of 51"
    assert len(kept) == 50 and all(a is b for a, b in zip(kept, untouched(second.tree), strict=True))
    moved = reparser.parse("f.py", inside.replace("def f10(x):\n", "\n\ndef f10(x):\n"))
    assert reparser.last == "reused 51 of 51"  # blank lines: every statement below moves down
    assert [s.lineno for s in moved.tree.body] == [s.lineno for s in src.parse("f.py", moved.text).tree.body]
    reparser.close()


@pytest.mark.parametrize("before, after", [
    # An indented line after a def belongs to the def: only the whole file can say so.
    ("def f():\n    x = 1\n\ny = 2\n", "def f():\n    x = 1\n    z = 3\ny = 2\n"),
    # A backslash then a blank line ends the statement; a line typed there continues it.
    ("x = 1 \\\n\ny = 2\n", "x = 1 \\\n+ 2\ny = 2\n"),
    # Two statements on one line, one of them edited.
    ("a = 1; b = 2\nc = 3\n", "a = 1; b = 20\nc = 3\n"),
    # A bracket opened above the next statement swallows it.
    ("x = 1\ny = 2\n", "x = (1,\ny) = 2\n"),
])
def test_edits_that_join_statements_parse_as_the_whole_file_does(before, after):
    reparser = Reparser()
    reparser.parse("j.py", before)
    whole = parsed_whole("j.py", after)
    try:
        again = reparser.parse("j.py", after)
    except SyntaxError:
        again = None
    assert (whole is None) == (again is None)
    if whole is not None:
        assert ast.dump(again.tree, include_attributes=True) == ast.dump(whole.tree, include_attributes=True)
    reparser.close()


def test_mid_typing_syntax_errors_leave_the_last_text_that_parsed():
    reparser = Reparser()
    good = "import torch\n\ndef f(x):\n    return x\n\ny = f(1)\n"
    reparser.parse("m.py", good)
    with pytest.raises(SyntaxError):
        reparser.parse("m.py", good.replace("return x\n", "return (x\n"))
    again = reparser.parse("m.py", good.replace("return x\n", "return (x)\n"))
    assert reparser.last == "reused 2 of 3"
    assert ast.dump(again.tree) == ast.dump(ast.parse(again.text))
    reparser.close()


# What the rules learn from other statements must not outlive the edit that changes them: the
# value made before the loop carries history only while the helper returns the model's output,
# and the answer is remembered on `train`, a statement the edit does not touch.
HELPER = '''import torch

def make_state(model, x):
    return model(x)

def train():
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = make_state(model, torch.zeros(1, 3))
    for step in range(5):
        loss = (model(torch.ones(1, 3)) * state).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
'''
PLAIN = HELPER.replace("    return model(x)", "    return torch.zeros_like(x)")


def codes(text: str, reparser: Reparser | None) -> list[str]:
    return [d.code for d in check_text(text, "h.py", reparser=reparser)]


def test_findings_that_depend_on_another_statement_follow_its_edits():
    assert codes(HELPER, None) == ["BX004"] and codes(PLAIN, None) == []
    reparser = Reparser()
    assert codes(HELPER, reparser) == ["BX004"]
    assert codes(PLAIN, reparser) == [] and reparser.last == "reused 2 of 3"
    assert codes(HELPER, reparser) == ["BX004"] and reparser.last == "reused 2 of 3"
    reparser.close()


def test_without_forgetting_the_stale_answer_would_show(monkeypatch):
    """The test above can fail: when nothing is forgotten, `train` keeps the old answer."""
    monkeypatch.setattr(src, "forget", lambda scope: scope.__dict__.pop("_remembered", None))
    reparser = Reparser()
    assert codes(HELPER, reparser) == ["BX004"]
    assert codes(PLAIN, reparser) == ["BX004"]
    reparser.close()
