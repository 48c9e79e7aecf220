# source: https://github.com/hijkzzz/pymarl2/blob/72f9c31/src/learners/ppo_learner.py — MAPPO learner computes values/GAE advantages once before the mini_epochs loop (reported as issue https://github.com/hijkzzz/pymarl2/issues/46: crashes when mini_epochs > 1)
# fix-source: https://github.com/hijkzzz/pymarl2/commit/fa50b6d — maintainer's commit computes values and advantages under `with th.no_grad():`
# expect-kind: second-backward
# expect-culprit: advantages
import types
import torch as th
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical
from torch.optim import Adam
from _device import DEVICE


def categorical_entropy(probs):
    assert probs.size(-1) > 1
    return Categorical(probs=probs).entropy()


def build_gae_targets(rewards, masks, values, gamma, lambd):
    B, T, _ = values.size()
    T -= 1
    advantages = th.zeros(B, T, 1).to(device=values.device)
    advantage_t = th.zeros(B, 1).to(device=values.device)
    for t in reversed(range(T)):
        delta = rewards[:, t] + values[:, t+1] * gamma * masks[:, t] - values[:, t]
        advantage_t = delta + advantage_t * gamma * lambd * masks[:, t]
        advantages[:, t] = advantage_t
    returns = values[:, :T] + advantages
    return advantages, returns


class EpisodeBatch:
    def __init__(self, data, batch_size, max_seq_length):
        self.data, self.batch_size, self.max_seq_length, self.device = data, batch_size, max_seq_length, DEVICE

    def __getitem__(self, key):
        return self.data[key]


class RNNAgent(nn.Module):
    def __init__(self, input_shape, args):
        super(RNNAgent, self).__init__()
        self.args = args
        self.fc1 = nn.Linear(input_shape, args.rnn_hidden_dim)
        self.rnn = nn.GRUCell(args.rnn_hidden_dim, args.rnn_hidden_dim)
        self.fc2 = nn.Linear(args.rnn_hidden_dim, args.n_actions)

    def init_hidden(self):
        return self.fc1.weight.new(1, self.args.rnn_hidden_dim).zero_()

    def forward(self, inputs, hidden_state=None):
        b, a, e = inputs.size()
        x = F.relu(self.fc1(inputs.view(-1, e)), inplace=True)
        if hidden_state is not None:
            hidden_state = hidden_state.reshape(-1, self.args.rnn_hidden_dim)
        h = self.rnn(x, hidden_state)
        q = self.fc2(h)
        return q.view(b, a, -1), h.view(b, a, -1)


class BasicMAC:
    def __init__(self, scheme, groups, args):
        self.n_agents = args.n_agents
        self.args = args
        self.agent = RNNAgent(scheme["obs"]["vshape"] + self.n_agents, args).to(DEVICE)
        self.hidden_states = None

    def forward(self, ep_batch, t, test_mode=False):
        agent_inputs = self._build_inputs(ep_batch, t)
        avail_actions = ep_batch["avail_actions"][:, t]
        agent_outs, self.hidden_states = self.agent(agent_inputs, self.hidden_states)
        agent_outs = agent_outs.reshape(ep_batch.batch_size * self.n_agents, -1)
        reshaped_avail_actions = avail_actions.reshape(ep_batch.batch_size * self.n_agents, -1)
        agent_outs[reshaped_avail_actions == 0] = -1e10
        agent_outs = th.nn.functional.softmax(agent_outs, dim=-1)
        return agent_outs.view(ep_batch.batch_size, self.n_agents, -1)

    def init_hidden(self, batch_size):
        self.hidden_states = self.agent.init_hidden()
        self.hidden_states = self.hidden_states.unsqueeze(0).expand(batch_size, self.n_agents, -1)

    def parameters(self):
        return self.agent.parameters()

    def _build_inputs(self, batch, t):
        bs = batch.batch_size
        inputs = [batch["obs"][:, t], th.eye(self.n_agents, device=batch.device).unsqueeze(0).expand(bs, -1, -1)]
        return th.cat([x.reshape(bs, self.n_agents, -1) for x in inputs], dim=-1)


class CentralVCritic(nn.Module):
    def __init__(self, scheme, args):
        super(CentralVCritic, self).__init__()
        self.args = args
        input_shape = scheme["state"]["vshape"]
        self.fc1 = nn.Sequential(nn.Linear(input_shape, 8), nn.ReLU(inplace=True),
                                 nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 1))

    def forward(self, batch, t=None):
        ts = slice(None) if t is None else slice(t, t+1)
        return self.fc1(batch["state"][:, ts])


