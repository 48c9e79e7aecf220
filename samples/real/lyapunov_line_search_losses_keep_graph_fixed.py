# source: https://github.com/StanfordASL/neural-network-lyapunov/pull/140 — merged PR "Fix the memory leak when calling line search sd for training Lyapunov": TrainLyapunovReLU.train_with_line_search (robust_value_approx/train_lyapunov.py) stores every iteration's loss tensor in `losses`, and LineSearchGD.step gets the previous loss tensor back, so each iteration's graph stays alive for the whole training run
# fix-source: https://github.com/StanfordASL/neural-network-lyapunov/commit/a0fdc7087128a8aabf4905f71beb4d51bbeefa72 — maintainers' fix: the closure returns only the loss, `losses[iter_count] = loss.item()` keeps floats, and LineSearchGD.step takes the previous loss as a float
# expect-kind: none
# fix: the closure returns only the loss and writes the MIP costs itself; `losses[iter_count] = loss.item()` after `loss.backward()`; LineSearchGD.step takes the previous loss as a float (a0fdc70), with the follow-up f24a511's move of zero_grad into the closure and the `-d_p.clone()`
import torch
import torch.nn as nn
from torch.optim.optimizer import Optimizer, required
from _device import DEVICE


class LineSearchGD(Optimizer):
    def __init__(self, params, lr=required, momentum=0, dampening=0,
                 weight_decay=0, nesterov=False, min_step_size=1e-8,
                 loss_minimal_decrement=1e-4, step_size_reduction=0.2):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov,
                        min_step_size=min_step_size,
                        loss_minimal_decrement=loss_minimal_decrement,
                        step_size_reduction=step_size_reduction)
        super(LineSearchGD, self).__init__(params, defaults)

    def add_grad(self, p, t, d_p):
        p.data.add_(d_p, alpha=t)

    def directional_evaluate(self, closure, p, t, d_p):
        for i in range(len(p)):
            self.add_grad(p[i], t, d_p[i])
        loss = closure()
        return loss

    def line_search(self, loss0, closure, p, t, d_p):
        for group in self.param_groups:
            loss_minimal_decrement = group['loss_minimal_decrement']
            step_size_reduction = group['step_size_reduction']
            min_step_size = group['min_step_size']

        increment = loss_minimal_decrement * torch.sum(torch.stack(
            [torch.sum(p[i].grad * d_p[i]) for i in range(len(p))]))
        t_prev = 0
        while t > min_step_size:
            loss = self.directional_evaluate(closure, p, t - t_prev, d_p)
            if loss <= loss0 + t * increment:
                return loss
            t_prev = t
            t *= step_size_reduction
        return loss

    def step(self, closure, loss0):
        assert(isinstance(loss0, float))
        p_all = []
        dp_all = []
        for group in self.param_groups:
            momentum = group['momentum']
            lr = group['lr']
            for p in group['params']:
                if p.grad is None:
                    continue
                d_p = p.grad.data
                if momentum != 0:
                    param_state = self.state[p]
                    if 'momentum_buffer' not in param_state:
                        buf = param_state['momentum_buffer'] = \
                            torch.clone(d_p).detach()
                    else:
                        buf = param_state['momentum_buffer']
                        buf.mul_(momentum).add_(d_p)
                    d_p = buf
                p_all.append(p)
                dp_all.append(-d_p.clone())
        return self.line_search(loss0, closure, p_all, lr, dp_all)


class LyapunovDiscreteTimeHybridSystem:
    def __init__(self, A):
        self.A = A
        self.x_dim = A.shape[0]

    def step_forward(self, x):
        return self.A @ x

    def lyapunov_value(self, relu_model, x_equilibrium, V_rho, x, relu_at_equilibrium):
        return relu_model(x).squeeze(-1) - relu_at_equilibrium + \
            V_rho * torch.norm(x - x_equilibrium, p=1, dim=-1)

    def lyapunov_positivity_loss_at_samples(self, relu_model, relu_at_equilibrium, x_equilibrium,
                                            state_samples, V_rho, epsilon, margin=0.):
        v = self.lyapunov_value(relu_model, x_equilibrium, V_rho, state_samples, relu_at_equilibrium)
        return torch.nn.HingeEmbeddingLoss(margin=margin)(
            v - epsilon * torch.norm(state_samples - x_equilibrium, p=1, dim=-1),
            torch.tensor(-1.).to(state_samples.device))

    def lyapunov_derivative_loss_at_samples_and_next_states(self, relu_model, V_rho, epsilon,
                                                            state_samples, state_next,
                                                            x_equilibrium, margin=0.):
        relu_at_equilibrium = relu_model(x_equilibrium)
        v = self.lyapunov_value(relu_model, x_equilibrium, V_rho, state_samples, relu_at_equilibrium)
        v_next = self.lyapunov_value(relu_model, x_equilibrium, V_rho, state_next, relu_at_equilibrium)
        return torch.nn.HingeEmbeddingLoss(margin=margin)(
            -(v_next - v + epsilon * v), torch.tensor(-1.).to(state_samples.device))


