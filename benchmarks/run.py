#!/usr/bin/env python
"""Benchmarks for the explainer, measured within one run on a noisy machine.

    .venv/bin/python benchmarks/run.py                     # full run, about 5-7 minutes
    .venv/bin/python benchmarks/run.py --quick             # under a minute
    .venv/bin/python benchmarks/run.py --profile           # also cProfile the largest graphs
    .venv/bin/python benchmarks/run.py --only synthetic    # one part (repeatable)
    .venv/bin/python benchmarks/run.py --only samples --sample H3DNet   # some samples (repeatable)
    python benchmarks/run.py --device cuda --only overhead --only samples   # on a GPU

Three parts (see benchmarks/README.md):

1. overhead  - per-step time of three training loops with no hook, with `explainer.install()`
               and under `torch.autograd.detect_anomaly()`, interleaved round by round; ratios
               are medians of per-round paired ratios, so machine drift cancels out.
2. samples   - every buggy sample run in-process with and without the hook; the explanation
               latency is the time spent inside the callbacks `explainer.install()` gives the
               hooks (`notes.add_note`: explain, then render the note; `notes.warn_growth`),
               measured by a timer wrapped around them here.
3. synthetic - a second-backward error on graphs of 10^4..10^6 autograd nodes (the failing
               code is in synthetic_graphs.py): a carried state whose huge part is current or
               stale, and a huge trunk shared by two losses; then (3b) a 200k-step unroll
               stacked for its loss and a 10^7-entry dict in the globals.

Everything is printed as tables, then as one JSON blob (also written to
benchmarks/results/latest.json). Only ratios and latencies measured in this run are reported;
nothing here asserts absolute thresholds.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import linecache
import os
import platform
import pstats
import random
import runpy
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))

import torch  # noqa: E402

import explainer  # noqa: E402
from explainer.reading import source as explainer_source  # noqa: E402

# What the first explanation in a process pays once: the hooks import the analysis (and, through
# it, the fix builders and the renderer) on the first error only. Measured here, in this process.
_import_started = time.perf_counter()
import explainer.render.text  # noqa: E402,F401
import explainer.runtime.analysis  # noqa: E402,F401
from explainer import notes  # noqa: E402
from explainer.runtime import hooks, journal  # noqa: E402

ANALYSIS_IMPORT_S = time.perf_counter() - _import_started

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic_graphs  # noqa: E402

perf_counter = time.perf_counter

TARGET_HOOK_RATIO = 1.01
TARGET_SAMPLE_MS = 100.0
TARGET_SYNTHETIC_S = 1.0  # at 10^6 nodes


# ---------------------------------------------------------------------------------------------
# Small helpers


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def bootstrap_ci(values, rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the median of `values`, by resampling."""
    rng = random.Random(seed)
    n = len(values)
    if n < 3:
        return (min(values), max(values))
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def rss_mb() -> float | None:
    return _status_field("VmRSS")


def peak_mb() -> float | None:
    return _status_field("VmHWM")


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _status_field(name: str) -> float | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def clear_source_caches() -> None:
    """Make the next explanation read and parse source as a fresh process would."""
    linecache.clearcache()
    explainer_source._parse.cache_clear()


class AnalysisTimer:
    """Wraps the two callbacks `explainer.install()` gives the hooks, recording (name, seconds).

    Entered while the hooks are installed, it installs them again with the callbacks wrapped (an
    installed hook only takes the new callbacks), and gives them back the plain ones on exit; the
    engine is not modified. With `profiler`, the wrapped calls (and only they) run under that
    cProfile.Profile.
    """

    def __init__(self, profiler: cProfile.Profile | None = None, memory: bool = False) -> None:
        self.records: list[tuple[str, float]] = []
        self.profiler = profiler
        self.memory = memory
        self.peak_extra_mb: float | None = None  # largest RSS peak above the RSS at entry

    def _wrap(self, name, function):
        records, profiler = self.records, self.profiler

        def timed(*args, **kwargs):
            before = rss_mb() if self.memory and reset_peak() else None
            if profiler is not None:
                profiler.enable()
            started = perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                records.append((name, perf_counter() - started))
                if profiler is not None:
                    profiler.disable()
                if before is not None:
                    extra = (peak_mb() or before) - before
                    self.peak_extra_mb = max(self.peak_extra_mb or 0.0, extra)

        return timed

    def __enter__(self):
        if hooks.installed():
            hooks.install(self._wrap("explain", notes.add_note), self._wrap("growth", notes.warn_growth))
        return self

    def __exit__(self, *exc) -> None:
        if hooks.installed():
            hooks.install(notes.add_note, notes.warn_growth)

    def total(self, name: str) -> float:
        return sum(s for n, s in self.records if n == name)

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.records if n == name)

    def largest(self, name: str) -> float | None:
        found = [s for n, s in self.records if n == name]
        return max(found) if found else None


