"""Post-mortem against hooked: how often `explainer.explain(err)`, called after the error with no
hook installed (a user who meets the error first, then loads the tool), says what the hooked run
says: the same kind, culprit and line, for every buggy sample (ours, samples/real/,
samples/libraries/). Graph-growth samples raise nothing, so they are left out. Each sample also
runs hooked: the headline is agreement with the hooked run; beside it, how often post-mortem
names what the sample's label names (where the hooked run is wrong too, the two differ). With
`--fixes`, the figure of post-mortem `fixes[0]` equal to the hooked one (message, edits,
applicability) is added.

    .venv/bin/python benchmarks/postmortem.py [--fixes] [--json OUT]

Each sample runs in its own process; prints one line per sample, then the agreement, and its
JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "samples"))

import manifest  # noqa: E402

# Run in the sample's process: the script as __main__ with its folder first on sys.path, as
# `python SCRIPT` runs it, then the explanation of what it raised. The script stays __main__ for
# the explanation, as the user's own script does when it explains its error. Only the finding's
# facts come back.
_CHILD = """
import json, os, sys, types
script, hooked = sys.argv[1], sys.argv[2:] == ["hooked"]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script]
import explainer
if hooked:
    explainer.install()
out = {"raised": None}
main = types.ModuleType("__main__")
main.__dict__.update(__file__=script, __builtins__=__builtins__)
sys.modules["__main__"] = main
try:
    with open(script, "rb") as source:
        exec(compile(source.read(), script, "exec"), main.__dict__)
except Exception as error:
    out["raised"] = type(error).__name__
    finding = explainer.explain(error)
    if finding is not None:
        culprit = finding.culprits[0] if finding.culprits else None
        out.update(kind=finding.kind, code=finding.code, culprit=culprit and culprit.name,
                   row=culprit and culprit.location.row,
                   fix=finding.fixes[0].to_json() if finding.fixes else None)
print(json.dumps(out))
"""


def explain_after(sample: manifest.Sample, hooked: bool = False, runner=subprocess.run) -> dict:
    """The finding's facts for `sample` explained post-mortem (or, `hooked`, as the hooks did), in
    a process `runner` starts as `subprocess.run` does."""
    proc = runner([sys.executable, "-c", _CHILD, str(sample.path), *(["hooked"] if hooked else [])],
                  capture_output=True, text=True, cwd=sample.path.parent, timeout=600,
                  env={**os.environ, "PYTHONPATH": str(ROOT), "EXPLAINER_SAMPLE_DEVICE": "cpu"})
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"crashed": proc.stderr.strip().splitlines()[-1:]}


def _edits(fix: dict | None):
    return fix and (fix["message"], fix["edits"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixes", action="store_true", help="also compare fixes[0] with the hooked run's")
    parser.add_argument("--json", metavar="OUT")
    options = parser.parse_args()
    rows = []
    for sample in manifest.samples() + manifest.real_cases() + manifest.library_cases():
        if sample.kind in ("none", "graph-growth"):
            continue
        got, hooked = explain_after(sample), explain_after(sample, hooked=True)
        expected = {"kind": sample.kind, "culprit": sample.culprit, "row": sample.culprit_row}
        labelled = all(got.get(k) == v for k, v in expected.items())
        same = all(got.get(k) == hooked.get(k) for k in expected)
        row = {"sample": sample.name, "same": same, "labelled": labelled, "expected": expected, "post_mortem": got,
               "hooked": {k: hooked.get(k) for k in expected}}
        if options.fixes:
            row["same_fix"] = got.get("fix") == hooked.get("fix")
            row["same_edits"] = _edits(got.get("fix")) == _edits(hooked.get("fix"))
        rows.append(row)
        print(f"{'same' if same else 'DIFF'}{'' if row.get('same_fix', True) else ' (fix differs)'} {sample.name}"
              + ("" if same else f"  { {k: v for k, v in got.items() if k != 'fix'} }"), file=sys.stderr, flush=True)
    agreed = sum(r["same"] for r in rows)
    ours = [r for r in rows if "/" not in r["sample"]]
    labelled = sum(r["labelled"] for r in rows)
    summary = {"agreement": round(agreed / len(rows), 3), "same": agreed, "samples": len(rows),
               "labelled": labelled, "ours": f"{sum(r['same'] for r in ours)}/{len(ours)}", "rows": rows}
    print(f"post-mortem says what the hooked run says on {agreed} of {len(rows)} buggy samples "
          f"({summary['agreement']:.0%}); ours {summary['ours']}; what the label says on {labelled}")
    if options.fixes:
        summary["same_fix"] = sum(r["same_fix"] for r in rows)
        summary["same_edits"] = sum(r["same_edits"] for r in rows)
        print(f"post-mortem fixes[0] is the hooked run's on {summary['same_fix']} of {len(rows)}; "
              f"its message and edits on {summary['same_edits']} (where not, it may be offered as unsafe)")
    if options.json:
        Path(options.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
