# source: https://github.com/toshikwa/slac.pytorch/issues/1 — SlacAgent.learn_sac (code/agent.py) builds q1_loss, q2_loss and policy_loss first and then steps q1_optim, q2_optim and policy_optim in turn, so policy_loss.backward() meets Q-network weights that the two critic steps already changed: "one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [256, 1]], which is output 0 of TBackward"
# fix-source: https://github.com/toshikwa/slac.pytorch/pull/2 — maintainer's merged PR "Fix/torch1.6.0" (merge 1593923): one q_optim over the whole critic steps q1_loss + q2_loss first, and calc_policy_loss runs only after that step; alpha is kept detached (log_alpha.detach().exp(), .item() after the alpha step)
# expect-kind: inplace-modified
# expect-culprit: self.critic.Q2.Q[4].weight
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Normal
from torch.optim import Adam
from _device import DEVICE


# --- code/network/base.py ---
def weights_init_xavier(m):
    if isinstance(m, nn.Linear):
        torch.nn.init.xavier_uniform_(m.weight, gain=1)
        if m.bias is not None:
            torch.nn.init.constant_(m.bias, 0)


def create_linear_network(input_dim, output_dim, hidden_units=[8, 8],
                          hidden_activation=nn.ReLU(), output_activation=None,
                          initializer=weights_init_xavier):
    model = []
    units = input_dim
    for next_units in hidden_units:
        model.append(nn.Linear(units, next_units))
        model.append(hidden_activation)
        units = next_units
    model.append(nn.Linear(units, output_dim))
    if output_activation is not None:
        model.append(output_activation)
    return nn.Sequential(*model).apply(initializer)


# --- code/network/latent.py (trimmed: a linear encoder and a deterministic posterior) ---
class LatentNetwork(nn.Module):
    def __init__(self, observation_dim, action_dim, feature_dim, latent1_dim, latent2_dim):
        super().__init__()
        self.encoder = nn.Linear(observation_dim, feature_dim)
        self.posterior = nn.Linear(feature_dim + action_dim, latent1_dim + latent2_dim)
        self.decoder = nn.Linear(latent1_dim + latent2_dim, observation_dim)
        self.latent1_dim = latent1_dim

    def sample_posterior(self, features_seq, actions_seq):
        actions_seq = torch.cat([actions_seq, actions_seq[:, -1:]], dim=1)
        latents = torch.tanh(self.posterior(torch.cat([features_seq, actions_seq], dim=-1)))
        return (latents[..., :self.latent1_dim], latents[..., self.latent1_dim:])


# --- code/network/policy.py ---
class GaussianPolicy(nn.Module):
    LOG_STD_MAX = 2
    LOG_STD_MIN = -20
    eps = 1e-6

    def __init__(self, input_dim, output_dim, hidden_units=[8, 8]):
        super().__init__()
        self.net = create_linear_network(input_dim, output_dim * 2, hidden_units=hidden_units)

    def forward(self, x):
        means, log_stds = torch.chunk(self.net(x), 2, dim=-1)
        log_stds = torch.clamp(log_stds, min=self.LOG_STD_MIN, max=self.LOG_STD_MAX)
        return means, log_stds

    def sample(self, x):
        means, log_stds = self.forward(x)
        stds = log_stds.exp()
        normals = Normal(means, stds)
        xs = normals.rsample()
        actions = torch.tanh(xs)
        log_probs = normals.log_prob(xs) - torch.log(1 - actions.pow(2) + self.eps)
        entropies = -log_probs.sum(dim=1, keepdim=True)
        return actions, entropies, torch.tanh(means)


# --- code/network/q_func.py ---
class QNetwork(nn.Module):
    def __init__(self, latent_dim, action_dim, hidden_units=[8, 8]):
        super().__init__()
        self.Q = create_linear_network(latent_dim + action_dim, 1, hidden_units=hidden_units)

    def forward(self, x):
        return self.Q(x)


class TwinnedQNetwork(nn.Module):
    def __init__(self, latent_dim, action_dim, hidden_units=[8, 8]):
        super().__init__()
        self.Q1 = QNetwork(latent_dim, action_dim, hidden_units)
        self.Q2 = QNetwork(latent_dim, action_dim, hidden_units)

    def forward(self, latents, actions):
        x = torch.cat([latents, actions], dim=1)
        q1 = self.Q1(x)
        q2 = self.Q2(x)
        return q1, q2


