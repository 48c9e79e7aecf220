# source: https://github.com/Lightning-AI/pytorch-lightning/issues/18254 — issue: with transformers' AdamW, whose step() is @torch.no_grad() and calls closure() as is, the training_step run inside the closure has no grad_fn
# fix-source: maintainer's comment in https://github.com/Lightning-AI/pytorch-lightning/issues/18222 (run the closure with grad enabled: torch.set_grad_enabled(True) in training_step, or torch's AdamW, whose step wraps closure() in torch.enable_grad())
# expect-kind: no-grad
# expect-culprit: out
import math

import torch
from _device import DEVICE


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                beta1, beta2 = group["betas"]
                state["step"] += 1
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
                step_size = group["lr"] * math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"])
                p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-step_size)
                p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return loss


class BoringModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(31, 2)
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def training_step(self, batch, batch_idx):
        input, label = batch
        out = self.layer(input)  # culprit
        loss = self.loss_fn(out, label)
        return loss

    def configure_optimizers(self):
        return AdamW(self.parameters(), lr=1e-2)


model = BoringModel().to(DEVICE)
optimizer = model.configure_optimizers()

for batch_idx in range(4):
    batch = (torch.randn(8, 31, device=DEVICE), torch.zeros(8, dtype=torch.long, device=DEVICE))

    def closure():  # what the trainer's automatic optimization hands to optimizer.step
        loss = model.training_step(batch, batch_idx)
        optimizer.zero_grad()
        loss.backward()
        return loss

    optimizer.step(closure=closure)
print("done")
