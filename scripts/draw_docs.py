"""Draw docs/boundary.md's pictures: for each cause whose error has a boundary, run its sample
with `explainer run --svg` and write docs/media/boundary-BXnnn.svg. tests/test_diagram.py fails
while a picture is not what its sample draws now. Needs torch (it runs the samples)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEDIA = ROOT / "docs" / "media"
# The cause each picture shows, and the sample whose run draws it.
PICTURES = {
    "BX001": "rnn_hidden_chunks",
    "BX002": "running_loss_total",
    "BX004": "weight_outside_loop",
    "BX005": "past_states_list",
    "BX006": "gan_fake_reuse",
    "BX007": "seed002_ex1_hidden_layer",
    "BX008": "seed003_yest_retain_graph",
    "BX010": "grad_then_backward",
    "BX011": "real/moco_queue_no_clone",
}


def picture(code: str) -> Path:
    return MEDIA / f"boundary-{code}.svg"


def main() -> int:
    env = {**os.environ, "EXPLAINER_HANDOFF": "0", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as scratch:
        for code, sample in PICTURES.items():
            found = Path(scratch) / f"{sample.replace('/', '_')}.json"
            subprocess.run([sys.executable, "-m", "explainer", "run", "--json", str(found), "--svg", str(picture(code)),
                            str(ROOT / "samples" / f"{sample}.py")], env=env, cwd=ROOT, capture_output=True)
            if not found.exists():
                print(f"{sample}.py: the explainer wrote no findings", file=sys.stderr)
                return 1
            codes = [f["code"] for f in json.loads(found.read_text())["findings"]]
            if codes[:1] != [code]:
                print(f"{sample}.py: found {codes}, not {code}", file=sys.stderr)
                return 1
            print(f"wrote {picture(code).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
