#!/usr/bin/env python
"""The checker on public training repositories: diagnostics per 10k lines, each one listed.

    .venv/bin/python benchmarks/corpus.py                      # every pinned repository
    .venv/bin/python benchmarks/corpus.py --mirror DIR         # where the git snapshots are
    .venv/bin/python benchmarks/corpus.py --only sfujim/TD3    # one (repeat for several)
    .venv/bin/python benchmarks/corpus.py --json OUT.json

Each repository of PINNED is read at its pinned commit from a bare git snapshot under
`MIRROR/<owner>+<name>/repo` (the layout the tool library's `fetch` writes; a clone's `.git`
works too). Only its `.py` and `.ipynb` files are written out, into a temporary folder, and
checked there as `explainer check` would, in this process. Nothing of theirs is imported or run,
and nothing is kept: the repositories' code never enters this one.

Prints a table (files, lines, diagnostics, per 10k lines, seconds), then every diagnostic as
`CODE repo/path:row message`, so each can be triaged. A repository missing from the mirror is
listed as missing and left out of the totals; a commit missing from its snapshot is an error.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# owner/name and the commit read. Training code of many kinds: RL (on-policy, off-policy,
# multi-agent), GANs, detection, translation, graph networks, forecasting, meta-learning,
# libraries that wrap training loops. Chosen before looking at what the checker says of them.
PINNED = (
    ("Beomi/InfiniTransformer", "045f4eba17a3155dbdc255d76b4623bebc768eb6"),
    ("DLR-RM/stable-baselines3", "e05d2dbe6eda0acd0ef2e316e3e4065677add3eb"),
    ("GFNOrg/torchgfn", "f39bfc96407c0dcf443a41e5abb97503d707ea94"),
    ("Lightning-AI/pytorch-lightning", "7f0c3436cd3f6ad3753125672024fc415cbcb414"),
    ("Liuhong99/Sophia", "a7e157229b71d58cf995d32854f1be15c265b350"),
    ("NCAR/miles-credit", "5e14b83c9927edf0b67cddc4f2ed33d2630d17cf"),
    ("NVIDIA/pix2pixHD", "14b3b3c7fff413086e3b58df52096f16b6891172"),
    ("OpenNMT/OpenNMT-py", "97111d97551c24857076a4102eabdb468b35cff4"),
    ("Rose-STL-Lab/torchTS", "93597cac5363a1377342146682d6af998cfc9734"),
    ("Zhaoyi-Yan/Shift-Net_pytorch", "a3534315b23c2db4f37e82666b8254bf13d2698d"),
    ("benedekrozemberczki/pytorch_geometric_temporal", "adefe44265ad8faf239fd6cf3b59b95ca3ee60aa"),
    ("bfGraph/STGraph", "ac8c137203b140253126c5256fcbb61985a59340"),
    ("cross32768/Dreamer_PyTorch", "0402b35c7324cb50dba1120fdd64d382042a6725"),
    ("dragen1860/MAML-Pytorch", "98a00d41724c133bd29619a2fb2cc46dd128a368"),
    ("facebookresearch/pytorch_GAN_zoo", "b75dee40918caabb4fe7ec561522717bf096a8cb"),
    ("hijkzzz/pymarl2", "8ccac7c5aa134422a2e3009be735d23cdf8ce2f8"),
    ("ikostrikov/pytorch-a3c", "48d95844755e2c3e2c7e48bbd1a7141f7212b63f"),
    ("jlamprou/Infini-Attention", "3a86dd5c528f3cf9ecd231314338c5fac6f88dd1"),
    ("k2-fsa/k2", "a741ae88abc6995345aa166464a239b7d270dd4c"),
    ("kashif/firedup", "8f3389c239c94b3ff46453f359061ae30d851ce8"),
    ("lucidrains/rotary-embedding-torch", "8bb4643d1c29f944c47d2e807452ac437689af18"),
    ("lweitkamp/option-critic-pytorch", "fab40f7aae0ff45cf5945b7de79d5ae5446d31a0"),
    ("marrlab/DomainLab", "0b0115acf12a1fec79332b2c102b00071d8c6f03"),
    ("medipixel/rl_algorithms", "fdfac4e7056ee5a9d5b48b7b9653ce844a03ca22"),
    ("memgraph/mage", "c72636014a8b144b5ec1969a8de39f5369a53f5c"),
    ("mosaicml/composer", "6405188805a0054b4551ec49e4919c54c971d0e8"),
    ("p-christ/Deep-Reinforcement-Learning-Algorithms-with-PyTorch", "4835bac8557fdacff1735eca004e35ea5a4b7443"),
    ("philtabor/Multi-Agent-Deep-Deterministic-Policy-Gradients", "a3c294aa6834f348a7401306dff3e67919c861f5"),
    ("pyg-team/pytorch-frame", "f6ff914e6668a48831be020b2b7f5db11f43089f"),
    ("seungeunrho/minimalRL", "c8efed8481e3cd40e9739cfde220a55522555b57"),
    ("sfujim/TD3", "34770ccdcb51df6f6c7d85c1ba7e40d71b940d16"),
    ("synsense/sinabs", "904eb89398cc4006af4a8ec2d5b7e48fc17b4ba1"),
    ("thu-ml/tianshou", "f2402056b03acafeedf2518a5088db55add004ab"),
    ("toshikwa/soft-actor-critic.pytorch", "1688d3595817d85c2bcd279bb8ec71221b502899"),
    ("ultralytics/yolov5", "5081342f04fb287fc2e5f2b5a4e06752b7937b1c"),
    ("watchernyu/REDQ", "7b5d1bff39291a57325a2836bd397a55728960bb"),
)
SUFFIXES = (".py", ".ipynb")


def git_dir(mirror: Path, repo: str) -> Path | None:
    folder = mirror / repo.replace("/", "+") / "repo"
    for candidate in (folder / ".git", folder):
        if (candidate / "HEAD").is_file():
            return candidate
    return None


def write_out(git: Path, commit: str, into: Path) -> int:
    """Write the .py and .ipynb files of `commit` under `into`; how many were written. Blobs the
    snapshot lacks (it keeps no file of 4 MiB or more) are skipped."""
    listing = subprocess.run(["git", f"--git-dir={git}", "ls-tree", "-r", "-z", commit],
                             capture_output=True, check=True).stdout.split(b"\0")
    wanted = []
    for entry in filter(None, listing):
        info, path = entry.split(b"\t", 1)
        mode, kind, blob = info.split()
        if kind == b"blob" and mode != b"120000" and path.decode("utf-8", "replace").endswith(SUFFIXES):
            wanted.append((blob.decode(), path.decode("utf-8", "replace")))
    batch = subprocess.run(["git", f"--git-dir={git}", "cat-file", "--batch"],
                           input="".join(f"{blob}\n" for blob, _ in wanted).encode(),
                           capture_output=True, check=True).stdout
    written, at = 0, 0
    for _, path in wanted:
        header_end = batch.index(b"\n", at)
        header = batch[at:header_end].split()
        at = header_end + 1
        if header[-1] == b"missing":
            continue
        size = int(header[2])
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(batch[at:at + size])
        at += size + 1
        written += 1
    return written


def lines_of(folder: Path) -> int:
    """Lines of Python: a .py file's lines, a notebook's code cells' lines."""
    total = 0
    for path in folder.rglob("*"):
        if path.suffix == ".py":
            total += path.read_bytes().count(b"\n")
        elif path.suffix == ".ipynb":
            try:
                cells = json.loads(path.read_bytes()).get("cells", [])
            except (ValueError, AttributeError):
                continue
            for cell in cells if isinstance(cells, list) else []:
                if isinstance(cell, dict) and cell.get("cell_type") == "code":
                    source = cell.get("source", "")
                    total += len("".join(source).splitlines()) if isinstance(source, list) else len(source.splitlines())
    return total