def table(headers: list[str], rows: list[list], title: str) -> str:
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [all(_looks_numeric(r[i]) for r in cells if r[i]) for i in range(len(headers))]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [title, "=" * len(title), line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _looks_numeric(text: str) -> bool:
    text = text.rstrip("x%").replace("+", "").replace("-", "").replace(".", "").replace("e", "")
    return text.isdigit() or text in ("", "n/a")


def fmt(value, digits: int = 3, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}{suffix}"


# ---------------------------------------------------------------------------------------------
# 1. Hook overhead on training loops

# Where the loops' tensors live (--device). On CUDA a block's time includes waiting for its
# kernels, so the hook's CPU-side cost is measured against the step's real duration.
LOOP_DEVICE = torch.device("cpu")


def mlp_loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    ).to(LOOP_DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 784, device=LOOP_DEVICE), torch.randint(0, 10, (64,), device=LOOP_DEVICE)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    return step


def gru_loop():
    torch.manual_seed(0)
    gru = torch.nn.GRU(32, 64, batch_first=True).to(LOOP_DEVICE)
    head = torch.nn.Linear(64, 1).to(LOOP_DEVICE)
    optimizer = torch.optim.SGD([*gru.parameters(), *head.parameters()], lr=0.01)
    x, y = torch.randn(16, 20, 32, device=LOOP_DEVICE), torch.randn(16, 1, device=LOOP_DEVICE)

    def step():
        optimizer.zero_grad(set_to_none=True)
        output, _ = gru(x)
        loss = torch.nn.functional.mse_loss(head(output[:, -1]), y)
        loss.backward()
        optimizer.step()

    return step


def small_op_loop():
    torch.manual_seed(0)
    weight = torch.randn(16, device=LOOP_DEVICE, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.001)
    target = torch.randn(16, device=LOOP_DEVICE)

    def step():
        optimizer.zero_grad(set_to_none=True)
        z = weight
        for _ in range(20):  # 40 tiny elementwise ops: per-call Python overhead dominates
            z = z * 0.99 + 0.01
        loss = ((z - target) ** 2).sum()
        loss.backward()
        optimizer.step()

    return step


def micro_backward_loop():
    weight = torch.randn(1, device=LOOP_DEVICE, requires_grad=True)

    def step():
        (weight * 2.0).sum().backward()

    return step


def micro_step_loop():
    weight = torch.randn(1, device=LOOP_DEVICE, requires_grad=True)
    weight.grad = torch.zeros(1, device=LOOP_DEVICE)
    optimizer = torch.optim.SGD([weight], lr=0.0)

    def step():
        optimizer.step()

    return step


def micro_zero_grad_loop():
    weight = torch.randn(1, device=LOOP_DEVICE, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.0)

    def step():
        optimizer.zero_grad()

    return step


LOOPS = {
    "mlp (3 Linear, batch 64, SGD)": mlp_loop,
    "gru (seq 20, batch 16, h 64)": gru_loop,
    "small-op (40 tiny ops/step)": small_op_loop,
}
# Per-call cost of each hook, to read the loops' "+us" against.
MICRO_LOOPS = {
    "micro: 2-node backward()": micro_backward_loop,
    "micro: optimizer.step() only": micro_step_loop,
    "micro: optimizer.zero_grad() only": micro_zero_grad_loop,
}
VARIANTS = ("none", "none2", "hook", "anomaly")  # none2: a second no-hook block (A/A control)


def synchronize() -> None:
    if LOOP_DEVICE.type == "cuda":
        torch.cuda.synchronize(LOOP_DEVICE)


# Steps run inside a block's context before it is timed: the hooks' first backward calls after
# `install()` look for a graph kept aside (hooks.KEPT_CHECKS of them, the first also importing
# the analysis), once a process; a block installs the hooks afresh, so without these its short
# run would charge that start-up to every step. `startup_ms` measures it on its own.
WARM_STEPS = hooks.KEPT_CHECKS + 2


def timed_block(step, steps: int, context, warm: int = 0) -> float:
    """Seconds per step over one block of `steps` steps, run inside `context` (entered and left
    outside the timed part) after `warm` untimed ones."""
    gc.collect()
    with context:
        for _ in range(warm):
            step()
        synchronize()
        started = perf_counter()
        for _ in range(steps):
            step()
        synchronize()
        elapsed = perf_counter() - started
    return elapsed / steps


@contextlib.contextmanager
def _hooks_installed():
    explainer.install()
    try:
        yield
    finally:
        explainer.uninstall()


