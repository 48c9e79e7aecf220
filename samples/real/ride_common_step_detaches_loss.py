# source: https://github.com/LukasHedegaard/ride/pull/12 — "Fix missing gradient in train step": Lifecycle.common_step detached the returned "loss" along with the logged metrics
# fix-source: https://github.com/LukasHedegaard/ride/commit/f571e7c49d1b9965b0e0f19b6c756835d0d801fb — maintainer's fix "Removed loss detach in step"
# expect-kind: no-grad
# expect-culprit: step_output["loss"]
import collections
from types import SimpleNamespace
from typing import Any, Dict, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from _device import DEVICE


class Lifecycle:
    """Adds train lifecycle methods with cross_entropy loss (the part of ride.Lifecycle used in training)"""

    def metrics_step(self, preds: torch.Tensor, targets: torch.Tensor, **kwargs):
        return {"loss": self.loss(preds, targets)}

    def collect_metrics(self, preds: Tensor, targets: Tensor):
        return {
            k: v.to(device=DEVICE) if hasattr(v, "to") else v
            for k, v in self.metrics_step(preds, targets).items()
        }

    def common_step(self, pred, target, prefix="train/", log=False):
        loss_key = prefix + "loss"
        metrics = prefix_keys(prefix, self.collect_metrics(pred, target))

        if log:
            self.logged[f"step_{loss_key}"] = metrics[loss_key].item()
        return detach_to_cpu(  # culprit
            {
                "loss": metrics[loss_key],
                **metrics,
                "pred": pred,
                "target": target,
            }
        )

    def common_epoch_end(self, step_outputs, prefix="train/", exclude_keys={"pred", "target"}):
        keys = list(step_outputs[0].keys())
        mean_step_metrics = {
            k: torch.mean(torch.stack([x[k] for x in step_outputs]))
            for k in keys
            if k not in exclude_keys
        }
        preds, targets = zip(*[(s["pred"], s["target"]) for s in step_outputs])
        preds = cat_steps(preds)
        targets = cat_steps(targets)
        self.logged.update({k: v.item() for k, v in mean_step_metrics.items()})

    def preprocess_batch(self, batch):
        return batch

    def training_step(self, batch, batch_idx=None):
        batch = self.preprocess_batch(batch)
        x, target = batch[0], batch[1]
        pred = self.forward(x)
        return self.common_step(pred, target, prefix="train/", log=True)

    def training_epoch_end(self, step_outputs):
        self._epoch += 1
        self.common_epoch_end(step_outputs, prefix="train/")


def prefix_keys(prefix: str, dictionary: Dict) -> Dict:
    return {f"{prefix}{k}": v for k, v in dictionary.items()}


def detach_to_cpu(x: Union[Tensor, Sequence[Tensor], Dict[Any, Tensor]]):
    if isinstance(x, Tensor):
        return x.detach().cpu()
    if isinstance(x, collections.abc.Sequence):
        return [detach_to_cpu(t) for t in x]
    if isinstance(x, dict):
        return {k: detach_to_cpu(v) for k, v in x.items()}
    return x


def cat_steps(steps: Sequence[Union[Tensor, Sequence[Tensor], Dict[Any, Tensor]]]):
    if len(steps) == 0:
        return steps
    step = steps[0]
    if isinstance(step, Tensor):
        return torch.cat(steps)
    if isinstance(step, collections.abc.Sequence):
        return [cat_steps([s[i] for s in steps]) for i in range(len(step))]
    if isinstance(step, dict):
        return {k: cat_steps([s[k] for s in steps]) for k in step.keys()}
    raise ValueError("Steps should contain either a Tensor of Dict")


class MyModel(Lifecycle, nn.Module):
    def __init__(self, hparams):
        nn.Module.__init__(self)
        self.hparams = hparams
        self._epoch = 0
        self.logged = {}
        self.loss = getattr(F, hparams.loss)
        self.l1 = nn.Linear(10, 16)
        self.l2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


model = MyModel(SimpleNamespace(loss="cross_entropy")).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# what PyTorch Lightning's automatic optimization does with training_step's output
for epoch in range(2):
    step_outputs = []
    for batch_idx in range(3):
        batch = (torch.randn(8, 10, device=DEVICE), torch.randint(0, 3, (8,), device=DEVICE))
        step_output = model.training_step(batch, batch_idx)
        optimizer.zero_grad()
        step_output["loss"].backward()
        optimizer.step()
        # Lightning hands training_epoch_end the step's outputs detached
        step_outputs.append({k: v.detach() if isinstance(v, Tensor) else v for k, v in step_output.items()})
    model.training_epoch_end(step_outputs)
print("done")
