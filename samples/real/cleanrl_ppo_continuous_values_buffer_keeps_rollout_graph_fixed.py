# source: https://github.com/vwxyzjn/cleanrl/blob/f381c7b16920fb0ef694368bc3b8c988ff321fba/cleanrl/ppo_continuous_action.py — commit f381c7b1: PPO fills `values[step] = vf.forward(...)` with grad during the rollout and reuses that graph in every update epoch, kept alive with total_loss.backward(retain_graph=True) across optimizer.step()
# fix-source: https://github.com/vwxyzjn/cleanrl/commit/5a3a092564a9fcf2cb748ca2ad23007989567f2e — maintainer's commit "PPO # fix the retain_graph=True": rollout forwards under torch.no_grad(), newvalues recomputed in each update epoch, plain backward()
# expect-kind: none
# fix: run the rollout forwards under torch.no_grad() and recompute newvalues = vf.forward(obs) in every update epoch, so no backward reaches the rollout graph; drop retain_graph=True
import argparse
import random

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import torch.nn.functional as F
from torch.distributions.normal import Normal

from _device import DEVICE

parser = argparse.ArgumentParser(description='PPO agent')
parser.add_argument('--learning-rate', type=float, default=7e-4)
parser.add_argument('--seed', type=int, default=1)
parser.add_argument('--episode-length', type=int, default=6)
parser.add_argument('--total-timesteps', type=int, default=12)
parser.add_argument('--gamma', type=float, default=0.99)
parser.add_argument('--vf-coef', type=float, default=0.25)
parser.add_argument('--max-grad-norm', type=float, default=0.5)
parser.add_argument('--ent-coef', type=float, default=0.01)
parser.add_argument('--clip-coef', type=float, default=0.2)
parser.add_argument('--update-epochs', type=int, default=3)
args = parser.parse_args([])


class FakeEnv:
    """Stands in for the pybullet gym env: random observations and rewards, fixed length."""
    obs_dim, act_dim = 5, 2

    def reset(self):
        self.t = 0
        return np.random.randn(self.obs_dim).astype(np.float32)

    def step(self, action):
        self.t += 1
        return np.random.randn(self.obs_dim).astype(np.float32), float(np.random.randn()), self.t >= args.episode_length, {}


device = DEVICE
env = FakeEnv()
random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)
input_shape, output_shape = env.obs_dim, env.act_dim


def preprocess_obs_fn(x):
    return torch.Tensor(x).to(device)


class Policy(nn.Module):
    def __init__(self):
        super(Policy, self).__init__()
        self.fc1 = nn.Linear(input_shape, 120)
        self.fc2 = nn.Linear(120, 84)
        self.mean = nn.Linear(84, output_shape)
        self.logstd = nn.Parameter(torch.zeros(1, output_shape))

    def forward(self, x):
        x = preprocess_obs_fn(x)
        x = torch.tanh(self.fc1(x))
        x = torch.tanh(self.fc2(x))
        action_mean = self.mean(x)
        action_logstd = self.logstd.expand_as(action_mean)
        return action_mean, action_logstd

    def get_action(self, x):
        mean, logstd = self.forward(x)
        std = torch.exp(logstd)
        probs = Normal(mean, std)
        action = probs.sample()
        return action, probs.log_prob(action).sum(1)

    def get_logproba(self, x, actions):
        action_mean, action_logstd = self.forward(x)
        action_std = torch.exp(action_logstd)
        dist = Normal(action_mean, action_std)
        return dist.log_prob(actions).sum(1)


class Value(nn.Module):
    def __init__(self):
        super(Value, self).__init__()
        self.fc1 = nn.Linear(input_shape, 64)
        self.fc2 = nn.Linear(64, 1)

    def forward(self, x):
        x = preprocess_obs_fn(x)
        x = F.tanh(self.fc1(x))
        x = self.fc2(x)
        return x


pg = Policy().to(device)
vf = Value().to(device)
optimizer = optim.Adam(list(pg.parameters()) + list(vf.parameters()), lr=args.learning_rate)
loss_fn = nn.MSELoss()

global_step = 0
while global_step < args.total_timesteps:
    next_obs = np.array(env.reset())
    actions = np.empty((args.episode_length, output_shape))
    rewards, dones = np.zeros((2, args.episode_length))
    obs = np.empty((args.episode_length, input_shape))

    # ALGO LOGIC: put other storage logic here
    values = torch.zeros((args.episode_length), device=device)
    logprobs = np.zeros((args.episode_length,),)
    entropys = torch.zeros((args.episode_length,), device=device)

    for step in range(args.episode_length):
        global_step += 1
        obs[step] = next_obs.copy()

        # ALGO LOGIC: put action logic here
        with torch.no_grad():
            values[step] = vf.forward(obs[step:step+1])
            action, logproba = pg.get_action(obs[step:step+1])
        actions[step] = action.data.cpu().numpy()[0]
        logprobs[step] = logproba.data.cpu().numpy()[0]

        clipped_action = np.clip(action.tolist(), -1.0, 1.0)[0]
        next_obs, rewards[step], dones[step], _ = env.step(clipped_action)
        next_obs = np.array(next_obs)
        if dones[step]:
            break

    # ALGO LOGIC: training.
    returns = np.zeros_like(rewards)
    returns[step] = rewards[step]
    for t in reversed(range(rewards.shape[0]-1)):
        returns[t] = rewards[t] + args.gamma * returns[t+1] * (1-dones[t])
    advantages = returns - values.detach().cpu().numpy()

    for _ in range(args.update_epochs):
        newlogproba = pg.get_logproba(obs[:step+1], torch.Tensor(actions[:step+1]).to(device))
        newvalues = vf.forward(obs[:step+1]).flatten()
        ratio = torch.exp(newlogproba - torch.Tensor(logprobs[:step+1]).to(device))
        surrogate1 = ratio * torch.Tensor(advantages[:step+1]).to(device)
        surrogate2 = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef) * torch.Tensor(advantages[:step+1]).to(device)
        policy_loss = - torch.mean(torch.min(surrogate1, surrogate2))
        vf_loss = torch.mean((newvalues - torch.Tensor(returns[:step+1]).to(device)).pow(2))
        entropy_loss = torch.mean(torch.exp(newlogproba) * newlogproba)
        total_loss = policy_loss + args.vf_coef * vf_loss + args.ent_coef * entropy_loss
        optimizer.zero_grad()
        total_loss.backward()
        nn.utils.clip_grad_norm_(list(pg.parameters()) + list(vf.parameters()), args.max_grad_norm)
        optimizer.step()

print("done")
