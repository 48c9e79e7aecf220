"""Fuzzing `explainer check` (issue 6): whatever it reads, it never crashes or hangs.

The CI part: hypothesis over mutated samples, a small grammar, deep nesting, huge literals,
random bytes and notebooks (a few hundred examples, derandomized), the saved inputs that once
broke the checker (tests/fuzz_regressions/, with their expected exit codes), and the CLI's exit
code and one-line message for unreadable input. The long run is benchmarks/fuzz.py.

Every input goes through `check_paths`, what the CLI runs over paths; a failure is an exception,
an "internal error" line (the per-file boundary in check.py), a message that is not one line
about its file, a location that is not 1-based, or a check slower than BOUND_S.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from explainer.reading import source as src
from explainer.static.check import check_paths, check_text

_spec = importlib.util.spec_from_file_location("benchmarks_fuzz", ROOT / "benchmarks" / "fuzz.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

REGRESSIONS = ROOT / "tests" / "fuzz_regressions"
EXPECTED = json.loads((REGRESSIONS / "expected.json").read_text())
# Per file, on a loaded 2-core machine; the slowest of 100,000 fuzz inputs took about 5 s (a
# 1 MB string literal checked with --fix), the inputs here take well under a second.
BOUND_S = 10.0

FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_input(suffix: str, data: bytes, fix: bool = False) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"input{suffix}"
        path.write_bytes(data)
        parsed = fix and suffix == ".py" and fuzz._parses(data)
        started = time.perf_counter()
        report = check_paths([str(path)], fix=fix)
        seconds = time.perf_counter() - started
        assert seconds < BOUND_S, f"{seconds:.1f} s for {data[:200]!r}"
        problem = fuzz.problem_in(report, str(path), parsed, path)
        assert problem is None, f"{problem} for {data[:300]!r}"


# ---------------------------------------------------------------------------------------------
# Strategies

samples = st.sampled_from(fuzz.SAMPLE_TEXTS)


@st.composite
def mutated_samples(draw) -> bytes:
    """A sample truncated, with lines deleted, inserted, duplicated, bytes flipped, tokens inserted."""
    data = draw(samples).encode("utf-8")
    for _ in range(draw(st.integers(1, 4))):
        lines = data.splitlines(keepends=True) or [b""]
        at = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["truncate", "delete", "insert", "duplicate", "flip", "token", "indent"]))
        if op == "truncate":
            data = data[:draw(st.integers(0, len(data)))]
        elif op == "delete":
            del lines[at:at + draw(st.integers(1, 3))]
            data = b"".join(lines)
        elif op == "insert":
            lines.insert(at, draw(st.sampled_from(fuzz.SAMPLE_LINES)).encode("utf-8"))
            data = b"".join(lines)
        elif op == "duplicate":
            lines[at:at] = lines[at:at + draw(st.integers(1, 5))] * draw(st.integers(1, 3))
            data = b"".join(lines)
        elif op == "flip" and data:
            index = draw(st.integers(0, len(data) - 1))
            data = data[:index] + bytes([data[index] ^ (1 << draw(st.integers(0, 7)))]) + data[index + 1:]
        elif op == "token":
            index = draw(st.integers(0, len(data)))
            data = data[:index] + draw(st.sampled_from(fuzz.TOKENS)).encode("utf-8") + data[index:]
        else:
            lines[at] = b" " * draw(st.sampled_from([0, 1, 2, 4, 8])) + lines[at].lstrip(b" ")
            data = b"".join(lines)
    return data


names = st.sampled_from(["x", "h", "loss", "model", "self.state", "cache['prev']", "opt", "total", "torch"])
atoms = names | st.sampled_from(["1", "0.5", "None", "torch.zeros(3)", "torch.randn(2, requires_grad=True)"])
expressions = st.recursive(atoms, lambda inner: st.one_of(
    st.tuples(inner, st.sampled_from(["+", "*", "@", "-", "**"]), inner).map(" ".join),
    st.tuples(inner, st.sampled_from([".detach()", ".sum()", ".data", ".item()", "[0]"])).map("".join),
    st.tuples(st.sampled_from(["model", "torch.cat", "self.net", "rnn"]), st.lists(inner, max_size=3)).map(
        lambda t: f"{t[0]}({', '.join(t[1])})"),
    st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} if {t[1]} else {t[2]}"),
    inner.map(lambda e: f"-{e}"),
    inner.map(lambda e: f"[{e} for x in xs]"),
), max_leaves=12)
simple_statements = st.one_of(
    st.tuples(names, expressions).map(lambda t: f"{t[0]} = {t[1]}"),
    st.tuples(names, expressions).map(lambda t: f"{t[0]} += {t[1]}"),
    expressions.map(lambda e: f"{e}.backward()"),
    expressions.map(lambda e: f"states.append({e})"),
    expressions.map(lambda e: f"backward({e})"),  # from torch.autograd import backward
    st.sampled_from(["opt.step()", "opt.zero_grad()", "loss.backward(retain_graph=True)", "pass", "backward()",
                     "loss > backward()"]),
)
headers = st.sampled_from(["for x in data:", "while True:", "if x:", "with torch.no_grad():",
                           "def forward(self, x):", "class Net(nn.Module):", "def step(x, h=None):"])


@st.composite
def blocks(draw, depth: int = 0, indent: str = "") -> str:
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        if depth < 3 and draw(st.booleans()):
            lines.append(f"{indent}{draw(headers)}\n{draw(blocks(depth + 1, indent + '    '))}")
        else:
            lines.append(f"{indent}{draw(simple_statements)}\n")
    return "".join(lines)


programs = blocks(1, "    ").map(lambda body: f"import torch\nfor x in data:\n{body}    loss.backward()\n")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.sampled_from(fuzz.SAMPLE_LINES) | st.just("x = '\ud800'"),  # a lone surrogate
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["cells", "cell_type", "source", "metadata", "kernelspec", "language", "x"]), inner,
        max_size=4),
    max_leaves=15)
cells = st.fixed_dictionaries({
    "cell_type": st.sampled_from(["code", "code", "markdown", "raw"]) | json_values,
    "source": st.one_of(programs, mutated_samples().map(lambda b: b.decode("utf-8", "replace")),
                        st.sampled_from(["%matplotlib inline", "!ls", "%%bash\nls", "%%time\nloss.backward()",
                                         "model?", "def f(:"]),
                        st.lists(st.sampled_from(fuzz.SAMPLE_LINES), max_size=8), json_values),
    "metadata": st.just({}) | json_values,
})
notebooks = st.fixed_dictionaries({
    "cells": st.lists(cells | json_values, max_size=5) | json_values,
    "metadata": st.just({"kernelspec": {"language": "python"}}) | json_values,
    "nbformat": st.just(4),
}) | json_values


# ---------------------------------------------------------------------------------------------
# The checker in-process


@FUZZ
@given(mutated_samples(), st.booleans())
def test_mutated_samples(data, fix):
    check_input(".py", data, fix)


@FUZZ
@given(programs)
def test_generated_programs(text):
    check_input(".py", text.encode("utf-8"), fix=True)
    try:
        check_text(text, "generated.py")
    except (SyntaxError, ValueError):  # the only ways check_text says "does not parse"
        pass


@settings(FUZZ, max_examples=25)
@given(st.sampled_from([*fuzz.CHAINS, "blocks"]), st.integers(1, 3500), st.sampled_from(["loop", "module"]))
def test_deep_nesting(shape, depth, where):
    depth = min(depth, {"blocks": 110, "parens": 210, "lists": 210, "calls": 210}.get(shape, depth))
    check_input(".py", fuzz.deep_source(shape, depth, where).encode("utf-8"))


@settings(FUZZ, max_examples=20)
@given(st.one_of(
    st.integers(4290, 4310).map(lambda n: "9" * n),
    st.integers(0, 200_000).map(lambda n: repr("x" * n)),
    st.integers(0, 20_000).map(lambda n: "[" + ", ".join(["1"] * n) + "]"),
    st.sampled_from(["1e999", "0x" + "f" * 5000, "b'" + "\\x00" * 10_000 + "'"]),
))
def test_huge_literals(literal):
    check_input(".py", f"for x in data:\n    h = {literal}\n    h.backward()\n".encode("utf-8"), fix=True)


@FUZZ
@given(st.binary(max_size=500), st.none() | st.sampled_from(fuzz.ENCODINGS), st.sampled_from([".py", ".ipynb"]))
def test_random_bytes(data, encoding, suffix):
    if encoding is not None:
        data = f"# -*- coding: {encoding} -*-\n".encode("ascii") + data
    check_input(suffix, data)


@FUZZ
@given(notebooks, st.sampled_from(["whole", "truncated", "non-utf-8"]), st.booleans(), st.data())
def test_notebooks(document, damage, fix, data):
    raw = json.dumps(document, indent=1, ensure_ascii=data.draw(st.booleans())).encode("utf-8", "surrogatepass")
    if damage == "truncated":
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    elif damage == "non-utf-8":
        raw = raw.replace(b"x", b"\xff", 1)
    check_input(".ipynb", raw, fix)


@pytest.mark.parametrize("shape", sorted(fuzz.CHAINS))
def test_chains_at_the_depth_cap_check_in_a_worker_thread(shape):
    """The language server checks in threads (asyncio.to_thread): the recursion headroom for
    trees up to src.MAX_DEPTH must fit a thread's stack too."""
    depth = {"parens": 199, "lists": 199, "calls": 199}.get(shape, src.MAX_DEPTH - 10)
    text = fuzz.deep_source(shape, depth, "loop")
    outcome = []

    def run():
        try:
            check_text(text, "deep.py")
            outcome.append("checked")
        except SyntaxError as error:  # Python refuses some shapes sooner (`lambda: lambda: ...`)
            outcome.append(f"refused: {error.msg}")
        except BaseException as error:  # noqa: BLE001 (reported below)
            outcome.append(f"{type(error).__name__}: {error}")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert outcome and (outcome[0] == "checked" or outcome[0].startswith("refused")), outcome
    limit = sys.getrecursionlimit()
    assert limit < 2000, f"recursion limit left raised: {limit}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_saved_inputs_that_once_broke_the_checker(name):
    expected = EXPECTED[name]
    path = REGRESSIONS / name
    started = time.perf_counter()
    report = check_paths([str(path)])
    assert time.perf_counter() - started < BOUND_S
    assert fuzz.problem_in(report, str(path), False, path) is None, report.errors
    code = 2 if report.errors else 1 if report.diagnostics else 0
    assert code == expected["exit"], (report.errors, expected)
    if expected["message"]:
        assert any(expected["message"] in e for e in report.errors), report.errors


