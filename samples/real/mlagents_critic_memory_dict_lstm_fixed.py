# source: https://github.com/Unity-Technologies/ml-agents/pull/5048 — LSTM critic memory stored per agent with its graph, so each trajectory's value pass extends the previous one's graph
# fix-source: https://github.com/Unity-Technologies/ml-agents/pull/5048 — maintainers evaluate the trajectory under torch.no_grad() so the stored memory has no gradient
# expect-kind: none
# fix: evaluate the trajectory under torch.no_grad(), so the memory stored in critic_memory_dict has no gradient (PR #5048)
import math
from typing import Dict, List

import numpy as np
import torch
import torch.nn as nn
from _device import DEVICE


class LSTM(nn.Module):
    def __init__(self, input_size, memory_size):
        super().__init__()
        self.hidden_size = memory_size // 2
        self.lstm = nn.LSTM(input_size, self.hidden_size, batch_first=True)

    def forward(self, input_tensor, memories):
        h0, c0 = torch.split(memories, self.hidden_size, dim=-1)
        lstm_out, hidden_out = self.lstm(input_tensor, (h0.contiguous(), c0.contiguous()))
        output_mem = torch.cat(hidden_out, dim=-1)
        return lstm_out, output_mem


class ValueNetwork(nn.Module):
    def __init__(self, obs_size, memory_size=8, stream_names=("extrinsic",)):
        super().__init__()
        self.memory_size = memory_size
        self.encoder = nn.Sequential(nn.Linear(obs_size, 8), nn.ReLU())
        self.lstm = LSTM(8, memory_size)
        self.value_heads = nn.ModuleDict({name: nn.Linear(memory_size // 2, 1) for name in stream_names})

    def critic_pass(self, inputs: List[torch.Tensor], memories: torch.Tensor, sequence_length: int = 1):
        encoding = self.encoder(inputs[0])
        encoding = encoding.reshape([-1, sequence_length, encoding.shape[-1]])
        encoding, memories = self.lstm(encoding, memories)
        encoding = encoding.reshape([-1, encoding.shape[-1]])
        value_outputs = {name: head(encoding).squeeze(-1) for name, head in self.value_heads.items()}
        return value_outputs, memories


class Policy:
    use_recurrent = True
    sequence_length = 4


class TorchOptimizer:
    def __init__(self, critic: ValueNetwork, policy: Policy):
        self.policy = policy
        self._critic = critic
        self.optimizer = torch.optim.Adam(self._critic.parameters(), lr=3e-4)
        self.critic_memory_dict: Dict[str, torch.Tensor] = {}

    @property
    def critic(self):
        return self._critic

    def _evaluate_by_sequence(self, tensor_obs: List[torch.Tensor], initial_memory: torch.Tensor):
        num_experiences = tensor_obs[0].shape[0]
        all_next_memories = []
        leftover = num_experiences % self.policy.sequence_length

        seq_obs = []
        first_seq_len = leftover if leftover > 0 else self.policy.sequence_length
        for _obs in tensor_obs:
            first_seq_obs = _obs[0:first_seq_len]
            seq_obs.append(first_seq_obs)

        for _ in range(first_seq_len):
            all_next_memories.append(initial_memory.squeeze().detach().cpu().numpy())

        init_values, _mem = self.critic.critic_pass(seq_obs, initial_memory, sequence_length=first_seq_len)
        all_values = {signal_name: [init_values[signal_name]] for signal_name in init_values.keys()}

        for seq_num in range(1, math.ceil((num_experiences) / (self.policy.sequence_length))):
            seq_obs = []
            for _ in range(self.policy.sequence_length):
                all_next_memories.append(_mem.squeeze().detach().cpu().numpy())
            start = seq_num * self.policy.sequence_length - (self.policy.sequence_length - leftover)
            end = (seq_num + 1) * self.policy.sequence_length - (self.policy.sequence_length - leftover)
            for _obs in tensor_obs:
                seq_obs.append(_obs[start:end])
            values, _mem = self.critic.critic_pass(seq_obs, _mem, sequence_length=self.policy.sequence_length)
            for signal_name, _val in values.items():
                all_values[signal_name].append(_val)
        all_value_tensors = {
            signal_name: torch.cat(value_list, dim=0) for signal_name, value_list in all_values.items()
        }
        next_mem = _mem
        return all_value_tensors, all_next_memories, next_mem

    def get_trajectory_value_estimates(self, batch: Dict[str, np.ndarray], next_obs: List[np.ndarray],
                                       done: bool, agent_id: str = ""):
        if agent_id in self.critic_memory_dict:
            memory = self.critic_memory_dict[agent_id]
        else:
            memory = torch.zeros((1, 1, self.critic.memory_size), device=DEVICE) if self.policy.use_recurrent else None

        current_obs = [torch.as_tensor(batch["obs"], dtype=torch.float32, device=DEVICE)]
        next_obs = [torch.as_tensor(obs, dtype=torch.float32, device=DEVICE) for obs in next_obs]
        next_obs = [obs.unsqueeze(0) for obs in next_obs]

        all_next_memories = None
        with torch.no_grad():
            if self.policy.use_recurrent:
                (
                    value_estimates,
                    all_next_memories,
                    next_memory,
                ) = self._evaluate_by_sequence(current_obs, memory)
            else:
                value_estimates, next_memory = self.critic.critic_pass(current_obs, memory, sequence_length=len(batch["obs"]))
        # Store the memory for the next trajectory. This should NOT have a gradient.
        self.critic_memory_dict[agent_id] = next_memory

        next_value_estimate, _ = self.critic.critic_pass(next_obs, next_memory, sequence_length=1)

        for name, estimate in value_estimates.items():
            value_estimates[name] = estimate.detach().cpu().numpy()
            next_value_estimate[name] = next_value_estimate[name].detach().cpu().numpy()

        if done:
            for k in next_value_estimate:
                next_value_estimate[k] = 0.0
            if agent_id in self.critic_memory_dict:
                self.critic_memory_dict.pop(agent_id)
        return value_estimates, next_value_estimate, all_next_memories

    def update(self, batch: Dict[str, np.ndarray], num_sequences: int):
        obs = [torch.as_tensor(batch["obs"], dtype=torch.float32, device=DEVICE)]
        memories = torch.as_tensor(
            np.stack(batch["critic_memory"][:: self.policy.sequence_length]), device=DEVICE
        ).unsqueeze(0)
        values, _ = self.critic.critic_pass(obs, memories, sequence_length=self.policy.sequence_length)
        returns = torch.as_tensor(batch["returns"], dtype=torch.float32, device=DEVICE)
        value_loss = ((values["extrinsic"] - returns) ** 2).mean()
        self.optimizer.zero_grad()
        value_loss.backward()
        self.optimizer.step()
        return {"Losses/Value Loss": value_loss.item()}


obs_size, traj_len = 5, 8
optimizer = TorchOptimizer(ValueNetwork(obs_size).to(DEVICE), Policy())
rng = np.random.default_rng(0)
for step in range(5):
    batch = {"obs": rng.standard_normal((traj_len, obs_size)).astype(np.float32),
             "rewards": rng.standard_normal(traj_len).astype(np.float32)}
    next_obs = [rng.standard_normal(obs_size).astype(np.float32)]
    value_estimates, value_next, value_memories = optimizer.get_trajectory_value_estimates(
        batch, next_obs, done=False, agent_id="agent_0")
    batch["critic_memory"] = value_memories
    batch["returns"] = batch["rewards"] + 0.99 * np.append(value_estimates["extrinsic"][1:], value_next["extrinsic"])
    optimizer.update(batch, num_sequences=traj_len // Policy.sequence_length)
print("done")
