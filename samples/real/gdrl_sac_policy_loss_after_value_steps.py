# source: https://github.com/mimoralea/gdrl/issues/13 — issue "For the records who faced inplace operation error": the SAC agent of chapter 12 (SAC.optimize_model) fails on torch>=1.5 in policy_loss.backward(), because policy_loss is built through online_value_model_a/b before value_optimizer_a/b.step() (same report: gdrl#34)
# fix-source: https://github.com/mimoralea/gdrl/issues/13 — the forum comment quoted in the issue (and the answer in gdrl#34, "updating/optimizing the policy model just before the value models are optimized"): zero_grad, backward, clip and step the policy right after policy_loss is computed, before the Q loss
# expect-kind: inplace-modified
# expect-culprit: self.online_value_model_b.output_layer.weight
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Normal
from _device import DEVICE


class FCQSA(nn.Module):
    def __init__(self, input_dim, output_dim, hidden_dims=(32, 32), activation_fc=F.relu):
        super(FCQSA, self).__init__()
        self.activation_fc = activation_fc
        self.input_layer = nn.Linear(input_dim + output_dim, hidden_dims[0])
        self.hidden_layers = nn.ModuleList()
        for i in range(len(hidden_dims) - 1):
            self.hidden_layers.append(nn.Linear(hidden_dims[i], hidden_dims[i + 1]))
        self.output_layer = nn.Linear(hidden_dims[-1], 1)

    def forward(self, state, action):
        x = self.activation_fc(self.input_layer(torch.cat((state, action), dim=1)))
        for hidden_layer in self.hidden_layers:
            x = self.activation_fc(hidden_layer(x))
        return self.output_layer(x)


class FCGP(nn.Module):
    def __init__(self, input_dim, action_bounds, log_std_min=-20, log_std_max=2,
                 hidden_dims=(32, 32), activation_fc=F.relu, entropy_lr=0.001):
        super(FCGP, self).__init__()
        self.activation_fc = activation_fc
        self.env_min, self.env_max = action_bounds
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        self.input_layer = nn.Linear(input_dim, hidden_dims[0])
        self.hidden_layers = nn.ModuleList()
        for i in range(len(hidden_dims) - 1):
            self.hidden_layers.append(nn.Linear(hidden_dims[i], hidden_dims[i + 1]))
        self.output_layer_mean = nn.Linear(hidden_dims[-1], len(self.env_max))
        self.output_layer_log_std = nn.Linear(hidden_dims[-1], len(self.env_max))
        self.to(DEVICE)
        self.env_min = torch.tensor(self.env_min, device=DEVICE, dtype=torch.float32)
        self.env_max = torch.tensor(self.env_max, device=DEVICE, dtype=torch.float32)
        self.nn_min, self.nn_max = -1.0, 1.0
        self.rescale_fn = lambda x: (x - self.nn_min) * (self.env_max - self.env_min) / \
            (self.nn_max - self.nn_min) + self.env_min
        self.target_entropy = -np.prod(self.env_max.shape)
        self.logalpha = torch.zeros(1, requires_grad=True, device=DEVICE)
        self.alpha_optimizer = optim.Adam([self.logalpha], lr=entropy_lr)

    def forward(self, state):
        x = self.activation_fc(self.input_layer(state))
        for hidden_layer in self.hidden_layers:
            x = self.activation_fc(hidden_layer(x))
        x_mean = self.output_layer_mean(x)
        x_log_std = self.output_layer_log_std(x)
        x_log_std = torch.clamp(x_log_std, self.log_std_min, self.log_std_max)
        return x_mean, x_log_std

    def full_pass(self, state, epsilon=1e-6):
        mean, log_std = self.forward(state)
        pi_s = Normal(mean, log_std.exp())
        pre_tanh_action = pi_s.rsample()
        tanh_action = torch.tanh(pre_tanh_action)
        action = self.rescale_fn(tanh_action)
        log_prob = pi_s.log_prob(pre_tanh_action) - torch.log(
            (1 - tanh_action.pow(2)).clamp(0, 1) + epsilon)
        log_prob = log_prob.sum(dim=1, keepdim=True)
        return action, log_prob, self.rescale_fn(torch.tanh(mean))


