# source: https://github.com/facebookresearch/flow_matching/issues/59 — "solver.compute_likelihood with enable_grad=True returns a trajectory and logprob which gradients are set to None": maximum-likelihood training of a CNF with loss = -log_p.mean() fails at loss.backward() with "element 0 of tensors does not require grad and does not have a grad_fn"
# fix-source: https://github.com/facebookresearch/flow_matching/pull/91 — merged by the maintainers as 7aaeb46279153a24742ee4228a9076c62239edaf: ODESolver.compute_likelihood's dynamics_func detaches the divergence terms and the returned (ut, div) only when enable_grad is False
# expect-kind: none
# fix: as PR #91: dynamics_func keeps the exact-divergence terms, the Hutchinson gradient (create_graph=enable_grad) and the returned ut, div attached when enable_grad is True
"""ODESolver.compute_likelihood of flow_matching (solver/ode_solver.py before PR #91) and the
maximum-likelihood training loop of the PR's notebook examples/2d_cnf_maximum_likelihood.ipynb.

Stand-ins: torchdiffeq.odeint is replaced by a fixed-step Euler `odeint` for a tuple state (what
torchdiffeq's "euler" computes, y + dt * f(t, y)); sklearn's make_moons by a tiny random batch.
"""
from typing import Callable, Optional

import torch
from torch import Tensor, nn
from torch.distributions import Independent, Normal
from _device import DEVICE

D = 2  # Data dimensionality


def odeint(func, y0, t, method="euler", options=None, atol=1e-5, rtol=1e-5):
    """Stands in for torchdiffeq.odeint: like its _TupleFunc, the tuple state is concatenated into
    one flat tensor and func gets views of it; fixed-grid euler steps y + dt * f(t, y)."""
    shapes = [y_i.shape for y_i in y0]
    numels = [y_i.numel() for y_i in y0]

    def unflat(y):
        return tuple(v.view(s) for v, s in zip(torch.split(y, numels), shapes))

    step_size = options["step_size"]
    t0, t1 = float(t[0]), float(t[-1])
    n_steps = int(round(abs(t1 - t0) / step_size))
    dt = (t1 - t0) / n_steps
    y = torch.cat([y_i.reshape(-1) for y_i in y0])
    sols = [y]
    for k in range(n_steps):
        tk = torch.tensor(t0 + k * dt, device=t.device)
        f = torch.cat([f_i.reshape(-1) for f_i in func(tk, unflat(y))])
        y = y + dt * f
    sols.append(y)
    return tuple(torch.stack(s) for s in zip(*[unflat(y_k) for y_k in sols]))


def gradient(output: Tensor, x: Tensor, grad_outputs: Optional[Tensor] = None,
             create_graph: bool = False) -> Tensor:
    if grad_outputs is None:
        grad_outputs = torch.ones_like(output).detach()
    grad = torch.autograd.grad(output, x, grad_outputs=grad_outputs, create_graph=create_graph)[0]
    return grad


class ModelWrapper(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, t: Tensor, **extras) -> Tensor:
        return self.model(x=x, t=t, **extras)


class ODESolver(nn.Module):
    def __init__(self, velocity_model):
        super().__init__()
        self.velocity_model = velocity_model

    def compute_likelihood(self, x_1: Tensor, log_p0: Callable[[Tensor], Tensor],
                           step_size: Optional[float], method: str = "euler",
                           atol: float = 1e-5, rtol: float = 1e-5,
                           time_grid: Tensor = torch.tensor([1.0, 0.0]),
                           return_intermediates: bool = False, exact_divergence: bool = False,
                           enable_grad: bool = False, **model_extras):
        assert time_grid[0] == 1.0 and time_grid[-1] == 0.0

        # Fix the random projection for the Hutchinson divergence estimator
        if not exact_divergence:
            z = (torch.randn_like(x_1).to(x_1.device) < 0) * 2.0 - 1.0

        def ode_func(x, t):
            return self.velocity_model(x=x, t=t, **model_extras)

        def dynamics_func(t, states):
            xt = states[0]
            with torch.set_grad_enabled(True):
                xt.requires_grad_()
                ut = ode_func(xt, t)

                if exact_divergence:
                    # Compute exact divergence
                    div = 0
                    for i in range(ut.flatten(1).shape[1]):
                        g = gradient(ut[:, i], xt, create_graph=True)[:, i]
                        if not enable_grad:
                            g = g.detach()
                        div += g
                else:
                    # Compute Hutchinson divergence estimator E[z^T D_x(ut) z]
                    ut_dot_z = torch.einsum("ij,ij->i", ut.flatten(start_dim=1), z.flatten(start_dim=1))
                    grad_ut_dot_z = gradient(ut_dot_z, xt, create_graph=enable_grad)
                    div = torch.einsum("ij,ij->i", grad_ut_dot_z.flatten(start_dim=1),
                                       z.flatten(start_dim=1))

            if not enable_grad:
                ut = ut.detach()
                div = div.detach()
            return ut, div

        y_init = (x_1, torch.zeros(x_1.shape[0], device=x_1.device))
        ode_opts = {"step_size": step_size} if step_size is not None else {}

        with torch.set_grad_enabled(enable_grad):
            sol, log_det = odeint(dynamics_func, y_init, time_grid.to(x_1.device), method=method,
                                  options=ode_opts, atol=atol, rtol=rtol)

        x_source = sol[-1]
        source_log_p = log_p0(x_source)

        if return_intermediates:
            return sol, source_log_p + log_det[-1]
        else:
            return sol[-1], source_log_p + log_det[-1]


class WrappedModel(ModelWrapper):
    def forward(self, x: torch.Tensor, t: torch.Tensor, **extras):
        t = t.view(1, 1).expand(x.shape[0], 1)  # nn model requires time to be [batch_size].
        return self.model(t, x)


class Flow(nn.Module):
    def __init__(self, dim: int = 2, h: int = 16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim + 1, h), nn.ELU(),
            nn.Linear(h, h), nn.ELU(),
            nn.Linear(h, dim))

    def forward(self, t: Tensor, x_t: Tensor) -> Tensor:
        return self.net(torch.cat((t, x_t), -1))


def get_data_batch(batch_size):
    # stands in for Tensor(make_moons(batch_size, noise=0.1)[0])
    return torch.randn(batch_size, D, device=DEVICE) * 0.5 + 0.5


if __name__ == "__main__":
    torch.manual_seed(0)
    exact_divergence = True
    p_init = Independent(Normal(torch.zeros(D, device=DEVICE), torch.ones(D, device=DEVICE)), 1)

    flow = Flow().to(DEVICE)
    wrapped_flow = WrappedModel(flow)
    solver = ODESolver(velocity_model=wrapped_flow)

    optimizer = torch.optim.Adam(flow.parameters(), 1e-3)

    losses = []

    for i in range(4):
        x_1 = get_data_batch(batch_size=8)

        z, log_p = solver.compute_likelihood(x_1=x_1, method='euler', step_size=0.25,
                                             exact_divergence=exact_divergence,
                                             log_p0=p_init.log_prob, enable_grad=True)
        loss = -log_p.mean()

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        losses.append(loss.item())

    print("done")
