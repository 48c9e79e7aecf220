"""On a GPU: samples explained on CUDA, and GPU memory back to its level after an explanation.
Skipped cleanly where there is no CUDA device (CI never has one)."""
from __future__ import annotations

import gc

import pytest
import torch

import explainer
from conftest import ROOT

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_a_sample_is_explained_on_cuda(explain_run):
    run = explain_run(ROOT / "samples" / "rnn_hidden_chunks.py", env={"EXPLAINER_SAMPLE_DEVICE": "cuda"})
    assert run.returncode == 1
    assert run.findings[0]["culprits"][0]["name"] == "hidden"


def test_gpu_memory_returns_to_its_level_after_an_explanation():
    def train():
        rnn = torch.nn.GRU(64, 256).cuda()
        hidden = torch.zeros(1, 8, 256, device="cuda")
        for _ in range(2):
            out, hidden = rnn(torch.randn(32, 8, 64, device="cuda"), hidden)
            out.sum().backward()

    explainer.install()
    try:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        try:
            train()
        except RuntimeError as error:
            assert error.__notes__
        gc.collect()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before
    finally:
        explainer.uninstall()
