#!/usr/bin/env python
"""The long fuzz run of `explainer check` (issue 6): generated and mutated sources, in-process.

    .venv/bin/python benchmarks/fuzz.py --inputs 100000        # both cores, about 15-25 minutes
    .venv/bin/python benchmarks/fuzz.py --inputs 2000 --seed 7 # a quick look
    .venv/bin/python benchmarks/fuzz.py --replay 1234          # one input again, by its number

Every input is written to a file and checked with `check_paths` (what the CLI runs over
paths), a quarter of them with `--fix`, and the report rendered in the three formats. An input
fails when the checker raises or reports an internal error, when a message is not one line,
when a diagnostic's location is not 1-based, when --fix leaves code that no longer parses, or
when it takes longer than --limit seconds (SIGALRM: a hang is reported, not waited out).

Inputs (cheap strategies, so that 100,000 fit in well under an hour on 2 cores):

- mutate:   a samples/*.py file truncated, with lines deleted, inserted, duplicated or swapped,
            bytes flipped, random tokens inserted, indentation changed (1-4 mutations);
- grammar:  random statements and expressions (a small grammar) around a training loop;
- deep:     chains (`a+a+...`, `a.b.c...`, `a()()...`, `a[0][0]...`, `-(-...)`, `x if c else`),
            brackets and blocks nested around Python's and the checker's limits;
- huge:     long int literals (around the 4300-digit limit), long strings, many statements;
- bytes:    random bytes, with and without a coding cookie (also non-text codecs: rot13, hex);
- notebook: .ipynb with random JSON, odd cell shapes and kernelspecs, broken or truncated
            JSON, non-UTF-8 bytes, cells from mutated samples and IPython lines.

Input N is made by `random.Random(f"{seed}:{N}")`, so any input can be replayed alone.
Prints progress, then a summary; writes benchmarks/results/fuzz.json (git-ignored) and every
failing input to benchmarks/results/fuzz_failures/ (copy those to tests/fuzz_regressions/).
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import multiprocessing
import os
import platform
import random
import signal
import sys
import tempfile
import time
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

from explainer.render.diagnostics import render_json, render_text  # noqa: E402
from explainer.render.sarif import render_sarif  # noqa: E402
from explainer.static.check import check_paths  # noqa: E402

CATEGORIES = ("mutate", "grammar", "deep", "huge", "bytes", "notebook")
WEIGHTS = (40, 20, 10, 5, 10, 15)
SAMPLE_TEXTS = [p.read_text(encoding="utf-8") for p in sorted(SAMPLES.glob("*.py"))]
SAMPLE_LINES = [line for text in SAMPLE_TEXTS for line in text.splitlines(keepends=True)]
TOKENS = ["(", ")", "[", "]", "{", "}", ":", ",", ".", "=", "+=", "\n", "    ", "\t", "\\\n", "'", '"', '"""',
          "#", "# noqa", "# noqa: BX001", "@", "*", "**", "lambda", "for", "while", "if", "else", "with",
          "def", "class", "return", "yield", "await", "async", "global", "nonlocal", "del", "pass",
          "backward()", ".backward()", ".detach()", "retain_graph=True", "torch.no_grad()", "forward",
          "autograd.grad(", "self.", "nn.Module", "%matplotlib inline", "!ls", "x?", "\x00", "\r", "\x0c",
          "\u00e9", "\U0001f600", "\ufeff", "0x", "1e999", "9" * 50, "f'{", "match x:", "case _:", ":="]
ENCODINGS = ["utf-8", "latin-1", "ascii", "utf-16", "utf-32", "cp1252", "rot13", "hex", "zlib", "bogus",
             "unicode_escape", "utf-8-sig", "idna", "punycode"]


# ---------------------------------------------------------------------------------------------
# Inputs: (suffix, bytes)


def make_input(rng: random.Random) -> tuple[str, str, bytes]:
    category = rng.choices(CATEGORIES, WEIGHTS)[0]
    suffix, data = globals()[f"_{category}"](rng)
    return category, suffix, data


