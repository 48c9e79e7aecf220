"""The README's example is what `explainer run` prints for the README's main job, today: the
explanation, the fix once (the message is the explanation, not a second copy of the fix)."""
from __future__ import annotations

from conftest import ROOT, run_explainer

RULE = "─" * 72


def test_the_readme_example_is_the_note_the_main_job_prints(tmp_path):
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```\n[explainer] ") + 4
    example = readme[start:readme.index("```\n", start)].rstrip("\n")
    ran = run_explainer(ROOT / "samples" / "rnn_hidden_chunks.py", tmp_path=tmp_path)
    note = ran.stderr[ran.stderr.index(RULE) + len(RULE):ran.stderr.rindex(RULE)].strip("\n")
    assert example == note
    assert note.count("Fix:") == 1 and note.count("hidden.detach()") == 1
