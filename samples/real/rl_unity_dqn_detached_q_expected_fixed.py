# source: https://github.com/QasimWani/RL-Unity/issues/2 — DQN Agent.train computes Q_expected from qnetwork_local(...).detach(), so loss.backward() has nothing to differentiate
# fix-source: https://github.com/QasimWani/RL-Unity/commit/b22dcc59183be340454eb2ed87247d1d1beab1e2 — maintainer's working agent.py: Q_expected = self.qnetwork_local(states).gather(1, actions), no detach
# expect-kind: none
# fix: qexp = self.qnetwork_local(...)[0] without .detach(), as in the maintainer's agent.py train(), so the TD loss reaches qnetwork_local
import random
from collections import deque

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from _device import DEVICE

BUFFER_SIZE = int(1e5)  # replay buffer size
BATCH_SIZE = 8          # minibatch size
TAU = 1e-3              # for soft update of target parameters


class DQNetwork(nn.Module):
    def __init__(self, input_features, output_features, dropout_layers=[0.3, 0.1]):
        super().__init__()
        self.state_size = input_features[0]
        self.action_size = output_features[-1]
        self.FC = nn.ModuleList()
        self.Dropout = []
        for input_unit, output_unit in zip(input_features, output_features):
            self.FC.append(nn.Linear(input_unit, output_unit, bias=True))
        for prob in dropout_layers:
            self.Dropout.append(nn.Dropout(prob))

    def forward(self, state):
        for i in range(len(self.FC)):
            if(i == 0):
                X = F.relu(self.FC[0](state))
            else:
                X = F.relu(self.FC[i](X)) if (i < len(self.FC) - 1) else self.FC[i](X)
            if(i < len(self.Dropout)):
                X = self.Dropout[i](X)
        return X


class ReplayBuffer():
    def __init__(self, buffer_size, batch_size):
        self.buffer_size = buffer_size
        self.batch_size = batch_size
        self.replay_memory = deque(maxlen=self.buffer_size)

    def add(self, transition):
        self.replay_memory.append(transition)

    def sample(self):
        experiences = random.sample(self.replay_memory, k=self.batch_size)
        states = torch.from_numpy(np.vstack([e[0] for e in experiences if e is not None])).float().to(DEVICE)
        actions = torch.from_numpy(np.vstack([e[1] for e in experiences if e is not None])).long().to(DEVICE)
        rewards = torch.from_numpy(np.vstack([e[2] for e in experiences if e is not None])).float().to(DEVICE)
        next_states = torch.from_numpy(np.vstack([e[3] for e in experiences if e is not None])).float().to(DEVICE)
        dones = torch.from_numpy(np.vstack([e[4] for e in experiences if e is not None]).astype(np.uint8)).float().to(DEVICE)
        return (states, actions, rewards, next_states, dones)

    def __len__(self):
        return len(self.replay_memory)


class Agent():
    """Defines the agent class for DQN using Double Q-learning and Prioritized Experience Replay architecture"""
    def __init__(self, state_size=6, action_size=3, gamma=0.99, lr=0.001, update_every=2):
        self.state_size = state_size
        self.action_size = action_size
        self.input_features = [state_size, 16, 8, 8]
        self.output_features = [16, 8, 8, action_size]
        self.gamma = gamma
        #Q-network : defines the 2 DQN (using doubling Q-learning architecture via fixed Q target)
        self.qnetwork_local = DQNetwork(self.input_features, self.output_features).to(DEVICE)
        self.qnetwork_target = DQNetwork(self.input_features, self.output_features).to(DEVICE)
        self.optimizer = optim.Adam(self.qnetwork_local.parameters(), lr=lr)
        self.memory = ReplayBuffer(BUFFER_SIZE, BATCH_SIZE)
        self.update_every = update_every
        self.target_update_counter = 0

    def step(self, transition):
        self.memory.add(transition)
        self.target_update_counter = (self.target_update_counter + 1) % self.update_every
        if(self.target_update_counter == 0):
            if(len(self.memory) > BATCH_SIZE):
                experiences = self.memory.sample()
                self.train(experiences)

    def get_action(self, state, eps=0.0):
        state = torch.from_numpy(state).float().unsqueeze(0).to(DEVICE)
        self.qnetwork_local.eval()
        with torch.no_grad():
            action_val = self.qnetwork_local(state)
        self.qnetwork_local.train()
        if(random.random() > eps):#exploit
            return np.argmax(action_val.cpu().data.numpy())
        return random.choice(np.arange(self.action_size))#explore

    def train(self, experiences):
        states, actions, rewards, next_states, done = experiences

        #Implement SGD using Adam as regularizer
        Q_targets_next = self.qnetwork_target(next_states).detach().max(1)[0].unsqueeze(1)
        Q_targets = rewards + (self.gamma * Q_targets_next * (1 - done))
        qexp = self.qnetwork_local(states.float().unsqueeze(0))[0]
        Q_expected = qexp.gather(1, actions)
        #set loss as mse.
        loss = F.mse_loss(Q_expected, Q_targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

        #Update target network using soft update
        self.soft_update(self.qnetwork_local, self.qnetwork_target)

    def soft_update(self, local_model, target_model):
        for target_param, local_param in zip(target_model.parameters(), local_model.parameters()):
            target_param.data.copy_(TAU*local_param.data + (1.0-TAU)*target_param.data)


random.seed(0)
np.random.seed(0)
agent = Agent()
state = np.random.randn(agent.state_size).astype(np.float32)
for t in range(16):
    action = agent.get_action(state, eps=0.1)
    next_state = np.random.randn(agent.state_size).astype(np.float32)
    reward, done = float(np.random.randn()), (t % 7 == 6)
    transition = (state, action, reward, next_state, done)
    agent.step(transition)
    state = next_state
print("done")
