# source: https://github.com/rtqichen/torchdiffeq/issues/154 — issue: an ODEFunc whose forward returns autograd.grad(self.my_func(x), x) trains with odeint but fails with odeint_adjoint ("y does not contain a gradient"), because OdeintAdjointMethod.forward solves the ODE under torch.no_grad()
# fix-source: https://github.com/rtqichen/torchdiffeq/issues/154 — maintainer's comment (rtqichen, 2021-03-16): wrap the evaluation in `with torch.enable_grad():` and take `x = x.clone().requires_grad_(True)` first
# expect-kind: none
# fix: evaluate my_func and its autograd.grad under torch.enable_grad() on x.clone().requires_grad_(True), so the field has a graph even inside the adjoint's no_grad forward solve
import argparse

import torch
import torch.nn as nn
import torch.optim as optim

from _device import DEVICE

parser = argparse.ArgumentParser('ODE demo')
parser.add_argument('--data_size', type=int, default=40)
parser.add_argument('--batch_time', type=int, default=5)
parser.add_argument('--batch_size', type=int, default=8)
parser.add_argument('--niters', type=int, default=4)
parser.add_argument('--adjoint', action='store_true', default=True)
args = parser.parse_args([])


# --- a small stand-in for torchdiffeq (fixed-step Euler), keeping its odeint / OdeintAdjointMethod split ---
def odeint(func, y0, t):
    ys = [y0]
    y = y0
    for i in range(len(t) - 1):
        y = y + (t[i + 1] - t[i]) * func(t[i], y)
        ys.append(y)
    return torch.stack(ys)


class OdeintAdjointMethod(torch.autograd.Function):

    @staticmethod
    def forward(ctx, func, y0, t, *adjoint_params):
        ctx.func = func
        with torch.no_grad():
            y = odeint(func, y0, t)
        ctx.save_for_backward(t, y, *adjoint_params)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        with torch.no_grad():
            func = ctx.func
            t, y, *adjoint_params = ctx.saved_tensors
            adjoint_params = tuple(adjoint_params)
            adj_y = grad_y[-1]
            adj_params = [torch.zeros_like(p) for p in adjoint_params]

            def augmented_dynamics(t, y, adj_y):
                with torch.enable_grad():
                    y = y.detach().requires_grad_(True)
                    func_eval = func(t, y)
                    vjp_y, *vjp_params = torch.autograd.grad(
                        func_eval, (y,) + adjoint_params, -adj_y, allow_unused=True, retain_graph=True)
                vjp_y = torch.zeros_like(y) if vjp_y is None else vjp_y
                vjp_params = [torch.zeros_like(p) if v is None else v for p, v in zip(adjoint_params, vjp_params)]
                return vjp_y, vjp_params

            for i in range(len(t) - 1, 0, -1):
                h = t[i - 1] - t[i]
                vjp_y, vjp_params = augmented_dynamics(t[i], y[i], adj_y)
                adj_y = adj_y + h * vjp_y + grad_y[i - 1]
                adj_params = [a + h * v for a, v in zip(adj_params, vjp_params)]
        return (None, adj_y, None, *adj_params)


def odeint_adjoint(func, y0, t):
    return OdeintAdjointMethod.apply(func, y0, t, *tuple(func.parameters()))


if args.adjoint:
    odeint_fn = odeint_adjoint
else:
    odeint_fn = odeint
# --- end of the stand-in ---

true_y0 = torch.tensor([[2., 0.]]).to(DEVICE)
t = torch.linspace(0., 0.5, args.data_size).to(DEVICE)
true_A = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]]).to(DEVICE)


class Lambda(nn.Module):

    def forward(self, t, y):
        return torch.mm(y**3, true_A)


with torch.no_grad():
    true_y = odeint(Lambda(), true_y0, t)


def get_batch():
    s = torch.randperm(args.data_size - args.batch_time, device=DEVICE)[:args.batch_size]
    batch_y0 = true_y[s]  # (M, D)
    batch_t = t[:args.batch_time]  # (T)
    batch_y = torch.stack([true_y[s + i] for i in range(args.batch_time)], dim=0)  # (T, M, D)
    return batch_y0.to(DEVICE), batch_t.to(DEVICE), batch_y.to(DEVICE)


class ODEFunc(nn.Module):
    def __init__(self):
        super(ODEFunc, self).__init__()
        self.net = nn.Sequential(nn.Linear(2, 50), nn.Tanh(), nn.Linear(50, 2))

    def my_func(self, x):
        y = self.net(x)
        return y

    def forward(self, t, x):
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            y = self.my_func(x)
            dy = torch.autograd.grad(y, x, grad_outputs=torch.ones_like(y), create_graph=True)[0]
        return dy


func = ODEFunc().to(DEVICE)
optimizer = optim.RMSprop(func.parameters(), lr=1e-3)

for itr in range(1, args.niters + 1):
    optimizer.zero_grad()
    batch_y0, batch_t, batch_y = get_batch()
    pred_y = odeint_fn(func, batch_y0, batch_t).to(DEVICE)
    loss = torch.mean(torch.abs(pred_y - batch_y))
    loss.backward()
    optimizer.step()

print("done")
