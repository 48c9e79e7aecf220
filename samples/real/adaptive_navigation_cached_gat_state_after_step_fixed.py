# source: https://github.com/FazelYU/Adaptive-Navigation/issues/41 — multi-agent Q-routing with a shared GAT over the road network; loss.backward raises "one of the variables needed for gradient computation has been modified by an inplace operation ... is at version 2; expected version 1"
# fix-source: https://github.com/FazelYU/Adaptive-Navigation/commit/e2210a7d08b1cbae8258b8ab863cacaa0fa8334e — the author's fix stores the raw network state in each routing state and runs the GAT afresh inside compute_expected_q_values instead of caching its output in Utils
# expect-kind: none
# fix: keep the raw network state in each routing state and run the GAT inside the learning step, so every loss gets a fresh GAT graph
import torch
import torch.nn as nn
import torch.nn.functional as F

from _device import DEVICE


class GATLayer(nn.Module):
    def __init__(self, num_in_features, num_out_features, activation=None):
        super().__init__()
        self.linear_proj = nn.Linear(num_in_features, num_out_features, bias=False)
        self.scoring_fn_source = nn.Parameter(0.1 * torch.randn(1, num_out_features))
        self.scoring_fn_target = nn.Parameter(0.1 * torch.randn(1, num_out_features))
        self.activation = activation

    def forward(self, data):
        in_nodes_features, edge_index = data
        num_nodes = in_nodes_features.shape[0]
        proj = self.linear_proj(in_nodes_features)
        scores_source = (proj * self.scoring_fn_source).sum(-1)
        scores_target = (proj * self.scoring_fn_target).sum(-1)
        src, trg = edge_index[0], edge_index[1]
        scores = F.leaky_relu(scores_source[src] + scores_target[trg], 0.2).exp()
        denom = torch.zeros(num_nodes, device=scores.device).index_add(0, trg, scores)
        attention = scores / denom[trg]
        out = torch.zeros_like(proj).index_add(0, trg, proj[src] * attention.unsqueeze(-1))
        if self.activation is not None:
            out = self.activation(out)
        return (out, edge_index)


class GAT(nn.Module):
    def __init__(self, num_features_per_layer):
        super().__init__()
        layers = [GATLayer(num_features_per_layer[i], num_features_per_layer[i + 1],
                           nn.ELU() if i < len(num_features_per_layer) - 2 else None)
                  for i in range(len(num_features_per_layer) - 1)]
        self.gat_net = nn.Sequential(*layers)

    def forward(self, data):
        return self.gat_net(data)


class Utils:
    """Environment helper: network state of every intersection and the routing states."""

    def __init__(self, gat, num_agents=4, max_len_out_edges=3):
        self.gat = gat
        self.num_agents = num_agents
        self.max_len_out_edges = max_len_out_edges
        self.agent_id_embedding_dic = {a: F.one_hot(torch.tensor(a), num_agents).float().to(DEVICE)
                                       for a in range(num_agents)}
        self.edge_index = self.create_edge_index()
        self.set_network_state()

    def create_edge_index(self):
        src = [i for i in range(self.num_agents)] + [i for i in range(self.num_agents)]
        trg = [i for i in range(self.num_agents)] + [(i + 1) % self.num_agents for i in range(self.num_agents)]
        return torch.tensor([src, trg], dtype=torch.long, device=DEVICE)

    def set_network_state(self):
        congested = torch.rand(self.num_agents, self.max_len_out_edges, device=DEVICE) > 0.5
        self.agents_state = congested.float()

    def graph_attention_network(self, edge_index, node_features):
        return self.gat((node_features, edge_index))[0]

    def get_state(self, source_node, sink_node):
        dest_embed = self.agent_id_embedding_dic[sink_node]
        return {"agent_id": source_node, "agent_idx": source_node, "embeding": dest_embed,
                "network_state": self.agents_state.detach().clone()}