def _mutate(rng: random.Random) -> tuple[str, bytes]:
    return ".py", mutate_bytes(rng, rng.choice(SAMPLE_TEXTS).encode("utf-8"))


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    for _ in range(rng.randint(1, 4)):
        lines = data.splitlines(keepends=True) or [b""]
        op = rng.randrange(8)
        at = rng.randrange(len(lines))
        if op == 0:
            data = data[:rng.randint(0, len(data))]
        elif op == 1:
            del lines[at:at + rng.randint(1, 3)]
            data = b"".join(lines)
        elif op == 2:
            lines.insert(at, rng.choice(SAMPLE_LINES).encode("utf-8"))
            data = b"".join(lines)
        elif op == 3:
            lines[at:at] = lines[at:at + rng.randint(1, 5)] * rng.randint(1, 3)
            data = b"".join(lines)
        elif op == 4 and len(lines) > 1:
            other = rng.randrange(len(lines))
            lines[at], lines[other] = lines[other], lines[at]
            data = b"".join(lines)
        elif op == 5 and data:
            index = rng.randrange(len(data))
            data = data[:index] + bytes([data[index] ^ (1 << rng.randrange(8))]) + data[index + 1:]
        elif op == 6:
            index = rng.randint(0, len(data))
            data = data[:index] + rng.choice(TOKENS).encode("utf-8") + data[index:]
        else:
            stripped = lines[at].lstrip(b" ")
            lines[at] = b" " * rng.choice([0, 1, 2, 4, 8, 12]) + stripped
            data = b"".join(lines)
    return data


_NAMES = ["x", "h", "hidden", "loss", "model", "self.state", "cache['prev']", "opt", "torch", "total", "y", "data"]


def expression(rng: random.Random, depth: int = 0) -> str:
    if depth > 4 or rng.random() < 0.3:
        return rng.choice([*_NAMES, "1", "0.5", "'s'", "None", "True", "torch.zeros(3)",
                           "torch.randn(2, requires_grad=True)", "nn.Parameter(w)"])
    sub = lambda: expression(rng, depth + 1)  # noqa: E731
    return rng.choice([
        lambda: f"{sub()} {rng.choice(['+', '-', '*', '@', '/', '**', '%', '<<', '&'])} {sub()}",
        lambda: f"{rng.choice(['-', 'not ', '~'])}{sub()}",
        lambda: f"{sub()}.{rng.choice(['detach()', 'sum()', 'backward()', 'data', 'grad', 'item()', 'h'])}",
        lambda: f"{rng.choice(['model', 'torch.cat', 'f', 'self.net', 'rnn', 'torch.autograd.grad'])}"
                f"({', '.join(sub() for _ in range(rng.randint(0, 3)))})",
        lambda: f"{sub()}[{sub()}]",
        lambda: f"({sub()}, {sub()})",
        lambda: f"[{sub()} for x in {sub()}]",
        lambda: f"{sub()} if {sub()} else {sub()}",
        lambda: f"lambda x: {sub()}",
        lambda: f"(h := {sub()})",
        lambda: f"{sub()}.backward(retain_graph={rng.choice(['True', 'False'])})",
    ])()


def statements(rng: random.Random, indent: str = "", depth: int = 0) -> str:
    out = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.randrange(12 if depth < 3 else 6)
        target = rng.choice(_NAMES[:8])
        if kind == 0:
            out.append(f"{indent}{target} = {expression(rng)}\n")
        elif kind == 1:
            out.append(f"{indent}{target} {rng.choice(['+=', '-=', '*='])} {expression(rng)}\n")
        elif kind == 2:
            out.append(f"{indent}{expression(rng)}.backward()\n")
        elif kind == 3:
            out.append(f"{indent}{rng.choice(['opt', 'optimizer', 'opt_d'])}.{rng.choice(['step', 'zero_grad'])}()\n")
        elif kind == 4:
            out.append(f"{indent}{rng.choice(['states', 'self.cache', 'xs'])}.append({expression(rng)})\n")
        elif kind == 5:
            out.append(f"{indent}{expression(rng)}\n")
        else:
            header = rng.choice([f"for x in {expression(rng)}:", "while True:", f"if {expression(rng)}:",
                                 "with torch.no_grad():", "def forward(self, x):", "def step(x, h=None):",
                                 "class Net(nn.Module):", "try:", "else:", "async def f():"])
            out.append(f"{indent}{header}\n{statements(rng, indent + '    ', depth + 1)}")
    return "".join(out)


