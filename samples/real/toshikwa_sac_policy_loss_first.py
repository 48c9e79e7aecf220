# source: https://github.com/toshikwa/soft-actor-critic.pytorch/issues/1 — SACAgent.learn raises the in-place version error with torch 1.7 (works with 1.3.1)
# fix-source: issue comment (lknownothing), accepted by the maintainer — calculate policy_loss after the Q1/Q2 updates
# expect-kind: inplace-modified
# expect-culprit: self.critic.Q2.Q[2].weight
import torch
import torch.nn as nn
from torch.distributions import Normal
from _device import DEVICE


def update_params(optim, network, loss, grad_clip=None, retain_graph=False):
    optim.zero_grad()
    loss.backward(retain_graph=retain_graph)
    if grad_clip is not None:
        for p in network.modules():
            torch.nn.utils.clip_grad_norm_(p.parameters(), grad_clip)
    optim.step()


def soft_update(target, source, tau):
    for t, s in zip(target.parameters(), source.parameters()):
        t.data.copy_(t.data * (1.0 - tau) + s.data * tau)


class QNetwork(nn.Module):
    def __init__(self, num_inputs, num_actions, hidden_units=16):
        super().__init__()
        self.Q = nn.Sequential(nn.Linear(num_inputs + num_actions, hidden_units), nn.ReLU(),
                               nn.Linear(hidden_units, 1))

    def forward(self, x):
        return self.Q(x)


class TwinnedQNetwork(nn.Module):
    def __init__(self, num_inputs, num_actions):
        super().__init__()
        self.Q1 = QNetwork(num_inputs, num_actions)
        self.Q2 = QNetwork(num_inputs, num_actions)

    def forward(self, states, actions):
        x = torch.cat([states, actions], dim=1)
        return self.Q1(x), self.Q2(x)


class GaussianPolicy(nn.Module):
    def __init__(self, num_inputs, num_actions, hidden_units=16):
        super().__init__()
        self.policy = nn.Sequential(nn.Linear(num_inputs, hidden_units), nn.ReLU(),
                                    nn.Linear(hidden_units, num_actions * 2))

    def forward(self, states):
        mean, log_std = torch.chunk(self.policy(states), 2, dim=-1)
        return mean, torch.clamp(log_std, min=-20, max=2)

    def sample(self, states):
        means, log_stds = self.forward(states)
        normals = Normal(means, log_stds.exp())
        xs = normals.rsample()
        actions = torch.tanh(xs)
        log_probs = normals.log_prob(xs) - torch.log(1 - actions.pow(2) + 1e-6)
        entropies = -log_probs.sum(dim=1, keepdim=True)
        return actions, entropies, torch.tanh(means)


class Memory:
    def sample(self, batch_size):
        states = torch.randn(batch_size, 3, device=DEVICE)
        actions = torch.rand(batch_size, 1, device=DEVICE) * 2 - 1
        rewards = torch.randn(batch_size, 1, device=DEVICE)
        next_states = torch.randn(batch_size, 3, device=DEVICE)
        dones = torch.zeros(batch_size, 1, device=DEVICE)
        return states, actions, rewards, next_states, dones


class SacAgent:
    def __init__(self, num_inputs=3, num_actions=1, batch_size=8, gamma=0.99, tau=0.005, grad_clip=None):
        self.policy = GaussianPolicy(num_inputs, num_actions).to(DEVICE)
        self.critic = TwinnedQNetwork(num_inputs, num_actions).to(DEVICE)
        self.critic_target = TwinnedQNetwork(num_inputs, num_actions).to(DEVICE).eval()
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.policy_optim = torch.optim.Adam(self.policy.parameters(), lr=3e-4)
        self.q1_optim = torch.optim.Adam(self.critic.Q1.parameters(), lr=3e-4)
        self.q2_optim = torch.optim.Adam(self.critic.Q2.parameters(), lr=3e-4)
        self.target_entropy = -float(num_actions)
        self.log_alpha = torch.zeros(1, requires_grad=True, device=DEVICE)
        self.alpha = self.log_alpha.exp()
        self.alpha_optim = torch.optim.Adam([self.log_alpha], lr=3e-4)
        self.entropy_tuning = True
        self.memory = Memory()
        self.batch_size, self.gamma_n, self.tau, self.grad_clip = batch_size, gamma, tau, grad_clip
        self.learning_steps = 0
        self.target_update_interval = 1

    def calc_current_q(self, states, actions, rewards, next_states, dones):
        curr_q1, curr_q2 = self.critic(states, actions)
        return curr_q1, curr_q2

    def calc_target_q(self, states, actions, rewards, next_states, dones):
        with torch.no_grad():
            next_actions, next_entropies, _ = self.policy.sample(next_states)
            next_q1, next_q2 = self.critic_target(next_states, next_actions)
            next_q = torch.min(next_q1, next_q2) + self.alpha * next_entropies
        return rewards + (1.0 - dones) * self.gamma_n * next_q

    def calc_critic_loss(self, batch, weights):
        curr_q1, curr_q2 = self.calc_current_q(*batch)
        target_q = self.calc_target_q(*batch)
        errors = torch.abs(curr_q1.detach() - target_q)
        mean_q1 = curr_q1.detach().mean().item()
        mean_q2 = curr_q2.detach().mean().item()
        q1_loss = torch.mean((curr_q1 - target_q).pow(2) * weights)
        q2_loss = torch.mean((curr_q2 - target_q).pow(2) * weights)
        return q1_loss, q2_loss, errors, mean_q1, mean_q2

    def calc_policy_loss(self, batch, weights):
        states, actions, rewards, next_states, dones = batch
        # re-sample actions to calculate expectations of Q
        sampled_action, entropy, _ = self.policy.sample(states)
        q1, q2 = self.critic(states, sampled_action)  # culprit
        q = torch.min(q1, q2)
        policy_loss = torch.mean((- q - self.alpha * entropy) * weights)
        return policy_loss, entropy

    def calc_entropy_loss(self, entropy, weights):
        return -torch.mean(self.log_alpha * (self.target_entropy - entropy).detach() * weights)

    def learn(self):
        self.learning_steps += 1
        if self.learning_steps % self.target_update_interval == 0:
            soft_update(self.critic_target, self.critic, self.tau)

        batch = self.memory.sample(self.batch_size)
        weights = 1.

        q1_loss, q2_loss, errors, mean_q1, mean_q2 = self.calc_critic_loss(batch, weights)
        policy_loss, entropies = self.calc_policy_loss(batch, weights)

        update_params(self.q1_optim, self.critic.Q1, q1_loss, self.grad_clip)
        update_params(self.q2_optim, self.critic.Q2, q2_loss, self.grad_clip)  # step
        update_params(self.policy_optim, self.policy, policy_loss, self.grad_clip)

        if self.entropy_tuning:
            entropy_loss = self.calc_entropy_loss(entropies, weights)
            update_params(self.alpha_optim, None, entropy_loss)
            self.alpha = self.log_alpha.exp()


agent = SacAgent()
for step in range(4):
    agent.learn()
print("done")