def run_block(step, steps: int, variant: str) -> float:
    if variant == "hook":
        context = _hooks_installed()
    elif variant == "anomaly":
        context = torch.autograd.detect_anomaly()
    else:
        context = contextlib.nullcontext()
    return timed_block(step, steps, context, warm=0 if variant == "anomaly" else WARM_STEPS)


def startup_ms(step, per_step: float) -> float:
    """What the first WARM_STEPS steps after `install()` cost above as many plain steps, in ms:
    paid once a process."""
    return (timed_block(step, WARM_STEPS, _hooks_installed()) - per_step) * WARM_STEPS * 1e3


def bench_overhead(loops: dict, rounds: int, block_s: float, seed: int = 0, target: bool = True) -> dict:
    rng = random.Random(seed)
    results = {}
    for name, factory in loops.items():
        log(f"[overhead] {name}: calibrating")
        step = factory()
        for variant in ("none", "hook", "anomaly", "none"):  # warm every path
            run_block(step, 5, variant)
        per_step = median(run_block(step, 10, "none") for _ in range(3))
        per_step_anomaly = median(run_block(step, 2, "anomaly") for _ in range(3))
        startup = startup_ms(step, per_step)
        steps = max(5, round(block_s / per_step))
        steps_anomaly = max(2, round(block_s / per_step_anomaly))
        samples = {v: [] for v in VARIANTS}
        log(f"[overhead] {name}: {rounds} rounds x {steps} steps per block "
            f"({steps_anomaly} under anomaly)")
        for _ in range(rounds):
            order = list(VARIANTS)
            rng.shuffle(order)
            for variant in order:
                samples[variant].append(
                    run_block(step, steps_anomaly if variant == "anomaly" else steps, variant))
        base = [(a + b) / 2 for a, b in zip(samples["none"], samples["none2"])]
        hook_ratios = [h / b for h, b in zip(samples["hook"], base)]
        anomaly_ratios = [a / b for a, b in zip(samples["anomaly"], base)]
        aa_ratios = [b / a for a, b in zip(samples["none"], samples["none2"])]
        hook_ratio = median(hook_ratios)
        results[name] = {
            "rounds": rounds,
            "steps_per_block": steps,
            "steps_per_block_anomaly": steps_anomaly,
            "none_us": median(base) * 1e6,
            "hook_us": median(samples["hook"]) * 1e6,
            "anomaly_us": median(samples["anomaly"]) * 1e6,
            "hook_ratio": hook_ratio,
            "hook_startup_ms": startup,
            "hook_ratio_ci95": bootstrap_ci(hook_ratios),
            "hook_delta_us": median([h - b for h, b in zip(samples["hook"], base)]) * 1e6,
            "anomaly_ratio": median(anomaly_ratios),
            "aa_ratio": median(aa_ratios),
            "aa_ratio_ci95": bootstrap_ci(aa_ratios),
            "target_hook_ratio": TARGET_HOOK_RATIO if target else None,
            "target_met": hook_ratio <= TARGET_HOOK_RATIO if target else None,
        }
    return results


def overhead_table(results: dict, title: str) -> str:
    rows = []
    for name, r in results.items():
        lo, hi = r["hook_ratio_ci95"]
        alo, ahi = r["aa_ratio_ci95"]
        rows.append([
            name, fmt(r["none_us"], 1), fmt(r["hook_us"], 1), fmt(r["hook_delta_us"], 1, ""),
            fmt(r["hook_ratio"], 4, "x"), f"{lo:.4f}-{hi:.4f}", fmt(r["anomaly_us"], 1),
            fmt(r["anomaly_ratio"], 2, "x"), fmt(r["aa_ratio"], 4, "x"), f"{alo:.4f}-{ahi:.4f}",
            "-" if r["target_met"] is None else "yes" if r["target_met"] else "NO", fmt(r["hook_startup_ms"], 1),
        ])
    return table(
        ["loop", "none us/step", "hook us/step", "hook +us", "hook ratio", "hook 95% CI",
         "anomaly us/step", "anomaly ratio", "A/A ratio", "A/A 95% CI", f"<= {TARGET_HOOK_RATIO}x",
         "start-up ms (once)"],
        rows, title)


# ---------------------------------------------------------------------------------------------
# 2. Explanation latency on the samples


def buggy_samples(names: list[str] | None = None):
    """The buggy samples; with `names`, those whose name contains one of them (any case)."""
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    import manifest

    found = [s for s in manifest.samples() + manifest.real_cases() if s.kind != "none"]
    if names:
        found = [s for s in found if any(n.lower() in s.name.lower() for n in names)]
    return found


