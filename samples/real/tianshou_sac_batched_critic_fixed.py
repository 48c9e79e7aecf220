# source: https://github.com/thu-ml/tianshou/issues/37 — SACPolicy.learn fails with torch 1.5: in-place version error ([128, 1], output 0 of TBackward) at actor_loss.backward()
# fix-source: https://github.com/thu-ml/tianshou/commit/70290346eaf7aade89a60ff7cfb0f7d11d02d918 — one critic forward per loss; the actor's Q values are computed after both critic steps
# expect-kind: none
# fix: each critic loss gets its own forward, and the actor's Q values are computed after both critic steps (no retain_graph)
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class Batch:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class ActorProb(nn.Module):
    def __init__(self, state_dim, action_dim):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(state_dim, 16), nn.ReLU())
        self.mu = nn.Linear(16, action_dim)
        self.sigma = nn.Linear(16, action_dim)

    def forward(self, s, state=None):
        logits = self.model(s)
        mu = self.mu(logits)
        sigma = torch.exp(self.sigma(logits).clamp(-20, 2))
        return (mu, sigma), None


class Critic(nn.Module):
    def __init__(self, state_dim, action_dim):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(state_dim + action_dim, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, s, a):
        return self.model(torch.cat([s, a], dim=1))


class SACPolicy(nn.Module):
    def __init__(self, actor, actor_optim, critic1, critic1_optim, critic2, critic2_optim,
                 tau=0.005, gamma=0.99, alpha=0.2, action_range=(-1.0, 1.0)):
        super().__init__()
        self.actor, self.actor_optim = actor, actor_optim
        self.critic1, self.critic1_optim = critic1, critic1_optim
        self.critic2, self.critic2_optim = critic2, critic2_optim
        self.critic1_old = Critic(3, 1).to(DEVICE)
        self.critic1_old.load_state_dict(self.critic1.state_dict())
        self.critic2_old = Critic(3, 1).to(DEVICE)
        self.critic2_old.load_state_dict(self.critic2.state_dict())
        self._tau, self._gamma, self._alpha = tau, gamma, alpha
        self._range = action_range
        self._action_bias = (action_range[0] + action_range[1]) / 2
        self._action_scale = (action_range[1] - action_range[0]) / 2
        self.__eps = 1e-6

    def sync_weight(self):
        for o, n in zip(self.critic1_old.parameters(), self.critic1.parameters()):
            o.data.copy_(o.data * (1 - self._tau) + n.data * self._tau)
        for o, n in zip(self.critic2_old.parameters(), self.critic2.parameters()):
            o.data.copy_(o.data * (1 - self._tau) + n.data * self._tau)

    def forward(self, batch, state=None, input='obs'):
        obs = getattr(batch, input)
        logits, h = self.actor(obs, state=state)
        dist = torch.distributions.Normal(*logits)
        x = dist.rsample()
        y = torch.tanh(x)
        act = y * self._action_scale + self._action_bias
        log_prob = dist.log_prob(x) - torch.log(self._action_scale * (1 - y.pow(2)) + self.__eps)
        act = act.clamp(self._range[0], self._range[1])
        return Batch(logits=logits, act=act, state=h, dist=dist, log_prob=log_prob)

    def learn(self, batch):
        with torch.no_grad():
            obs_next_result = self(batch, input='obs_next')
            a_ = obs_next_result.act
            target_q = torch.min(
                self.critic1_old(batch.obs_next, a_),
                self.critic2_old(batch.obs_next, a_),
            ) - self._alpha * obs_next_result.log_prob
            rew = batch.rew[:, None]
            done = batch.done[:, None]
            target_q = (rew + (1. - done) * self._gamma * target_q)
        # critic 1
        current_q1 = self.critic1(batch.obs, batch.act)
        critic1_loss = F.mse_loss(current_q1, target_q)
        self.critic1_optim.zero_grad()
        critic1_loss.backward()
        self.critic1_optim.step()
        # critic 2
        current_q2 = self.critic2(batch.obs, batch.act)
        critic2_loss = F.mse_loss(current_q2, target_q)
        self.critic2_optim.zero_grad()
        critic2_loss.backward()
        self.critic2_optim.step()
        # actor
        obs_result = self(batch)
        a = obs_result.act
        current_q1a = self.critic1(batch.obs, a)
        current_q2a = self.critic2(batch.obs, a)
        actor_loss = (self._alpha * obs_result.log_prob - torch.min(current_q1a, current_q2a)).mean()
        self.actor_optim.zero_grad()
        actor_loss.backward()
        self.actor_optim.step()
        self.sync_weight()
        return {'loss/actor': actor_loss.item(), 'loss/critic1': critic1_loss.item(),
                'loss/critic2': critic2_loss.item()}


actor = ActorProb(3, 1).to(DEVICE)
actor_optim = torch.optim.Adam(actor.parameters(), lr=1e-3)
critic1 = Critic(3, 1).to(DEVICE)
critic1_optim = torch.optim.Adam(critic1.parameters(), lr=1e-3)
critic2 = Critic(3, 1).to(DEVICE)
critic2_optim = torch.optim.Adam(critic2.parameters(), lr=1e-3)
policy = SACPolicy(actor, actor_optim, critic1, critic1_optim, critic2, critic2_optim)

for it in range(4):
    b = Batch(obs=torch.randn(8, 3, device=DEVICE), act=torch.rand(8, 1, device=DEVICE) * 2 - 1,
              rew=torch.randn(8, device=DEVICE), done=torch.zeros(8, device=DEVICE),
              obs_next=torch.randn(8, 3, device=DEVICE))
    losses = policy.learn(b)
print("done")
