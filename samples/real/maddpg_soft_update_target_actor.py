# source: https://github.com/philtabor/Multi-Agent-Deep-Deterministic-Policy-Gradients/issues/2 — issue: MADDPG.learn fails at critic_loss.backward(retain_graph=True) with torch 1.8 ("[64, 8], output 0 of TBackward, is at version 3; expected version 2"); the author's answer was to downgrade to torch 1.4
# fix-source: the author's rewrite in philtabor/Multi-Agent-Reinforcement-Learning (maddpg/agent.py, Agent.learn): target actions and target computed under T.no_grad(), the agent's own actor re-run after its critic step with the other agents' actions taken from the buffer
# expect-kind: inplace-modified
# expect-culprit: self.agents[0].target_actor.pi.weight
import numpy as np
import torch as T
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from _device import DEVICE

np.random.seed(0)


class CriticNetwork(nn.Module):
    def __init__(self, beta, input_dims, fc1_dims, fc2_dims, n_agents, n_actions, name):
        super(CriticNetwork, self).__init__()
        self.fc1 = nn.Linear(input_dims + n_agents * n_actions, fc1_dims)
        self.fc2 = nn.Linear(fc1_dims, fc2_dims)
        self.q = nn.Linear(fc2_dims, 1)
        self.optimizer = optim.Adam(self.parameters(), lr=beta)
        self.device = DEVICE
        self.to(self.device)

    def forward(self, state, action):
        x = F.relu(self.fc1(T.cat([state, action], dim=1)))
        x = F.relu(self.fc2(x))
        q = self.q(x)
        return q


class ActorNetwork(nn.Module):
    def __init__(self, alpha, input_dims, fc1_dims, fc2_dims, n_actions, name):
        super(ActorNetwork, self).__init__()
        self.fc1 = nn.Linear(input_dims, fc1_dims)
        self.fc2 = nn.Linear(fc1_dims, fc2_dims)
        self.pi = nn.Linear(fc2_dims, n_actions)
        self.optimizer = optim.Adam(self.parameters(), lr=alpha)
        self.device = DEVICE
        self.to(self.device)

    def forward(self, state):
        x = F.relu(self.fc1(state))
        x = F.relu(self.fc2(x))
        pi = T.softmax(self.pi(x), dim=1)
        return pi


class Agent:
    def __init__(self, actor_dims, critic_dims, n_actions, n_agents, agent_idx,
                 alpha=0.01, beta=0.01, fc1=16, fc2=16, gamma=0.95, tau=0.01):
        self.gamma = gamma
        self.tau = tau
        self.n_actions = n_actions
        self.agent_name = 'agent_%s' % agent_idx
        self.actor = ActorNetwork(alpha, actor_dims, fc1, fc2, n_actions, name=self.agent_name + '_actor')
        self.critic = CriticNetwork(beta, critic_dims, fc1, fc2, n_agents, n_actions, name=self.agent_name + '_critic')
        self.target_actor = ActorNetwork(alpha, actor_dims, fc1, fc2, n_actions, name=self.agent_name + '_target_actor')
        self.target_critic = CriticNetwork(beta, critic_dims, fc1, fc2, n_agents, n_actions, name=self.agent_name + '_target_critic')
        self.update_network_parameters(tau=1)

    def update_network_parameters(self, tau=None):
        if tau is None:
            tau = self.tau

        target_actor_params = self.target_actor.named_parameters()
        actor_params = self.actor.named_parameters()
        target_actor_state_dict = dict(target_actor_params)
        actor_state_dict = dict(actor_params)
        for name in actor_state_dict:
            actor_state_dict[name] = tau * actor_state_dict[name].clone() + \
                (1 - tau) * target_actor_state_dict[name].clone()
        self.target_actor.load_state_dict(actor_state_dict)

        target_critic_params = self.target_critic.named_parameters()
        critic_params = self.critic.named_parameters()
        target_critic_state_dict = dict(target_critic_params)
        critic_state_dict = dict(critic_params)
        for name in critic_state_dict:
            critic_state_dict[name] = tau * critic_state_dict[name].clone() + \
                (1 - tau) * target_critic_state_dict[name].clone()
        self.target_critic.load_state_dict(critic_state_dict)


