# source: https://github.com/watchernyu/REDQ/pull/2 — merged PR "Refactor order of gradient computations and model updates to make compatible with later versions of Pytorch": REDQSACAgent.train raises the in-place RuntimeError with torch 1.8.1 (the PR blames the alpha update; the Q optimizers' steps run before policy_loss.backward())
# fix-source: https://github.com/watchernyu/REDQ/commit/a60008c1327ed8001168dd04c42b59ff19d43e53 — merged fix: q_loss_all.backward() and policy_loss.backward() run before any optimizer step, with the Q nets frozen for the policy loss (follow-up 1647fef, PR #3)
# expect-kind: inplace-modified
# expect-culprit: self.q_net_list[3].last_fc_layer.weight
import numpy as np
import torch
from torch import Tensor
import torch.nn as nn
import torch.optim as optim
from torch.nn import functional as F
from torch.distributions import Normal
from _device import DEVICE

LOG_SIG_MAX = 2
LOG_SIG_MIN = -20
ACTION_BOUND_EPSILON = 1E-6


def weights_init_(m):
    if isinstance(m, nn.Linear):
        torch.nn.init.xavier_uniform_(m.weight, gain=1)
        torch.nn.init.constant_(m.bias, 0)


class ReplayBuffer:
    def __init__(self, obs_dim, act_dim, size):
        self.obs1_buf = np.zeros([size, obs_dim], dtype=np.float32)
        self.obs2_buf = np.zeros([size, obs_dim], dtype=np.float32)
        self.acts_buf = np.zeros([size, act_dim], dtype=np.float32)
        self.rews_buf = np.zeros(size, dtype=np.float32)
        self.done_buf = np.zeros(size, dtype=np.float32)
        self.ptr, self.size, self.max_size = 0, 0, size

    def store(self, obs, act, rew, next_obs, done):
        self.obs1_buf[self.ptr] = obs
        self.obs2_buf[self.ptr] = next_obs
        self.acts_buf[self.ptr] = act
        self.rews_buf[self.ptr] = rew
        self.done_buf[self.ptr] = done
        self.ptr = (self.ptr + 1) % self.max_size
        self.size = min(self.size + 1, self.max_size)

    def sample_batch(self, batch_size=32):
        idxs = np.random.randint(0, self.size, size=batch_size)
        return dict(obs1=self.obs1_buf[idxs], obs2=self.obs2_buf[idxs], acts=self.acts_buf[idxs],
                    rews=self.rews_buf[idxs], done=self.done_buf[idxs], idxs=idxs)


class Mlp(nn.Module):
    def __init__(self, input_size, output_size, hidden_sizes, hidden_activation=F.relu):
        super().__init__()
        self.hidden_activation = hidden_activation
        self.hidden_layers = nn.ModuleList()
        in_size = input_size
        for i, next_size in enumerate(hidden_sizes):
            self.hidden_layers.append(nn.Linear(in_size, next_size))
            in_size = next_size
        self.last_fc_layer = nn.Linear(in_size, output_size)
        self.apply(weights_init_)

    def forward(self, input):
        h = input
        for i, fc_layer in enumerate(self.hidden_layers):
            h = self.hidden_activation(fc_layer(h))
        return self.last_fc_layer(h)


class TanhGaussianPolicy(Mlp):
    def __init__(self, obs_dim, action_dim, hidden_sizes, hidden_activation=F.relu, action_limit=1.0):
        super().__init__(obs_dim, action_dim, hidden_sizes, hidden_activation)
        self.last_fc_log_std = nn.Linear(hidden_sizes[-1], action_dim)
        self.action_limit = action_limit
        self.apply(weights_init_)

    def forward(self, obs, deterministic=False, return_log_prob=True):
        h = obs
        for fc_layer in self.hidden_layers:
            h = self.hidden_activation(fc_layer(h))
        mean = self.last_fc_layer(h)
        log_std = torch.clamp(self.last_fc_log_std(h), LOG_SIG_MIN, LOG_SIG_MAX)
        std = torch.exp(log_std)
        normal = Normal(mean, std)
        pre_tanh_value = mean if deterministic else normal.rsample()
        action = torch.tanh(pre_tanh_value)
        log_prob = None
        if return_log_prob:
            log_prob = normal.log_prob(pre_tanh_value)
            log_prob -= torch.log(1 - action.pow(2) + ACTION_BOUND_EPSILON)
            log_prob = log_prob.sum(1, keepdim=True)
        return action * self.action_limit, mean, log_std, log_prob, std, pre_tanh_value