def test_every_saved_input_has_an_expectation():
    assert sorted(p.name for p in REGRESSIONS.iterdir() if p.name != "expected.json") == sorted(EXPECTED)


# ---------------------------------------------------------------------------------------------
# The CLI: exit code 2 and one clear line per unreadable file; the other files are still checked


def run_check(*args):
    return subprocess.run([sys.executable, "-m", "explainer", "check", "--format", "json", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})


def test_cli_non_utf8_file_and_broken_notebook(tmp_path):
    (tmp_path / "latin.py").write_bytes(b"x = '\xe9'\nloss.backward()\n")
    (tmp_path / "broken.ipynb").write_text('{"cells": [{"cell_type": "code", "source": "x = ')
    (tmp_path / "deep.ipynb").write_bytes((REGRESSIONS / "notebook_deep_cell.ipynb").read_bytes())
    result = run_check(str(tmp_path / "latin.py"), str(tmp_path / "broken.ipynb"), str(tmp_path / "deep.ipynb"),
                       "samples/rnn_hidden_chunks.py")
    assert result.returncode == 2
    assert [d["code"] for d in json.loads(result.stdout)] == ["BX001"]  # the good file still checked
    lines = result.stderr.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == f"explainer: {tmp_path / 'latin.py'}: cannot read: invalid or missing encoding declaration"
    assert lines[1].startswith(f"explainer: {tmp_path / 'broken.ipynb'}: not a notebook (invalid JSON: ")
    assert lines[2] == f"explainer: {tmp_path / 'deep.ipynb'}: cannot parse: too deeply nested for Python's parser " \
                       "(RecursionError)"


def test_cli_folder_with_unreadable_files(tmp_path):
    (tmp_path / "good.py").write_bytes((ROOT / "samples" / "rnn_hidden_chunks.py").read_bytes())
    (tmp_path / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    os.mkfifo(tmp_path / "pipe.py")  # reading it would wait for a writer forever
    (tmp_path / "rot13.py").write_bytes(b"# coding: rot13\nx = 1\n")
    (tmp_path / "secret.py").write_text("x = 1\n")
    (tmp_path / "secret.py").chmod(0)
    result = run_check(str(tmp_path))
    assert result.returncode == 2
    assert [d["code"] for d in json.loads(result.stdout)] == ["BX001"]
    errors = dict(line.removeprefix(f"explainer: {tmp_path}/").split(": ", 1) for line in result.stderr.splitlines())
    assert errors.pop("dangling.py") == "cannot read: a broken symbolic link"
    assert errors.pop("pipe.py") == "cannot read: not a regular file"
    assert errors.pop("rot13.py") == "cannot read: encoding problem: rot13 is not a text encoding"
    if os.geteuid() != 0:  # root reads it anyway
        assert errors.pop("secret.py").startswith("cannot read: [Errno 13] Permission denied")
    assert errors == {}
