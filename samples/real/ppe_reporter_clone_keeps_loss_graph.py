# source: https://github.com/pfnet/pytorch-pfn-extras/pull/49 — PR "Use detach instead of clone to avoid retention of computational graph in reporter": Reporter.report copies a reported tensor with value.clone(), so LogReport's DictSummary sums (Summary.add: self._x += weight * value) every iteration's loss together with its graph until the epoch's log is written
# fix-source: https://github.com/pfnet/pytorch-pfn-extras/commit/39fd07116fc10ba6db2454c3c84119b3052e7c91 — merged fix: _copy_variable returns value.detach() instead of value.clone()
# expect-kind: graph-growth
# expect-culprit: self._x
import collections
import contextlib
import threading

import numpy
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

_thread_local = threading.local()


def _copy_variable(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


class Reporter:
    """Object to which observed values are reported."""

    def __init__(self):
        self._observer_names = {}
        self.observation = {}

    def __enter__(self):
        _get_reporters().append(self)

    def __exit__(self, exc_type, exc_value, traceback):
        _get_reporters().pop()

    @contextlib.contextmanager
    def scope(self, observation):
        old = self.observation
        self.observation = observation
        self.__enter__()
        try:
            yield
        finally:
            self.__exit__(None, None, None)
            self.observation = old

    def report(self, values, observer=None):
        # "If a value is of type Tensor, the variable is copied without
        # preserving the computational graph"
        values = {k: _copy_variable(v) for k, v in values.items()}
        self.observation.update(values)


def _get_reporters():
    try:
        reporters = _thread_local.reporters
    except AttributeError:
        reporters = _thread_local.reporters = []
    return reporters


def report(values, observer=None):
    reporters = _get_reporters()
    if reporters:
        reporters[-1].report(values, observer)


class Summary:
    """Computes the statistics of given scalars online."""

    def __init__(self):
        self._x = 0.0
        self._x2 = 0.0
        self._n = 0

    def add(self, value, weight=1):
        self._x += weight * value  # culprit
        self._x2 += weight * value * value
        self._n += weight

    def compute_mean(self):
        x, n = self._x, self._n
        return x / n


class DictSummary:
    def __init__(self):
        self._summaries = collections.defaultdict(Summary)

    def add(self, d):
        summaries = self._summaries
        for k, v in d.items():
            w = 1
            if numpy.isscalar(v) or getattr(v, 'ndim', -1) == 0:
                summaries[k].add(v, weight=w)

    def compute_mean(self):
        return {name: summary.compute_mean() for name, summary in self._summaries.items()}


class LogReport:
    """Accumulates the manager's observations and logs their mean every epoch."""

    def __init__(self, keys=None, trigger=(1, 'epoch')):
        self._keys = keys
        self._trigger_period = trigger[0]
        self._log = []
        self._init_summary()

    def __call__(self, manager):
        keys = self._keys
        observation = manager.observation
        summary = self._summary
        if keys is None:
            summary.add(observation)
        else:
            summary.add({k: observation[k] for k in keys if k in observation})

        if manager.iteration % (self._trigger_period * manager.iters_per_epoch) == 0:
            stats = self._summary.compute_mean()
            stats_cpu = {}
            for name, value in stats.items():
                stats_cpu[name] = float(value)  # copy to CPU
            stats_cpu['epoch'] = manager.epoch
            stats_cpu['iteration'] = manager.iteration
            self._log.append(stats_cpu)
            self._init_summary()

    @property
    def log(self):
        return self._log

    def _init_summary(self):
        self._summary = DictSummary()


class ExtensionsManager:
    def __init__(self, models, optimizers, max_epochs, iters_per_epoch, extensions):
        self._models = models
        self._optimizers = optimizers
        self.max_epochs = max_epochs
        self.iters_per_epoch = iters_per_epoch
        self._extensions = extensions
        self.iteration = 0
        self.observation = {}
        self.reporter = Reporter()

    @property
    def epoch(self):
        return self.iteration // self.iters_per_epoch

    @property
    def stop_trigger(self):
        return self.iteration >= self.max_epochs * self.iters_per_epoch

    def run_extensions(self):
        for extension in self._extensions:
            extension(self)

    @contextlib.contextmanager
    def run_iteration(self):
        self.observation = {}
        with self.reporter.scope(self.observation):
            try:
                yield
            finally:
                self.iteration += 1
                self.run_extensions()


# a GRU forecaster trained on sliding windows of a noisy sine wave
class Forecaster(nn.Module):
    def __init__(self, hidden=8):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, window):
        out, _ = self.gru(window)
        return self.head(out[:, -1])


series = torch.sin(torch.linspace(0, 12, 80, device=DEVICE)) + 0.1 * torch.randn(80, device=DEVICE)
windows = series.unfold(0, 9, 1)  # (72, 9): 8 steps of input, 1 to predict
model = Forecaster().to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

log_report = LogReport()
manager = ExtensionsManager(model, optimizer, max_epochs=1, iters_per_epoch=4, extensions=[log_report])

while not manager.stop_trigger:
    for batch_idx in range(manager.iters_per_epoch):
        batch = windows[batch_idx * 8:(batch_idx + 1) * 8]
        x, y = batch[:, :8].unsqueeze(-1), batch[:, 8:]
        with manager.run_iteration():
            optimizer.zero_grad()
            output = model(x)
            loss = F.mse_loss(output, y)
            report({'train/loss': loss})
            loss.backward()
            optimizer.step()

for entry in log_report.log:
    print(f"epoch {entry['epoch']} iteration {entry['iteration']}: train/loss {entry['train/loss']:.4f}")
print("done")