def soft_update_model1_with_model2(model1, model2, rou):
    for model1_param, model2_param in zip(model1.parameters(), model2.parameters()):
        model1_param.data.copy_(rou * model1_param.data + (1 - rou) * model2_param.data)


def get_probabilistic_num_min(num_mins):
    floored_num_mins = np.floor(num_mins)
    if num_mins - floored_num_mins > 0.001:
        prob_for_higher_value = num_mins - floored_num_mins
        return int(floored_num_mins + 1) if np.random.uniform(0, 1) < prob_for_higher_value else int(floored_num_mins)
    return num_mins


class REDQSACAgent(object):
    def __init__(self, obs_dim, act_dim, act_limit, device, hidden_sizes=(16, 16), replay_size=100,
                 batch_size=8, lr=3e-4, gamma=0.99, polyak=0.995, auto_alpha=True, start_steps=8,
                 utd_ratio=3, num_Q=4, num_min=2, policy_update_delay=20):
        self.policy_net = TanhGaussianPolicy(obs_dim, act_dim, hidden_sizes, action_limit=act_limit).to(device)
        self.q_net_list, self.q_target_net_list = [], []
        for q_i in range(num_Q):
            new_q_net = Mlp(obs_dim + act_dim, 1, hidden_sizes).to(device)
            self.q_net_list.append(new_q_net)
            new_q_target_net = Mlp(obs_dim + act_dim, 1, hidden_sizes).to(device)
            new_q_target_net.load_state_dict(new_q_net.state_dict())
            self.q_target_net_list.append(new_q_target_net)
        self.policy_optimizer = optim.Adam(self.policy_net.parameters(), lr=lr)
        self.q_optimizer_list = []
        for q_i in range(num_Q):
            self.q_optimizer_list.append(optim.Adam(self.q_net_list[q_i].parameters(), lr=lr))
        self.auto_alpha = auto_alpha
        self.target_entropy = -act_dim
        self.log_alpha = torch.zeros(1, requires_grad=True, device=device)
        self.alpha_optim = optim.Adam([self.log_alpha], lr=lr)
        self.alpha = self.log_alpha.cpu().exp().item()
        self.replay_buffer = ReplayBuffer(obs_dim=obs_dim, act_dim=act_dim, size=replay_size)
        self.mse_criterion = nn.MSELoss()
        self.start_steps, self.gamma, self.polyak, self.batch_size = start_steps, gamma, polyak, batch_size
        self.num_min, self.num_Q, self.utd_ratio = num_min, num_Q, utd_ratio
        self.delay_update_steps = self.start_steps
        self.policy_update_delay = policy_update_delay
        self.device = device

    def __get_current_num_data(self):
        return self.replay_buffer.size

    def store_data(self, o, a, r, o2, d):
        self.replay_buffer.store(o, a, r, o2, d)

    def sample_data(self, batch_size):
        batch = self.replay_buffer.sample_batch(batch_size)
        obs_tensor = Tensor(batch['obs1']).to(self.device)
        obs_next_tensor = Tensor(batch['obs2']).to(self.device)
        acts_tensor = Tensor(batch['acts']).to(self.device)
        rews_tensor = Tensor(batch['rews']).unsqueeze(1).to(self.device)
        done_tensor = Tensor(batch['done']).unsqueeze(1).to(self.device)
        return obs_tensor, obs_next_tensor, acts_tensor, rews_tensor, done_tensor

    def get_redq_q_target_no_grad(self, obs_next_tensor, rews_tensor, done_tensor):
        num_mins_to_use = get_probabilistic_num_min(self.num_min)
        sample_idxs = np.random.choice(self.num_Q, num_mins_to_use, replace=False)
        with torch.no_grad():
            a_tilda_next, _, _, log_prob_a_tilda_next, _, _ = self.policy_net.forward(obs_next_tensor)
            q_prediction_next_list = []
            for sample_idx in sample_idxs:
                q_prediction_next = self.q_target_net_list[sample_idx](torch.cat([obs_next_tensor, a_tilda_next], 1))
                q_prediction_next_list.append(q_prediction_next)
            q_prediction_next_cat = torch.cat(q_prediction_next_list, 1)
            min_q, min_indices = torch.min(q_prediction_next_cat, dim=1, keepdim=True)
            next_q_with_log_prob = min_q - self.alpha * log_prob_a_tilda_next
            y_q = rews_tensor + self.gamma * (1 - done_tensor) * next_q_with_log_prob
        return y_q, sample_idxs

    def train(self, logger):
        # one call per environment step; utd_ratio updates once the buffer holds enough data
        num_update = 0 if self.__get_current_num_data() <= self.delay_update_steps else self.utd_ratio
        for i_update in range(num_update):
            obs_tensor, obs_next_tensor, acts_tensor, rews_tensor, done_tensor = self.sample_data(self.batch_size)
            update_policy = (i_update + 1) % self.policy_update_delay == 0 or i_update == num_update - 1

            # Q loss: every ensemble member regresses onto the same REDQ target
            y_q, sample_idxs = self.get_redq_q_target_no_grad(obs_next_tensor, rews_tensor, done_tensor)
            q_prediction_list = []
            for q_i in range(self.num_Q):
                q_prediction = self.q_net_list[q_i](torch.cat([obs_tensor, acts_tensor], 1))
                q_prediction_list.append(q_prediction)
            q_prediction_cat = torch.cat(q_prediction_list, dim=1)
            y_q = y_q.expand((-1, self.num_Q)) if y_q.shape[1] == 1 else y_q
            q_loss_all = self.mse_criterion(q_prediction_cat, y_q) * self.num_Q

            # policy loss against the ensemble's average Q, then the temperature
            if update_policy:
                a_tilda, mean_a_tilda, log_std_a_tilda, log_prob_a_tilda, _, pretanh = self.policy_net.forward(obs_tensor)
                q_a_tilda_list = []
                for sample_idx in range(self.num_Q):
                    q_a_tilda = self.q_net_list[sample_idx](torch.cat([obs_tensor, a_tilda], 1))  # culprit
                    q_a_tilda_list.append(q_a_tilda)
                ave_q = torch.cat(q_a_tilda_list, 1).mean(dim=1, keepdim=True)
                policy_loss = (self.alpha * log_prob_a_tilda - ave_q).mean()

                if self.auto_alpha:
                    alpha_loss = -(self.log_alpha * (log_prob_a_tilda + self.target_entropy).detach()).mean()
                    self.alpha_optim.zero_grad()
                    alpha_loss.backward()
                    self.alpha_optim.step()
                    self.alpha = self.log_alpha.cpu().exp().item()
                else:
                    alpha_loss = Tensor([0])

            # update the networks
            for q_i in range(self.num_Q):
                self.q_optimizer_list[q_i].zero_grad()
            q_loss_all.backward()
            for q_i in range(self.num_Q):
                self.q_optimizer_list[q_i].step()  # step

            if update_policy:
                self.policy_optimizer.zero_grad()
                policy_loss.backward()
                self.policy_optimizer.step()

            for q_i in range(self.num_Q):
                soft_update_model1_with_model2(self.q_target_net_list[q_i], self.q_net_list[q_i], self.polyak)

            if i_update == num_update - 1:
                logger.store(LossPi=policy_loss.item(), LossQ1=q_loss_all.item() / self.num_Q,
                             LossAlpha=alpha_loss.item(), Alpha=self.alpha)


class EpochLogger:
    def __init__(self):
        self.epoch_dict = {}

    def store(self, **kwargs):
        for k, v in kwargs.items():
            self.epoch_dict.setdefault(k, []).append(v)


obs_dim, act_dim = 3, 1
agent = REDQSACAgent(obs_dim, act_dim, act_limit=1.0, device=DEVICE)
logger = EpochLogger()
o = np.random.randn(obs_dim).astype(np.float32)
for t in range(12):
    a = np.random.uniform(-1, 1, act_dim)
    o2, r, d = np.random.randn(obs_dim).astype(np.float32), float(np.random.randn()), False
    agent.store_data(o, a, r, o2, d)
    o = o2
    agent.train(logger)
print("done")