def run_sample(path: Path, hooked: bool) -> dict:
    """Run one sample in-process as `python samples/NAME.py` would; time it."""
    clear_source_caches()
    torch.manual_seed(0)
    argv, path0 = sys.argv, list(sys.path)
    sys.argv = [str(path)]
    sys.path.insert(0, str(path.parent))
    timer = AnalysisTimer()
    error = None
    finding_kind = None
    grad_enabled = torch.is_grad_enabled()  # a sample may switch autograd off for good (tbd-nets)
    if hooked:
        explainer.install()
    try:
        with timer, contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = perf_counter()
            try:
                runpy.run_path(str(path), run_name="__main__")
            except RuntimeError as raised:
                error = raised
            elapsed = perf_counter() - started
        if hooked:
            last = journal.last()
            finding_kind = last.kind if last is not None else None
    finally:
        if hooked:
            explainer.uninstall()
        sys.argv = argv
        sys.path[:] = path0
        torch.set_grad_enabled(grad_enabled)
    error_notes = getattr(error, "__notes__", []) if error is not None else []
    result = {
        "run_s": elapsed,
        "raised": error is not None,
        "explain_s": timer.total("explain") if timer.count("explain") else None,
        "explain_calls": timer.count("explain"),
        "growth_s": timer.total("growth") if timer.count("growth") else None,
        "growth_max_s": timer.largest("growth"),
        "growth_calls": timer.count("growth"),
        "finding_kind": finding_kind,
        "failed_note": any("could not explain" in n for n in error_notes),
        "warned": sum(1 for w in caught if issubclass(w.category, notes.GraphGrowthWarning)),
    }
    del error, error_notes, caught
    return result