class SAC():
    def __init__(self, policy_model_fn, policy_max_grad_norm, policy_optimizer_fn, policy_optimizer_lr,
                 value_model_fn, value_max_grad_norm, value_optimizer_fn, value_optimizer_lr, tau):
        self.policy_model_fn = policy_model_fn
        self.policy_max_grad_norm = policy_max_grad_norm
        self.policy_optimizer_fn = policy_optimizer_fn
        self.policy_optimizer_lr = policy_optimizer_lr
        self.value_model_fn = value_model_fn
        self.value_max_grad_norm = value_max_grad_norm
        self.value_optimizer_fn = value_optimizer_fn
        self.value_optimizer_lr = value_optimizer_lr
        self.tau = tau

    def optimize_model(self, experiences):
        states, actions, rewards, next_states, is_terminals = experiences
        batch_size = len(is_terminals)

        # policy loss
        current_actions, logpi_s, _ = self.policy_model.full_pass(states)

        target_alpha = (logpi_s + self.policy_model.target_entropy).detach()
        alpha_loss = -(self.policy_model.logalpha * target_alpha).mean()

        self.policy_model.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.policy_model.alpha_optimizer.step()
        alpha = self.policy_model.logalpha.exp()

        current_q_sa_a = self.online_value_model_a(states, current_actions)
        current_q_sa_b = self.online_value_model_b(states, current_actions)  # culprit
        current_q_sa = torch.min(current_q_sa_a, current_q_sa_b)
        policy_loss = (alpha * logpi_s - current_q_sa).mean()

        # Q loss
        ap, logpi_sp, _ = self.policy_model.full_pass(next_states)
        q_spap_a = self.target_value_model_a(next_states, ap)
        q_spap_b = self.target_value_model_b(next_states, ap)
        q_spap = torch.min(q_spap_a, q_spap_b) - alpha * logpi_sp
        target_q_sa = (rewards + self.gamma * q_spap * (1 - is_terminals)).detach()

        q_sa_a = self.online_value_model_a(states, actions)
        q_sa_b = self.online_value_model_b(states, actions)
        qa_loss = (q_sa_a - target_q_sa).pow(2).mul(0.5).mean()
        qb_loss = (q_sa_b - target_q_sa).pow(2).mul(0.5).mean()

        self.value_optimizer_a.zero_grad()
        qa_loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online_value_model_a.parameters(),
                                       self.value_max_grad_norm)
        self.value_optimizer_a.step()

        self.value_optimizer_b.zero_grad()
        qb_loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online_value_model_b.parameters(),
                                       self.value_max_grad_norm)
        self.value_optimizer_b.step()  # step

        self.policy_optimizer.zero_grad()
        policy_loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy_model.parameters(),
                                       self.policy_max_grad_norm)
        self.policy_optimizer.step()

    def update_value_networks(self, tau=None):
        tau = self.tau if tau is None else tau
        for target, online in zip(self.target_value_model_a.parameters(),
                                  self.online_value_model_a.parameters()):
            target_ratio = (1.0 - tau) * target.data
            online_ratio = tau * online.data
            mixed_weights = target_ratio + online_ratio
            target.data.copy_(mixed_weights)

        for target, online in zip(self.target_value_model_b.parameters(),
                                  self.online_value_model_b.parameters()):
            target_ratio = (1.0 - tau) * target.data
            online_ratio = tau * online.data
            mixed_weights = target_ratio + online_ratio
            target.data.copy_(mixed_weights)

    def train(self, nS, nA, action_bounds, gamma, n_updates, batch_size=16):
        self.gamma = gamma
        self.target_value_model_a = self.value_model_fn(nS, nA)
        self.online_value_model_a = self.value_model_fn(nS, nA)
        self.target_value_model_b = self.value_model_fn(nS, nA)
        self.online_value_model_b = self.value_model_fn(nS, nA)
        self.update_value_networks(tau=1.0)

        self.policy_model = self.policy_model_fn(nS, action_bounds)

        self.value_optimizer_a = self.value_optimizer_fn(self.online_value_model_a,
                                                         self.value_optimizer_lr)
        self.value_optimizer_b = self.value_optimizer_fn(self.online_value_model_b,
                                                         self.value_optimizer_lr)
        self.policy_optimizer = self.policy_optimizer_fn(self.policy_model,
                                                         self.policy_optimizer_lr)

        for step in range(n_updates):
            # stand-in for self.replay_buffer.sample() and load(): a random batch of transitions
            states = torch.randn(batch_size, nS, device=DEVICE)
            actions = torch.rand(batch_size, nA, device=DEVICE) * 4 - 2
            rewards = torch.randn(batch_size, 1, device=DEVICE)
            next_states = torch.randn(batch_size, nS, device=DEVICE)
            is_terminals = (torch.rand(batch_size, 1, device=DEVICE) < 0.1).float()
            experiences = (states, actions, rewards, next_states, is_terminals)
            self.optimize_model(experiences)
            self.update_value_networks()


nS, nA = 3, 1
action_bounds = np.array([-2.0]), np.array([2.0])
agent = SAC(policy_model_fn=lambda nS, bounds: FCGP(nS, bounds, hidden_dims=(16, 16)),
            policy_max_grad_norm=float('inf'),
            policy_optimizer_fn=lambda net, lr: optim.Adam(net.parameters(), lr=lr),
            policy_optimizer_lr=0.0005,
            value_model_fn=lambda nS, nA: FCQSA(nS, nA, hidden_dims=(16, 16)).to(DEVICE),
            value_max_grad_norm=float('inf'),
            value_optimizer_fn=lambda net, lr: optim.Adam(net.parameters(), lr=lr),
            value_optimizer_lr=0.0007,
            tau=0.005)
agent.train(nS, nA, action_bounds, gamma=0.99, n_updates=4)
print("done")