class PPOLearner:
    def __init__(self, mac, scheme, logger, args):
        self.args = args
        self.n_agents = args.n_agents
        self.mac = mac
        self.critic = CentralVCritic(scheme, args).to(DEVICE)
        self.params = list(mac.parameters()) + list(self.critic.parameters())
        self.optimiser = Adam(params=self.params, lr=args.lr)

    def train(self, batch, t_env, episode_num):
        rewards = batch["reward"][:, :-1]
        actions = batch["actions"][:, :-1]
        terminated = batch["terminated"][:, :-1].float()
        mask = batch["filled"][:, :-1].float()
        mask[:, 1:] = mask[:, 1:] * (1 - terminated[:, :-1])
        avail_actions = batch["avail_actions"][:, :-1]

        old_probs = batch["probs"][:, :-1]
        old_probs[avail_actions == 0] = 1e-10
        old_logprob = th.log(th.gather(old_probs, dim=3, index=actions)).detach()
        mask_agent = mask.unsqueeze(2).repeat(1, 1, self.n_agents, 1)

        # targets and advantages
        values = self.critic(batch)
        advantages, targets = build_gae_targets(
            rewards, mask, values, self.args.gamma, self.args.gae_lambda)

        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        advantages = advantages.unsqueeze(2).repeat(1, 1, self.n_agents, 1)  # culprit

        for _ in range(self.args.mini_epochs):
            # Critic
            values = self.critic(batch)
            td_error = (values[:, :-1] - targets.detach())
            masked_td_error = td_error * mask
            critic_loss = 0.5 * (masked_td_error ** 2).sum() / mask.sum()

            # Actor
            pi = []
            self.mac.init_hidden(batch.batch_size)
            for t in range(batch.max_seq_length-1):
                agent_outs = self.mac.forward(batch, t=t)
                pi.append(agent_outs)
            pi = th.stack(pi, dim=1)

            pi[avail_actions == 0] = 1e-10
            pi_taken = th.gather(pi, dim=3, index=actions)
            log_pi_taken = th.log(pi_taken)

            ratios = th.exp(log_pi_taken - old_logprob)
            surr1 = ratios * advantages
            surr2 = th.clamp(ratios, 1-self.args.eps_clip, 1+self.args.eps_clip) * advantages
            actor_loss = -(th.min(surr1, surr2) * mask_agent).sum() / mask_agent.sum()

            entropy_loss = categorical_entropy(pi).mean(-1, keepdim=True)
            entropy_loss[mask == 0] = 0
            entropy_loss = (entropy_loss * mask).sum() / mask.sum()
            loss = actor_loss + self.args.critic_coef * critic_loss - self.args.entropy * entropy_loss / entropy_loss.item()

            self.optimiser.zero_grad()
            loss.backward()
            grad_norm = th.nn.utils.clip_grad_norm_(self.params, self.args.grad_norm_clip)
            self.optimiser.step()


args = types.SimpleNamespace(n_agents=2, n_actions=3, rnn_hidden_dim=8, lr=0.001, gamma=0.99, gae_lambda=0.95,
                             mini_epochs=3, eps_clip=0.2, critic_coef=1, entropy=0.01, grad_norm_clip=10)
scheme = {"obs": {"vshape": 4}, "state": {"vshape": 5}}
mac = BasicMAC(scheme, None, args)
learner = PPOLearner(mac, scheme, None, args)

B, T = 2, 5
for episode in range(2):
    probs = th.softmax(th.randn(B, T, args.n_agents, args.n_actions, device=DEVICE), dim=-1)
    batch = EpisodeBatch({
        "obs": th.randn(B, T, args.n_agents, 4, device=DEVICE),
        "state": th.randn(B, T, 5, device=DEVICE),
        "reward": th.randn(B, T, 1, device=DEVICE),
        "actions": th.randint(0, args.n_actions, (B, T, args.n_agents, 1), device=DEVICE),
        "terminated": th.zeros(B, T, 1, device=DEVICE),
        "filled": th.ones(B, T, 1, device=DEVICE),
        "avail_actions": th.ones(B, T, args.n_agents, args.n_actions, dtype=th.long, device=DEVICE),
        "probs": probs,
    }, B, T)
    learner.train(batch, t_env=episode * T, episode_num=episode)
print("done")
