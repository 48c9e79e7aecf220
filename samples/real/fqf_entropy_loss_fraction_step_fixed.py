# source: https://github.com/toshikwa/fqf-iqn-qrdqn.pytorch/issues/3 — FQF's learn() fails on torch 1.5: the quantile update back-propagates entropy_loss through the fraction net the fraction update has just stepped
# fix-source: https://github.com/toshikwa/fqf-iqn-qrdqn.pytorch/pull/4 — maintainer's fix (commit 62595c9 "Bump torch up to 1.5.0")
# expect-kind: none
# fix: the fraction net sees state_embeddings.detach(), and the quantile update back-propagates quantile_loss alone (no entropy_loss)
import numpy as np
import torch
from torch import nn
from torch.optim import Adam, RMSprop
import torch.nn.functional as F
from _device import DEVICE


def update_params(optim, loss, networks, retain_graph=False,
                  grad_cliping=None):
    optim.zero_grad()
    loss.backward(retain_graph=retain_graph)
    # Clip norms of gradients to stebilize training.
    if grad_cliping:
        for net in networks:
            torch.nn.utils.clip_grad_norm_(net.parameters(), grad_cliping)
    optim.step()


def disable_gradients(network):
    for param in network.parameters():
        param.requires_grad = False


def calculate_huber_loss(td_errors, kappa=1.0):
    return torch.where(
        td_errors.abs() <= kappa,
        0.5 * td_errors.pow(2),
        kappa * (td_errors.abs() - 0.5 * kappa))


def calculate_quantile_huber_loss(td_errors, taus, weights=None, kappa=1.0):
    assert not taus.requires_grad
    element_wise_huber_loss = calculate_huber_loss(td_errors, kappa)
    element_wise_quantile_huber_loss = torch.abs(
        taus[..., None] - (td_errors.detach() < 0).float()
        ) * element_wise_huber_loss / kappa
    batch_quantile_huber_loss = element_wise_quantile_huber_loss.sum(
        dim=1).mean(dim=1, keepdim=True)
    if weights is not None:
        return (batch_quantile_huber_loss * weights).mean()
    return batch_quantile_huber_loss.mean()


def evaluate_quantile_at_action(s_quantiles, actions):
    batch_size, N = s_quantiles.shape[0], s_quantiles.shape[1]
    action_index = actions[..., None].expand(batch_size, N, 1)
    return s_quantiles.gather(dim=2, index=action_index)


