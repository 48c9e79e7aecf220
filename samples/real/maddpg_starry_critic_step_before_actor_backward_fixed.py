# source: https://github.com/starry-sky6688/MADDPG/issues/27 — issue: after moving the critic update (backward, step) before the actor update in MADDPG.train, actor_loss.backward() fails with the in-place version error
# fix-source: https://github.com/starry-sky6688/MADDPG/issues/27 — maintainer's comment (starry-sky6688): do the critic update right after critic_loss, before actor_loss is computed through critic_network
# expect-kind: none
# fix: take the critic step right after critic_loss, before the actor's action and actor_loss go through critic_network (maintainer's comment)
import copy
import types
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# define the actor network
class Actor(nn.Module):
    def __init__(self, args, agent_id):
        super(Actor, self).__init__()
        self.max_action = args.high_action
        self.fc1 = nn.Linear(args.obs_shape[agent_id], 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)
        self.action_out = nn.Linear(8, args.action_shape[agent_id])

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        actions = self.max_action * torch.tanh(self.action_out(x))
        return actions


class Critic(nn.Module):
    def __init__(self, args, input_shape=0):
        super(Critic, self).__init__()
        self.max_action = args.high_action if hasattr(args, "high_action") else 1
        self.input_shape = input_shape
        if self.input_shape == 0:
            self.input_shape = sum(args.obs_shape) + sum(args.action_shape)
        self.fc1 = nn.Linear(self.input_shape, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)
        self.q_out = nn.Linear(8, 1)

    def forward(self, state, action):
        state = torch.cat(state, dim=1)
        for i in range(len(action)):
            action[i] /= self.max_action
        action = torch.cat(action, dim=1)
        x = torch.cat([state, action], dim=1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        q_value = self.q_out(x)
        return q_value


class MADDPG:
    def __init__(self, args, agent_id, input_shape=0):
        self.args = args
        self.agent_id = agent_id
        self.train_step = 0
        self.input_shape = input_shape
        # create the network
        self.actor_network = Actor(args, agent_id).to(DEVICE)
        self.critic_network = Critic(args, self.input_shape).to(DEVICE)
        # build up the target network
        self.actor_target_network = Actor(args, agent_id).to(DEVICE)
        self.critic_target_network = Critic(args, self.input_shape).to(DEVICE)
        # load the weights into the target networks
        self.actor_target_network.load_state_dict(self.actor_network.state_dict())
        self.critic_target_network.load_state_dict(self.critic_network.state_dict())
        # create the optimizer
        self.actor_optim = torch.optim.Adam(self.actor_network.parameters(), lr=self.args.lr_actor)
        self.critic_optim = torch.optim.Adam(self.critic_network.parameters(), lr=self.args.lr_critic)
        self.q_loss = None
        self.a_loss = None

    # soft update
    def _soft_update_target_network(self):
        for target_param, param in zip(self.actor_target_network.parameters(), self.actor_network.parameters()):
            target_param.data.copy_((1 - self.args.tau) * target_param.data + self.args.tau * param.data)
        for target_param, param in zip(self.critic_target_network.parameters(), self.critic_network.parameters()):
            target_param.data.copy_((1 - self.args.tau) * target_param.data + self.args.tau * param.data)

    # update the network
    def train(self, transitions, other_agents):
        for key in transitions.keys():
            transitions[key] = torch.tensor(transitions[key], dtype=torch.float32, device=DEVICE)
        r = transitions['r_%d' % self.agent_id]
        o, u, o_next = [], [], []
        for agent_id in range(self.args.n_agents):
            o.append(transitions['o_%d' % agent_id])
            u.append(transitions['u_%d' % agent_id])
            o_next.append(transitions['o_next_%d' % agent_id])

        # calculate the target Q value function
        u_next = []
        with torch.no_grad():
            index = 0
            for agent_id in range(self.args.n_agents):
                if agent_id == self.agent_id:
                    u_next.append(self.actor_target_network(o_next[agent_id]))
                else:
                    u_next.append(other_agents[index].policy.actor_target_network(o_next[agent_id]))
                    index += 1
            q_next = self.critic_target_network(o_next, u_next).detach()

            target_q = (r.unsqueeze(1) + self.args.gamma * q_next).detach()

        # the q loss
        o_copy = copy.deepcopy(o)
        u_copy = copy.deepcopy(u)
        q_value = self.critic_network(o, u)
        critic_loss = (target_q - q_value).pow(2).mean()
        self.critic_optim.zero_grad()
        critic_loss.backward()
        self.critic_optim.step()

        # the actor loss
        u[self.agent_id] = self.actor_network(o[self.agent_id])
        actor_loss = - self.critic_network(o, u).mean()

        # record the loss
        self.a_loss = actor_loss
        self.q_loss = critic_loss

        # update the network (critic first, as in the paper)
        self.actor_optim.zero_grad()
        actor_loss.backward()
        self.actor_optim.step()

        self._soft_update_target_network()
        self.train_step += 1
        return o_copy, u_copy


class Agent:
    def __init__(self, agent_id, args):
        self.args = args
        self.agent_id = agent_id
        self.policy = MADDPG(args, agent_id)

    def learn(self, transitions, other_agents):
        self.policy.train(transitions, other_agents)


def sample(args, batch_size):
    transitions = {}
    for i in range(args.n_agents):
        transitions['o_%d' % i] = np.random.randn(batch_size, args.obs_shape[i])
        transitions['u_%d' % i] = np.random.uniform(-1, 1, (batch_size, args.action_shape[i]))
        transitions['r_%d' % i] = np.random.randn(batch_size)
        transitions['o_next_%d' % i] = np.random.randn(batch_size, args.obs_shape[i])
    return transitions


np.random.seed(0)
args = types.SimpleNamespace(n_agents=2, obs_shape=[3, 4], action_shape=[2, 2], high_action=1,
                             lr_actor=1e-3, lr_critic=1e-3, gamma=0.95, tau=0.01)
agents = [Agent(i, args) for i in range(args.n_agents)]
for time_step in range(3):
    for agent in agents:
        other_agents = agents.copy()
        other_agents.remove(agent)
        agent.learn(sample(args, 4), other_agents)
print("done")
