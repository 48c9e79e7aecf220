#!/usr/bin/env python
"""The hooks' cost per training step in instructions and estimated cycles (callgrind), as
ratios from one run that a noisy machine cannot blur.

    .venv/bin/python benchmarks/instructions.py              # about 5 minutes on 2 cores
    .venv/bin/python benchmarks/instructions.py --no-cache-sim   # instructions only, about 2 minutes

On a shared 2-core VM two back-to-back 50 ms blocks of the same training loop differ by a
standard deviation of about 15% (CPU time as much as wall time), so a wall-clock ratio cannot
show whether the hooks stay under 1% (`run.py --only overhead` reports its A/A control beside
it). Callgrind counts what the CPU executes instead: the same program gives the same count to
about 0.1%, whatever else the machine is doing.

Two processes run under `valgrind --tool=callgrind`, one without the hooks and one with
`explainer.install()`, each running the training loops of `run.py` (the same code). Every loop
runs inside its own marker, a C function of `itertools` that nothing in torch or the hooks calls,
and callgrind collects only inside the markers (`--toggle-collect`), so torch's import and the
warm-up steps are not counted. With the cache and branch simulators on, the estimated cycles are
callgrind's usual formula: Ir + 10 x (branch mispredictions + L1 misses) + 100 x last-level
misses. Instructions are not seconds; they are what the hooks add, measured exactly.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET_RATIO = 1.01


# Each driver runs `steps` steps inside its marker and returns how many items its `for` loop
# pulled: the loop enters the marker once per item and once more to find it exhausted.
def _inside_takewhile(step, steps: int) -> int:
    return sum(1 for _ in itertools.takewhile(lambda _: step() or True, range(steps)))


def _inside_accumulate(step, steps: int) -> int:
    return sum(1 for _ in itertools.accumulate(range(steps + 1), lambda total, _: step()))


def _inside_reduce(step, steps: int) -> int:
    functools.reduce(lambda total, _: step(), range(steps), None)
    return 0  # one call, no items


def _inside_starmap(step, steps: int) -> int:
    return sum(1 for _ in itertools.starmap(step, itertools.repeat((), steps)))


def _inside_call_tracing(step, steps: int) -> int:
    # sys.call_tracing is for debuggers: with no tracer set it only calls its function.
    sys.call_tracing(lambda: [step() for _ in range(steps)] and None, ())
    return 0  # one call, no items


# loop name in run.py -> (steps counted, the C function callgrind collects in, how to run inside it)
LOOPS = {
    "mlp (3 Linear, batch 64, SGD)": (30, "takewhile_next", _inside_takewhile),
    "gru (seq 20, batch 16, h 64)": (15, "accumulate_next", _inside_accumulate),
    "small-op (40 tiny ops/step)": (60, "functools_reduce", _inside_reduce),
    "micro: 2-node backward()": (300, "starmap_next", _inside_starmap),
    "micro: optimizer.step() only": (300, "sys_call_tracing", _inside_call_tracing),
}
WARMUP_STEPS = 30  # fills the hooks' call records and the allocator's caches before counting
EVENTS_CEST = {"Bcm": 10, "Bim": 10, "I1mr": 10, "D1mr": 10, "D1mw": 10, "ILmr": 100, "DLmr": 100, "DLmw": 100}


def child(variant: str) -> None:
    """Runs under callgrind: every loop, warmed up, then counted inside its marker."""
    sys.path.insert(0, str(HERE))
    import run
    import torch

    torch.set_num_threads(1)
    factories = {**run.LOOPS, **run.MICRO_LOOPS}
    loops = {name: factories[name]() for name in LOOPS}
    if variant == "hook":
        import explainer

        explainer.install()
    entries = {}
    for name, (steps, marker, inside) in LOOPS.items():
        step = loops[name]
        for _ in range(WARMUP_STEPS):
            step()
        entries[marker] = inside(step, steps) + 1
    print(json.dumps(entries))


def _callgrind(variant: str, out: Path, cache_sim: bool) -> subprocess.Popen:
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
               *(f"--toggle-collect={marker}" for _, marker, _ in LOOPS.values())]
    if cache_sim:
        command += ["--cache-sim=yes", "--branch-sim=yes"]
    command += [sys.executable, __file__, "--_child", variant]
    # A fixed hash seed: dict and set layouts, hence instruction counts, repeat run to run.
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _marker_costs(out: Path) -> dict[str, dict[str, int]]:
    """Each marker's inclusive event counts and how often it was entered, read from the raw
    profile: in callgrind's format the cost line after a `calls=` line is the inclusive cost of
    those calls."""
    markers = {marker for _, marker, _ in LOOPS.values()}
    events: list[str] = []
    positions = 1
    names: dict[str, str] = {}
    costs: dict[str, dict[str, int]] = {}
    callee, calls = None, 0
    for line in out.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("positions:"):
            positions = len(line.split()) - 1
        elif named := re.match(r"^c?fn=\((\d+)\)(?: (.*))?$", line):
            number, name = named.groups()
            names.setdefault(number, name)
            if line.startswith("cfn="):
                callee = names.get(number)
        elif line.startswith("calls="):
            calls = int(line[len("calls="):].split()[0])
        elif calls and callee in markers:
            counted = costs.setdefault(callee, dict.fromkeys(["calls", *events], 0))
            counted["calls"] += calls
            for event, value in zip(events, line.split()[positions:]):
                counted[event] += int(value)
            calls = 0
        else:
            calls = 0
    return costs


def cycles_estimate(counted: dict[str, int]) -> int | None:
    if "I1mr" not in counted:
        return None
    return counted["Ir"] + sum(weight * counted.get(event, 0) for event, weight in EVENTS_CEST.items())


def measure(cache_sim: bool) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        outs = {variant: Path(folder) / f"callgrind.{variant}" for variant in ("none", "hook")}
        processes = {variant: _callgrind(variant, out, cache_sim) for variant, out in outs.items()}
        entries = {}
        for variant, process in processes.items():
            stdout, stderr = process.communicate()
            if process.returncode != 0:
                raise SystemExit(f"callgrind run '{variant}' failed:\n{stderr[-3000:]}")
            entries[variant] = json.loads(stdout.strip().splitlines()[-1])
        costs = {variant: _marker_costs(out) for variant, out in outs.items()}
    # A marker entered from inside a measured step (by torch, or by the hooks) would switch
    # collection off there: each must be entered exactly as often as its driver's loop did, in
    # the whole process.
    misused = [f"{marker} ({variant} run): entered {costs[variant].get(marker, {}).get('calls', 0)} times, "
               f"by its driver {entries[variant][marker]}"
               for variant in costs for _, marker, _ in LOOPS.values()
               if costs[variant].get(marker, {}).get("calls", 0) != entries[variant][marker]]
    if misused:
        raise SystemExit("markers used outside their driver, choose others:\n  " + "\n  ".join(misused))
    results = {}
    for name, (steps, marker, _) in LOOPS.items():
        none, hook = costs["none"][marker], costs["hook"][marker]
        entry = {"steps": steps, "marker": marker,
                 "none_ir_per_step": none["Ir"] / steps, "hook_ir_per_step": hook["Ir"] / steps,
                 "hook_extra_ir_per_step": (hook["Ir"] - none["Ir"]) / steps, "ir_ratio": hook["Ir"] / none["Ir"]}
        none_cycles, hook_cycles = cycles_estimate(none), cycles_estimate(hook)
        if none_cycles and hook_cycles:
            entry.update({"none_cycles_per_step": none_cycles / steps, "hook_cycles_per_step": hook_cycles / steps,
                          "cycles_ratio": hook_cycles / none_cycles})
        entry["target_met"] = (entry.get("cycles_ratio") or entry["ir_ratio"]) <= TARGET_RATIO \
            if not name.startswith("micro") else None
        results[name] = entry
    return results


def report(results: dict) -> str:
    sys.path.insert(0, str(HERE))
    from run import table

    rows = []
    for name, r in results.items():
        cycles = "cycles_ratio" in r
        rows.append([
            name, str(r["steps"]), f"{r['none_ir_per_step']:,.0f}", f"+{r['hook_extra_ir_per_step']:,.0f}",
            f"{r['ir_ratio']:.4f}x",
            f"{r['none_cycles_per_step']:,.0f}" if cycles else "n/a",
            f"{r['cycles_ratio']:.4f}x" if cycles else "n/a",
            "-" if r["target_met"] is None else "yes" if r["target_met"] else "NO"])
    return table(["loop", "steps", "none Ir/step", "hook +Ir/step", "Ir ratio", "none est. cycles/step",
                  "est. cycles ratio", f"<= {TARGET_RATIO}x"], rows,
                 "Hook cost in instructions (callgrind; the micro loops give the per-call cost)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-cache-sim", action="store_true",
                        help="count instructions only (about twice as fast, no cycle estimate)")
    parser.add_argument("--json", type=Path, default=RESULTS / "instructions.json", help="where to write the JSON")
    parser.add_argument("--_child", dest="child", choices=["none", "hook"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    missing = [tool for tool in ("valgrind", "callgrind_annotate") if shutil.which(tool) is None]
    if missing:
        print(f"instructions.py needs {' and '.join(missing)} (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    import torch

    results = measure(cache_sim=not args.no_cache_sim)
    print(report(results))
    blob = {"meta": {"torch": torch.__version__, "python": sys.version.split()[0],
                     "cache_sim": not args.no_cache_sim, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "elapsed_s": round(time.perf_counter() - started, 1)},
            "loops": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(blob, indent=2))
    print(f"\nelapsed {blob['meta']['elapsed_s']} s; JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
