# source: https://github.com/kashif/firedup/issues/11 — fireup DDPG: in-place version error ([300, 1], output 0 of TBackward) with torch 1.6
# fix-source: https://github.com/kashif/firedup/commit/b658ae505815d2df7049bf3d02084aa01c06c220 — "fix loss update order": q from its own forward, q_pi from a forward after the Q step
# expect-kind: inplace-modified
# expect-culprit: main.q.layers[2].weight
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

np.random.seed(0)


class MLP(nn.Module):
    def __init__(self, layers, activation=torch.tanh, output_activation=None, output_scale=1, output_squeeze=False):
        super().__init__()
        self.layers = nn.ModuleList()
        self.activation = activation
        self.output_activation = output_activation
        self.output_scale = output_scale
        self.output_squeeze = output_squeeze
        for i, layer in enumerate(layers[1:]):
            self.layers.append(nn.Linear(layers[i], layer))
            nn.init.zeros_(self.layers[i].bias)

    def forward(self, inputs):
        x = inputs
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        if self.output_activation is None:
            x = self.layers[-1](x) * self.output_scale
        else:
            x = self.output_activation(self.layers[-1](x)) * self.output_scale
        return x.squeeze() if self.output_squeeze else x


class ActorCritic(nn.Module):
    def __init__(self, in_features, action_dim, action_scale=1.0, hidden_sizes=(16, 12)):
        super().__init__()
        self.policy = MLP(layers=[in_features] + list(hidden_sizes) + [action_dim], activation=torch.relu,
                          output_activation=torch.tanh, output_scale=action_scale)
        self.q = MLP(layers=[in_features + action_dim] + list(hidden_sizes) + [1], activation=torch.relu,
                     output_squeeze=True)

    def forward(self, x, a):
        pi = self.policy(x)
        q = self.q(torch.cat((x, a), dim=1))
        q_pi = self.q(torch.cat((x, pi), dim=1))
        return pi, q, q_pi


class ReplayBuffer:
    def __init__(self, obs_dim, act_dim, size):
        self.obs1_buf = np.zeros([size, obs_dim], dtype=np.float32)
        self.obs2_buf = np.zeros([size, obs_dim], dtype=np.float32)
        self.acts_buf = np.zeros([size, act_dim], dtype=np.float32)
        self.rews_buf = np.zeros(size, dtype=np.float32)
        self.done_buf = np.zeros(size, dtype=np.float32)
        self.ptr, self.size, self.max_size = 0, 0, size

    def store(self, obs, act, rew, next_obs, done):
        self.obs1_buf[self.ptr], self.obs2_buf[self.ptr] = obs, next_obs
        self.acts_buf[self.ptr], self.rews_buf[self.ptr], self.done_buf[self.ptr] = act, rew, done
        self.ptr = (self.ptr + 1) % self.max_size
        self.size = min(self.size + 1, self.max_size)

    def sample_batch(self, batch_size=8):
        idxs = np.random.randint(0, self.size, size=batch_size)
        return dict(obs1=self.obs1_buf[idxs], obs2=self.obs2_buf[idxs], acts=self.acts_buf[idxs],
                    rews=self.rews_buf[idxs], done=self.done_buf[idxs])


class FakeEnv:
    def reset(self):
        return np.random.randn(3).astype(np.float32)

    def step(self, a):
        return np.random.randn(3).astype(np.float32), float(np.random.randn()), False, {}


obs_dim, act_dim, act_limit = 3, 1, 1.0
gamma, polyak, batch_size, max_ep_len, total_steps = 0.99, 0.995, 8, 3, 6
env = FakeEnv()
main = ActorCritic(obs_dim, act_dim).to(DEVICE)
target = ActorCritic(obs_dim, act_dim).to(DEVICE)
target.eval()
replay_buffer = ReplayBuffer(obs_dim=obs_dim, act_dim=act_dim, size=100)
pi_optimizer = torch.optim.Adam(main.policy.parameters(), lr=1e-3)
q_optimizer = torch.optim.Adam(main.q.parameters(), lr=1e-3)
target.load_state_dict(main.state_dict())


def get_action(o, noise_scale):
    pi = main.policy(torch.as_tensor(o.reshape(1, -1), device=DEVICE))
    a = pi.detach().cpu().numpy()[0] + noise_scale * np.random.randn(act_dim)
    return np.clip(a, -act_limit, act_limit)


o, r, d, ep_ret, ep_len = env.reset(), 0, False, 0, 0
for t in range(total_steps):
    main.eval()
    a = get_action(o, 0.1)
    o2, r, d, _ = env.step(a)
    ep_ret += r
    ep_len += 1
    d = False if ep_len == max_ep_len else d
    replay_buffer.store(o, a, r, o2, d)
    o = o2

    if d or (ep_len == max_ep_len):
        main.train()
        for _ in range(ep_len):
            batch = replay_buffer.sample_batch(batch_size)
            (obs1, obs2, acts, rews, done) = (
                torch.as_tensor(batch["obs1"], device=DEVICE),
                torch.as_tensor(batch["obs2"], device=DEVICE),
                torch.as_tensor(batch["acts"], device=DEVICE),
                torch.as_tensor(batch["rews"], device=DEVICE),
                torch.as_tensor(batch["done"], device=DEVICE),
            )
            _, q, q_pi = main(obs1, acts)  # culprit
            _, _, q_pi_targ = target(obs2, acts)

            # Bellman backup for Q function
            backup = (rews + gamma * (1 - done) * q_pi_targ).detach()

            # DDPG losses
            pi_loss = -q_pi.mean()
            q_loss = F.mse_loss(q, backup)

            # Q-learning update
            q_optimizer.zero_grad()
            q_loss.backward()
            q_optimizer.step()  # step

            # Policy update
            pi_optimizer.zero_grad()
            pi_loss.backward()
            pi_optimizer.step()

            # Polyak averaging for target parameters
            for p_main, p_target in zip(main.parameters(), target.parameters()):
                p_target.data.copy_(polyak * p_target.data + (1 - polyak) * p_main.data)
        o, r, d, ep_ret, ep_len = env.reset(), 0, False, 0, 0
print("done")
