"""benchmarks/design_floor.py's variants do what its figures claim: the least-recording hooks
record each backward call and each optimizer step from the user's frame, and every variant
puts torch back as it found it."""
from __future__ import annotations

import gc
import importlib.util
import sys

import torch

from conftest import ROOT


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_least_recording_records_every_backward_and_step_from_the_user_frame():
    floor = _load("design_floor")
    run = _load("run")
    step = run.small_op_loop()
    with floor.VARIANTS["least recording"]():
        for _ in range(3):
            step()
        records = list(floor._marks)
    assert len(records) == 6
    backward_calls, steps = records[0::2], records[1::2]
    assert all(len(r) == 3 and r[1].co_name == "step" for r in backward_calls)
    assert all(len(r) == 4 and isinstance(r[1](), torch.optim.SGD) and r[2].co_name == "step" for r in steps)
    # A step's watermark is the one of the backward call before it: no node is made in between.
    assert [r[0] for r in backward_calls] == [r[0] for r in steps]


def test_every_variant_runs_and_restores_torch(capsys):
    floor = _load("design_floor")
    originals = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
    threads = torch.get_num_threads()
    try:
        assert floor.main(["--rounds", "1", "--block-s", "0.001", "--loop", "small-op"]) == 0
    finally:
        # main() sets one torch thread and freezes the heap for steadier timings; later tests
        # need neither.
        torch.set_num_threads(threads)
        gc.unfreeze()
    printed = capsys.readouterr().out
    assert all(variant in printed for variant in floor.VARIANTS if variant != "none")
    assert (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad) == originals
    from torch.optim.optimizer import _global_optimizer_post_hooks

    assert not _global_optimizer_post_hooks
