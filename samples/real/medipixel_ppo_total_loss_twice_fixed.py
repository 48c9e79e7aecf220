# source: https://github.com/medipixel/rl_algorithms/pull/274 — torch 1.3.1 -> 1.6 upgrade; PPOLearner back-propagated total_loss once per optimizer with the critic step in between
# fix-source: https://github.com/medipixel/rl_algorithms/commit/133ff6330b1abad028cbd108f7bd407018b9648c — merged: "separate loss that repeated in training phase" (critic_loss_ for the critic, actor_loss_ for the actor)
# expect-kind: none
# fix: split total_loss: the critic step back-propagates critic_loss_ = w_value * critic_loss, the actor step actor_loss_ = actor_loss - w_entropy * entropy
import torch
import torch.nn as nn
from torch.nn.utils import clip_grad_norm_
from _device import DEVICE


class HyperParams:
    gamma, tau, epsilon = 0.99, 0.95, 0.2
    epoch, batch_size, rollout_len = 2, 4, 8
    w_value, w_entropy = 1.0, 1e-3
    gradient_clip_ac, gradient_clip_cr = 0.5, 1.0
    standardize_advantage = True
    use_clipped_value_loss = True


class GaussianActor(nn.Module):
    def __init__(self, state_dim, action_dim):
        super().__init__()
        self.mu = nn.Sequential(nn.Linear(state_dim, 16), nn.Tanh(), nn.Linear(16, action_dim))
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def forward(self, state):
        dist = torch.distributions.Normal(self.mu(state), self.log_std.exp())
        return dist.sample(), dist


def compute_gae(next_value, rewards, masks, values, gamma, tau):
    values = values + [next_value]
    gae = 0
    returns = []
    for step in reversed(range(len(rewards))):
        delta = rewards[step] + gamma * values[step + 1] * masks[step] - values[step]
        gae = delta + gamma * tau * masks[step] * gae
        returns.insert(0, gae + values[step])
    return returns


def ppo_iter(epoch, mini_batch_size, states, actions, values, log_probs, returns, advantages):
    batch_size = states.size(0)
    for _ in range(epoch):
        for _ in range(batch_size // mini_batch_size):
            rand_ids = torch.randint(0, batch_size, (mini_batch_size,), device=states.device)
            yield (states[rand_ids], actions[rand_ids], values[rand_ids], log_probs[rand_ids],
                   returns[rand_ids], advantages[rand_ids])


class PPOLearner:
    def __init__(self, hyper_params, state_dim=3, action_dim=1):
        self.hyper_params = hyper_params
        self.actor = GaussianActor(state_dim, action_dim).to(DEVICE)
        self.critic = nn.Sequential(nn.Linear(state_dim, 16), nn.ReLU(), nn.Linear(16, 1)).to(DEVICE)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=3e-4)
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=1e-3)

    def update_model(self, experience, epsilon):
        states, actions, rewards, values, log_probs, next_state, masks = experience
        next_value = self.critic(next_state)
        returns = compute_gae(next_value, rewards, masks, values,
                              self.hyper_params.gamma, self.hyper_params.tau)

        states = torch.cat(states)
        actions = torch.cat(actions)
        returns = torch.cat(returns).detach()
        values = torch.cat(values).detach()
        log_probs = torch.cat(log_probs).detach()
        advantages = returns - values

        if self.hyper_params.standardize_advantage:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-7)

        actor_losses, critic_losses, total_losses = [], [], []
        for state, action, old_value, old_log_prob, return_, adv in ppo_iter(
            self.hyper_params.epoch, self.hyper_params.batch_size,
            states, actions, values, log_probs, returns, advantages,
        ):
            # calculate ratios
            _, dist = self.actor(state)
            log_prob = dist.log_prob(action)
            ratio = (log_prob - old_log_prob).exp()

            # actor_loss
            surr_loss = ratio * adv
            clipped_surr_loss = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon) * adv
            actor_loss = -torch.min(surr_loss, clipped_surr_loss).mean()

            # critic_loss
            value = self.critic(state)
            if self.hyper_params.use_clipped_value_loss:
                value_pred_clipped = old_value + torch.clamp((value - old_value), -epsilon, epsilon)
                value_loss_clipped = (return_ - value_pred_clipped).pow(2)
                value_loss = (return_ - value).pow(2)
                critic_loss = 0.5 * torch.max(value_loss, value_loss_clipped).mean()
            else:
                critic_loss = 0.5 * (return_ - value).pow(2).mean()

            # entropy
            entropy = dist.entropy().mean()

            # total_loss
            w_value = self.hyper_params.w_value
            w_entropy = self.hyper_params.w_entropy

            critic_loss_ = w_value * critic_loss
            actor_loss_ = actor_loss - w_entropy * entropy
            total_loss = critic_loss_ + actor_loss_

            # train critic
            gradient_clip_ac = self.hyper_params.gradient_clip_ac
            gradient_clip_cr = self.hyper_params.gradient_clip_cr

            self.critic_optim.zero_grad()
            critic_loss_.backward(retain_graph=True)
            clip_grad_norm_(self.critic.parameters(), gradient_clip_ac)
            self.critic_optim.step()

            # train actor
            self.actor_optim.zero_grad()
            actor_loss_.backward()
            clip_grad_norm_(self.actor.parameters(), gradient_clip_cr)
            self.actor_optim.step()

            actor_losses.append(actor_loss.item())
            critic_losses.append(critic_loss.item())
            total_losses.append(total_loss.item())

        return sum(actor_losses) / len(actor_losses), sum(critic_losses) / len(critic_losses)


class FakeEnv:
    def reset(self):
        return torch.randn(1, 3, device=DEVICE)

    def step(self, action):
        return torch.randn(1, 3, device=DEVICE), torch.randn(1, 1, device=DEVICE), False


hyper_params = HyperParams()
learner = PPOLearner(hyper_params)
env = FakeEnv()
state = env.reset()
for update in range(3):
    states, actions, rewards, values, log_probs, masks = [], [], [], [], [], []
    for _ in range(hyper_params.rollout_len):
        action, dist = learner.actor(state)
        value = learner.critic(state)
        next_state, reward, done = env.step(action)
        states.append(state)
        actions.append(action)
        rewards.append(reward)
        values.append(value)
        log_probs.append(dist.log_prob(action))
        masks.append(torch.ones(1, 1, device=DEVICE) * (1 - done))
        state = next_state
    learner.update_model((states, actions, rewards, values, log_probs, state, masks), hyper_params.epsilon)
print("done")
