# source: https://github.com/facebookresearch/Pearl/issues/47 — actor-critic learners with an LSTM history summarization module: learn_batch runs the critic update (backward + step) and then the actor update, both through the LSTM graph of the preprocessed batch.state: "Trying to backward through the graph a second time"
# fix-source: https://github.com/facebookresearch/Pearl/commit/74741482ea5c864ebe7c7c35c5cf1fa27d83ddaa — maintainers' fix: _actor_loss/_critic_loss return the losses and learn_batch calls (actor_loss + critic_loss).backward() once, then both optimizer steps (the LSTM forward also stops seeding h0/c0 from the acting-time hidden state)
# expect-kind: none
# fix: learn_batch sums the actor and critic losses and calls backward once before both optimizer steps (actor/critic learn_batch helpers become _actor_loss/_critic_loss, twin_critic_action_value_update becomes twin_critic_action_value_loss); the LSTM forward no longer seeds h0/c0 from the stored hidden_representation
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
from torch import optim
from _device import DEVICE

observation_dim, action_dim, history_length = 3, 1, 4
hidden_dim, batch_size = 8, 4


@dataclass
class TransitionBatch:
    state: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_state: torch.Tensor
    done: torch.Tensor


class ReplayBuffer:
    def __len__(self):
        return 16

    def sample(self, batch_size):
        feat = observation_dim + action_dim
        return TransitionBatch(
            state=torch.randn(batch_size, history_length, feat, device=DEVICE),
            action=torch.rand(batch_size, action_dim, device=DEVICE) * 2 - 1,
            reward=torch.randn(batch_size, device=DEVICE),
            next_state=torch.randn(batch_size, history_length, feat, device=DEVICE),
            done=torch.zeros(batch_size, dtype=torch.bool, device=DEVICE),
        )


