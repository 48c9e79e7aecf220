# source: https://github.com/juntang-zhuang/torch_ACA/issues/1 — issue: "modified by an inplace operation ... is at version N; expected version N-1" since PyTorch 1.5, from func.load_state_dict inside the adaptive-step ODE integration
# fix-source: maintainer's comment in the issue (comment out the load_state_dict calls; the repository then gated them behind reload_state = False)
# expect-kind: inplace-modified
# expect-culprit: func.norm.weight
import torch
from torch import nn
from _device import DEVICE

reload_state = True


class ODEFunc(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.BatchNorm1d(dim)

    def forward(self, t, y):
        return torch.tanh(self.norm(self.fc(y)))


class RK12(nn.Module):
    order = 1

    def __init__(self, func, t0=0.0, t1=1.0, h=0.25):
        super().__init__()
        self.func, self.t0, self.t1, self.h = func, t0, t1, h

    def step(self, func, t, dt, y):
        k1 = func(t, y)
        k2 = func(t + dt, y + dt * k1)
        return y + dt * 0.5 * (k1 + k2), dt * 0.5 * (k2 - k1)

    def integrate(self, y0):
        y_current = y0
        t_current = self.t0
        h_current = self.h
        while t_current < self.t1 - 1e-9:
            if reload_state:
                state0 = self.func.state_dict()
            with torch.no_grad():  # trial step to choose the step size
                y_detach = y_current.clone().detach()
                _y_new, _error = self.step(self.func, t_current, h_current, y_detach)
            # restore state dict to before the trial step
            if reload_state:
                self.func.load_state_dict(state0)  # step
            y_current, error = self.step(self.func, t_current, h_current, y_current)  # culprit
            t_current = t_current + h_current
        return y_current


func = ODEFunc().to(DEVICE)
solver = RK12(func)
head = nn.Linear(4, 2).to(DEVICE)
optimizer = torch.optim.SGD(list(func.parameters()) + list(head.parameters()), lr=0.05)

for epoch in range(3):
    x = torch.randn(8, 4, device=DEVICE)
    target = torch.randn(8, 2, device=DEVICE)
    optimizer.zero_grad()
    out = head(solver.integrate(x))
    loss = nn.functional.mse_loss(out, target)
    loss.backward()
    optimizer.step()
print("done")