class TrainLyapunovReLU:
    def __init__(self, lyapunov_hybrid_system, V_rho, x_equilibrium):
        self.lyapunov_hybrid_system = lyapunov_hybrid_system
        self.V_rho = V_rho
        self.x_equilibrium = x_equilibrium
        self.max_iterations = 4
        self.learning_rate = 0.01
        self.momentum = 0.
        self.lyapunov_positivity_epsilon = 0.01
        self.lyapunov_derivative_epsilon = 0.01
        self.lyapunov_positivity_sample_margin = 0.
        self.lyapunov_derivative_sample_margin = 0.
        self.lyapunov_positivity_convergence_tol = -1.
        self.lyapunov_derivative_convergence_tol = -1.

    def total_loss(self, relu, state_samples_all, state_samples_next):
        relu_at_equilibrium = relu.forward(self.x_equilibrium)
        positivity_sample_loss = self.lyapunov_hybrid_system.\
            lyapunov_positivity_loss_at_samples(
                relu, relu_at_equilibrium, self.x_equilibrium,
                state_samples_all, self.V_rho,
                self.lyapunov_positivity_epsilon,
                margin=self.lyapunov_positivity_sample_margin)
        derivative_sample_loss = self.lyapunov_hybrid_system.\
            lyapunov_derivative_loss_at_samples_and_next_states(
                relu, self.V_rho, self.lyapunov_derivative_epsilon,
                state_samples_all, state_samples_next,
                self.x_equilibrium,
                margin=self.lyapunov_derivative_sample_margin)
        # stand-in for the Gurobi MIP objectives (floats, no history)
        with torch.no_grad():
            v = self.lyapunov_hybrid_system.lyapunov_value(
                relu, self.x_equilibrium, self.V_rho, state_samples_all, relu_at_equilibrium)
            positivity_mip_obj = v.min().item()
            derivative_mip_obj = (-v).max().item()
        positivity_mip_loss = 0.
        derivative_mip_loss = 0.
        loss = positivity_sample_loss + derivative_sample_loss + \
            positivity_mip_loss + derivative_mip_loss
        return loss, positivity_mip_obj, derivative_mip_obj,\
            positivity_sample_loss, derivative_sample_loss,\
            positivity_mip_loss, derivative_mip_loss

    def train_with_line_search(self, relu, state_samples_all):
        state_samples_next = torch.stack([
            self.lyapunov_hybrid_system.step_forward(
                state_samples_all[i]) for i in
            range(state_samples_all.shape[0])], dim=0)
        lyapunov_positivity_mip_costs = [None] * self.max_iterations
        lyapunov_derivative_mip_costs = [None] * self.max_iterations
        losses = [None] * self.max_iterations

        iter_count = 0

        def closure():
            relu.zero_grad()
            loss, lyapunov_positivity_mip_costs[iter_count],\
                lyapunov_derivative_mip_costs[iter_count], _, _, _, _ = \
                self.total_loss(relu, state_samples_all, state_samples_next)
            return loss

        loss = closure()
        loss.backward()
        losses[0] = loss.item()
        iter_count = 1
        optimizer = LineSearchGD(
            relu.parameters(), lr=self.learning_rate, momentum=self.momentum,
            min_step_size=1e-8, loss_minimal_decrement=-1e-4,
            step_size_reduction=0.2)
        while iter_count < self.max_iterations:
            loss = optimizer.step(closure, losses[iter_count-1])
            loss.backward()
            losses[iter_count] = loss.item()
            if lyapunov_positivity_mip_costs[iter_count] < \
                self.lyapunov_positivity_convergence_tol and \
                lyapunov_derivative_mip_costs[iter_count] < \
                    self.lyapunov_derivative_convergence_tol:
                return True
            print(f"iter {iter_count}, loss {losses[iter_count]}")
            iter_count += 1
        return False


x_dim = 2
A = torch.tensor([[0.9, 0.2], [-0.1, 0.8]], device=DEVICE)
system = LyapunovDiscreteTimeHybridSystem(A)
relu = nn.Sequential(nn.Linear(x_dim, 4), nn.ReLU(), nn.Linear(4, 1)).to(DEVICE)
x_equilibrium = torch.zeros(x_dim, device=DEVICE)
state_samples_all = torch.rand(16, x_dim, device=DEVICE) * 2 - 1
dut = TrainLyapunovReLU(system, 0.1, x_equilibrium)
dut.train_with_line_search(relu, state_samples_all)
print("done")
