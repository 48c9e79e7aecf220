# source: https://github.com/MIT-REALM/neural_clbf/issues/11 — issue: train_inverted_pendulum.py fails before the first epoch with "one of the variables needed for gradient computation has been modified by an inplace operation" (traceback through NeuralCLBFController.training_step -> descent_loss: `violation = F.relu(...)` then `violation *= condition_active`)
# fix-source: https://github.com/MIT-REALM/neural_clbf/pull/12 — merged PR (626cc1c): descent_loss writes `violation = violation * condition_active` and its accumulators out of place, and training_step sums `total_loss = total_loss + loss_value`
# expect-kind: inplace-modified
# expect-culprit: violation
from collections import OrderedDict
from typing import List, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class InvertedPendulum:
    """x = [theta, theta_dot], u = [torque]; control-affine xdot = f(x) + g(x) u."""

    N_DIMS = 2
    N_CONTROLS = 1
    THETA = 0
    THETA_DOT = 1
    U = 0

    def __init__(self, nominal_params, dt=0.01):
        self.nominal_params = nominal_params
        self.dt = dt
        self.n_dims = InvertedPendulum.N_DIMS
        self.n_controls = InvertedPendulum.N_CONTROLS
        self.angle_dims = [InvertedPendulum.THETA]
        self.goal_point = torch.zeros((1, self.n_dims), device=DEVICE)
        self.K = torch.tensor([[12.0, 4.0]], device=DEVICE)  # LQR gain (precomputed)
        self.P = torch.tensor([[3.0, 0.5], [0.5, 0.4]], device=DEVICE)  # Lyapunov matrix

    @property
    def state_limits(self):
        upper_limit = torch.ones(self.n_dims, device=DEVICE) * 2.0
        return (upper_limit, -1.0 * upper_limit)

    def _f(self, x, params):
        f = torch.zeros((x.shape[0], self.n_dims, 1)).type_as(x)
        m, L, b = params["m"], params["L"], params["b"]
        theta = x[:, InvertedPendulum.THETA]
        theta_dot = x[:, InvertedPendulum.THETA_DOT]
        f[:, InvertedPendulum.THETA, 0] = theta_dot
        f[:, InvertedPendulum.THETA_DOT, 0] = 9.81 / L * theta - b / (m * L ** 2) * theta_dot
        return f

    def _g(self, x, params):
        g = torch.zeros((x.shape[0], self.n_dims, self.n_controls)).type_as(x)
        m, L = params["m"], params["L"]
        g[:, InvertedPendulum.THETA_DOT, InvertedPendulum.U] = 1 / (m * L ** 2)
        return g

    def control_affine_dynamics(self, x, params):
        return self._f(x, params), self._g(x, params)

    def closed_loop_dynamics(self, x, u, params):
        f, g = self.control_affine_dynamics(x, params)
        return (f + torch.bmm(g, u.unsqueeze(-1))).squeeze(-1)

    def u_nominal(self, x):
        return -(x - self.goal_point) @ self.K.t()


