# source: https://github.com/pytorch/tnt/pull/539 — PR (Meta, D49265347): "The fit function calls _train_impl which is not decorated with torch.enable_grad(). If the user were to call fit after disabling grad, the call will fail" (torchtnt/framework/fit.py and train.py at a274b654^: only the train() entry point enables grad)
# fix-source: https://github.com/pytorch/tnt/commit/a274b65485ade30bad94d99168d528fb830bd18a — maintainers' "Enabling grad for _torch_impl function": decorate _train_impl with @torch.enable_grad(), so fit() trains with autograd on whatever the caller's grad mode
# expect-kind: no-grad
# expect-culprit: outputs
from typing import Iterable, Optional

import torch
import torch.nn as nn
from _device import DEVICE


class Progress:
    def __init__(self):
        self.num_epochs_completed = 0
        self.num_steps_completed = 0
        self.num_steps_completed_in_epoch = 0

    def increment_step(self):
        self.num_steps_completed += 1
        self.num_steps_completed_in_epoch += 1

    def increment_epoch(self):
        self.num_epochs_completed += 1
        self.num_steps_completed_in_epoch = 0


class PhaseState:
    def __init__(self, dataloader: Iterable, max_epochs: Optional[int] = None, evaluate_every_n_epochs: Optional[int] = None):
        self.dataloader = dataloader
        self.max_epochs = max_epochs
        self.evaluate_every_n_epochs = evaluate_every_n_epochs
        self._step_output = None


class State:
    def __init__(self, train_state: Optional[PhaseState] = None, eval_state: Optional[PhaseState] = None):
        self.train_state = train_state
        self.eval_state = eval_state


class TrainUnit:
    def __init__(self):
        self.train_progress = Progress()

    def tracked_modules(self):
        return {k: v for k, v in vars(self).items() if isinstance(v, nn.Module)}


class EvalUnit:
    def __init__(self):
        self.eval_progress = Progress()


def _set_module_training_mode(modules, mode):
    prior = {name: module.training for name, module in modules.items()}
    for module in modules.values():
        module.train(mode)
    return prior


def _reset_module_training_mode(modules, prior):
    for name, module in modules.items():
        module.train(prior[name])


@torch.no_grad()
def _evaluate_impl(state: State, eval_unit: EvalUnit) -> None:
    eval_state = state.eval_state
    tracked_modules = eval_unit.tracked_modules()
    prior_module_train_states = _set_module_training_mode(tracked_modules, False)
    for step_input in eval_state.dataloader:
        eval_state._step_output = eval_unit.eval_step(state, step_input)
        eval_unit.eval_progress.increment_step()
        eval_state._step_output = None
    eval_unit.eval_progress.increment_epoch()
    _reset_module_training_mode(tracked_modules, prior_module_train_states)


@torch.enable_grad()
def train(train_unit: TrainUnit, train_dataloader: Iterable, *, max_epochs: Optional[int] = None) -> None:
    state = State(train_state=PhaseState(dataloader=train_dataloader, max_epochs=max_epochs))
    _train_impl(state, train_unit)


def _train_impl(state: State, train_unit: TrainUnit) -> None:
    train_state = state.train_state
    tracked_modules = train_unit.tracked_modules()
    prior_module_train_states = _set_module_training_mode(tracked_modules, True)
    while train_unit.train_progress.num_epochs_completed < train_state.max_epochs:
        _train_epoch_impl(state, train_unit)
    _reset_module_training_mode(tracked_modules, prior_module_train_states)


def _train_epoch_impl(state: State, train_unit: TrainUnit) -> None:
    train_state = state.train_state
    evaluate_every_n_epochs = state.eval_state.evaluate_every_n_epochs if state.eval_state else None

    for step_input in train_state.dataloader:
        train_state._step_output = train_unit.train_step(state, step_input)
        train_unit.train_progress.increment_step()
        train_state._step_output = None

    train_unit.train_progress.increment_epoch()
    train_unit.on_train_epoch_end(state)

    if evaluate_every_n_epochs and train_unit.train_progress.num_epochs_completed % evaluate_every_n_epochs == 0:
        _evaluate_impl(state, train_unit)


def fit(unit, *, train_dataloader: Iterable, eval_dataloader: Iterable, max_epochs: Optional[int] = None,
        evaluate_every_n_epochs: Optional[int] = 1) -> None:
    state = State(
        train_state=PhaseState(dataloader=train_dataloader, max_epochs=max_epochs),
        eval_state=PhaseState(dataloader=eval_dataloader, evaluate_every_n_epochs=evaluate_every_n_epochs),
    )
    _train_impl(state, unit)


class MyUnit(TrainUnit, EvalUnit):
    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler):
        TrainUnit.__init__(self)
        EvalUnit.__init__(self)
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler

    def train_step(self, state: State, data) -> None:
        inputs, targets = data
        outputs = self.module(inputs)  # culprit
        loss = torch.nn.functional.binary_cross_entropy_with_logits(outputs, targets)
        loss.backward()

        self.optimizer.step()
        self.optimizer.zero_grad()

    def eval_step(self, state: State, data) -> None:
        inputs, targets = data
        outputs = self.module(inputs)
        return torch.nn.functional.binary_cross_entropy_with_logits(outputs, targets)

    def on_train_epoch_end(self, state: State) -> None:
        self.lr_scheduler.step()


module = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)).to(DEVICE)
optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
unit = MyUnit(module=module, optimizer=optimizer, lr_scheduler=lr_scheduler)

batches = [(torch.randn(4, 6, device=DEVICE), torch.rand(4, 1, device=DEVICE).round()) for _ in range(2)]

# the caller has switched autograd off before calling fit, the scenario the PR describes
torch.set_grad_enabled(False)
fit(unit, train_dataloader=batches, eval_dataloader=batches[:1], max_epochs=2)
print("done")