def _grammar(rng: random.Random) -> tuple[str, bytes]:
    text = "import torch\nfrom torch import nn\n" + statements(rng)
    text += f"for x in data:\n{statements(rng, '    ', 1)}    loss.backward()\n"
    return ".py", text.encode("utf-8")


CHAINS = {
    "binop": lambda n: "+".join(["a"] * n),
    "attr": lambda n: "a" + ".b" * n,
    "call": lambda n: "a" + "()" * n,
    "subscript": lambda n: "a" + "[0]" * n,
    "method": lambda n: "h" + ".detach()" * n,
    "unary": lambda n: "-" * n + "a",
    "power": lambda n: "**".join(["a"] * n),
    "ifexp": lambda n: " if c else ".join(["a"] * n),
    "not": lambda n: "not " * n + "a",
    "compare": lambda n: "<".join(["a"] * n),
    "boolop": lambda n: " and ".join(["a"] * n),
    "lambda": lambda n: "lambda: " * n + "a",
    "parens": lambda n: "(" * n + "a" + ")" * n,
    "lists": lambda n: "[" * n + "]" * n,
    "calls": lambda n: "f(" * n + "x" + ")" * n,
}


def deep_source(shape: str, n: int, where: str) -> str:
    """A chain or nesting of `n` levels, placed where a rule reads it (in a training loop)."""
    if shape == "blocks":
        body = "".join("    " * i + "if x:\n" for i in range(n))
        return f"for x in data:\n{body}{'    ' * n}loss.backward()\n"
    chain = CHAINS[shape](n)
    if where == "module":
        return f"x = {chain}\n"
    return (f"for x in data:\n    h = {chain}\n    h = model(x, h)\n    loss = h.sum() + {chain}\n"
            f"    total = total + {chain}\n    states.append({chain})\n    loss.backward()\n")