class DQNBase(nn.Module):
    def __init__(self, num_channels, embedding_dim=32):
        super(DQNBase, self).__init__()
        self.net = nn.Sequential(
            nn.Conv2d(num_channels, 4, kernel_size=3, stride=2, padding=0),
            nn.ReLU(),
            nn.Conv2d(4, 8, kernel_size=2, stride=1, padding=0),
            nn.ReLU(),
            nn.Conv2d(8, 8, kernel_size=1, stride=1, padding=0),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.embedding_dim = embedding_dim

    def forward(self, states):
        return self.net(states)


class FractionProposalNetwork(nn.Module):
    def __init__(self, N=8, embedding_dim=32):
        super(FractionProposalNetwork, self).__init__()
        self.net = nn.Sequential(nn.Linear(embedding_dim, N))
        self.N = N

    def forward(self, state_embeddings):
        batch_size = state_embeddings.shape[0]
        log_probs = F.log_softmax(self.net(state_embeddings), dim=1)
        probs = log_probs.exp()
        tau_0 = torch.zeros((batch_size, 1), dtype=state_embeddings.dtype,
                            device=state_embeddings.device)
        taus_1_N = torch.cumsum(probs, dim=1)
        taus = torch.cat((tau_0, taus_1_N), dim=1)
        tau_hats = (taus[:, :-1] + taus[:, 1:]).detach() / 2.
        entropies = -(log_probs * probs).sum(dim=-1, keepdim=True)
        return taus, tau_hats, entropies


class CosineEmbeddingNetwork(nn.Module):
    def __init__(self, num_cosines=4, embedding_dim=32):
        super(CosineEmbeddingNetwork, self).__init__()
        self.net = nn.Sequential(nn.Linear(num_cosines, embedding_dim), nn.ReLU())
        self.num_cosines = num_cosines
        self.embedding_dim = embedding_dim

    def forward(self, taus):
        batch_size, N = taus.shape[0], taus.shape[1]
        i_pi = np.pi * torch.arange(start=1, end=self.num_cosines + 1, dtype=taus.dtype,
                                    device=taus.device).view(1, 1, self.num_cosines)
        cosines = torch.cos(taus.view(batch_size, N, 1) * i_pi).view(batch_size * N, self.num_cosines)
        return self.net(cosines).view(batch_size, N, self.embedding_dim)


class QuantileNetwork(nn.Module):
    def __init__(self, num_actions, embedding_dim=32):
        super(QuantileNetwork, self).__init__()
        self.net = nn.Sequential(nn.Linear(embedding_dim, 16), nn.ReLU(), nn.Linear(16, num_actions))
        self.num_actions = num_actions
        self.embedding_dim = embedding_dim

    def forward(self, state_embeddings, tau_embeddings):
        batch_size, N = state_embeddings.shape[0], tau_embeddings.shape[1]
        state_embeddings = state_embeddings.view(batch_size, 1, self.embedding_dim)
        embeddings = (state_embeddings * tau_embeddings).view(batch_size * N, self.embedding_dim)
        return self.net(embeddings).view(batch_size, N, self.num_actions)


class FQF(nn.Module):
    def __init__(self, num_channels, num_actions, N=8, num_cosines=4,
                 embedding_dim=32, target=False):
        super(FQF, self).__init__()
        self.dqn_net = DQNBase(num_channels=num_channels)
        self.cosine_net = CosineEmbeddingNetwork(num_cosines=num_cosines, embedding_dim=embedding_dim)
        self.quantile_net = QuantileNetwork(num_actions=num_actions, embedding_dim=embedding_dim)
        if not target:
            self.fraction_net = FractionProposalNetwork(N=N, embedding_dim=embedding_dim)
        self.N = N
        self.num_actions = num_actions
        self.target = target

    def sample_noise(self):
        pass  # noisy_net=False

    def calculate_state_embeddings(self, states):
        return self.dqn_net(states)

    def calculate_fractions(self, states=None, state_embeddings=None, fraction_net=None):
        if state_embeddings is None:
            state_embeddings = self.dqn_net(states)
        fraction_net = fraction_net if self.target else self.fraction_net
        taus, tau_hats, entropies = fraction_net(state_embeddings)
        return taus, tau_hats, entropies

    def calculate_quantiles(self, taus, states=None, state_embeddings=None):
        if state_embeddings is None:
            state_embeddings = self.dqn_net(states)
        tau_embeddings = self.cosine_net(taus)
        return self.quantile_net(state_embeddings, tau_embeddings)

    def calculate_q(self, taus=None, tau_hats=None, states=None,
                    state_embeddings=None, fraction_net=None):
        if state_embeddings is None:
            state_embeddings = self.dqn_net(states)
        if taus is None or tau_hats is None:
            taus, tau_hats, _ = self.calculate_fractions(
                state_embeddings=state_embeddings, fraction_net=fraction_net)
        quantile_hats = self.calculate_quantiles(tau_hats, state_embeddings=state_embeddings)
        return ((taus[:, 1:, None] - taus[:, :-1, None]) * quantile_hats).sum(dim=1)


class Memory:
    """Stands in for the replay buffer: random Atari-like transitions."""

    def __init__(self, num_channels, num_actions):
        self.num_channels, self.num_actions = num_channels, num_actions

    def sample(self, batch_size):
        states = torch.rand(batch_size, self.num_channels, 8, 8, device=DEVICE)
        actions = torch.randint(0, self.num_actions, (batch_size, 1), device=DEVICE)
        rewards = torch.randn(batch_size, 1, device=DEVICE)
        next_states = torch.rand(batch_size, self.num_channels, 8, 8, device=DEVICE)
        dones = torch.zeros(batch_size, 1, device=DEVICE)
        return states, actions, rewards, next_states, dones


class FQFAgent:

    def __init__(self, num_channels=2, num_actions=3, batch_size=4, N=8,
                 num_cosines=4, ent_coef=0, kappa=1.0, quantile_lr=5e-3,
                 fraction_lr=2.5e-3, gamma=0.99, grad_cliping=None):
        self.num_actions = num_actions
        self.batch_size = batch_size
        self.memory = Memory(num_channels, num_actions)
        self.use_per = False
        self.double_q_learning = False
        self.gamma_n = gamma
        self.grad_cliping = grad_cliping
        self.learning_steps = 0

        self.online_net = FQF(num_channels=num_channels, num_actions=num_actions,
                              N=N, num_cosines=num_cosines).to(DEVICE)
        self.target_net = FQF(num_channels=num_channels, num_actions=num_actions,
                              N=N, num_cosines=num_cosines, target=True).to(DEVICE)
        self.update_target()
        disable_gradients(self.target_net)

        self.fraction_optim = RMSprop(
            self.online_net.fraction_net.parameters(),
            lr=fraction_lr, alpha=0.95, eps=0.00001)
        self.quantile_optim = Adam(
            list(self.online_net.dqn_net.parameters())
            + list(self.online_net.cosine_net.parameters())
            + list(self.online_net.quantile_net.parameters()),
            lr=quantile_lr, eps=1e-2 / batch_size)

        self.ent_coef = ent_coef
        self.N = N
        self.kappa = kappa

    def update_target(self):
        self.target_net.dqn_net.load_state_dict(self.online_net.dqn_net.state_dict())
        self.target_net.quantile_net.load_state_dict(self.online_net.quantile_net.state_dict())
        self.target_net.cosine_net.load_state_dict(self.online_net.cosine_net.state_dict())

    def learn(self):
        self.learning_steps += 1
        self.online_net.sample_noise()
        self.target_net.sample_noise()

        states, actions, rewards, next_states, dones = self.memory.sample(self.batch_size)
        weights = None

        # Calculate embeddings of current states.
        state_embeddings = self.online_net.calculate_state_embeddings(states)

        # Calculate fractions of current states and entropies.
        taus, tau_hats, entropies = self.online_net.calculate_fractions(state_embeddings=state_embeddings.detach())

        # Calculate quantile values of current states and actions at tau_hats.
        current_sa_quantile_hats = evaluate_quantile_at_action(
            self.online_net.calculate_quantiles(
                tau_hats, state_embeddings=state_embeddings),
            actions)

        fraction_loss = self.calculate_fraction_loss(
            state_embeddings.detach(), current_sa_quantile_hats.detach(),
            taus, actions, weights)

        quantile_loss, mean_q, errors = self.calculate_quantile_loss(
            state_embeddings, tau_hats, current_sa_quantile_hats, actions,
            rewards, next_states, dones, weights)

        entropy_loss = -self.ent_coef * entropies.mean()

        update_params(
            self.fraction_optim, fraction_loss + entropy_loss,
            networks=[self.online_net.fraction_net], retain_graph=True,
            grad_cliping=self.grad_cliping)
        update_params(
            self.quantile_optim, quantile_loss,
            networks=[
                self.online_net.dqn_net, self.online_net.cosine_net,
                self.online_net.quantile_net],
            retain_graph=False, grad_cliping=self.grad_cliping)

    def calculate_fraction_loss(self, state_embeddings, sa_quantile_hats, taus,
                                actions, weights):
        assert not state_embeddings.requires_grad
        assert not sa_quantile_hats.requires_grad
        batch_size = state_embeddings.shape[0]

        with torch.no_grad():
            sa_quantiles = evaluate_quantile_at_action(
                self.online_net.calculate_quantiles(
                    taus=taus[:, 1:-1], state_embeddings=state_embeddings),
                actions)

        values_1 = sa_quantiles - sa_quantile_hats[:, :-1]
        signs_1 = sa_quantiles > torch.cat([
            sa_quantile_hats[:, :1], sa_quantiles[:, :-1]], dim=1)
        values_2 = sa_quantiles - sa_quantile_hats[:, 1:]
        signs_2 = sa_quantiles < torch.cat([
            sa_quantiles[:, 1:], sa_quantile_hats[:, -1:]], dim=1)
        gradient_of_taus = (
            torch.where(signs_1, values_1, -values_1)
            + torch.where(signs_2, values_2, -values_2)
        ).view(batch_size, self.N - 1)
        assert not gradient_of_taus.requires_grad

        return (gradient_of_taus * taus[:, 1:-1]).sum(dim=1).mean()

    def calculate_quantile_loss(self, state_embeddings, tau_hats,
                                current_sa_quantile_hats, actions, rewards,
                                next_states, dones, weights):
        assert not tau_hats.requires_grad

        with torch.no_grad():
            next_state_embeddings = self.target_net.calculate_state_embeddings(next_states)
            next_q = self.target_net.calculate_q(
                state_embeddings=next_state_embeddings,
                fraction_net=self.online_net.fraction_net)
            next_actions = torch.argmax(next_q, dim=1, keepdim=True)
            next_sa_quantile_hats = evaluate_quantile_at_action(
                self.target_net.calculate_quantiles(
                    taus=tau_hats, state_embeddings=next_state_embeddings),
                next_actions).transpose(1, 2)
            target_sa_quantile_hats = rewards[..., None] + (
                1.0 - dones[..., None]) * self.gamma_n * next_sa_quantile_hats

        td_errors = target_sa_quantile_hats - current_sa_quantile_hats
        quantile_huber_loss = calculate_quantile_huber_loss(
            td_errors, tau_hats, weights, self.kappa)
        return quantile_huber_loss, next_q.detach().mean().item(), td_errors.detach().abs()


agent = FQFAgent()
for step in range(4):
    agent.learn()
print("done")
