"""The hooks beside the rest of PyTorch: DataLoader worker processes, `torch.compile`, activation
checkpointing (reentrant and not), autocast and DDP (single-process gloo). For each, correct
training gives bit-identical results with and without the hooks, and the carried-state bug
raises the same error with the same args and frames; where the engine can explain it there, the
note names the carrier."""
from __future__ import annotations

import multiprocessing
import os
import socket
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

import explainer
from conftest import without_and_with_hooks


class Windows(Dataset):
    """Sine windows; each item also runs a tiny backward, so the workers exercise autograd (and,
    forked, the hooked functions they inherit)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int):
        scale = torch.tensor(1.0 + index / 16, requires_grad=True)
        (scale * 2).backward()
        steps = torch.linspace(0, 6.28, 9) + index
        return torch.sin(steps[:-1]).unsqueeze(-1) * scale.grad / 2, torch.sin(steps[1:]).unsqueeze(-1)


class Recurrent(torch.nn.Module):
    def __init__(self, wrap=None) -> None:
        super().__init__()
        self.rnn = torch.nn.GRU(1, 6, batch_first=True)
        self.head = torch.nn.Linear(6, 1)
        self.wrap = wrap  # how the GRU is called: directly, through checkpoint, ...

    def forward(self, x, hidden):
        out, hidden = self.wrap(self.rnn, x, hidden) if self.wrap else self.rnn(x, hidden)
        return self.head(out), hidden


def train(model: torch.nn.Module, batches, carry_bug: bool, autocast: bool = False) -> list[torch.Tensor]:
    """A few steps of truncated BPTT; with `carry_bug`, `hidden` is never detached."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hidden = torch.zeros(1, 4, 6)
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            prediction, hidden = model(x, hidden if carry_bug else hidden.detach())
            loss = torch.nn.functional.mse_loss(prediction.float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def batches(workers: int = 0, context: str | None = None):
    return list(DataLoader(Windows(), batch_size=4, num_workers=workers, multiprocessing_context=context))


def assert_same_training(scenario) -> None:
    plain, hooked = without_and_with_hooks(scenario)
    assert not isinstance(plain, BaseException) and not isinstance(hooked, BaseException), (plain, hooked)
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked, strict=True))


def frames(error: BaseException) -> list[tuple[str, str]]:
    return [(f.name, f.line) for f in traceback.extract_tb(error.__traceback__) if "/explainer/" not in f.filename]


def assert_same_error(scenario, explained: bool = True) -> None:
    plain, hooked = without_and_with_hooks(scenario)
    assert isinstance(plain, RuntimeError) and isinstance(hooked, RuntimeError), (plain, hooked)
    assert (type(hooked), hooked.args) == (type(plain), plain.args)
    assert frames(hooked) == frames(plain)
    notes = getattr(hooked, "__notes__", [])
    if explained:
        assert len(notes) == 1 and "`hidden`" in notes[0], notes
    else:
        assert len(notes) <= 1


def _forked_batches_without_and_with_hooks() -> tuple[list, list]:
    plain = batches(2, "fork")
    explainer.install()
    try:
        return plain, batches(2, "fork")
    finally:
        explainer.uninstall()


def test_dataloader_forked_workers():
    # Forked workers that use autograd fail ("Autograd-and-Fork") once their parent has run a
    # backward on a machine with a GPU, and this pytest process has run many. A fresh spawned
    # process forks them before any backward, with and without the hooks it then installs.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        plain, hooked = pool.submit(_forked_batches_without_and_with_hooks).result(timeout=120)
    in_process = batches()
    for made in (plain, hooked):
        assert all(torch.equal(a, b) and torch.equal(c, d)
                   for (a, c), (b, d) in zip(made, in_process, strict=True))
    assert_same_training(lambda: train(Recurrent(), hooked, carry_bug=False))
    assert_same_error(lambda: train(Recurrent(), hooked, carry_bug=True))


def test_dataloader_spawned_workers():
    data = batches(2, "spawn")
    assert_same_training(lambda: train(Recurrent(), data, carry_bug=False))
    assert_same_error(lambda: train(Recurrent(), batches(2, "spawn"), carry_bug=True))


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing(reentrant):
    def wrap(rnn, x, hidden):
        # Reentrant checkpointing gives no parameter gradients unless an input requires grad.
        return checkpoint(rnn, x.detach().requires_grad_(reentrant), hidden, use_reentrant=reentrant)

    data = batches()
    assert_same_training(lambda: train(Recurrent(wrap), data, carry_bug=False))
    # Reentrant checkpointing runs its own backward inside ours; the carried state still fails
    # the same way (torch raises it from the inner backward) and nothing else is reported.
    assert_same_error(lambda: train(Recurrent(wrap), data, carry_bug=True))


def test_autocast():
    data = batches()
    assert_same_training(lambda: train(Recurrent(), data, carry_bug=False, autocast=True))
    assert_same_error(lambda: train(Recurrent(), data, carry_bug=True, autocast=True))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile(backend):
    torch._dynamo.reset()
    data = batches()

    def compiled(carry_bug: bool):
        model = Recurrent()
        model.forward = torch.compile(model.forward, backend=backend)
        return train(model, data, carry_bug)

    assert_same_training(lambda: compiled(False))
    assert_same_error(lambda: compiled(True))


def test_torch_compile_of_a_step_that_calls_backward():
    torch._dynamo.reset()
    data = batches()

    def run():
        model = Recurrent()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

        @torch.compile(backend="eager")
        def step(x, y, hidden):
            prediction, hidden = model(x, hidden)
            loss = torch.nn.functional.mse_loss(prediction, y)
            optimizer.zero_grad()
            loss.backward()  # a graph break: dynamo runs our hooked backward eagerly
            optimizer.step()
            return hidden.detach()

        hidden = torch.zeros(1, 4, 6)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x, y in data:
                hidden = step(x, y, hidden)
        seen.append(sorted({str(w.message) for w in caught}))
        return [p.detach().clone() for p in model.parameters()]

    seen: list[list[str]] = []
    assert_same_training(run)
    plain, hooked = seen
    assert set(hooked) <= set(plain)  # nothing new to warn about (dynamo would trace into the hooks)


@pytest.fixture
def process_group():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_distributed_data_parallel_gloo(process_group):
    data = batches()
    assert_same_training(lambda: train(DistributedDataParallel(Recurrent()), data, carry_bug=False))
    assert_same_error(lambda: train(DistributedDataParallel(Recurrent()), data, carry_bug=True))


def test_threads_training_side_by_side():
    import copy
    import threading

    data = batches()
    torch.manual_seed(0)
    models = [Recurrent() for _ in range(4)]  # made here: torch's RNG is shared by the threads
    references = [copy.deepcopy(m) for m in models]
    results: dict[int, list] = {}

    def worker(index: int) -> None:
        results[index] = train(models[index], data, carry_bug=False)

    explainer.install()
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        explainer.uninstall()
    for index, reference in enumerate(references):
        assert all(torch.equal(a, b) for a, b in zip(results[index], train(reference, data, False), strict=True))


@pytest.fixture(autouse=True)
def _quiet_workers(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