class NeuralCLBFController(nn.Module):
    def __init__(self, dynamics_model, scenarios, clbf_hidden_layers=2, clbf_hidden_size=8,
                 clf_lambda=1.0, safe_level=1.0, clf_relaxation_penalty=1e2,
                 controller_period=0.05, barrier=False):
        super().__init__()
        self.dynamics_model = dynamics_model
        self.scenarios = scenarios
        self.n_scenarios = len(scenarios)
        self.clf_lambda = clf_lambda
        self.safe_level = safe_level
        self.clf_relaxation_penalty = clf_relaxation_penalty
        self.controller_period = controller_period
        self.barrier = barrier
        self.current_epoch = 0
        self.num_init_epochs = 5

        x_max, x_min = dynamics_model.state_limits
        self.x_center = (x_max + x_min) / 2.0
        self.x_range = (x_max - x_min) / 2.0
        self.n_dims_extended = dynamics_model.n_dims + len(dynamics_model.angle_dims)

        self.V_layers: OrderedDict[str, nn.Module] = OrderedDict()
        self.V_layers["input_linear"] = nn.Linear(self.n_dims_extended, clbf_hidden_size)
        self.V_layers["input_activation"] = nn.Tanh()
        for i in range(clbf_hidden_layers):
            self.V_layers[f"layer_{i}_linear"] = nn.Linear(clbf_hidden_size, clbf_hidden_size)
            if i < clbf_hidden_layers - 1:
                self.V_layers[f"layer_{i}_activation"] = nn.Tanh()
        self.V_nn = nn.Sequential(self.V_layers)

    def V_with_jacobian(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x_norm = (x - self.x_center) / self.x_range
        angles = x_norm[:, self.dynamics_model.angle_dims]
        x_norm = torch.cat((torch.sin(angles), x_norm[:, 1:], torch.cos(angles)), dim=-1)

        bs = x_norm.shape[0]
        JV = torch.zeros((bs, self.n_dims_extended, self.dynamics_model.n_dims)).type_as(x)
        for dim in range(self.dynamics_model.n_dims):
            JV[:, dim, dim] = 1.0 / self.x_range[dim]
        JV[:, 0, 0] = x_norm[:, 2] / self.x_range[0]
        JV[:, 2, 0] = -x_norm[:, 0] / self.x_range[0]

        V = x_norm
        for layer in self.V_nn:
            V = layer(V)
            if isinstance(layer, nn.Linear):
                JV = torch.matmul(layer.weight, JV)
            elif isinstance(layer, nn.Tanh):
                JV = torch.matmul(torch.diag_embed(1 - V ** 2), JV)

        JV = torch.bmm(V.unsqueeze(1), JV)
        V = 0.5 * (V * V).sum(dim=1)
        return V, JV

    def V(self, x):
        V, _ = self.V_with_jacobian(x)
        return V

    def V_lie_derivatives(self, x):
        _, gradV = self.V_with_jacobian(x)
        batch_size = x.shape[0]
        Lf_V = torch.zeros(batch_size, self.n_scenarios, 1).type_as(x)
        Lg_V = torch.zeros(batch_size, self.n_scenarios, self.dynamics_model.n_controls).type_as(x)
        for i in range(self.n_scenarios):
            f, g = self.dynamics_model.control_affine_dynamics(x, params=self.scenarios[i])
            Lf_V[:, i, :] = torch.bmm(gradV, f).squeeze(1)
            Lg_V[:, i, :] = torch.bmm(gradV, g).squeeze(1)
        return Lf_V, Lg_V

    def solve_CLF_QP(self, x, requires_grad=False):
        # stands in for the differentiable cvxpylayers QP:
        # min ||u - u_ref||^2 + p * r  s.t.  Lf_V + Lg_V u + lambda V <= r
        V = self.V(x)
        Lf_V, Lg_V = self.V_lie_derivatives(x)
        u_ref = self.dynamics_model.u_nominal(x)
        u_result = u_ref
        r_result = []
        for i in range(self.n_scenarios):
            Lg = Lg_V[:, i, :]
            excess = Lf_V[:, i, 0] + (Lg * u_ref).sum(-1) + self.clf_lambda * V
            u_result = u_result - Lg * (F.relu(excess) / ((Lg * Lg).sum(-1) + 1.0)).unsqueeze(-1)
            r_result.append(F.relu(Lf_V[:, i, 0] + (Lg * u_result).sum(-1) + self.clf_lambda * V).unsqueeze(-1))
        return u_result, torch.hstack(r_result)

    def boundary_loss(self, x, goal_mask, safe_mask, unsafe_mask) -> List[Tuple[str, torch.Tensor]]:
        loss = []
        V_goal_pt = self.V(self.dynamics_model.goal_point.type_as(x))
        goal_term = 1e1 * V_goal_pt.mean()
        loss.append(("CLBF goal term", goal_term))
        return loss

    def descent_loss(self, x, goal_mask, safe_mask, unsafe_mask, requires_grad=False):
        loss = []
        eps = 0.1
        V = self.V(x)
        if self.barrier:
            condition_active = torch.sigmoid(10 * (self.safe_level + eps - V))
        else:
            condition_active = torch.tensor(1.0, device=DEVICE)

        u_qp, qp_relaxation = self.solve_CLF_QP(x, requires_grad=requires_grad)
        qp_relaxation = torch.mean(qp_relaxation, dim=-1)
        qp_relaxation_loss = (qp_relaxation * condition_active).mean()
        loss.append(("QP relaxation", qp_relaxation_loss))

        # decrease using linearization
        eps = 1.0
        clbf_descent_term_lin = torch.tensor(0.0).type_as(x)
        clbf_descent_acc_lin = torch.tensor(0.0).type_as(x)
        Lf_V, Lg_V = self.V_lie_derivatives(x)
        for i, s in enumerate(self.scenarios):
            Vdot = Lf_V[:, i, :].unsqueeze(1) + torch.bmm(
                Lg_V[:, i, :].unsqueeze(1),
                u_qp.reshape(-1, self.dynamics_model.n_controls, 1),
            )
            Vdot = Vdot.reshape(V.shape)
            violation = F.relu(eps + Vdot + self.clf_lambda * V)
            violation *= condition_active
            clbf_descent_term_lin += violation.mean()
            clbf_descent_acc_lin += (violation <= eps).sum() / (violation.nelement() * self.n_scenarios)
        loss.append(("CLBF descent term (linearized)", clbf_descent_term_lin))

        # decrease using simulation
        eps = 1.0
        clbf_descent_term_sim = torch.tensor(0.0).type_as(x)
        clbf_descent_acc_sim = torch.tensor(0.0).type_as(x)
        for s in self.scenarios:
            xdot = self.dynamics_model.closed_loop_dynamics(x, u_qp, params=s)
            x_next = x + self.dynamics_model.dt * xdot
            V_next = self.V(x_next)
            violation = F.relu(eps + (V_next - V) / self.controller_period + self.clf_lambda * V)  # culprit
            violation *= condition_active

            clbf_descent_term_sim += violation.mean()
            clbf_descent_acc_sim += (violation <= eps).sum() / (violation.nelement() * self.n_scenarios)
        loss.append(("CLBF descent term (simulated)", clbf_descent_term_sim))
        return loss

    def initial_loss(self, x):
        loss = []
        epoch_count = max(self.current_epoch - self.num_init_epochs, 0)
        decrease_factor = 0.8 ** epoch_count
        V = self.V(x)
        P = self.dynamics_model.P.type_as(x)
        x0 = self.dynamics_model.goal_point.type_as(x)
        P = P.reshape(1, self.dynamics_model.n_dims, self.dynamics_model.n_dims)
        V_nominal = 0.5 * F.bilinear(x - x0, x - x0, P).squeeze()
        clbf_mse_loss = (V - V_nominal) ** 2
        clbf_mse_loss = decrease_factor * clbf_mse_loss.mean()
        loss.append(("CLBF MSE", clbf_mse_loss))
        return loss

    def training_step(self, batch, batch_idx):
        x, goal_mask, safe_mask, unsafe_mask = batch

        component_losses = {}
        component_losses.update(self.initial_loss(x))
        component_losses.update(self.boundary_loss(x, goal_mask, safe_mask, unsafe_mask))
        component_losses.update(
            self.descent_loss(x, goal_mask, safe_mask, unsafe_mask, requires_grad=True)
        )

        total_loss = torch.tensor(0.0).type_as(x)
        for _, loss_value in component_losses.items():
            if not torch.isnan(loss_value):
                total_loss += loss_value

        batch_dict = {"loss": total_loss, **component_losses}
        return batch_dict


nominal_params = {"m": 1.0, "L": 1.0, "b": 0.01}
scenarios = [nominal_params]
dynamics_model = InvertedPendulum(nominal_params, dt=0.01)
clbf_controller = NeuralCLBFController(dynamics_model, scenarios).to(DEVICE)
optimizer = torch.optim.SGD(clbf_controller.parameters(), lr=1e-3)

# the EpisodicDataModule's fixed samples: theta in (-pi/2, pi/2), theta_dot in (-1, 1)
lo = torch.tensor([-np.pi / 2, -1.0], device=DEVICE)
hi = torch.tensor([np.pi / 2, 1.0], device=DEVICE)
samples = lo + (hi - lo) * torch.rand(48, 2, device=DEVICE)

# what Lightning's automatic optimization does for each batch
for epoch in range(2):
    clbf_controller.current_epoch = epoch
    for batch_idx in range(3):
        x = samples[batch_idx * 16:(batch_idx + 1) * 16]
        goal_mask = x.norm(dim=-1) <= 0.3
        safe_mask = x.norm(dim=-1) <= 0.5
        unsafe_mask = x.norm(dim=-1) >= 1.5
        optimizer.zero_grad()
        out = clbf_controller.training_step((x, goal_mask, safe_mask, unsafe_mask), batch_idx)
        out["loss"].backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {out['loss'].item():.4f}")

print("done")
