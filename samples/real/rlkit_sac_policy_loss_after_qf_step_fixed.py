# source: https://github.com/rail-berkeley/rlkit/pull/109 — PR "Optimize actor before the critic": SACTrainer.train_from_torch steps qf1/qf2 before policy_loss.backward(), which fails on torch>=1.5 with "one of the variables needed for gradient computation has been modified by an inplace operation"
# fix-source: https://github.com/rail-berkeley/rlkit/commit/b7f97b2463df1c5a1ecd2d293cfcc7a4971dd0ab — maintainers' merge of #109: the policy is optimized (zero_grad, backward, step) before the Q functions
# expect-kind: none
# fix: update the policy (zero_grad, backward, step) before qf1/qf2 are stepped, as rlkit's b7f97b2 (#109) does
from collections import OrderedDict

import torch
import torch.optim as optim
from torch import nn as nn
from torch.nn import functional as F
from _device import DEVICE

LOG_SIG_MAX = 2
LOG_SIG_MIN = -20


class Mlp(nn.Module):
    def __init__(self, hidden_sizes, output_size, input_size, init_w=3e-3):
        super().__init__()
        self.fcs = []
        in_size = input_size
        for i, next_size in enumerate(hidden_sizes):
            fc = nn.Linear(in_size, next_size)
            in_size = next_size
            self.__setattr__("fc{}".format(i), fc)
            self.fcs.append(fc)
        self.last_fc = nn.Linear(in_size, output_size)
        self.last_fc.weight.data.uniform_(-init_w, init_w)
        self.last_fc.bias.data.uniform_(-init_w, init_w)

    def forward(self, input):
        h = input
        for fc in self.fcs:
            h = F.relu(fc(h))
        return self.last_fc(h)


class FlattenMlp(Mlp):
    def forward(self, *inputs):
        return super().forward(torch.cat(inputs, dim=1))


class TanhNormal:
    def __init__(self, normal_mean, normal_std, epsilon=1e-6):
        self.normal = torch.distributions.Normal(normal_mean, normal_std)
        self.epsilon = epsilon

    def rsample(self):
        z = self.normal.rsample()
        return torch.tanh(z), z

    def log_prob(self, value, pre_tanh_value):
        return self.normal.log_prob(pre_tanh_value) - torch.log(1 - value * value + self.epsilon)


class TanhGaussianPolicy(Mlp):
    def __init__(self, hidden_sizes, obs_dim, action_dim, init_w=1e-3):
        super().__init__(hidden_sizes, input_size=obs_dim, output_size=action_dim, init_w=init_w)
        self.last_fc_log_std = nn.Linear(hidden_sizes[-1], action_dim)
        self.last_fc_log_std.weight.data.uniform_(-init_w, init_w)
        self.last_fc_log_std.bias.data.uniform_(-init_w, init_w)

    def forward(self, obs, reparameterize=True, return_log_prob=False):
        h = obs
        for fc in self.fcs:
            h = F.relu(fc(h))
        mean = self.last_fc(h)
        log_std = torch.clamp(self.last_fc_log_std(h), LOG_SIG_MIN, LOG_SIG_MAX)
        std = torch.exp(log_std)
        tanh_normal = TanhNormal(mean, std)
        action, pre_tanh_value = tanh_normal.rsample()
        log_prob = tanh_normal.log_prob(action, pre_tanh_value=pre_tanh_value)
        log_prob = log_prob.sum(dim=1, keepdim=True)
        return action, mean, log_std, log_prob, None, std, None, pre_tanh_value


def soft_update_from_to(source, target, tau):
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(target_param.data * (1.0 - tau) + param.data * tau)


