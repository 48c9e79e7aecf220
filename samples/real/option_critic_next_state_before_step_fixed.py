# source: https://github.com/lweitkamp/option-critic-pytorch/issues/9 — issue: main.py fails at loss.backward() with "[torch.FloatTensor [32, 64]], which is output 0 of AsStridedBackward0, is at version 2; expected version 1"
# fix-source: https://github.com/lweitkamp/option-critic-pytorch/commit/7d323e61ac531438593aa9999d48ccc288d032c9 — maintainer's fix "Fix biased gradient": compute the next state (and the option termination) after optim.step() (the day before, 38728db had only cut the policy's path into the features with state.data; upstream keeps both)
# expect-kind: none
# fix: compute the next state and the option termination after optim.step() (the maintainer's "Fix biased gradient"), so get_action's logp is built on the updated features
import argparse
import random
from collections import deque
from copy import deepcopy
from math import exp
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical, Bernoulli
from _device import DEVICE

parser = argparse.ArgumentParser(description="Option-critic on a small control task")
for flag, kind, value in [('--env', str, 'CartPole-v0'), ('--optimal-eps', float, 0.05),
                          ('--learning-rate', float, 5e-4), ('--gamma', float, 0.99),
                          ('--epsilon-start', float, 1.0), ('--epsilon-min', float, 0.1),
                          ('--epsilon-decay', float, 2e4), ('--max-history', int, 10000),
                          ('--batch-size', int, 4), ('--freeze-interval', int, 4),
                          ('--update-frequency', int, 2), ('--termination-reg', float, 0.01),
                          ('--entropy-reg', float, 0.01), ('--num-options', int, 2), ('--temp', float, 1.0),
                          ('--max_steps_ep', int, 8), ('--max_steps_total', int, 12), ('--seed', int, 0)]:
    parser.add_argument(flag, type=kind, default=value)


def to_tensor(obs):
    return torch.from_numpy(np.asarray(obs)).float()


class ToyEnv:
    """In place of gym's CartPole-v0: four observations, two actions, random transitions."""
    observation_space = SimpleNamespace(shape=(4,))
    action_space = SimpleNamespace(n=2)

    def seed(self, seed):
        self.rng = np.random.RandomState(seed)

    def reset(self):
        self.t = 0
        return self.rng.randn(4).astype(np.float32)

    def step(self, action):
        self.t += 1
        return self.rng.randn(4).astype(np.float32), 1.0, self.t >= 6, {}


def make_env(env_name):
    return ToyEnv(), False  # (env, is_atari)


class ReplayBuffer(object):
    def __init__(self, capacity, seed=42):
        self.rng = random.Random(seed)  # upstream: random.SystemRandom(seed), which ignores the seed
        self.buffer = deque(maxlen=capacity)

    def push(self, obs, option, reward, next_obs, done):
        self.buffer.append((obs, option, reward, next_obs, done))

    def sample(self, batch_size):
        batch = self.rng.sample(self.buffer, batch_size)
        obs, option, reward, next_obs, done = zip(*batch)
        return np.stack(obs), option, reward, np.stack(next_obs), done

    def __len__(self):
        return len(self.buffer)


class Logger:
    """Upstream writes tensorboard summaries; here it only counts episodes."""

    def __init__(self, logdir=None, run_name=None):
        self.n_eps = 0

    def log_data(self, step, actor_loss, critic_loss, entropy, epsilon):
        pass

    def log_episode(self, steps, reward, option_lengths, ep_steps, epsilon):
        self.n_eps += 1


class OptionCriticFeatures(nn.Module):
    def __init__(self, in_features, num_actions, num_options, temperature=1.0, eps_start=1.0, eps_min=0.1,
                 eps_decay=int(1e6), eps_test=0.05, device='cpu', testing=False):
        super(OptionCriticFeatures, self).__init__()
        self.in_features, self.num_actions, self.num_options = in_features, num_actions, num_options
        self.device, self.testing, self.temperature = device, testing, temperature
        self.eps_start, self.eps_min, self.eps_decay, self.eps_test = eps_start, eps_min, eps_decay, eps_test
        self.num_steps = 0

        # shared body: observation -> 64 features
        self.features = nn.Sequential(nn.Linear(in_features, 32), nn.ReLU(), nn.Linear(32, 64), nn.ReLU())
        self.Q = nn.Linear(64, num_options)             # policy over options
        self.terminations = nn.Linear(64, num_options)  # beta, one per option
        # one linear softmax policy per option
        self.options_W = nn.Parameter(torch.zeros(num_options, 64, num_actions))
        self.options_b = nn.Parameter(torch.zeros(num_options, num_actions))

        self.to(device)
        self.train(not testing)

    def get_state(self, obs):
        if obs.ndim < 4:
            obs = obs.unsqueeze(0)
        return self.features(obs.to(self.device))

    def get_Q(self, state):
        return self.Q(state)

    def predict_option_termination(self, state, current_option):
        beta = self.terminations(state)[:, current_option].sigmoid()
        terminate = Bernoulli(beta).sample()
        next_option = self.get_Q(state).argmax(dim=-1)
        return bool(terminate.item()), next_option.item()

    def get_terminations(self, state):
        return self.terminations(state).sigmoid()

    def get_action(self, state, option):
        logits = state @ self.options_W[option] + self.options_b[option]
        action_dist = Categorical((logits / self.temperature).softmax(dim=-1))
        action = action_dist.sample()
        logp = action_dist.log_prob(action)
        entropy = action_dist.entropy()
        return action.item(), logp, entropy

    def greedy_option(self, state):
        return self.get_Q(state).argmax(dim=-1).item()

    @property
    def epsilon(self):
        if self.testing:
            return self.eps_test
        eps = self.eps_min + (self.eps_start - self.eps_min) * exp(-self.num_steps / self.eps_decay)
        self.num_steps += 1
        return eps