class MultiAgentReplayBuffer:
    def __init__(self, max_size, critic_dims, actor_dims, n_actions, n_agents, batch_size):
        self.batch_size = batch_size
        self.actor_dims = actor_dims
        self.n_agents = n_agents
        self.n_actions = n_actions
        self.critic_dims = critic_dims

    def ready(self):
        return True

    def sample_buffer(self):
        B = self.batch_size
        actor_states = [np.random.randn(B, d) for d in self.actor_dims]
        actor_new_states = [np.random.randn(B, d) for d in self.actor_dims]
        states = np.concatenate(actor_states, axis=1)
        states_ = np.concatenate(actor_new_states, axis=1)
        actions = [np.random.dirichlet(np.ones(self.n_actions), size=B) for _ in range(self.n_agents)]
        rewards = np.random.randn(B, self.n_agents)
        dones = np.random.rand(B, self.n_agents) < 0.1
        return actor_states, states, actions, rewards, actor_new_states, states_, dones


class MADDPG:
    def __init__(self, actor_dims, critic_dims, n_agents, n_actions, alpha=0.01, beta=0.01, fc1=16, fc2=16,
                 gamma=0.99, tau=0.01):
        self.agents = []
        self.n_agents = n_agents
        self.n_actions = n_actions
        for agent_idx in range(self.n_agents):
            self.agents.append(Agent(actor_dims[agent_idx], critic_dims, n_actions, n_agents, agent_idx,
                                     alpha=alpha, beta=beta))

    def learn(self, memory):
        if not memory.ready():
            return

        actor_states, states, actions, rewards, \
            actor_new_states, states_, dones = memory.sample_buffer()

        device = self.agents[0].actor.device

        states = T.tensor(states, dtype=T.float).to(device)
        actions = T.tensor(np.array(actions), dtype=T.float).to(device)
        rewards = T.tensor(rewards, dtype=T.float).to(device)
        states_ = T.tensor(states_, dtype=T.float).to(device)
        dones = T.tensor(dones).to(device)

        all_agents_new_actions = []
        all_agents_new_mu_actions = []
        old_agents_actions = []

        for agent_idx, agent in enumerate(self.agents):
            new_states = T.tensor(actor_new_states[agent_idx], dtype=T.float).to(device)

            new_pi = agent.target_actor.forward(new_states)  # culprit

            all_agents_new_actions.append(new_pi)
            mu_states = T.tensor(actor_states[agent_idx], dtype=T.float).to(device)
            pi = agent.actor.forward(mu_states)
            all_agents_new_mu_actions.append(pi)
            old_agents_actions.append(actions[agent_idx])

        new_actions = T.cat([acts for acts in all_agents_new_actions], dim=1)
        mu = T.cat([acts for acts in all_agents_new_mu_actions], dim=1)
        old_actions = T.cat([acts for acts in old_agents_actions], dim=1)

        for agent_idx, agent in enumerate(self.agents):
            critic_value_ = agent.target_critic.forward(states_, new_actions).flatten()
            critic_value_[dones[:, 0]] = 0.0
            critic_value = agent.critic.forward(states, old_actions).flatten()

            target = rewards[:, agent_idx] + agent.gamma * critic_value_
            critic_loss = F.mse_loss(target, critic_value)
            agent.critic.optimizer.zero_grad()
            critic_loss.backward(retain_graph=True)
            agent.critic.optimizer.step()

            actor_loss = agent.critic.forward(states, mu).flatten()
            actor_loss = -T.mean(actor_loss)
            agent.actor.optimizer.zero_grad()
            actor_loss.backward(retain_graph=True)
            agent.actor.optimizer.step()

            agent.update_network_parameters()  # step


actor_dims = [8, 10]
critic_dims = sum(actor_dims)
n_agents, n_actions = 2, 5
maddpg_agents = MADDPG(actor_dims, critic_dims, n_agents, n_actions, fc1=16, fc2=16, alpha=0.01, beta=0.01)
memory = MultiAgentReplayBuffer(1000, critic_dims, actor_dims, n_actions, n_agents, batch_size=8)

for total_steps in range(4):
    maddpg_agents.learn(memory)
print("done")