class SACTrainer:
    def __init__(self, action_dim, policy, qf1, qf2, target_qf1, target_qf2, discount=0.99,
                 reward_scale=1.0, policy_lr=1e-3, qf_lr=1e-3, optimizer_class=optim.Adam,
                 soft_target_tau=1e-2, target_update_period=1, use_automatic_entropy_tuning=True):
        self.policy = policy
        self.qf1 = qf1
        self.qf2 = qf2
        self.target_qf1 = target_qf1
        self.target_qf2 = target_qf2
        self.soft_target_tau = soft_target_tau
        self.target_update_period = target_update_period
        self.use_automatic_entropy_tuning = use_automatic_entropy_tuning
        if self.use_automatic_entropy_tuning:
            self.target_entropy = -float(action_dim)
            self.log_alpha = torch.zeros(1, requires_grad=True, device=DEVICE)
            self.alpha_optimizer = optimizer_class([self.log_alpha], lr=policy_lr)
        self.qf_criterion = nn.MSELoss()
        self.policy_optimizer = optimizer_class(self.policy.parameters(), lr=policy_lr)
        self.qf1_optimizer = optimizer_class(self.qf1.parameters(), lr=qf_lr)
        self.qf2_optimizer = optimizer_class(self.qf2.parameters(), lr=qf_lr)
        self.discount = discount
        self.reward_scale = reward_scale
        self.eval_statistics = OrderedDict()
        self._n_train_steps_total = 0

    def train_from_torch(self, batch):
        rewards = batch['rewards']
        terminals = batch['terminals']
        obs = batch['observations']
        actions = batch['actions']
        next_obs = batch['next_observations']

        """
        Policy and Alpha Loss
        """
        new_obs_actions, policy_mean, policy_log_std, log_pi, *_ = self.policy(
            obs, reparameterize=True, return_log_prob=True,
        )
        if self.use_automatic_entropy_tuning:
            alpha_loss = -(self.log_alpha * (log_pi + self.target_entropy).detach()).mean()
            self.alpha_optimizer.zero_grad()
            alpha_loss.backward()
            self.alpha_optimizer.step()
            alpha = self.log_alpha.exp()
        else:
            alpha_loss = 0
            alpha = 1

        q_new_actions = torch.min(
            self.qf1(obs, new_obs_actions),
            self.qf2(obs, new_obs_actions),
        )
        policy_loss = (alpha * log_pi - q_new_actions).mean()

        """
        QF Loss
        """
        q1_pred = self.qf1(obs, actions)
        q2_pred = self.qf2(obs, actions)
        new_next_actions, _, _, new_log_pi, *_ = self.policy(
            next_obs, reparameterize=True, return_log_prob=True,
        )
        target_q_values = torch.min(
            self.target_qf1(next_obs, new_next_actions),
            self.target_qf2(next_obs, new_next_actions),
        ) - alpha * new_log_pi

        q_target = self.reward_scale * rewards + (1. - terminals) * self.discount * target_q_values
        qf1_loss = self.qf_criterion(q1_pred, q_target.detach())
        qf2_loss = self.qf_criterion(q2_pred, q_target.detach())

        """
        Update networks
        """
        self.policy_optimizer.zero_grad()
        policy_loss.backward()
        self.policy_optimizer.step()

        self.qf1_optimizer.zero_grad()
        qf1_loss.backward()
        self.qf1_optimizer.step()

        self.qf2_optimizer.zero_grad()
        qf2_loss.backward()
        self.qf2_optimizer.step()

        """
        Soft Updates
        """
        if self._n_train_steps_total % self.target_update_period == 0:
            soft_update_from_to(self.qf1, self.target_qf1, self.soft_target_tau)
            soft_update_from_to(self.qf2, self.target_qf2, self.soft_target_tau)

        self.eval_statistics['QF1 Loss'] = qf1_loss.item()
        self.eval_statistics['Policy Loss'] = policy_loss.item()
        self._n_train_steps_total += 1


class SimpleReplayBuffer:
    """A tiny fake environment's transitions, stored as in rlkit's replay buffer."""

    def __init__(self, obs_dim, action_dim, size):
        self._observations = torch.randn(size, obs_dim)
        self._actions = torch.rand(size, action_dim) * 2 - 1
        self._rewards = torch.randn(size, 1)
        self._terminals = (torch.rand(size, 1) < 0.1).float()
        self._next_obs = torch.randn(size, obs_dim)
        self._size = size

    def random_batch(self, batch_size):
        indices = torch.randint(0, self._size, (batch_size,))
        return dict(
            observations=self._observations[indices].to(DEVICE),
            actions=self._actions[indices].to(DEVICE),
            rewards=self._rewards[indices].to(DEVICE),
            terminals=self._terminals[indices].to(DEVICE),
            next_observations=self._next_obs[indices].to(DEVICE),
        )


obs_dim, action_dim, M = 5, 2, 16
qf1 = FlattenMlp(input_size=obs_dim + action_dim, output_size=1, hidden_sizes=[M, M]).to(DEVICE)
qf2 = FlattenMlp(input_size=obs_dim + action_dim, output_size=1, hidden_sizes=[M, M]).to(DEVICE)
target_qf1 = FlattenMlp(input_size=obs_dim + action_dim, output_size=1, hidden_sizes=[M, M]).to(DEVICE)
target_qf2 = FlattenMlp(input_size=obs_dim + action_dim, output_size=1, hidden_sizes=[M, M]).to(DEVICE)
policy = TanhGaussianPolicy(obs_dim=obs_dim, action_dim=action_dim, hidden_sizes=[M, M]).to(DEVICE)
trainer = SACTrainer(action_dim, policy, qf1, qf2, target_qf1, target_qf2)
replay_buffer = SimpleReplayBuffer(obs_dim, action_dim, 64)

for _ in range(4):
    trainer.train_from_torch(replay_buffer.random_batch(8))
print("done")