def check_repo(git: Path, repo: str, commit: str) -> dict:
    from explainer.static.check import check_paths

    with tempfile.TemporaryDirectory(prefix="corpus-") as folder:
        into = Path(folder) / repo.replace("/", "+")
        files = write_out(git, commit, into)
        lines = lines_of(into)
        started = time.process_time()
        report = check_paths([str(into)])
        seconds = time.process_time() - started
        found = [{"code": d.code, "path": str(Path(d.filename).relative_to(into)), "cell": d.cell,
                  "row": d.location.row, "message": d.message,
                  "fix": d.fix.applicability if d.fix is not None else None} for d in report.diagnostics]
        errors = [e.replace(str(into) + "/", "") for e in report.errors]
        fixed = _fix_everything(into, {d.filename for d in report.diagnostics if d.fix is not None})
    return {"repo": repo, "commit": commit, "files": files, "lines": lines, "cpu_seconds": seconds,
            "diagnostics": found, "errors": errors, "fixed": fixed}


def _fix_everything(into: Path, filenames: set[str]) -> dict:
    """`check --diff --unsafe-fixes` on the files with a fix: every fix, unsafe ones too, must
    leave code that parses (check_paths refuses to write any that does not; this counts it)."""
    from explainer.static.check import Fixing, check_paths

    report = check_paths(sorted(filenames), fix=Fixing(unsafe=True, write=False))
    return {"fixes": report.fixed, "files": len(report.diffs), "errors": report.errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=ROOT.parent / ".mirror",
                        help="folder of <owner>+<name>/repo git snapshots (default: ../.mirror)")
    parser.add_argument("--only", action="append", metavar="OWNER/NAME", help="check only this repository")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write every figure and diagnostic here")
    options = parser.parse_args(argv)
    pinned = [(r, c) for r, c in PINNED if not options.only or r in options.only]
    unknown = set(options.only or ()) - {r for r, _ in PINNED}
    if unknown:
        parser.error(f"not in the pinned list: {', '.join(sorted(unknown))}")

    results, missing = [], []
    for repo, commit in pinned:
        git = git_dir(options.mirror, repo)
        if git is None:
            missing.append(repo)
            continue
        print(f"checking {repo} ...", file=sys.stderr)
        results.append(check_repo(git, repo, commit))

    width = max((len(r["repo"]) for r in results), default=4)
    print(f"{'repository':<{width}}  {'files':>5}  {'lines':>7}  {'diag':>4}  {'/10k':>5}  {'cpu s':>6}")
    for r in results:
        per = 1e4 * len(r["diagnostics"]) / r["lines"] if r["lines"] else 0.0
        print(f"{r['repo']:<{width}}  {r['files']:>5}  {r['lines']:>7}  {len(r['diagnostics']):>4}  {per:>5.2f}  "
              f"{r['cpu_seconds']:>6.2f}")
    lines = sum(r["lines"] for r in results)
    count = sum(len(r["diagnostics"]) for r in results)
    seconds = sum(r["cpu_seconds"] for r in results)
    hit = sum(1 for r in results if r["diagnostics"])
    fixes = sum(r["fixed"]["fixes"] for r in results)
    summary = {"repositories": len(results), "missing": missing, "lines": lines, "diagnostics": count, "fixes": fixes,
               "per_10k_lines": 1e4 * count / lines if lines else 0.0, "repositories_hit": hit,
               "lines_per_cpu_second": lines / seconds if seconds else 0.0,
               "errors": sum(len(r["errors"]) for r in results)}
    print(f"\n{summary['repositories']} repositories, {lines} lines: {count} diagnostics "
          f"({summary['per_10k_lines']:.2f} per 10k lines), {hit} repositories hit, "
          f"{summary['lines_per_cpu_second']:,.0f} lines per CPU-second, {summary['errors']} errors")
    fixable = sum(1 for r in results for d in r["diagnostics"] if d["fix"])
    print(f"--fix --unsafe-fixes: {fixable} diagnostics offer a fix; applied pass after pass (a fix can uncover "
          f"another), {fixes} fixes, every result parsing ({sum(len(r['fixed']['errors']) for r in results)} errors)")
    if missing:
        print(f"missing from {options.mirror}: {', '.join(missing)}")
    for r in results:
        for d in r["diagnostics"]:
            cell = f"[cell {d['cell']}]" if d["cell"] else ""
            fix = f" (fix: {d['fix']})" if d["fix"] else ""
            print(f"{d['code']} {r['repo']}/{d['path']}{cell}:{d['row']} {d['message']}{fix}")
        for error in r["errors"]:
            print(f"error {r['repo']}: {error}")
    if options.json:
        options.json.write_text(json.dumps({"summary": summary, "repositories": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
