# source: https://github.com/clvrai/spirl/issues/6 — SACAgent.update steps both critics, then back-propagates policy_loss built through them (also issue #15)
# fix-source: https://github.com/clvrai/spirl/commit/fc84d1643668b284ee7c07b00e99e71af6532889 — maintainer moved the policy update before the critic updates
# expect-kind: none
# fix: update the policy on policy_loss before the critic updates, so its backward runs before the critic steps (fc84d16)
import torch
import torch.nn as nn
from _device import DEVICE


class AttrDict(dict):
    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


class TensorModule(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.t = nn.Parameter(t)

    def forward(self):
        return self.t


class MLPCritic(nn.Module):
    def __init__(self, input_dim, action_dim, nz_mid=16):
        super().__init__()
        self._net = nn.Sequential(nn.Linear(input_dim + action_dim, nz_mid), nn.ReLU(), nn.Linear(nz_mid, 1))

    def forward(self, obs, actions=None):
        return AttrDict(q=self._net(torch.cat((obs, actions), dim=-1)))


class GaussianPolicy(nn.Module):
    def __init__(self, input_dim, action_dim):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_dim, 16), nn.ReLU(), nn.Linear(16, 2 * action_dim))

    def forward(self, obs):
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        dist = torch.distributions.Normal(mean, log_std.clamp(-5, 2).exp())
        action = dist.rsample()
        return AttrDict(action=action, log_prob=dist.log_prob(action).sum(-1), dist=dist)


class SACAgent:
    def __init__(self, obs_dim=6, action_dim=2, batch_size=8):
        self._hp = AttrDict(batch_size=batch_size, discount_factor=0.99, reward_scale=1.0,
                            target_network_update_factor=0.005, update_iterations=1)
        self.policy = GaussianPolicy(obs_dim, action_dim).to(DEVICE)
        self.policy_opt = torch.optim.Adam(self.policy.parameters(), lr=3e-4)
        self.critics = nn.ModuleList([MLPCritic(obs_dim, action_dim) for _ in range(2)]).to(DEVICE)
        self.critic_targets = nn.ModuleList([MLPCritic(obs_dim, action_dim) for _ in range(2)]).to(DEVICE)
        [self._copy_to_target_network(target, source) for target, source in zip(self.critic_targets, self.critics)]
        self.critic_opts = [torch.optim.Adam(critic.parameters(), lr=3e-4) for critic in self.critics]
        self._log_alpha = TensorModule(torch.zeros(1, device=DEVICE))
        self.alpha_opt = torch.optim.Adam(self._log_alpha.parameters(), lr=3e-4)
        self._target_entropy = -action_dim
        self.obs_dim, self.action_dim = obs_dim, action_dim

    @property
    def alpha(self):
        return self._log_alpha().exp()

    def update(self, experience_batch):
        for _ in range(self._hp.update_iterations):
            policy_output = self._run_policy(experience_batch.observation)

            # update alpha
            alpha_loss = self._update_alpha(experience_batch, policy_output)

            # compute policy loss
            policy_loss = self._compute_policy_loss(experience_batch, policy_output)

            # compute target Q value
            with torch.no_grad():
                policy_output_next = self._run_policy(experience_batch.observation_next)
                value_next = self._compute_next_value(experience_batch, policy_output_next)
                q_target = experience_batch.reward * self._hp.reward_scale + \
                    (1 - experience_batch.done) * self._hp.discount_factor * value_next
                q_target = q_target.detach()

            # compute critic loss
            critic_losses, qs = self._compute_critic_loss(experience_batch, q_target)

            # update policy network on policy loss
            self._perform_update(policy_loss, self.policy_opt, self.policy)

            # update critic networks
            [self._perform_update(critic_loss, critic_opt, critic)
                for critic_loss, critic_opt, critic in zip(critic_losses, self.critic_opts, self.critics)]

            # update target networks
            [self._soft_update_target_network(critic_target, critic)
                for critic_target, critic in zip(self.critic_targets, self.critics)]
        return AttrDict(policy_loss=policy_loss.item(), alpha_loss=alpha_loss.item())

    def _run_policy(self, obs):
        return self.policy(obs)

    def _update_alpha(self, experience_batch, policy_output):
        alpha_loss = self._compute_alpha_loss(policy_output)
        self._perform_update(alpha_loss, self.alpha_opt, self._log_alpha)
        return alpha_loss

    def _compute_alpha_loss(self, policy_output):
        return -1 * (self.alpha * (self._target_entropy + policy_output.log_prob).detach()).mean()

    def _compute_policy_loss(self, experience_batch, policy_output):
        q_est = torch.min(*[critic(experience_batch.observation, self._prep_action(policy_output.action)).q
                            for critic in self.critics])
        policy_loss = -1 * q_est + self.alpha * policy_output.log_prob[:, None]
        return policy_loss.mean()

    def _compute_next_value(self, experience_batch, policy_output):
        q_next = torch.min(*[critic_target(experience_batch.observation_next, self._prep_action(policy_output.action)).q
                             for critic_target in self.critic_targets])
        next_val = (q_next - self.alpha * policy_output.log_prob[:, None])
        return next_val.squeeze(-1)

    def _compute_critic_loss(self, experience_batch, q_target):
        qs = self._compute_q_estimates(experience_batch)
        critic_losses = [0.5 * (q - q_target).pow(2).mean() for q in qs]
        return critic_losses, qs

    def _compute_q_estimates(self, experience_batch):
        return [critic(experience_batch.observation, self._prep_action(experience_batch.action.detach())).q.squeeze(-1)
                for critic in self.critics]

    def _prep_action(self, action):
        return action.float()

    def _perform_update(self, loss, opt, network):
        opt.zero_grad()
        loss.backward()
        opt.step()

    def _soft_update_target_network(self, target, source):
        for target_param, param in zip(target.parameters(), source.parameters()):
            target_param.data.copy_(self._hp.target_network_update_factor * param.data +
                                    (1 - self._hp.target_network_update_factor) * target_param.data)

    def _copy_to_target_network(self, target, source):
        for target_param, source_param in zip(target.parameters(), source.parameters()):
            target_param.data.copy_(source_param.data)


agent = SACAgent()
for step in range(4):
    n = agent._hp.batch_size
    experience_batch = AttrDict(
        observation=torch.randn(n, agent.obs_dim, device=DEVICE),
        observation_next=torch.randn(n, agent.obs_dim, device=DEVICE),
        action=torch.randn(n, agent.action_dim, device=DEVICE).tanh(),
        reward=torch.randn(n, device=DEVICE),
        done=torch.zeros(n, device=DEVICE),
    )
    info = agent.update(experience_batch)
print("done")