# --- code/utils.py ---
def create_feature_actions(features_seq, actions_seq):
    N = features_seq.size(0)
    f = features_seq[:, :-1].reshape(N, -1)
    n_f = features_seq[:, 1:].reshape(N, -1)
    a = actions_seq[:, :-1].reshape(N, -1)
    n_a = actions_seq[:, 1:].reshape(N, -1)
    fa = torch.cat([f, a], dim=-1)
    n_fa = torch.cat([n_f, n_a], dim=-1)
    return fa, n_fa


def grad_false(network):
    for param in network.parameters():
        param.requires_grad = False


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


def hard_update(target, source):
    target.load_state_dict(source.state_dict())


# --- code/memory/lazy.py (trimmed: random sequences instead of stored episodes) ---
class LazyMemory:
    def __init__(self, num_sequences, observation_dim, action_dim):
        self.num_sequences = num_sequences
        self.observation_dim = observation_dim
        self.action_dim = action_dim

    def sample_latent(self, batch_size):
        images_seq = torch.rand(batch_size, self.num_sequences + 1, self.observation_dim, device=DEVICE)
        actions_seq = torch.rand(batch_size, self.num_sequences, self.action_dim, device=DEVICE) * 2 - 1
        return images_seq, actions_seq

    def sample_sac(self, batch_size):
        images_seq, actions_seq = self.sample_latent(batch_size)
        rewards = torch.rand(batch_size, 1, device=DEVICE)
        return images_seq, actions_seq, rewards