def cold_sample(path: Path) -> dict:
    """First explanation in a fresh process (includes importing the analysis modules)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--_cold-sample", str(path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": proc.stderr[-2000:]}


def _cold_main(path: str) -> None:
    started = perf_counter()
    result = run_sample(Path(path), hooked=True)
    result["process_s"] = perf_counter() - started
    result["import_s"] = ANALYSIS_IMPORT_S
    print(json.dumps(result))


def bench_samples(reps: int, cold: int, seed: int = 1, names: list[str] | None = None) -> dict:
    rng = random.Random(seed)
    samples = buggy_samples(names)
    if not samples:
        raise SystemExit(f"run.py: no buggy sample's name contains any of {names}")
    log(f"[samples] {len(samples)} buggy samples x {reps} reps (hook and no hook)")
    for sample in samples:  # warm-up, discarded: first calls of an op (LSTM, ...) are slow
        run_sample(sample.path, hooked=False)
    run_sample(samples[0].path, hooked=True)
    runs = {s.name: {"hook": [], "none": []} for s in samples}
    for rep in range(reps):
        order = list(samples)
        rng.shuffle(order)
        for sample in order:
            modes = ("hook", "none") if rep % 2 == 0 else ("none", "hook")
            for mode in modes:
                runs[sample.name][mode].append(run_sample(sample.path, hooked=mode == "hook"))
                gc.collect()
    rows = []
    for sample in samples:
        hook, none = runs[sample.name]["hook"], runs[sample.name]["none"]
        explain = [r["explain_s"] for r in hook if r["explain_s"] is not None]
        growth_max = [r["growth_max_s"] for r in hook if r["growth_max_s"] is not None]
        latency = median(explain) if explain else median(growth_max)
        rows.append({
            "sample": sample.name,
            "expected_kind": sample.kind,
            "finding_kind": hook[0]["finding_kind"],
            "explained": hook[0]["finding_kind"] == sample.kind and not hook[0]["failed_note"],
            "explain_ms": median(explain) * 1e3 if explain else None,
            "explain_ms_max": max(explain) * 1e3 if explain else None,
            "growth_checks": hook[0]["growth_calls"],
            "growth_check_ms_max": max(growth_max) * 1e3 if growth_max else None,
            "growth_checks_ms_total": median([r["growth_s"] or 0.0 for r in hook]) * 1e3,
            "latency_ms": latency * 1e3 if latency is not None else None,
            "run_ms_none": median([r["run_s"] for r in none]) * 1e3,
            "run_ms_hook": median([r["run_s"] for r in hook]) * 1e3,
            "run_delta_ms": median([h["run_s"] - n["run_s"] for h, n in zip(hook, none)]) * 1e3,
            "raised_none": none[0]["raised"],
            "raised_hook": hook[0]["raised"],
            "target_met": latency is not None and latency * 1e3 <= TARGET_SAMPLE_MS,
        })
    cold_rows = []
    if cold:
        picked, kinds = [], set()
        for sample in samples:  # the first sample of each kind
            if sample.kind not in kinds:
                kinds.add(sample.kind)
                picked.append(sample)
        for sample in picked[:cold]:
            log(f"[samples] cold process: {sample.name}")
            result = cold_sample(sample.path)
            explain_s = result.get("explain_s") or result.get("growth_max_s")
            cold_rows.append({
                "sample": sample.name, "kind": sample.kind,
                "import_ms": result["import_s"] * 1e3 if "import_s" in result else None,
                "explain_ms": explain_s * 1e3 if explain_s else None,
                "first_explanation_ms": (explain_s + result["import_s"]) * 1e3
                if explain_s and "import_s" in result else None,
                "growth_check_ms_max": result["growth_max_s"] * 1e3 if result.get("growth_max_s") else None,
                "run_ms": result["run_s"] * 1e3 if "run_s" in result else None,
                "error": result.get("error"),
            })
    latencies = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
    return {
        "reps": reps,
        "samples": rows,
        "cold": cold_rows,
        "max_latency_ms": max(latencies) if latencies else None,
        "median_latency_ms": median(latencies),
        "all_explained": all(r["explained"] for r in rows),
        "target_ms": TARGET_SAMPLE_MS,
        "target_met": all(r["target_met"] for r in rows),
    }


def samples_table(results: dict) -> str:
    rows = []
    for r in results["samples"]:
        rows.append([
            r["sample"], r["expected_kind"], "yes" if r["explained"] else f"NO ({r['finding_kind']})",
            fmt(r["explain_ms"], 1), fmt(r["explain_ms_max"], 1),
            f"{r['growth_checks']}/{fmt(r['growth_check_ms_max'], 1)}" if r["growth_checks"] else "-",
            fmt(r["run_ms_none"], 1), fmt(r["run_ms_hook"], 1), fmt(r["run_delta_ms"], 1),
            "yes" if r["target_met"] else "NO",
        ])
    text = table(
        ["sample", "kind", "explained", "explain ms", "max ms", "growth n/max ms",
         "run ms none", "run ms hook", "run +ms", f"<= {TARGET_SAMPLE_MS:g} ms"],
        rows, f"2. Explanation latency per buggy sample (median of {results['reps']} in-process runs, "
              "source caches cleared before each)")
    text += (f"\nmax latency {fmt(results['max_latency_ms'], 1)} ms, median "
             f"{fmt(results['median_latency_ms'], 1)} ms; all explained with the expected kind: "
             f"{'yes' if results['all_explained'] else 'NO'}")
    if results["cold"]:
        cold = [[c["sample"], c["kind"], fmt(c["import_ms"], 1), fmt(c["explain_ms"], 1),
                 fmt(c["first_explanation_ms"], 1), fmt(c["run_ms"], 1), (c["error"] or "")[-60:]]
                for c in results["cold"]]
        text += "\n\n" + table(
            ["sample", "kind", "import ms", "explain ms", "first total ms", "run ms", "error"], cold,
            "2b. First explanation in a fresh process (import = the analysis modules the hooks load "
            "on the first error)")
    return text


# ---------------------------------------------------------------------------------------------
# 3. Explanation latency on synthetic graphs (the failing code is in synthetic_graphs.py)


SMALL_LINKS = 10


def _variant_current_huge(nodes, w, x, marks, timing):
    synthetic_graphs.carried_state(max(1, nodes // 2), SMALL_LINKS, w, x, marks, timing)


def _variant_stale_huge(nodes, w, x, marks, timing):
    synthetic_graphs.carried_state(SMALL_LINKS, max(1, nodes // 2), w, x, marks, timing)


def _variant_shared_trunk(nodes, w, x, marks, timing):
    synthetic_graphs.shared_trunk(max(1, nodes // 2), w, x, marks, timing)


# graph name -> (function of the size, what the size counts)
SYNTHETIC = {
    "carried, huge current": (_variant_current_huge, "nodes"),
    "carried, huge stale": (_variant_stale_huge, "nodes"),
    "shared trunk, 2 losses": (_variant_shared_trunk, "nodes"),
}
# Part 3b: sizes that are not node counts, each run at its own sizes.
LONG_RUNS = {
    "unrolled cell, carried": (synthetic_graphs.unrolled_cell, "steps"),
    "carried, big dict in globals": (synthetic_graphs.carried_beside_big_table, "dict entries"),
}
_GRAPHS = {**SYNTHETIC, **LONG_RUNS}


def run_synthetic(variant: str, size: int, hooked: bool, profiler=None) -> dict:
    """Run one synthetic graph of `size` (nodes, steps or entries, as its table says)."""
    build = _GRAPHS[variant][0]
    w = torch.full((1,), 0.5, requires_grad=True)
    x = torch.full((1,), 0.1)
    marks, timing = [], []
    timer = AnalysisTimer(profiler, memory=hooked and profiler is None)
    clear_source_caches()
    gc.collect()
    error = None
    if hooked:
        explainer.install()
    started = perf_counter()
    try:
        with timer:
            try:
                build(size, w, x, marks, timing)
            except RuntimeError as raised:
                error = raised
        total = perf_counter() - started
        finding = journal.last() if hooked else None
    finally:
        if hooked:
            explainer.uninstall()
    built = sum(b - a for a, b in zip(marks[::2], marks[1::2]))
    error_notes = list(getattr(error, "__notes__", [])) if error is not None else []
    second = "second time" in str(error) if error is not None else False
    result = {
        "nodes": built,
        "raised_second_backward": second,
        "explain_s": timer.total("explain") if timer.count("explain") else None,
        "failing_backward_s": timing[-1] if timing else None,
        "first_backward_s": timing[0] if len(timing) > 1 else None,
        "total_s": total,
        "finding_kind": finding.kind if hooked and finding is not None else None,
        "culprit": finding.culprits[0].name if hooked and finding is not None and finding.culprits else None,
        "confidence": finding.confidence if hooked and finding is not None else None,
        "failed_note": any("could not explain" in n for n in error_notes),
        "explain_peak_extra_mb": timer.peak_extra_mb,
    }
    del error, error_notes, w, x
    gc.collect()
    return result


def _synthetic_row(variant: str, size: int, reps: int) -> dict:
    """`reps` runs of one graph with and without the hook, interleaved, summarised."""
    hook_runs, none_runs = [], []
    unit = _GRAPHS[variant][1]
    for rep in range(reps):
        modes = ("none", "hook") if rep % 2 == 0 else ("hook", "none")
        for mode in modes:
            log(f"[synthetic] {variant}, {size:.0e} {unit}, {mode} (rep {rep + 1})")
            (hook_runs if mode == "hook" else none_runs).append(run_synthetic(variant, size, mode == "hook"))
    peaks = [r["explain_peak_extra_mb"] for r in hook_runs if r["explain_peak_extra_mb"] is not None]
    first = hook_runs[0]
    return {
        "variant": variant,
        "nodes_requested": size if unit == "nodes" else None,
        "size": size,
        "unit": unit,
        "nodes": first["nodes"],
        "reps": len(hook_runs),
        "explain_s": median([r["explain_s"] for r in hook_runs]),
        "explain_s_all": [r["explain_s"] for r in hook_runs],
        "failing_backward_s_none": median([r["failing_backward_s"] for r in none_runs]),
        "failing_backward_s_hook": median([r["failing_backward_s"] for r in hook_runs]),
        "first_backward_s": median([r["first_backward_s"] for r in none_runs]),
        "total_s_none": median([r["total_s"] for r in none_runs]),
        "peak_extra_mb": max(peaks) if peaks else None,
        "finding_kind": first["finding_kind"],
        "culprit": first["culprit"],
        "confidence": first["confidence"],
        "raised_second_backward": all(r["raised_second_backward"] for r in hook_runs + none_runs),
        "explained": first["finding_kind"] == "second-backward" and not first["failed_note"],
    }


def bench_synthetic(sizes: list[int], reps: dict[int, int], long_sizes: dict[str, int]) -> dict:
    rows = [_synthetic_row(variant, nodes, reps.get(nodes, 1)) for nodes in sizes for variant in SYNTHETIC]
    long_rows = [_synthetic_row(variant, long_sizes[variant], 2) for variant in LONG_RUNS]
    at_million = [r["explain_s"] for r in rows if r["nodes_requested"] >= 1_000_000 and r["explain_s"] is not None]
    long_explain = [r["explain_s"] for r in long_rows if r["explain_s"] is not None]
    return {
        "rows": rows,
        "long_rows": long_rows,
        "target_s_at_1e6": TARGET_SYNTHETIC_S,
        "target_met": (max(at_million) <= TARGET_SYNTHETIC_S) if at_million else None,
        "long_target_met": (max(long_explain) <= TARGET_SYNTHETIC_S
                            and all(r["explained"] for r in long_rows)) if long_rows else None,
        "rss_mb_end": rss_mb(),
    }


def synthetic_table(results: dict) -> str:
    rows = []
    for r in results["rows"]:
        rows.append([
            r["variant"], r["nodes"], r["reps"], fmt(r["explain_s"], 3),
            fmt(r["failing_backward_s_none"], 3), fmt(r["failing_backward_s_hook"], 3),
            fmt(r["total_s_none"], 2), fmt(r["peak_extra_mb"], 0),
            f"{r['finding_kind']} / {r['culprit']} / {r['confidence']}" if r["explained"] else f"NO ({r['finding_kind']})",
        ])
    text = table(
        ["graph", "nodes", "reps", "explain s", "failing bw s (none)", "failing bw s (hook)",
         "build+run s (none)", "explain peak +MB", "finding / culprit / confidence"],
        rows, "3. Explanation latency on synthetic carried-state graphs")
    met = results["target_met"]
    text += (f"\ntarget: explain <= {TARGET_SYNTHETIC_S:g} s at 10^6 nodes: "
             + ("n/a (10^6 not run)" if met is None else "yes" if met else "NO"))
    if results.get("long_rows"):
        long_rows = [[r["variant"], f"{r['size']:,} {r['unit']}", r["nodes"], r["reps"], fmt(r["explain_s"], 3),
                      fmt(r["failing_backward_s_none"], 3), fmt(r["total_s_none"], 2), fmt(r["peak_extra_mb"], 0),
                      f"{r['finding_kind']} / {r['culprit']} / {r['confidence']}" if r["explained"]
                      else f"NO ({r['finding_kind']})"] for r in results["long_rows"]]
        text += "\n\n" + table(
            ["case", "size", "nodes", "reps", "explain s", "failing bw s (none)", "build+run s (none)",
             "explain peak +MB", "finding / culprit / confidence"],
            long_rows, "3b. Long unrolls and big globals")
        text += (f"\ntarget: explain <= {TARGET_SYNTHETIC_S:g} s for each: "
                 + ("yes" if results["long_target_met"] else "NO"))
    check = results.get("main_thread_free")
    if check:
        def verdict(found):
            if found["survived"]:
                return "survives"
            return f"DIES (signal {found['signal']})" if found["signal"] else f"fails (rc {found['returncode']})"

        text += (f"\nfreeing a {check['nodes']}-node chain on the main thread (8 MiB stack) after the "
                 f"error: no hook {verdict(check['none'])}, hook {verdict(check['hook'])}"
                 "")
    return text


# torch 2.13 frees a node that ever had a Python wrapper recursively (THPCppFunction_dealloc),
# not through the iterative deleteNode, and a graph walk gives every node it visits a wrapper:
# freeing a chain of ~6*10^4 wrapped nodes overflows an 8 MiB stack (SIGSEGV). The explainer caps
# its walks (graph.WRAP_BUDGET); `deep_free_check` is the regression check, on a fresh main thread.


def deep_free_check(nodes: int) -> dict:
    """Run the huge-current case at `nodes` on the main thread of a fresh process, with and
    without the hook, and report whether the process survives freeing the graph."""
    found = {}
    for mode in ("none", "hook"):
        log(f"[synthetic] main-thread free check, {nodes:.0e} nodes, {mode}")
        command = [sys.executable, str(Path(__file__).resolve()), "--_deep-free", str(nodes)]
        if mode == "hook":
            command.append("--_hooked")
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
        found[mode] = {
            "returncode": proc.returncode,
            "survived": proc.returncode == 0 and "survived" in proc.stdout,
            "signal": -proc.returncode if proc.returncode < 0 else None,
        }
    return {"nodes": nodes, **found}


def _deep_free_main(nodes: int, hooked: bool) -> None:
    result = run_synthetic("carried, huge current", nodes, hooked)  # frees the graph on return
    print(json.dumps({"explain_s": result["explain_s"]}), flush=True)
    print("survived", flush=True)


def profile_synthetic(nodes: int, top: int = 15) -> dict:
    texts = {}
    for variant in SYNTHETIC:
        log(f"[profile] {variant}, {nodes:.0e} nodes")
        profiler = cProfile.Profile()
        result = run_synthetic(variant, nodes, True, profiler)
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        stats.strip_dirs().sort_stats("cumulative").print_stats(top)
        body = stream.getvalue().strip()
        texts[variant] = {"nodes": result["nodes"], "explain_s_profiled": result["explain_s"], "text": body}
    return texts


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (< ~60 s)")
    parser.add_argument("--only", action="append", choices=["overhead", "samples", "synthetic"],
                        help="run only these parts (repeatable)")
    parser.add_argument("--sample", action="append", metavar="NAME",
                        help="in the samples part, only the samples whose name contains NAME (repeatable)")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile the explanation at the largest synthetic size")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a small shared machine, "
                             "2 spinning OpenMP threads make step times jump by 10x)")
    parser.add_argument("--device", default="cpu",
                        help="where the overhead part's training loops run (cpu, cuda); the samples "
                             "run where samples/_device.py puts them, on CUDA when there is a GPU")
    parser.add_argument("--json", type=Path, default=RESULTS / "latest.json", help="where to write the JSON blob")
    parser.add_argument("--_cold-sample", dest="cold_sample", help=argparse.SUPPRESS)
    parser.add_argument("--_deep-free", dest="deep_free", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--_hooked", dest="hooked", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    global LOOP_DEVICE
    LOOP_DEVICE = torch.device(args.device)
    if LOOP_DEVICE.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but CUDA is not available here")
    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
    if args.cold_sample:
        _cold_main(args.cold_sample)
        return 0
    if args.deep_free:
        _deep_free_main(args.deep_free, args.hooked)
        return 0
    parts = args.only or ["overhead", "samples", "synthetic"]
    if args.quick:
        config = {"rounds": 10, "micro_rounds": 5, "block_s": 0.02, "sample_reps": 2, "cold": 1,
                  "sizes": [10_000, 100_000], "reps": {10_000: 2, 100_000: 1}, "deep_free_nodes": 100_000,
                  "long_sizes": {"unrolled cell, carried": 20_000, "carried, big dict in globals": 1_000_000}}
    else:
        config = {"rounds": 100, "micro_rounds": 30, "block_s": 0.05, "sample_reps": 5, "cold": 4,
                  "sizes": [10_000, 100_000, 1_000_000], "reps": {10_000: 5, 100_000: 3, 1_000_000: 2}, "deep_free_nodes": 100_000,
                  "long_sizes": {"unrolled cell, carried": 200_000, "carried, big dict in globals": 10_000_000}}

    started = perf_counter()
    blob = {
        "meta": {
            "mode": "quick" if args.quick else "full",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "overhead_device": str(LOOP_DEVICE),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": {k: (v if not isinstance(v, dict) else {str(a): b for a, b in v.items()}) for k, v in config.items()},
        },
    }
    printed = []

    def settle() -> None:
        # Collect, then move what is left (torch, this script) to the permanent generation, so
        # the gc.collect() calls between timed blocks take microseconds instead of ~70 ms.
        gc.collect()
        gc.freeze()

    settle()
    if "overhead" in parts:
        blob["overhead"] = bench_overhead(LOOPS, config["rounds"], config["block_s"])
        printed.append(overhead_table(blob["overhead"], "1. Hook overhead per training step "
                                      "(medians over interleaved rounds; ratios are per-round paired)"))
        print("\n" + printed[-1] + "\n", flush=True)
        blob["overhead_micro"] = bench_overhead(MICRO_LOOPS, config["micro_rounds"], config["block_s"] / 2,
                                               target=False)
        printed.append(overhead_table(blob["overhead_micro"], "1b. Per-call cost of the hooks "
                                      "(read '+us'; the ratio target applies to the loops above)"))
        print(printed[-1] + "\n", flush=True)
    if "samples" in parts:
        settle()
        blob["samples"] = bench_samples(config["sample_reps"], config["cold"], names=args.sample)
        printed.append(samples_table(blob["samples"]))
        print(printed[-1] + "\n", flush=True)
    if "synthetic" in parts:
        settle()
        blob["synthetic"] = bench_synthetic(config["sizes"], config["reps"], config["long_sizes"])
        blob["synthetic"]["main_thread_free"] = deep_free_check(config["deep_free_nodes"])
        printed.append(synthetic_table(blob["synthetic"]))
        print(printed[-1] + "\n", flush=True)
    if args.profile:
        largest = config["sizes"][-1]
        blob["profile"] = profile_synthetic(largest)
        for variant, found in blob["profile"].items():
            print(f"cProfile of the explanation, {variant}, {found['nodes']} nodes "
                  f"(explain {fmt(found['explain_s_profiled'], 3)} s under the profiler), "
                  f"top 15 by cumulative time:\n{found['text']}\n", flush=True)

    blob["meta"]["elapsed_s"] = perf_counter() - started
    blob["meta"]["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    blob["meta"]["peak_rss_mb"] = peak_mb()
    blob["summary"] = {
        "hook_ratio": {k: v["hook_ratio"] for k, v in blob.get("overhead", {}).items()},
        "anomaly_ratio": {k: v["anomaly_ratio"] for k, v in blob.get("overhead", {}).items()},
        "hook_target_met": all(v["target_met"] for v in blob["overhead"].values()) if "overhead" in blob else None,
        "sample_max_latency_ms": blob["samples"]["max_latency_ms"] if "samples" in blob else None,
        "sample_target_met": blob["samples"]["target_met"] if "samples" in blob else None,
        "synthetic_explain_s": {f"{r['variant']} @ {r['nodes_requested']}": r["explain_s"]
                                for r in blob["synthetic"]["rows"]} if "synthetic" in blob else None,
        "synthetic_target_met": blob["synthetic"]["target_met"] if "synthetic" in blob else None,
        "long_explain_s": {f"{r['variant']} @ {r['size']} {r['unit']}": r["explain_s"]
                           for r in blob["synthetic"]["long_rows"]} if "synthetic" in blob else None,
        "long_target_met": blob["synthetic"]["long_target_met"] if "synthetic" in blob else None,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(blob, indent=2, default=str) + "\n")
    print(f"elapsed {blob['meta']['elapsed_s']:.1f} s; JSON written to {args.json}")
    print(json.dumps(blob, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
