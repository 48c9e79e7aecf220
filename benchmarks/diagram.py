"""The boundary picture: how long drawing a finding takes (target 20 ms), and that a 10^6-node
graph gives the same picture as a 20-node one, from one run.

    .venv/bin/python benchmarks/diagram.py [--nodes N] [--json OUT]

Each synthetic graph of benchmarks/synthetic_graphs.py fails under the hooks at 20 nodes and at
N (10^6 by default); its finding is drawn (timeline, text and SVG) 200 times, and the median,
the largest time and the SVG's size are printed, with the ratio of the large picture's size to
the small one's. The whole Jupyter HTML of the finding (the picture as a data: URI among the
rest) is timed too, as `html`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from time import perf_counter

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402

import explainer  # noqa: E402
import synthetic_graphs  # noqa: E402
from explainer.render import diagram  # noqa: E402
from explainer.render.html import render_html  # noqa: E402
from explainer.runtime import journal  # noqa: E402

GRAPHS = {
    "carried, huge current": lambda n, *a: synthetic_graphs.carried_state(max(1, n // 2), 10, *a),
    "carried, huge stale": lambda n, *a: synthetic_graphs.carried_state(10, max(1, n // 2), *a),
    "shared trunk, 2 losses": lambda n, *a: synthetic_graphs.shared_trunk(max(1, n // 2), *a),
}
REPEATS = 200


def finding_of(build, nodes: int):
    """The finding the hooks explain for one synthetic graph of `nodes` nodes."""
    w, x = torch.full((1,), 0.5, requires_grad=True), torch.full((1,), 0.1)
    explainer.install()
    try:
        build(nodes, w, x, [], [])
    except RuntimeError:
        return journal.last()  # read before uninstalling, which clears it
    finally:
        explainer.uninstall()
    raise SystemExit(f"{build} did not fail at {nodes} nodes")


def drawn(finding) -> tuple[list[float], list[float], str]:
    """Seconds of each of REPEATS drawings (timeline, text and SVG) and of as many renderings of
    the Jupyter HTML, and the SVG."""
    times, html_times, picture = [], [], ""
    for _ in range(REPEATS):
        started = perf_counter()
        line = diagram.timeline(finding)
        diagram.text(line)
        picture = diagram.svg(line)
        times.append(perf_counter() - started)
        started = perf_counter()
        render_html(finding)
        html_times.append(perf_counter() - started)
    return times, html_times, picture


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10**6)
    parser.add_argument("--json", metavar="OUT")
    options = parser.parse_args()
    rows = []
    for name, build in GRAPHS.items():
        sizes = {}
        for nodes in (20, options.nodes):
            times, html_times, picture = drawn(finding_of(build, nodes))
            sizes[nodes] = len(picture)
            rows.append({"graph": name, "nodes": nodes, "median_ms": statistics.median(times) * 1e3,
                         "max_ms": max(times) * 1e3, "svg_bytes": len(picture),
                         "html_median_ms": statistics.median(html_times) * 1e3, "html_max_ms": max(html_times) * 1e3})
            print(f"{name:<24} {nodes:>9} nodes  draw median {rows[-1]['median_ms']:.3f} ms, "
                  f"max {rows[-1]['max_ms']:.3f} ms  svg {len(picture)} bytes  html median "
                  f"{rows[-1]['html_median_ms']:.3f} ms, max {rows[-1]['html_max_ms']:.3f} ms")
        print(f"{name:<24} picture size ratio {options.nodes} / 20 nodes: {sizes[options.nodes] / sizes[20]:.2f}")
    worst = max(r["max_ms"] for r in rows)
    print(f"slowest drawing {worst:.3f} ms against the 20 ms target ({worst / 20:.3f} of it)")
    if options.json:
        Path(options.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