class DQN:
    def __init__(self, utils, gat, num_agents=4, num_actions=3, state_size=8):
        self.utils = utils
        self.agent_dic = {}
        for agent_id in range(num_agents):
            nn_ = nn.Sequential(nn.Linear(state_size, 16), nn.ReLU(), nn.Linear(16, num_actions)).to(DEVICE)
            self.agent_dic[agent_id] = {
                "NN": nn_,
                "optimizer": torch.optim.Adam(list(nn_.parameters()) + list(gat.parameters()), lr=1e-3),
                "memory": [],
            }

    def state_embeding(self, state):
        network_state_embeding = self.utils.graph_attention_network(self.utils.edge_index, state["network_state"])
        return torch.cat((state["embeding"], network_state_embeding[state["agent_idx"]]), 0)

    def pick_action(self, state):
        q_network_local = self.agent_dic[state["agent_id"]]["NN"]
        with torch.no_grad():
            action_values = q_network_local(self.state_embeding(state).unsqueeze(0))
        return action_values.argmax(1).item()

    def save_experience(self, state, action, reward, next_state, done):
        self.agent_dic[state["agent_id"]]["memory"].append((state, action, reward, next_state, done))

    def sample_experiences(self, memory):
        states = [e[0] for e in memory]
        actions = torch.tensor([[e[1]] for e in memory], device=DEVICE)
        rewards = torch.stack([e[2] for e in memory]).unsqueeze(1)
        next_states = [e[3] for e in memory]
        dones = torch.tensor([[e[4]] for e in memory], dtype=torch.float, device=DEVICE)
        return states, actions, rewards, next_states, dones

    def learn(self, agent_id):
        memory = self.agent_dic[agent_id]["memory"]
        states, actions, rewards, next_states, dones = self.sample_experiences(memory)
        loss = self.compute_loss(agent_id, states, next_states, rewards, actions, dones)
        self.take_optimisation_step(agent_id, loss, 5.0, retain_graph=True)

    def compute_loss(self, agent_id, states, next_states, rewards, actions, dones):
        with torch.no_grad():
            Q_values_next_states = self.compute_q_values_for_next_states(next_states)
            Q_targets = rewards + 0.99 * Q_values_next_states * (1 - dones)
        Q_expected = self.compute_expected_q_values(agent_id, states, actions)
        return F.mse_loss(Q_expected, Q_targets)

    def compute_q_values_for_next_states(self, next_states):
        values = [self.agent_dic[s["agent_id"]]["NN"](self.state_embeding(s).unsqueeze(0)).max(1)[0] for s in next_states]
        return torch.stack(values)

    def compute_expected_q_values(self, agent_id, states, actions):
        states_embedings = torch.vstack([self.state_embeding(s) for s in states])
        return self.agent_dic[agent_id]["NN"](states_embedings).gather(1, actions.long())

    def take_optimisation_step(self, agent_id, loss, clipping_norm=None, retain_graph=False):
        network = self.agent_dic[agent_id]["NN"]
        optimizer = self.agent_dic[agent_id]["optimizer"]
        optimizer.zero_grad()
        loss.backward(retain_graph=retain_graph)
        torch.nn.utils.clip_grad_norm_(network.parameters(), clipping_norm)
        optimizer.step()


num_agents = 4
gat = GAT([3, 5, 4]).to(DEVICE)
utils = Utils(gat, num_agents=num_agents)
agent = DQN(utils, gat, num_agents=num_agents)

for episode in range(4):
    for vehicle in range(2 * num_agents):
        source = vehicle % num_agents
        sink = (source + 2) % num_agents
        state = utils.get_state(source, sink)
        action = agent.pick_action(state)
        next_state = utils.get_state((source + 1) % num_agents, sink)
        reward = -torch.rand((), device=DEVICE)
        agent.save_experience(state, action, reward, next_state, float(next_state["agent_id"] == sink))
    for agent_id in agent.agent_dic:
        agent.learn(agent_id)
        agent.agent_dic[agent_id]["memory"].clear()
    utils.set_network_state()

print("done")
