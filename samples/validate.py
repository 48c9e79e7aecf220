"""Run every sample through `python -m explainer run` and print a table.

    python samples/validate.py --device cpu|cuda [--write-readme] [--jobs N] [--only NAME ...]

For each buggy sample (the scenarios beside this file, the real-world cases in real/ and the
cases run by libraries in libraries/): the
explained kind, culprit and line against the sample's header; whether `fixes[0]` is offered as
safe, whether applying it makes the script run clean, and whether the fixed script then trains what its twin trains (every
parameter of every module and optimizer, same seed, within float tolerance; see trained.py); for
each fixed twin and clean scenario: that it runs clean. --write-readme puts the table into
samples/README.md with device and date.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import manifest
import trained

ROOT = manifest.HERE.parent
sys.path.insert(0, str(ROOT))

from explainer.fixes.edits import apply_edits  # noqa: E402
from explainer.model import Fix  # noqa: E402


def explain(script: Path, device: str, workdir: Path) -> tuple[int, list, float]:
    out = workdir / f"{script.stem}.{time.monotonic_ns()}.json"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "explainer", "run", "--json", str(out), str(script)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "EXPLAINER_SAMPLE_DEVICE": device, "PYTHONPATH": str(ROOT)},
    )
    return proc.returncode, json.loads(out.read_text())["findings"], time.perf_counter() - started


def patched_copy(sample: manifest.Sample, fix: dict, workdir: Path) -> Path:
    folder = Path(tempfile.mkdtemp(dir=workdir))
    shutil.copy(manifest.HERE / "_device.py", folder)  # the one that needs no parent folder
    target = folder / sample.path.name
    target.write_text(apply_edits(sample.path.read_text(), Fix.from_json(fix).edits))
    return target


def check(sample: manifest.Sample, device: str, workdir: Path) -> dict:
    code, findings, seconds = explain(sample.path, device, workdir)
    row = {"sample": sample.name, "expected": sample.kind, "seconds": round(seconds, 1)}
    if sample.kind == "none":
        row.update(kind="none" if not findings else findings[0]["kind"], ok=code == 0 and not findings)
        return row
    finding = findings[0] if findings else {}
    culprit = (finding.get("culprits") or [{}])[0]
    row.update(kind=finding.get("kind", "-"), culprit=culprit.get("name", "-"),
               line=culprit.get("location", {}).get("row", "-"))
    fixed_ok = trains_same = False
    row["fix0_safe"] = bool(finding.get("fixes")) and finding["fixes"][0]["applicability"] == "safe"
    if finding.get("fixes"):
        patched = patched_copy(sample, finding["fixes"][0], workdir)
        fix_code, fix_findings, _ = explain(patched, device, workdir)
        fixed_ok = fix_code == 0 and not fix_findings
        row["training"] = trained.trains_like(patched, sample.twins, workdir, device)
        trains_same = fixed_ok and not row["training"]
    twin_ok = None
    if sample.fixed is not None:
        twin_code, twin_findings, _ = explain(sample.fixed, device, workdir)
        twin_ok = twin_code == 0 and not twin_findings
    row.update(fix0_runs_clean=fixed_ok, fix0_trains_same=trains_same, twin_runs_clean=twin_ok)
    if finding.get("fixes") and not row["fix0_safe"] and sample.fixed is not None:
        # A fix that changes this step's gradients is unsafe by definition; when the expert's own
        # fix changes them too, the right fix cannot be safe.
        row["twin_changes_first_step"] = trained.changes_first_step(
            trained.trained_by(sample.path, workdir / f"{sample.path.stem}.buggy.pt", device),
            trained.trained_by(sample.fixed, workdir / f"{sample.path.stem}.twin.pt", device))
    expected = (sample.kind, sample.culprit_on(device), sample.culprit_row)
    row["ok"] = (row["kind"], row["culprit"], row["line"]) == expected \
        and (row["fix0_safe"] or row.get("twin_changes_first_step", False)) and trains_same and twin_ok is not False
    return row


def table(rows: list[dict]) -> str:
    lines = ["| sample | expected | explained | culprit (line) | fixes[0] is safe | fixes[0] runs clean "
             "| fixes[0] trains what the twin trains | twin runs clean | ok |",
             "|---|---|---|---|---|---|---|---|---|"]
    mark = {True: "yes", False: "**no**", None: "—"}
    for r in rows:
        culprit = f"`{r['culprit']}` ({r['line']})" if "culprit" in r else "—"
        lines.append(f"| `{r['sample']}` | {r['expected']} | {r['kind']} | {culprit} | "
                     f"{'no, as the twin' if r.get('twin_changes_first_step') else mark[r.get('fix0_safe')]} | {mark[r.get('fix0_runs_clean')]} | {mark[r.get('fix0_trains_same')]} | "
                     f"{mark[r.get('twin_runs_clean')]} | {mark[r['ok']]} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--write-readme", action="store_true")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="samples checked at once (each check runs its own processes)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="check only the samples whose name (`real/NAME` for a real-world case) starts "
                             "with one of these")
    options = parser.parse_args()
    if options.only and options.write_readme:
        parser.error("--write-readme writes the whole table: it cannot be combined with --only")
    chosen = [s for s in manifest.samples() + manifest.real_cases() + manifest.library_cases()
              if not options.only or s.name.startswith(tuple(options.only))]
    if not chosen:
        parser.error(f"no sample's name starts with {' or '.join(options.only)}")
    if options.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("validate: --device cuda, but CUDA is not available here", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as folder, \
            concurrent.futures.ThreadPoolExecutor(max(1, options.jobs)) as pool:
        def check_and_report(sample: manifest.Sample) -> dict:
            row = check(sample, options.device, Path(folder))
            why = "; ".join(row.get("training", [])[:2])
            print(f"{'ok ' if row['ok'] else 'BAD'} {sample.name}{'  ' + why if why else ''}",
                  file=sys.stderr, flush=True)
            return row

        rows = list(pool.map(check_and_report, chosen))
    rendered = table(rows)
    print(rendered)
    if options.write_readme:
        import torch

        device = torch.cuda.get_device_name(0) if options.device == "cuda" else "CPU"
        heading = (f"Device: {device} ({options.device}); torch {torch.__version__}; "
                   f"{datetime.date.today().isoformat()}. Made by `python samples/validate.py "
                   f"--device {options.device} --write-readme`.")
        if options.device == "cpu":
            heading = ("A CPU run: `--device cuda` runs the same checks on a GPU, and its table "
                       "replaces this one when a session has one.\n\n" + heading)
        readme = manifest.HERE / "README.md"
        text = readme.read_text()
        marker = "## Validation table"
        text = text[: text.index(marker)] if marker in text else text.rstrip() + "\n\n"
        readme.write_text(f"{text}{marker}\n\n{heading}\n\n{rendered}\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
