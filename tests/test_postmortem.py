"""Post-mortem (`explainer.explain(err)` after the error, no hooks installed) on samples: the
same kind, culprit and line as the hooked run. benchmarks/postmortem.py measures every sample;
these must hold."""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from postmortem import explain_after  # noqa: E402

import manifest  # noqa: E402

BY_NAME = {s.name: s for s in manifest.samples() + manifest.real_cases() + manifest.library_cases()}


@pytest.mark.parametrize("name", [
    "rnn_hidden_chunks",
    # The root read from torch's own backward frame: the user's line holds no `.backward()`.
    "libraries/accelerate_rnn_state",
    "libraries/lightning_rnn_state",
])
def test_post_mortem_says_what_the_hooked_run_says(name):
    sample = BY_NAME[name]
    got = explain_after(sample)
    assert (got.get("kind"), got.get("culprit"), got.get("row")) == (sample.kind, sample.culprit, sample.culprit_row), got
