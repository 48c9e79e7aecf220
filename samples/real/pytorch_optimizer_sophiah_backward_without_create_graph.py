# source: https://github.com/kozistr/pytorch_optimizer/issues/193 — "sophiah bug": training a Transformer LM (booydar/LM-RMT) with pytorch_optimizer's SophiaH fails in step() -> compute_hutchinson_hessian at torch.autograd.grad(grads, params, ...) with "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"
# fix-source: https://github.com/kozistr/pytorch_optimizer/issues/193 — maintainer's answer (kozistr, repeated with an example in #194): SophiaH needs the gradients' graph, call `loss.backward(create_graph=True)`
# expect-kind: no-grad
# expect-culprit: grads
from typing import List

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.optimizer import Optimizer
from _device import DEVICE


class BaseOptimizer:
    r"""Base optimizer class (pytorch_optimizer/base/optimizer.py at 840120a, the parts SophiaH uses)."""

    @staticmethod
    def zero_hessian(param_groups, state, pre_zero: bool = True):
        for group in param_groups:
            for p in group['params']:
                if p.requires_grad and p.grad is not None and not p.grad.is_sparse:
                    if 'hessian' not in state[p]:
                        state[p]['hessian'] = torch.zeros_like(p)
                    elif pre_zero:
                        state[p]['hessian'].zero_()

    @staticmethod
    @torch.no_grad()
    def compute_hutchinson_hessian(param_groups, state, num_samples: int = 1, alpha: float = 1.0,
                                   distribution: str = 'gaussian'):
        r"""Hutchinson's approximate hessian, added to the state under key `hessian`."""
        params: List[torch.Tensor] = [
            p
            for group in param_groups
            for p in group['params']
            if p.requires_grad and p.grad is not None and not p.grad.is_sparse
        ]
        if len(params) == 0:
            return

        grads = [p.grad for p in params]

        for i in range(num_samples):
            if distribution == 'rademacher':
                zs = [torch.randint_like(p, 0, 1) * 2.0 - 1.0 for p in params]
            else:
                zs = [torch.randn_like(p) for p in params]

            h_zs = torch.autograd.grad(grads, params, grad_outputs=zs, retain_graph=i < num_samples - 1)
            for h_z, z, p in zip(h_zs, zs, params):
                state[p]['hessian'].add_(h_z * z, alpha=alpha / num_samples)

    @staticmethod
    def apply_weight_decay(p, grad, lr, weight_decay, weight_decouple, fixed_decay):
        if weight_decouple:
            p.mul_(1.0 - weight_decay * (1.0 if fixed_decay else lr))
        elif weight_decay > 0.0 and grad is not None:
            grad.add_(p, alpha=weight_decay)


class SophiaH(Optimizer, BaseOptimizer):
    r"""Second-order Clipped Stochastic Optimization.

        Requires `loss.backward(create_graph=True)` in order to calculate hessians.
    """

    def __init__(self, params, lr=6e-2, betas=(0.96, 0.99), weight_decay=0.0, weight_decouple=True,
                 fixed_decay=False, p=1e-2, update_period=10, num_samples=1, hessian_distribution='gaussian',
                 eps=1e-12):
        self.update_period = update_period
        self.num_samples = num_samples
        self.distribution = hessian_distribution

        defaults = {
            'lr': lr,
            'betas': betas,
            'weight_decay': weight_decay,
            'weight_decouple': weight_decouple,
            'fixed_decay': fixed_decay,
            'p': p,
            'eps': eps,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None, hessian=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        step: int = self.param_groups[0].get('step', 1)

        if step % self.update_period == 0:
            self.zero_hessian(self.param_groups, self.state)
            self.compute_hutchinson_hessian(
                param_groups=self.param_groups,
                state=self.state,
                num_samples=self.num_samples,
                distribution=self.distribution,
            )

        for group in self.param_groups:
            if 'step' in group:
                group['step'] += 1
            else:
                group['step'] = 1

            beta1, beta2 = group['betas']
            for p in group['params']:
                if p.grad is None:
                    continue

                grad = p.grad

                state = self.state[p]
                if len(state) == 0:
                    state['momentum'] = torch.zeros_like(p)
                    state['hessian_moment'] = torch.zeros_like(p)

                self.apply_weight_decay(p=p, grad=grad, lr=group['lr'], weight_decay=group['weight_decay'],
                                        weight_decouple=group['weight_decouple'], fixed_decay=group['fixed_decay'])

                momentum, hessian_moment = state['momentum'], state['hessian_moment']
                momentum.mul_(beta1).add_(grad, alpha=1.0 - beta1)

                if 'hessian' in state and group['step'] % self.update_period == 0:
                    hessian_moment.mul_(beta2).add_(state['hessian'], alpha=1.0 - beta2)

                update = (momentum / torch.clip(hessian_moment, min=group['eps'])).clamp_(-group['p'], group['p'])
                p.add_(update, alpha=-group['lr'])

        return loss


class TinyLM(nn.Module):
    # stand-in for LM-RMT's Transformer-XL language model
    def __init__(self, vocab=11, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ff = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, vocab))

    def forward(self, tokens):
        return self.ff(self.emb(tokens))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = TinyLM().to(DEVICE)
    # LM-RMT: `elif args.optim.lower() == 'sophiah': optimizer = SophiaH(model.parameters(), lr=args.lr,
    # betas=(0.96, 0.99), p=0.01, weight_decay=1e-1)`; a short update_period so the hessian step comes within 5 batches
    optimizer = SophiaH(model.parameters(), lr=1e-3, betas=(0.96, 0.99), p=0.01, weight_decay=1e-1, update_period=3)
    data = torch.randint(0, 11, (5, 4, 7), device=DEVICE)
    for batch in data:
        optimizer.zero_grad()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        loss.backward()  # culprit
        optimizer.step()
    print("done")
