# source: https://github.com/cross32768/Dreamer_PyTorch/issues/2 — train.py: in-place version error ([400, 1], AsStridedBackward0) at action_loss.backward() after value_optimizer.step()
# fix-source: issue comment (hynkis: reorder the backward/step calls), made exact: the action model is updated first, then the value model on the detached imagined trajectory
# expect-kind: inplace-modified
# expect-culprit: value_model.fc3.weight
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Normal
from torch.nn.functional import mse_loss
from torch.nn.utils import clip_grad_norm_
from _device import DEVICE

state_dim, action_dim, rnn_hidden_dim, hidden_dim = 4, 1, 8, 12
batch_size, chunk_length, imagination_horizon = 4, 5, 3
gamma, lambda_, clip_grad_norm = 0.9, 0.95, 100.0


class RecurrentStateSpaceModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_state_action = nn.Linear(state_dim + action_dim, hidden_dim)
        self.rnn = nn.GRUCell(hidden_dim, rnn_hidden_dim)
        self.fc_rnn_hidden = nn.Linear(rnn_hidden_dim, hidden_dim)
        self.fc_state_mean_prior = nn.Linear(hidden_dim, state_dim)
        self.fc_state_stddev_prior = nn.Linear(hidden_dim, state_dim)

    def prior(self, state, action, rnn_hidden):
        hidden = F.elu(self.fc_state_action(torch.cat([state, action], dim=1)))
        rnn_hidden = self.rnn(hidden, rnn_hidden)
        hidden = F.elu(self.fc_rnn_hidden(rnn_hidden))
        mean = self.fc_state_mean_prior(hidden)
        stddev = F.softplus(self.fc_state_stddev_prior(hidden)) + 0.1
        return Normal(mean, stddev), rnn_hidden


class RewardModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(state_dim + rnn_hidden_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, 1)

    def forward(self, state, rnn_hidden):
        return self.fc2(F.elu(self.fc1(torch.cat([state, rnn_hidden], dim=1))))


class ValueModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(state_dim + rnn_hidden_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, 1)

    def forward(self, state, rnn_hidden):
        hidden = F.elu(self.fc1(torch.cat([state, rnn_hidden], dim=1)))
        return self.fc3(F.elu(self.fc2(hidden)))


class ActionModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(state_dim + rnn_hidden_dim, hidden_dim)
        self.fc_mean = nn.Linear(hidden_dim, action_dim)
        self.fc_stddev = nn.Linear(hidden_dim, action_dim)

    def forward(self, state, rnn_hidden):
        hidden = F.elu(self.fc1(torch.cat([state, rnn_hidden], dim=1)))
        mean = self.fc_mean(hidden)
        stddev = F.softplus(self.fc_stddev(hidden)) + 0.1
        return torch.tanh(mean + stddev * torch.randn_like(mean))


def lambda_target(rewards, values, gamma, lambda_):
    H = rewards.shape[0] - 1
    targets = [values[H]]
    for t in reversed(range(H)):
        targets.append(rewards[t + 1] + gamma * ((1 - lambda_) * values[t + 1] + lambda_ * targets[-1]))
    return torch.stack(targets[::-1])


rssm = RecurrentStateSpaceModel().to(DEVICE)
reward_model = RewardModel().to(DEVICE)
value_model = ValueModel().to(DEVICE)
action_model = ActionModel().to(DEVICE)
model_params = list(rssm.parameters()) + list(reward_model.parameters())
model_optimizer = torch.optim.Adam(model_params, lr=6e-4)
value_optimizer = torch.optim.Adam(value_model.parameters(), lr=8e-5)
action_optimizer = torch.optim.Adam(action_model.parameters(), lr=8e-5)

for update_step in range(3):
    # update model (rssm, reward_model) on a sampled chunk
    actions = torch.rand(chunk_length, batch_size, action_dim, device=DEVICE) * 2 - 1
    rewards = torch.randn(chunk_length, batch_size, 1, device=DEVICE)
    states = torch.zeros(chunk_length, batch_size, state_dim, device=DEVICE)
    rnn_hiddens = torch.zeros(chunk_length, batch_size, rnn_hidden_dim, device=DEVICE)
    state = torch.zeros(batch_size, state_dim, device=DEVICE)
    rnn_hidden = torch.zeros(batch_size, rnn_hidden_dim, device=DEVICE)
    for l in range(chunk_length - 1):
        next_state_prior, rnn_hidden = rssm.prior(state, actions[l], rnn_hidden)
        state = next_state_prior.rsample()
        states[l + 1] = state
        rnn_hiddens[l + 1] = rnn_hidden
    states = states[1:]
    rnn_hiddens = rnn_hiddens[1:]
    flatten_states = states.view(-1, state_dim)
    flatten_rnn_hiddens = rnn_hiddens.view(-1, rnn_hidden_dim)
    predicted_rewards = reward_model(flatten_states, flatten_rnn_hiddens).view(chunk_length - 1, batch_size, 1)
    model_loss = 0.5 * mse_loss(predicted_rewards, rewards[:-1])
    model_optimizer.zero_grad()
    model_loss.backward()
    clip_grad_norm_(model_params, clip_grad_norm)
    model_optimizer.step()

    # update value_model and action_model
    flatten_states = flatten_states.detach()
    flatten_rnn_hiddens = flatten_rnn_hiddens.detach()
    imaginated_states = torch.zeros(imagination_horizon + 1, *flatten_states.shape, device=DEVICE)
    imaginated_rnn_hiddens = torch.zeros(imagination_horizon + 1, *flatten_rnn_hiddens.shape, device=DEVICE)
    imaginated_states[0] = flatten_states
    imaginated_rnn_hiddens[0] = flatten_rnn_hiddens
    for h in range(1, imagination_horizon + 1):
        actions = action_model(flatten_states, flatten_rnn_hiddens)
        flatten_states_prior, flatten_rnn_hiddens = rssm.prior(flatten_states, actions, flatten_rnn_hiddens)
        flatten_states = flatten_states_prior.rsample()
        imaginated_states[h] = flatten_states
        imaginated_rnn_hiddens[h] = flatten_rnn_hiddens

    flatten_imaginated_states = imaginated_states.view(-1, state_dim)
    flatten_imaginated_rnn_hiddens = imaginated_rnn_hiddens.view(-1, rnn_hidden_dim)
    imaginated_rewards = reward_model(flatten_imaginated_states,
                                      flatten_imaginated_rnn_hiddens).view(imagination_horizon + 1, -1)
    imaginated_values = value_model(flatten_imaginated_states,  # culprit
                                    flatten_imaginated_rnn_hiddens).view(imagination_horizon + 1, -1)
    lambda_target_values = lambda_target(imaginated_rewards, imaginated_values, gamma, lambda_)

    # update_value model
    value_loss = 0.5 * mse_loss(imaginated_values, lambda_target_values.detach())
    value_optimizer.zero_grad()
    value_loss.backward(retain_graph=True)
    clip_grad_norm_(value_model.parameters(), clip_grad_norm)
    value_optimizer.step()  # step

    # update action model (multiply -1 for gradient ascent)
    action_loss = -1 * (lambda_target_values.mean())
    action_optimizer.zero_grad()
    action_loss.backward()
    clip_grad_norm_(action_model.parameters(), clip_grad_norm)
    action_optimizer.step()
print("done")
