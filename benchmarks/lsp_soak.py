#!/usr/bin/env python
"""Language server under sustained load: edits at a steady rate for minutes, on a training file of
a few hundred lines, while the server's memory is sampled every second.

    .venv/bin/python benchmarks/lsp_soak.py                        # 300 s at 50 edits/s
    .venv/bin/python benchmarks/lsp_soak.py --seconds 15 --rate 50

Each edit is a real incremental didChange with the next version, and they alternate: one adds
`.detach()` where the RNN's hidden state re-enters the loop (the BX001 bug goes), the next takes
it out (the bug is back). Every publishDiagnostics is checked: it carries a version, versions never
go backwards, and its diagnostics are the checker's for the text of that version. Every
`--checkpoint` seconds, and after the last edit, the client pauses until the server publishes
exactly the version it sent last (the latest version is what it answers), up to `--deadline-ms`.
At the end a hover must come back promptly (no backlog). Memory: VmRSS from /proc every second;
the growth after warm-up (the first minute, or a third of a shorter run) must stay under
MAX_GROWTH_MIB.

Results go to benchmarks/results/lsp_soak.json; tests/test_lsp_load.py runs a 15 s version.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from bisect import bisect_left
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from lsp_latency import training_file  # noqa: E402
from lsp_wire import WireClient  # noqa: E402

from explainer import editor  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FIX = ".detach()"
# Bounded memory: after warm-up RSS may grow at most this much. A text of this file is ~9 KB and
# its AST far more, so a server that kept anything per edit (a version's text, tree or
# diagnostics) would grow by 100+ MiB over 15,000 edits; allocator noise and caches filling stay
# within a few MiB.
MAX_GROWTH_MIB = 16.0


def rss_kib(pid: int) -> tuple[int, int] | None:
    """(VmRSS in KiB, thread count) of a live process; None once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (OSError, ValueError):
        return None
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"])


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def slope_mib_per_min(samples: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of (seconds, KiB) samples, in MiB per minute."""
    if len(samples) < 3:
        return None
    xs, ys = [t for t, _ in samples], [k / 1024 for _, k in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else None


def soak(seconds: float = 300, rate: float = 50, lines: int = 400, deadline_ms: float = 2000,
         checkpoint_s: float = 10, hover_deadline_ms: float = 1000, max_growth_mib: float = MAX_GROWTH_MIB,
         progress=None, command: list[str] | None = None) -> dict:
    """Run the soak; the figures, and `failures` (empty when every property held)."""
    text = training_file(lines)
    row = next(i for i, line in enumerate(text.splitlines()) if line.rstrip().endswith("# culprit"))
    column = text.splitlines()[row].index("hidden)") + len("hidden")
    fixed_line = text.splitlines()[row][:column] + FIX + text.splitlines()[row][column:]
    fixed_text = "\n".join(fixed_line if i == row else line for i, line in enumerate(text.splitlines())) + "\n"
    path = RESULTS / "lsp_soak_train.py"
    uri = path.as_uri()

    def expected(source: str) -> list[tuple[str, int]]:
        return [(d.code, d.location.row - 1) for d in editor.check_document(source, str(path), editor.Settings())]

    want = {False: expected(text), True: expected(fixed_text)}  # by "is the fix in"
    assert want[False] == [("BX001", row)] and want[True] == [], want

    server = WireClient(command)
    pid = server.process.pid
    server.initialize(ROOT.as_uri())
    server.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": uri, "languageId": "python", "version": 1, "text": text}}})

    publishes: list[tuple[float, int | None, list]] = []  # (arrival, version, [(code, line)])
    others: list[dict] = []
    failures: list[str] = []

    def drain(block: float = 0.0) -> None:
        """Move what the server sent into `publishes`; wait up to `block` s for the first."""
        deadline = time.perf_counter() + block
        while True:
            found = server.wait_for(lambda m: True, max(0.0, deadline - time.perf_counter())) if block else None
            if found is None:
                try:
                    found = server.messages.get_nowait()
                except Exception:  # noqa: BLE001 - queue.Empty
                    return
            block = 0.0
            at, message = found
            params = message.get("params") or {}
            if message.get("method") == "textDocument/publishDiagnostics" and params.get("uri") == uri:
                publishes.append((at, params.get("version"),
                                  [(d["code"], d["range"]["start"]["line"]) for d in params["diagnostics"]]))
            else:
                others.append(message)

    def wait_version(version: int, timeout_s: float) -> float | None:
        """Arrival time of the publish for exactly `version`, waiting up to `timeout_s`."""
        deadline = time.perf_counter() + timeout_s
        while True:
            for at, v, _ in reversed(publishes):
                if v == version:
                    return at
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return None
            drain(block=min(remaining, 0.05))

    if wait_version(1, 60) is None:
        raise RuntimeError("no diagnostics for the opened file")

    memory: list[tuple[float, int, int]] = []  # (seconds into the soak, VmRSS KiB, threads)
    stop = threading.Event()
    started = time.perf_counter()

    def sample() -> None:
        while not stop.is_set():
            found = rss_kib(pid)
            if found is not None:
                memory.append((time.perf_counter() - started, *found))
            stop.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    sent: list[tuple[int, float, bool]] = []  # (version, when, fix in)
    checkpoints: list[dict] = []
    fix_in, version = False, 1
    end = started + seconds
    pace_from, paced, next_checkpoint = started, 0, started + checkpoint_s
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        due = pace_from + paced / rate
        if due > now:
            drain()
            time.sleep(min(due - now, 0.005))
            continue
        version, fix_in = version + 1, not fix_in
        change = ({"range": {"start": {"line": row, "character": column}, "end": {"line": row, "character": column}},
                   "text": FIX} if fix_in else
                  {"range": {"start": {"line": row, "character": column},
                             "end": {"line": row, "character": column + len(FIX)}}, "text": ""})
        at = server.send({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
            "textDocument": {"uri": uri, "version": version}, "contentChanges": [change]}})
        sent.append((version, at, fix_in))
        paced += 1
        if at >= next_checkpoint or at + 1 / rate >= end:
            answered = wait_version(version, deadline_ms / 1000)
            checkpoints.append({"version": version, "at_s": at - started,
                                "latency_ms": None if answered is None else (answered - at) * 1000})
            if progress:
                progress(f"[soak] {at - started:6.1f} s: {len(sent)} edits, {len(publishes)} publishes, "
                         f"RSS {memory[-1][1] / 1024 if memory else float('nan'):.1f} MiB")
            pace_from, paced, next_checkpoint = time.perf_counter(), 0, time.perf_counter() + checkpoint_s
    duration = time.perf_counter() - started
    last_version, last_fix = version, fix_in

    # No backlog: a request now is answered at once, and about the latest text.
    asked = time.perf_counter()
    at_target = text.splitlines()[row].index("hidden") + 1  # in `hidden` of `out, hidden = ...`
    hover = server.request(10**6, "textDocument/hover", {"textDocument": {"uri": uri},
                                                         "position": {"line": row, "character": at_target}},
                           timeout=max(10.0, hover_deadline_ms / 1000))
    hover_ms = (time.perf_counter() - asked) * 1000 if hover is not None else None
    time.sleep(0.5)  # anything still to come would show an older version after the last one
    drain()
    stop.set()
    sampler.join()
    final_rss = rss_kib(pid)
    server.close()

    # -- properties -----------------------------------------------------------------------------
    fix_of = {v: f for v, _, f in sent}
    fix_of[1] = False
    unversioned = [p for p in publishes if p[1] is None]
    backwards = sum(1 for a, b in zip(publishes, publishes[1:]) if a[1] is not None and b[1] is not None
                    and b[1] < a[1])
    wrong = [(v, got) for _, v, got in publishes if v in fix_of and got != want[fix_of[v]]]
    unknown = [v for _, v, _ in publishes if v is not None and v not in fix_of]
    final = [p for p in publishes if p[1] == last_version]
    if unversioned:
        failures.append(f"{len(unversioned)} publishes without a version")
    if backwards:
        failures.append(f"versions went backwards {backwards} times")
    if wrong or unknown:
        failures.append(f"{len(wrong)} publishes with diagnostics wrong for their version, "
                        f"{len(unknown)} for versions never sent: {(wrong + unknown)[:3]}")
    if not publishes or publishes[-1][1] != last_version:
        failures.append(f"the last publish is for version {publishes[-1][1] if publishes else None}, "
                        f"not the last one sent ({last_version})")
    crashed = [m["params"]["message"] for m in others
               if m.get("method") == "window/logMessage" and "failed" in m["params"]["message"]]
    if crashed:
        failures.append(f"{len(crashed)} checks failed: {sorted(set(crashed))[:3]}")
    missed = [c for c in checkpoints if c["latency_ms"] is None]
    if missed:
        failures.append(f"{len(missed)} of {len(checkpoints)} checkpoints: the version sent last was not "
                        f"published within {deadline_ms:.0f} ms (versions {[c['version'] for c in missed][:5]})")
    expected_hover = not last_fix
    hover_ok = hover is not None and bool(hover.get("result")) == expected_hover and (
        not expected_hover or "BX001" in hover["result"]["contents"]["value"])
    if hover is None or hover_ms > hover_deadline_ms or not hover_ok:
        failures.append(f"hover after the soak: {hover_ms} ms (limit {hover_deadline_ms:.0f}), answer {hover}")

    # Staleness: from each edit to the first publish of that version or a later one.
    # (Published versions never go backwards, checked above: the first one >= v is the earliest.)
    arrivals = [(v, at) for at, v, _ in publishes if v is not None]
    versions = [v for v, _ in arrivals]
    staleness = []
    for v, when, _ in sent:
        i = bisect_left(versions, v)
        staleness.append((arrivals[i][1] - when) * 1000 if i < len(arrivals) else None)
    covered = [s for s in staleness if s is not None]
    exact = {v for _, v, _ in publishes} & set(fix_of)

    warm_at = min(60.0, duration / 3)
    after_warm = [(t, k) for t, k, _ in memory if t >= warm_at]
    start_kib = memory[0][1] if memory else None
    warm_kib = after_warm[0][1] if after_warm else None
    end_kib = memory[-1][1] if memory else None
    growth_mib = (end_kib - warm_kib) / 1024 if after_warm else None
    if growth_mib is None or growth_mib > max_growth_mib:
        failures.append(f"RSS grew {growth_mib} MiB after warm-up (limit {max_growth_mib} MiB)")

    checkpoint_ms = [c["latency_ms"] for c in checkpoints if c["latency_ms"] is not None]
    return {
        "seconds": round(duration, 1), "rate_target": rate, "lines": len(text.splitlines()),
        "edits": len(sent), "edits_per_s": round(len(sent) / duration, 1),
        "publishes": len(publishes),
        "other_messages": dict(Counter(m.get("method", "response") for m in others)),
        "logged": sorted({m["params"]["message"][:200] for m in others if m.get("method") == "window/logMessage"}),
        "versions_answered_exactly": len(exact), "fraction_answered_exactly": round(len(exact) / max(1, len(sent)), 3),
        "staleness_ms": {"p50": percentile(covered, 0.5), "p95": percentile(covered, 0.95),
                         "max": max(covered) if covered else None,
                         "within_deadline": round(sum(1 for s in covered if s <= deadline_ms) / max(1, len(sent)), 4)},
        "checkpoints": {"count": len(checkpoints), "answered": len(checkpoints) - len(missed),
                        "latency_ms_p50": percentile(checkpoint_ms, 0.5),
                        "latency_ms_p95": percentile(checkpoint_ms, 0.95),
                        "latency_ms_max": max(checkpoint_ms) if checkpoint_ms else None},
        "final": {"version": last_version, "published": bool(final), "diagnostics": final[-1][2] if final else None,
                  "right": bool(final) and final[-1][2] == want[last_fix],
                  "latency_ms": checkpoints[-1]["latency_ms"] if checkpoints else None},
        "hover_after_ms": hover_ms,
        "publishes_without_version": len(unversioned), "versions_backwards": backwards,
        "publishes_wrong": len(wrong) + len(unknown),
        "rss_mib": {"start": start_kib / 1024 if start_kib else None, "warm_at_s": round(warm_at, 1),
                    "warm": warm_kib / 1024 if warm_kib else None, "end": end_kib / 1024 if end_kib else None,
                    "max": max(k for _, k, _ in memory) / 1024 if memory else None,
                    "growth_after_warm": growth_mib, "limit": max_growth_mib,
                    "slope_after_warm_mib_per_min": slope_mib_per_min(after_warm),
                    "after_close_kib": final_rss},
        "threads_max": max((n for _, _, n in memory), default=None),
        "deadline_ms": deadline_ms,
        "memory": [(round(t, 1), k) for t, k, _ in memory],
        "failures": failures,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--rate", type=float, default=50, help="edits per second")
    parser.add_argument("--lines", type=int, default=400)
    parser.add_argument("--deadline-ms", type=float, default=2000,
                        help="how long the last version may take to be published")
    parser.add_argument("--checkpoint", type=float, default=10, help="seconds between pauses for the last version")
    parser.add_argument("--json", type=Path, default=RESULTS / "lsp_soak.json")
    options = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = soak(options.seconds, options.rate, options.lines, options.deadline_ms, options.checkpoint,
                   progress=lambda line: print(line, file=sys.stderr, flush=True))
    options.json.write_text(json.dumps(results, indent=2))

    r, m, s, c = results, results["rss_mib"], results["staleness_ms"], results["checkpoints"]
    print(f"\nLanguage server soak: {r['seconds']:.0f} s of edits at {r['rate_target']:.0f}/s on a "
          f"{r['lines']}-line file")
    print(f"edits sent {r['edits']} ({r['edits_per_s']}/s), publishDiagnostics received {r['publishes']}, "
          f"versions answered exactly {r['versions_answered_exactly']} ({r['fraction_answered_exactly']:.1%})")
    print(f"every publish versioned: {r['publishes_without_version'] == 0}; versions backwards: "
          f"{r['versions_backwards']}; publishes wrong for their version: {r['publishes_wrong']}")
    print(f"staleness (edit -> publish of it or a later version): p50 {s['p50']:.1f} ms, p95 {s['p95']:.1f} ms, "
          f"max {s['max']:.1f} ms; within {r['deadline_ms']:.0f} ms: {s['within_deadline']:.2%} of edits")
    print(f"last version published after a pause: {c['answered']}/{c['count']} checkpoints, "
          f"p50 {c['latency_ms_p50']:.1f} ms, p95 {c['latency_ms_p95']:.1f} ms, max {c['latency_ms_max']:.1f} ms")
    print(f"final version {r['final']['version']}: published {r['final']['published']}, diagnostics right "
          f"{r['final']['right']}, {r['final']['latency_ms']:.1f} ms; hover afterwards {r['hover_after_ms']:.1f} ms")
    print(f"RSS: start {m['start']:.1f} MiB, at {m['warm_at_s']:.0f} s {m['warm']:.1f} MiB, end {m['end']:.1f} MiB, "
          f"max {m['max']:.1f} MiB; growth after warm-up {m['growth_after_warm']:+.2f} MiB "
          f"(limit {m['limit']:.0f} MiB), slope {m['slope_after_warm_mib_per_min']:+.3f} MiB/min; "
          f"threads max {r['threads_max']}")
    print("all properties held" if not r["failures"] else "FAILED:\n  " + "\n  ".join(r["failures"]))
    return 1 if r["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
