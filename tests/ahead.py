"""Sample scripts run in processes of their own, on as many threads as the machine has cores, each
run once and shared by every test that reads it.

The sample tests spend their time waiting on such processes. Waiting on one at a time left every
core but one idle, so a test module names what each of its tests will read (`plan`), and those
runs start, in test order, as soon as the module's first test does; a run a test is waiting for
goes before every run started only ahead of its test."""
from __future__ import annotations

import itertools
import os
import queue
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Iterable

import pytest

import forkserver
import trained
from conftest import Run, run_explainer

# One thread each: torch's threads in two processes on two cores spin against each other (a third
# more CPU time for the same runs).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
NOW, AHEAD = 0, 1  # queue priorities: a test waits for it; a later test will
_queue: queue.PriorityQueue = queue.PriorityQueue()
_order = itertools.count()
_lock = threading.Lock()
_jobs: dict[tuple, tuple[Future, Callable[[], object]]] = {}


def _work() -> None:
    while True:
        _, _, future, call = _queue.get()
        with _lock:
            if not future.set_running_or_notify_cancel():
                continue
        try:
            future.set_result(call())
        except BaseException as error:  # noqa: BLE001 - handed to the test that reads it
            future.set_exception(error)


def _queued(future: Future, call: Callable[[], object], priority: int) -> Future:
    _queue.put((priority, next(_order), future, call))
    return future


class _Once(Future):
    """A future that may sit in the queue twice (ahead, then now): the first taken runs it."""

    def set_running_or_notify_cancel(self) -> bool:
        return not (self.running() or self.done()) and super().set_running_or_notify_cancel()


for _ in range(max(2, os.cpu_count() or 1)):
    threading.Thread(target=_work, name="sample-run", daemon=True).start()


def _once(key: tuple, call: Callable[[], object], priority: int) -> Future:
    with _lock:
        if key not in _jobs:
            _jobs[key] = (_queued(_Once(), call, priority), call)
            return _jobs[key][0]
        future, call = _jobs[key]
        if priority == NOW and not (future.running() or future.done()):
            _queued(future, call, NOW)
        return future


def explaining(script: Path, priority: int = NOW) -> Future[Run]:
    """`script` under `python -m explainer run --json`, once."""
    return _once(("explain", script), lambda: explained(script, Path(tempfile.mkdtemp(prefix="explained-"))), priority)


def training(script: Path, priority: int = NOW) -> Future[dict]:
    """What `script` trains (`trained.trained_by`), once."""
    return _once(("train", script), lambda: trained_of(
        script, Path(tempfile.mkdtemp(prefix="trained-")) / f"{script.stem}.pt"), priority)


def explained(script: Path, folder: Path) -> Run:
    return run_explainer(script, tmp_path=folder, env=ONE_THREAD)


def trained_of(script: Path, out: Path) -> dict:
    return trained.trained_by(script, out, env=ONE_THREAD, runner=forkserver.run)


def now(call: Callable, *args) -> Future:
    """`call(*args)` on the pool, before everything started only ahead."""
    return _queued(Future(), lambda: call(*args), NOW)


def like_a_twin(result: dict, twins: tuple[Path, ...]) -> list[str]:
    """`trained.like_a_twin`, each twin trained once for every test that compares with it."""
    return trained.like_one_of(result, ((twin.name, training(twin).result()) for twin in twins))


def plan(items: Iterable[pytest.Item], module, reads: dict[str, Callable[[object], None]]) -> None:
    """Start, ahead, what each selected test of `module` reads: `reads[test name](sample)`."""
    for item in items:
        if getattr(item, "module", None) is module and item.originalname in reads:
            reads[item.originalname](item.callspec.params["sample"])