class LSTMHistorySummarizationModule(nn.Module):
    def __init__(self, observation_dim, action_dim, hidden_dim=8, num_layers=2):
        super().__init__()
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.lstm = nn.LSTM(num_layers=num_layers, input_size=action_dim + observation_dim,
                            hidden_size=hidden_dim, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, (_, _) = self.lstm(x)
        return out[:, -1, :]


class VanillaContinuousActorNetwork(nn.Module):
    def __init__(self, input_dim, hidden_dims, output_dim):
        super().__init__()
        self._model = nn.Sequential(nn.Linear(input_dim, hidden_dims[0]), nn.ReLU(),
                                    nn.Linear(hidden_dims[0], output_dim), nn.Tanh())

    def sample_action(self, x: torch.Tensor) -> torch.Tensor:
        return self._model(x)


class VanillaQValueNetwork(nn.Module):
    def __init__(self, state_dim, action_dim, hidden_dims):
        super().__init__()
        self._model = nn.Sequential(nn.Linear(state_dim + action_dim, hidden_dims[0]), nn.ReLU(),
                                    nn.Linear(hidden_dims[0], 1))

    def get_q_values(self, state_batch, action_batch):
        return self._model(torch.cat([state_batch, action_batch], dim=-1)).view(-1)


class TwinCritic(nn.Module):
    def __init__(self, state_dim, action_dim, hidden_dims):
        super().__init__()
        self._critic_1 = VanillaQValueNetwork(state_dim, action_dim, hidden_dims)
        self._critic_2 = VanillaQValueNetwork(state_dim, action_dim, hidden_dims)

    def get_q_values(self, state_batch, action_batch):
        return (self._critic_1.get_q_values(state_batch, action_batch),
                self._critic_2.get_q_values(state_batch, action_batch))


def update_target_network(target_network, source_network, tau):
    for target_param, source_param in zip(target_network.parameters(), source_network.parameters()):
        target_param.data.copy_(tau * source_param.data + (1.0 - tau) * target_param.data)


def twin_critic_action_value_loss(state_batch, action_batch, expected_target_batch,
                                  critic: TwinCritic) -> torch.Tensor:
    criterion = torch.nn.MSELoss()
    q_1, q_2 = critic.get_q_values(state_batch, action_batch)
    loss = criterion(q_1.reshape_as(expected_target_batch), expected_target_batch.detach()) + \
        criterion(q_2.reshape_as(expected_target_batch), expected_target_batch.detach())
    return loss


class DeepDeterministicPolicyGradient:
    def __init__(self, state_dim, actor_hidden_dims, critic_hidden_dims, discount_factor=0.99,
                 training_rounds=2, soft_update_tau=0.005):
        self._actor = VanillaContinuousActorNetwork(state_dim, actor_hidden_dims, action_dim).to(DEVICE)
        self._actor_target = VanillaContinuousActorNetwork(state_dim, actor_hidden_dims, action_dim).to(DEVICE)
        self._actor_target.load_state_dict(self._actor.state_dict())
        self._critic = TwinCritic(state_dim, action_dim, critic_hidden_dims).to(DEVICE)
        self._critic_target = TwinCritic(state_dim, action_dim, critic_hidden_dims).to(DEVICE)
        self._critic_target.load_state_dict(self._critic.state_dict())
        self._actor_optimizer = optim.AdamW(self._actor.parameters(), lr=1e-3, amsgrad=True)
        self._critic_optimizer = optim.AdamW(self._critic.parameters(), lr=1e-3, amsgrad=True)
        self._discount_factor = discount_factor
        self._training_rounds = training_rounds
        self._soft_update_tau = soft_update_tau
        self._history_summarization_module: Optional[nn.Module] = None

    def set_history_summarization_module(self, value: nn.Module) -> None:
        self._actor_optimizer.add_param_group({"params": value.parameters()})
        self._critic_optimizer.add_param_group({"params": value.parameters()})
        self._history_summarization_module = value

    def learn(self, replay_buffer: ReplayBuffer) -> Dict[str, Any]:
        report = {}
        for _ in range(self._training_rounds):
            batch = replay_buffer.sample(batch_size)
            batch = self.preprocess_batch(batch)
            single_report = self.learn_batch(batch)
            for k, v in single_report.items():
                report.setdefault(k, []).append(v)
        return report

    def preprocess_batch(self, batch: TransitionBatch) -> TransitionBatch:
        batch.state = self._history_summarization_module(batch.state)
        with torch.no_grad():
            batch.next_state = self._history_summarization_module(batch.next_state)
        return batch

    def learn_batch(self, batch: TransitionBatch) -> Dict[str, Any]:
        actor_loss = self._actor_loss(batch)
        self._actor_optimizer.zero_grad()
        critic_loss = self._critic_loss(batch)
        self._critic_optimizer.zero_grad()
        (actor_loss + critic_loss).backward()
        self._actor_optimizer.step()
        self._critic_optimizer.step()
        report = {
            "actor_loss": actor_loss.item(),
            "critic_loss": critic_loss.item(),
        }
        update_target_network(self._critic_target, self._critic, self._soft_update_tau)
        update_target_network(self._actor_target, self._actor, self._soft_update_tau)
        return report

    def _actor_loss(self, batch: TransitionBatch) -> torch.Tensor:
        action_batch = self._actor.sample_action(batch.state)
        q1, q2 = self._critic.get_q_values(state_batch=batch.state, action_batch=action_batch)
        q = torch.minimum(q1, q2)
        loss = -q.mean()
        return loss

    def _critic_loss(self, batch: TransitionBatch) -> torch.Tensor:
        with torch.no_grad():
            next_action = self._actor_target.sample_action(batch.next_state)
            next_q1, next_q2 = self._critic_target.get_q_values(state_batch=batch.next_state,
                                                                action_batch=next_action)
            next_q = torch.minimum(next_q1, next_q2)
            expected_state_action_values = (
                next_q * self._discount_factor * (1 - batch.done.float())
            ) + batch.reward
        loss = twin_critic_action_value_loss(
            state_batch=batch.state,
            action_batch=batch.action,
            expected_target_batch=expected_state_action_values,
            critic=self._critic,
        )
        return loss


policy_learner = DeepDeterministicPolicyGradient(state_dim=hidden_dim, actor_hidden_dims=[16],
                                                 critic_hidden_dims=[16])
policy_learner.set_history_summarization_module(
    LSTMHistorySummarizationModule(observation_dim, action_dim, hidden_dim=hidden_dim).to(DEVICE))
replay_buffer = ReplayBuffer()
for episode in range(3):
    report = policy_learner.learn(replay_buffer)
print("done")