# --- code/agent.py ---
class SlacAgent:
    def __init__(self, observation_dim=6, action_dim=2, batch_size=5, latent_batch_size=4,
                 num_sequences=3, lr=0.0003, latent_lr=0.0001, feature_dim=4,
                 latent1_dim=2, latent2_dim=3, hidden_units=[8, 8], gamma=0.99,
                 target_update_interval=1, tau=0.005, entropy_tuning=True, ent_coef=0.2,
                 grad_clip=None):
        self.action_shape = (action_dim,)
        self.batch_size = batch_size
        self.latent_batch_size = latent_batch_size
        self.gamma = gamma
        self.tau = tau
        self.target_update_interval = target_update_interval
        self.grad_clip = grad_clip
        self.entropy_tuning = entropy_tuning
        self.learning_steps = 0

        self.latent = LatentNetwork(observation_dim, action_dim, feature_dim,
                                    latent1_dim, latent2_dim).to(DEVICE)
        self.policy = GaussianPolicy(
            num_sequences * feature_dim + (num_sequences - 1) * self.action_shape[0],
            self.action_shape[0], hidden_units).to(DEVICE)
        self.critic = TwinnedQNetwork(
            latent1_dim + latent2_dim, self.action_shape[0], hidden_units).to(DEVICE)
        self.critic_target = TwinnedQNetwork(
            latent1_dim + latent2_dim, self.action_shape[0], hidden_units).to(DEVICE).eval()

        # Copy parameters of the learning network to the target network.
        hard_update(self.critic_target, self.critic)
        # Disable gradient calculations of the target network.
        grad_false(self.critic_target)

        # Policy is updated without the encoder.
        self.policy_optim = Adam(self.policy.parameters(), lr=lr)
        self.q1_optim = Adam(self.critic.Q1.parameters(), lr=lr)
        self.q2_optim = Adam(self.critic.Q2.parameters(), lr=lr)
        self.latent_optim = Adam(self.latent.parameters(), lr=latent_lr)

        if entropy_tuning:
            # Target entropy is -|A|.
            self.target_entropy = -torch.prod(torch.Tensor(self.action_shape)).item()
            # We optimize log(alpha), instead of alpha.
            self.log_alpha = torch.zeros(1, requires_grad=True, device=DEVICE)
            self.alpha = self.log_alpha.exp()
            self.alpha_optim = Adam([self.log_alpha], lr=lr)
        else:
            self.alpha = torch.tensor(ent_coef).to(DEVICE)

        self.memory = LazyMemory(num_sequences, observation_dim, action_dim)

    def learn(self):
        self.learning_steps += 1
        if self.learning_steps % self.target_update_interval == 0:
            soft_update(self.critic_target, self.critic, self.tau)

        # Update the latent model.
        self.learn_latent()
        # Update policy and critic.
        self.learn_sac()

    def learn_latent(self):
        images_seq, actions_seq = self.memory.sample_latent(self.latent_batch_size)
        features_seq = self.latent.encoder(images_seq)
        latent1, latent2 = self.latent.sample_posterior(features_seq, actions_seq)
        recon = self.latent.decoder(torch.cat([latent1, latent2], dim=-1))
        latent_loss = (recon - images_seq).pow(2).mean()
        update_params(self.latent_optim, self.latent, latent_loss, self.grad_clip)

    def learn_sac(self):
        images_seq, actions_seq, rewards = self.memory.sample_sac(self.batch_size)

        # NOTE: Don't update the encoder part of the policy here.
        with torch.no_grad():
            # f(1:t+1)
            features_seq = self.latent.encoder(images_seq)
            latent_samples = self.latent.sample_posterior(features_seq, actions_seq)

        # z(t), z(t+1)
        latents_seq = torch.cat(latent_samples, dim=-1)
        latents = latents_seq[:, -2]
        next_latents = latents_seq[:, -1]
        # a(t)
        actions = actions_seq[:, -1]
        # fa(t)=(x(1:t), a(1:t-1)), fa(t+1)=(x(2:t+1), a(2:t))
        feature_actions, next_feature_actions = create_feature_actions(features_seq, actions_seq)

        q1_loss, q2_loss = self.calc_critic_loss(
            latents, next_latents, actions, next_feature_actions, rewards)
        policy_loss, entropies = self.calc_policy_loss(latents, feature_actions)

        update_params(self.q1_optim, self.critic.Q1, q1_loss, self.grad_clip)
        update_params(self.q2_optim, self.critic.Q2, q2_loss, self.grad_clip)  # step
        update_params(self.policy_optim, self.policy, policy_loss, self.grad_clip)

        if self.entropy_tuning:
            entropy_loss = self.calc_entropy_loss(entropies)
            update_params(self.alpha_optim, None, entropy_loss)
            self.alpha = self.log_alpha.exp()
        else:
            entropy_loss = 0.

    def calc_critic_loss(self, latents, next_latents, actions, next_feature_actions, rewards):
        # Q(z(t), a(t))
        curr_q1, curr_q2 = self.critic(latents, actions)
        # E[Q(z(t+1), a(t+1)) + alpha * H(pi)]
        with torch.no_grad():
            next_actions, next_entropies, _ = self.policy.sample(next_feature_actions)
            next_q1, next_q2 = self.critic_target(next_latents, next_actions)
            next_q = torch.min(next_q1, next_q2) + self.alpha * next_entropies
        # r(t) + gamma * E[Q(z(t+1), a(t+1)) + alpha * H(pi)]
        target_q = rewards + self.gamma * next_q

        # Critic losses are mean squared TD errors.
        q1_loss = 0.5 * torch.mean((curr_q1 - target_q).pow(2))
        q2_loss = 0.5 * torch.mean((curr_q2 - target_q).pow(2))
        return q1_loss, q2_loss

    def calc_policy_loss(self, latents, feature_actions):
        # Re-sample actions to calculate expectations of Q.
        sampled_actions, entropies, _ = self.policy.sample(feature_actions)
        # E[Q(z(t), a(t))]
        q1, q2 = self.critic(latents, sampled_actions)  # culprit
        q = torch.min(q1, q2)

        # Policy objective is maximization of (Q + alpha * entropy).
        policy_loss = torch.mean((- q - self.alpha * entropies))
        return policy_loss, entropies

    def calc_entropy_loss(self, entropies):
        # Intuitively, we increse alpha when entropy is less than target
        # entropy, vice versa.
        entropy_loss = -torch.mean(
            self.log_alpha * (self.target_entropy - entropies).detach())
        return entropy_loss


np.random.seed(0)
agent = SlacAgent()
for _ in range(3):
    agent.learn()
print("done")
