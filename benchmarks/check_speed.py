#!/usr/bin/env python
"""Speed of `python -m explainer check` beside TorchFix and ruff, on the same files, in one run.

    .venv/bin/python benchmarks/check_speed.py                 # default corpus, 3 rounds
    .venv/bin/python benchmarks/check_speed.py --corpus DIR    # any folder of .py files
    .venv/bin/python benchmarks/check_speed.py --quick         # 1 round

The default corpus is a fixed part of the installed torch package (nn, optim, distributions,
utils/data, autograd) plus samples/: about 300 files that every machine with this project's
environment has, written in the style the checkers target.

Each round runs, in a shuffled order:
* cold: a fresh process per tool over the whole corpus (interpreter start-up, imports, no cache):
  `python -m explainer check`, `torchfix -j 1` (one process, as ours), `ruff check --no-cache`;
* warm: a second pass inside one already-running process, as an editor's language server would
  re-check (ours: `check_paths`; TorchFix: its `main()` again), and ruff with its cache.
Figures are medians over rounds; ratios compare medians of the same round kind. TorchFix and
ruff are optional: install them with `pip install torchfix ruff` (the `bench` extra).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TORCH_PARTS = ("nn", "optim", "distributions", "utils/data", "autograd")
TARGET_VS_TORCHFIX = 5.0


def default_corpus(workdir: Path) -> Path:
    """Copy the default corpus into `workdir` (so every tool reads the same plain files)."""
    import importlib.util

    torch_dir = Path(importlib.util.find_spec("torch").origin).parent
    corpus = workdir / "corpus"
    if corpus.exists():
        shutil.rmtree(corpus)
    for part in TORCH_PARTS:
        shutil.copytree(torch_dir / part, corpus / "torch" / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(ROOT / "samples", corpus / "samples", ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    return corpus


def python_files(corpus: Path) -> list[Path]:
    return sorted(p for p in corpus.rglob("*.py") if "__pycache__" not in p.parts)


def timed_process(command: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=3600)
    return time.perf_counter() - started, done


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# Our CPU seconds per run, cold and warm: the target is in lines per CPU-second (issue 21).
CPU: dict[str, list[float]] = {"cold": [], "warm": []}
TARGET_LINES_PER_CPU_S = 50_000


def ours_cold(corpus: Path) -> tuple[float, int]:
    cpu = children_cpu()
    seconds, done = timed_process([sys.executable, "-m", "explainer", "check", "--format", "json", str(corpus)], ROOT)
    CPU["cold"].append(children_cpu() - cpu)
    if done.returncode not in (0, 1, 2):
        raise RuntimeError(done.stderr)
    return seconds, len(json.loads(done.stdout or "[]"))


def ours_warm(corpus: Path) -> float:
    sys.path.insert(0, str(ROOT))
    from explainer.static.check import check_paths

    check_paths([str(corpus)])  # the first pass: imports and first-call costs
    cpu, started = time.process_time(), time.perf_counter()
    check_paths([str(corpus)])
    seconds = time.perf_counter() - started
    CPU["warm"].append(time.process_time() - cpu)
    return seconds


def torchfix_available() -> bool:
    return shutil.which("torchfix", path=os.path.dirname(sys.executable)) is not None


def torchfix_cold(corpus: Path) -> float:
    command = [os.path.join(os.path.dirname(sys.executable), "torchfix"), "-j", "1", str(corpus)]
    seconds, done = timed_process(command, ROOT)
    if "Finished checking" not in done.stderr:
        raise RuntimeError(done.stderr[-2000:])
    return seconds


def torchfix_warm(corpus: Path) -> float:
    from torchfix import __main__ as torchfix_main

    def once() -> None:
        argv = sys.argv
        sys.argv = ["torchfix", "-j", "1", str(corpus)]
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                torchfix_main.main()
        except SystemExit:
            pass
        finally:
            sys.argv = argv

    once()
    started = time.perf_counter()
    once()
    return time.perf_counter() - started


def ruff_binary() -> str | None:
    local = os.path.join(os.path.dirname(sys.executable), "ruff")
    return local if os.path.exists(local) else shutil.which("ruff")


def ruff_run(corpus: Path, cached: bool, cache_dir: Path) -> float:
    command = [ruff_binary(), "check", "--isolated", "--exit-zero", "--quiet", "--cache-dir", str(cache_dir), str(corpus)]
    if not cached:
        command.insert(2, "--no-cache")
    seconds, done = timed_process(command, ROOT)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, help="a folder of .py files (default: part of torch + samples)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--json", type=Path, default=RESULTS / "check_speed.json")
    options = parser.parse_args(argv)
    rounds = 1 if options.quick else options.rounds
    workdir = RESULTS / "check_speed"
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = options.corpus.resolve() if options.corpus else default_corpus(workdir)
    files = python_files(corpus)
    lines = sum(len(p.read_bytes().splitlines()) for p in files)
    print(f"corpus: {corpus} ({len(files)} .py files, {lines} lines)", file=sys.stderr)

    tools = {"explainer check": (lambda: ours_cold(corpus)[0], lambda: ours_warm(corpus))}
    if torchfix_available():
        tools["TorchFix -j 1"] = (lambda: torchfix_cold(corpus), lambda: torchfix_warm(corpus))
    if ruff_binary():
        cache = workdir / "ruff_cache"
        tools["ruff check"] = (lambda: ruff_run(corpus, False, cache), lambda: ruff_run(corpus, True, cache))
    times: dict[str, dict[str, list[float]]] = {name: {"cold": [], "warm": []} for name in tools}
    rng = random.Random(0)
    for number in range(rounds):
        order = list(tools)
        rng.shuffle(order)
        for name in order:
            for kind, run in zip(("cold", "warm"), tools[name]):
                seconds = run()
                times[name][kind].append(seconds)
                print(f"[round {number + 1}] {name} {kind}: {seconds:.2f} s", file=sys.stderr)

    cpu = {kind: statistics.median(values) for kind, values in CPU.items()}
    diagnostics = ours_cold(corpus)[1]
    results = {"corpus": str(corpus), "files": len(files), "lines": lines, "rounds": rounds,
               "cpu_count": os.cpu_count(), "python": sys.version.split()[0], "tools": {},
               "our_diagnostics": diagnostics, "our_cpu_s": cpu,
               "our_lines_per_cpu_s": {kind: lines / seconds for kind, seconds in cpu.items()}}
    rows = []
    for name, kinds in times.items():
        entry = {kind: statistics.median(values) for kind, values in kinds.items()}
        entry.update({f"{kind}_files_per_s": len(files) / entry[kind] for kind in ("cold", "warm")})
        results["tools"][name] = entry
    ours = results["tools"]["explainer check"]
    for name, entry in results["tools"].items():
        rows.append((name, entry["cold"], entry["cold_files_per_s"], entry["warm"], entry["warm_files_per_s"],
                     entry["cold"] / ours["cold"], entry["warm"] / ours["warm"]))
    print(f"\nCheck speed: {len(files)} files, {lines} lines, median of {rounds} round(s)")
    print(f"{'tool':16} {'cold s':>8} {'files/s':>8} {'warm s':>8} {'files/s':>8} {'cold ×ours':>11} {'warm ×ours':>11}")
    for name, cold, cold_rate, warm, warm_rate, cold_ratio, warm_ratio in rows:
        print(f"{name:16} {cold:8.2f} {cold_rate:8.1f} {warm:8.2f} {warm_rate:8.1f} {cold_ratio:10.2f}× {warm_ratio:10.2f}×")
    rate = results["our_lines_per_cpu_s"]
    print(f"\nexplainer check: {rate['cold']:,.0f} lines per CPU-second cold (a fresh process, start-up included), "
          f"{rate['warm']:,.0f} warm (target >= {TARGET_LINES_PER_CPU_S:,}: "
          f"{'met' if min(rate.values()) >= TARGET_LINES_PER_CPU_S else 'missed'})")
    if "TorchFix -j 1" in results["tools"]:
        torchfix = results["tools"]["TorchFix -j 1"]
        speedup = {kind: torchfix[kind] / ours[kind] for kind in ("cold", "warm")}
        results["speedup_vs_torchfix"] = speedup
        verdict = all(v >= TARGET_VS_TORCHFIX for v in speedup.values())
        print(f"\nexplainer check vs TorchFix: {speedup['cold']:.1f}× faster cold, {speedup['warm']:.1f}× warm "
              f"(target ≥ {TARGET_VS_TORCHFIX:.0f}×: {'met' if verdict else 'missed'})")
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(results, indent=2))
    print(f"JSON written to {options.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