def _deep(rng: random.Random) -> tuple[str, bytes]:
    shape = rng.choice([*CHAINS, "blocks"])
    limit = {"blocks": 110, "parens": 210, "lists": 210, "calls": 210}.get(shape, 3500)
    n = rng.choice([rng.randint(1, limit), rng.randint(limit * 9 // 10, limit)])
    if shape not in ("blocks", "parens", "lists", "calls"):
        n = min(n, rng.choice([400, 1200, 3500]))  # most below the cap: checked, not refused
    return ".py", deep_source(shape, n, rng.choice(["loop", "loop", "module"])).encode("utf-8")


def _huge(rng: random.Random) -> tuple[str, bytes]:
    kind = rng.randrange(4)
    if kind == 0:
        literal = "9" * rng.choice([rng.randint(1, 5000), 4300, 4301])
    elif kind == 1:
        literal = repr("x" * rng.randint(0, 1_000_000))
    elif kind == 2:
        literal = "[" + ", ".join(["1"] * rng.randint(0, 50_000)) + "]"
    else:
        body = "    loss = model(x)\n    loss.backward()\n" * rng.randint(1, 2000)
        return ".py", f"for x in data:\n{body}".encode("utf-8")
    return ".py", f"for x in data:\n    h = {literal}\n    h.backward()\n".encode("utf-8")


def _bytes(rng: random.Random) -> tuple[str, bytes]:
    data = rng.randbytes(rng.randint(0, 400))
    if rng.random() < 0.5:
        cookie = f"# -*- coding: {rng.choice(ENCODINGS)} -*-\n".encode("ascii")
        data = (b"\xef\xbb\xbf" if rng.random() < 0.1 else b"") + cookie + rng.choice([data, b"x = 1\n"])
    return rng.choice([".py", ".py", ".ipynb"]), data


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False, 0, -1, 1.5, 10**30])
    if kind == 2:
        return rng.choice(["", "code", "markdown", "python", "x = 1\n", "%%bash\n", "!ls", "\x00", "\ud800"])
    if kind == 3:
        return rng.choice(SAMPLE_LINES)
    if kind == 4:
        return rng.choice([[], {}, "", 0])
    if kind in (5, 6):
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["cells", "cell_type", "source", "metadata", "kernelspec", "language", "nbformat", "outputs", "x"]
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def notebook_document(rng: random.Random):
    cells = []
    for _ in range(rng.randint(0, 6)):
        source = mutate_bytes(rng, rng.choice(SAMPLE_TEXTS).encode("utf-8")).decode("utf-8", "replace") \
            if rng.random() < 0.5 else rng.choice(["%matplotlib inline\nx = 1", "!pip list", "%%bash\nls",
                                                  "%%time\nloss.backward()", "model?", "", "def f(:"])
        if rng.random() < 0.5:
            source = source.splitlines(keepends=True)
        cell = {"cell_type": rng.choice(["code", "code", "markdown", "raw", None, 3]), "source": source,
                "metadata": {}, "outputs": []}
        if rng.random() < 0.25:
            cell[rng.choice(list(cell))] = random_json(rng)
        cells.append(cell if rng.random() > 0.05 else random_json(rng))
    document = {"cells": cells, "metadata": {"kernelspec": {"language": "python"}}, "nbformat": 4}
    if rng.random() < 0.3:
        document[rng.choice(["cells", "metadata", "nbformat"])] = random_json(rng)
    if rng.random() < 0.15:
        document["metadata"] = {"kernelspec": random_json(rng)}
    return document


def _notebook(rng: random.Random) -> tuple[str, bytes]:
    document = random_json(rng) if rng.random() < 0.2 else notebook_document(rng)
    data = json.dumps(document, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5).encode(
        "utf-8", "surrogatepass")
    if rng.random() < 0.3:
        data = mutate_bytes(rng, data) if rng.random() < 0.5 else data[:rng.randint(0, len(data))]
    return ".ipynb", data


# ---------------------------------------------------------------------------------------------
# One check


class Hang(BaseException):  # not an Exception: the per-file boundary must not catch it
    pass


def _alarm(signum, frame):
    raise Hang()


def check_input(suffix: str, data: bytes, fix: bool, workdir: Path, limit: float) -> tuple[float, str | None]:
    """(seconds, what went wrong or None) for one input, checked as a file in `workdir`."""
    path = workdir / f"input{suffix}"
    path.write_bytes(data)
    parsed_before = _parses(data) if fix and suffix == ".py" else False
    signal.setitimer(signal.ITIMER_REAL, limit)
    started = time.perf_counter()
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            report = check_paths([str(path)], fix=fix)
            render_json(report.diagnostics)
            render_sarif(report.diagnostics)
            render_text(report.diagnostics, report.line, fixed=report.fixed if fix else None)
    except Hang:
        return time.perf_counter() - started, f"hang: over {limit} s"
    except BaseException as error:  # noqa: BLE001 (what the fuzzer is here to find)
        return time.perf_counter() - started, f"crash: {type(error).__name__}: {error}"[:500]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.perf_counter() - started
    return seconds, problem_in(report, str(path), parsed_before, path)


def problem_in(report, path: str, parsed_before: bool, written: Path) -> str | None:
    """What is wrong with a finished check's report, if anything (shared with tests/test_fuzz.py)."""
    for error in report.errors:
        if "internal error" in error:
            return error[:500]
        if "\n" in error or not error.startswith(f"{path}: "):
            return f"message not one line about the file: {error[:300]!r}"
    for d in report.diagnostics:
        if min(d.location.row, d.location.column, d.end_location.row, d.end_location.column) < 1:
            return f"location not 1-based: {d.code} {d.location} {d.end_location}"
    if parsed_before and not _parses(written.read_bytes()):
        return "--fix left code that no longer parses"
    return None


def _parses(data: bytes) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for `1if x`: the input's, not ours
            ast.parse(data)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def _worker(job: tuple[str, int, int, float]) -> list[tuple]:
    seed, first, count, limit = job
    results = []
    with tempfile.TemporaryDirectory(prefix="fuzz") as folder:
        for number in range(first, first + count):
            rng = random.Random(f"{seed}:{number}")
            category, suffix, data = make_input(rng)
            fix = rng.random() < 0.25
            seconds, problem = check_input(suffix, data, fix, Path(folder), limit)
            results.append((number, category, suffix, fix, seconds, problem, data if problem else None,
                            len(data)))
    return results


def _init_worker():
    sys.setrecursionlimit(1000)  # what `python -m explainer check` runs with
    signal.signal(signal.SIGALRM, _alarm)


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--seed", default="0")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--limit", type=float, default=10.0, help="seconds one input may take before it is a hang")
    parser.add_argument("--replay", type=int, help="check input number N alone and print what it is")
    parser.add_argument("--json", type=Path, default=RESULTS / "fuzz.json")
    options = parser.parse_args(argv)

    if options.replay is not None:
        _init_worker()
        rng = random.Random(f"{options.seed}:{options.replay}")
        category, suffix, data = make_input(rng)
        fix = rng.random() < 0.25
        with tempfile.TemporaryDirectory() as folder:
            seconds, problem = check_input(suffix, data, fix, Path(folder), options.limit)
        print(f"{category}{suffix} fix={fix} {len(data)} bytes: {seconds:.3f} s, {problem or 'ok'}")
        print(repr(data[:2000]))
        return 1 if problem else 0

    chunk = 250
    jobs = [(options.seed, first, min(chunk, options.inputs - first), options.limit)
            for first in range(0, options.inputs, chunk)]
    failures_dir = RESULTS / "fuzz_failures"
    failures_dir.mkdir(parents=True, exist_ok=True)
    done, failures, per_category, slowest = 0, [], {}, []
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(options.workers, initializer=_init_worker) as pool:
        for results in pool.imap_unordered(_worker, jobs):
            for number, category, suffix, fix, seconds, problem, data, size in results:
                stats = per_category.setdefault(category, {"inputs": 0, "seconds": 0.0, "failures": 0})
                stats["inputs"] += 1
                stats["seconds"] += seconds
                slowest.append((seconds, number, category, suffix, fix, size))
                if problem:
                    stats["failures"] += 1
                    name = f"{options.seed}_{number}_{category}{suffix}"
                    (failures_dir / name).write_bytes(data)
                    failures.append({"input": number, "category": category, "fix": fix, "file": name,
                                     "problem": problem, "seconds": round(seconds, 4)})
                    print(f"FAIL #{number} {category}{suffix} fix={fix}: {problem}", file=sys.stderr, flush=True)
            slowest = sorted(slowest, reverse=True)[:10]
            done += len(results)
            elapsed = time.perf_counter() - started
            if done % 5000 < chunk or done % 1000 == 0 and done <= 5000 or done == options.inputs:
                print(f"{done:>7}/{options.inputs} inputs  {len(failures)} failures  {done / elapsed:7.1f} inputs/s  "
                      f"slowest {slowest[0][0]:.3f} s (#{slowest[0][1]} {slowest[0][2]})", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    blob = {
        "inputs": done, "failures": len(failures), "seconds": round(elapsed, 1),
        "inputs_per_s": round(done / elapsed, 1), "seed": options.seed, "workers": options.workers,
        "limit_s": options.limit,
        "slowest": [{"seconds": round(s, 4), "input": n, "category": c, "suffix": x, "fix": f, "bytes": b}
                    for s, n, c, x, f, b in slowest],
        "per_category": {c: {**s, "seconds": round(s["seconds"], 1),
                             "mean_ms": round(1000 * s["seconds"] / max(s["inputs"], 1), 2)}
                         for c, s in sorted(per_category.items())},
        "failure_list": failures,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(blob, indent=2) + "\n")
    print(json.dumps({k: v for k, v in blob.items() if k != "failure_list"}, indent=2))
    print(f"{done} inputs, {len(failures)} failures, {elapsed:.0f} s, {done / elapsed:.1f} inputs/s, "
          f"slowest {slowest[0][0]:.3f} s (input #{slowest[0][1]}, {slowest[0][2]})", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