def critic_loss_fn(model, model_prime, data_batch, args):
    obs, options, rewards, next_obs, dones = data_batch
    batch_idx = torch.arange(len(options)).long()
    options = torch.LongTensor(options).to(model.device)
    rewards = torch.FloatTensor(rewards).to(model.device)
    masks = 1 - torch.FloatTensor(dones).to(model.device)

    Q = model.get_Q(model.get_state(to_tensor(obs)).squeeze(0))
    # bootstrap from the frozen copy, weighted by the online net's termination probability
    next_Q_prime = model_prime.get_Q(model_prime.get_state(to_tensor(next_obs)).squeeze(0))
    next_beta = model.get_terminations(model.get_state(to_tensor(next_obs)).squeeze(0)).detach()[batch_idx, options]
    continue_value = (1 - next_beta) * next_Q_prime[batch_idx, options]
    switch_value = next_beta * next_Q_prime.max(dim=-1)[0]
    gt = rewards + masks * args.gamma * (continue_value + switch_value)

    td_err = 0.5 * (Q[batch_idx, options] - gt.detach()).pow(2).mean()
    return td_err


def actor_loss_fn(obs, option, logp, entropy, reward, done, next_obs, model, model_prime, args):
    state = model.get_state(to_tensor(obs))
    next_state = model.get_state(to_tensor(next_obs))
    next_state_prime = model_prime.get_state(to_tensor(next_obs))

    beta = model.get_terminations(state)[:, option]
    next_beta = model.get_terminations(next_state)[:, option].detach()
    Q = model.get_Q(state).detach().squeeze()
    next_Q_prime = model_prime.get_Q(next_state_prime).detach().squeeze()

    gt = reward + (1 - done) * args.gamma * ((1 - next_beta) * next_Q_prime[option] + next_beta * next_Q_prime.max(dim=-1)[0])
    # termination gradient: raise beta where the option's value falls short of the best option
    advantage = Q[option] - Q.max(dim=-1)[0] + args.termination_reg
    termination_loss = beta * advantage.detach() * (1 - done)
    # intra-option policy gradient with an entropy bonus
    policy_loss = -logp * (gt.detach() - Q[option]) - args.entropy_reg * entropy
    return termination_loss + policy_loss


def run(args):
    env, is_atari = make_env(args.env)
    option_critic = OptionCriticFeatures(env.observation_space.shape[0], env.action_space.n, args.num_options,
                                         temperature=args.temp, eps_start=args.epsilon_start,
                                         eps_min=args.epsilon_min, eps_decay=args.epsilon_decay,
                                         eps_test=args.optimal_eps, device=DEVICE)
    option_critic_prime = deepcopy(option_critic)  # frozen copy for the bootstrap targets

    optim = torch.optim.RMSprop(option_critic.parameters(), lr=args.learning_rate)

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    env.seed(args.seed)

    buffer = ReplayBuffer(capacity=args.max_history, seed=args.seed)
    logger = Logger(logdir=None, run_name=f"{OptionCriticFeatures.__name__}-{args.env}")

    steps = 0
    while steps < args.max_steps_total:

        rewards = 0
        option_lengths = {opt: [] for opt in range(args.num_options)}

        obs = env.reset()
        state = option_critic.get_state(to_tensor(obs))
        greedy_option = option_critic.greedy_option(state)
        current_option = 0

        done, ep_steps, option_termination, curr_op_len = False, 0, True, 0
        while not done and ep_steps < args.max_steps_ep:
            epsilon = option_critic.epsilon

            if option_termination:  # pick a new option, epsilon-greedy over Q
                option_lengths[current_option].append(curr_op_len)
                explore = np.random.rand() < epsilon
                current_option = np.random.choice(args.num_options) if explore else greedy_option
                curr_op_len = 0

            action, logp, entropy = option_critic.get_action(state, current_option)

            next_obs, reward, done, _ = env.step(action)
            buffer.push(obs, current_option, reward, next_obs, done)
            rewards += reward

            actor_loss, critic_loss = None, None
            if len(buffer) > args.batch_size:
                actor_loss = actor_loss_fn(obs, current_option, logp, entropy,
                                           reward, done, next_obs, option_critic, option_critic_prime, args)
                loss = actor_loss

                if steps % args.update_frequency == 0:
                    data_batch = buffer.sample(args.batch_size)
                    critic_loss = critic_loss_fn(option_critic, option_critic_prime, data_batch, args)
                    loss += critic_loss

                optim.zero_grad()
                loss.backward()
                optim.step()

                if steps % args.freeze_interval == 0:
                    option_critic_prime.load_state_dict(option_critic.state_dict())

            state = option_critic.get_state(to_tensor(next_obs))
            option_termination, greedy_option = option_critic.predict_option_termination(state, current_option)

            steps += 1
            ep_steps += 1
            curr_op_len += 1
            obs = next_obs

            logger.log_data(steps, actor_loss, critic_loss, entropy.item(), epsilon)

        logger.log_episode(steps, rewards, option_lengths, ep_steps, epsilon)


if __name__ == "__main__":
    args = parser.parse_args()
    run(args)
    print("done")
