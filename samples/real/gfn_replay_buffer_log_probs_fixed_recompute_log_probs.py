# source: https://github.com/GFNOrg/torchgfn/pull/87 — PR "fix torch error Trying to backward through the graph a second time": scripts/train.py with a replay buffer of on-policy trajectories
# fix-source: https://github.com/GFNOrg/torchgfn/commit/a6527802d81c61897679c80af43fabdefbe924a8 — merged fix: add to and sample from the replay buffer under torch.no_grad()
# expect-kind: none
# fix: no-grad replay buffer as in the merged fix, and (as upstream's train_hypergrid.py does today) recompute the forward log-probs of replayed trajectories instead of using the stored ones
from dataclasses import dataclass

import torch
from _device import DEVICE

N_STEPS = 3


class Trajectories:
    def __init__(self, states=None, actions=None, log_probs=None, log_rewards=None):
        self.states = states if states is not None else torch.zeros(N_STEPS + 1, 0, 2, device=DEVICE)
        self.actions = actions if actions is not None else torch.zeros(N_STEPS, 0, dtype=torch.long, device=DEVICE)
        self.log_probs = log_probs if log_probs is not None else torch.zeros(N_STEPS, 0, device=DEVICE)
        self.log_rewards = log_rewards if log_rewards is not None else torch.zeros(0, device=DEVICE)

    def __len__(self):
        return self.actions.shape[1]

    def __getitem__(self, index):
        return Trajectories(self.states[:, index], self.actions[:, index], self.log_probs[:, index],
                            self.log_rewards[index])

    def extend(self, other):
        self.states = torch.cat((self.states, other.states), dim=1)
        self.actions = torch.cat((self.actions, other.actions), dim=1)
        self.log_probs = torch.cat((self.log_probs, other.log_probs), dim=1)
        self.log_rewards = torch.cat((self.log_rewards, other.log_rewards), dim=0)

    def sample(self, n_trajectories):
        return self[torch.randperm(len(self), device=DEVICE)[:n_trajectories]]


class LogZEstimator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tensor = torch.nn.Parameter(torch.zeros((), device=DEVICE))


@dataclass
class TBParametrization:
    logit_PF: torch.nn.Module
    logit_PB: torch.nn.Module
    logZ: LogZEstimator

    def parameters(self):
        return [*self.logit_PF.parameters(), *self.logit_PB.parameters(), self.logZ.tensor]


class TrajectoriesSampler:
    def __init__(self, estimator):
        self.estimator = estimator

    def sample(self, n_trajectories):
        states = torch.zeros(n_trajectories, 2, device=DEVICE)
        all_states, actions, log_probs = [states], [], []
        for _ in range(N_STEPS):
            dist = torch.distributions.Categorical(logits=self.estimator(states))
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            actions.append(action)
            states = states + torch.nn.functional.one_hot(action, 2).float()
            all_states.append(states)
        log_rewards = -(states[:, 0] - states[:, 1]).abs()
        return Trajectories(torch.stack(all_states), torch.stack(actions), torch.stack(log_probs), log_rewards)


def trajectories_to_training_samples(trajectories, loss_fn):
    return trajectories


class ReplayBuffer:
    def __init__(self, loss_fn, capacity=1000):
        self.capacity = capacity
        self.training_objects = Trajectories()

    def __len__(self):
        return len(self.training_objects)

    def add(self, training_objects):
        self.training_objects.extend(training_objects)
        self.training_objects = self.training_objects[-self.capacity:]

    def sample(self, n_trajectories):
        return self.training_objects.sample(n_trajectories)


class TrajectoryBalance:
    def __init__(self, parametrization, on_policy=False):
        self.parametrization = parametrization
        self.on_policy = on_policy

    def get_pfs_and_pbs(self, trajectories, no_pf=False):
        states, actions = trajectories.states, trajectories.actions
        log_pf = None
        if not no_pf:
            log_pf = torch.distributions.Categorical(
                logits=self.parametrization.logit_PF(states[:-1])).log_prob(actions)
        log_pb = torch.distributions.Categorical(
            logits=self.parametrization.logit_PB(states[1:])).log_prob(actions)
        return log_pf, log_pb

    def get_trajectories_scores(self, trajectories):
        log_pf_trajectories, log_pb_trajectories = self.get_pfs_and_pbs(trajectories, no_pf=self.on_policy)
        if self.on_policy:
            log_pf_trajectories = trajectories.log_probs
        scores = log_pf_trajectories.sum(dim=0) - log_pb_trajectories.sum(dim=0) - trajectories.log_rewards
        return log_pf_trajectories, log_pb_trajectories, scores

    def __call__(self, trajectories):
        _, _, scores = self.get_trajectories_scores(trajectories)
        return (scores + self.parametrization.logZ.tensor).pow(2).mean()


def make_sampler(parametrization):
    return TrajectoriesSampler(parametrization.logit_PF), True  # temperature 1, no epsilon: on-policy


config = {"batch_size": 8, "replay_buffer_size": 100, "n_iterations": 4}
parametrization = TBParametrization(torch.nn.Linear(2, 2).to(DEVICE), torch.nn.Linear(2, 2).to(DEVICE),
                                    LogZEstimator())
loss_fn = TrajectoryBalance(parametrization)
optimizer = torch.optim.Adam(parametrization.parameters(), lr=0.01)
trajectories_sampler, on_policy = make_sampler(parametrization)
loss_fn.on_policy = on_policy and config["replay_buffer_size"] == 0

replay_buffer = None
if config["replay_buffer_size"] > 0:
    replay_buffer = ReplayBuffer(loss_fn, capacity=config["replay_buffer_size"])

for i in range(config["n_iterations"]):
    trajectories = trajectories_sampler.sample(n_trajectories=config["batch_size"])
    training_samples = trajectories_to_training_samples(trajectories, loss_fn)
    if replay_buffer is not None:
        with torch.no_grad():
            replay_buffer.add(training_samples)
            training_objects = replay_buffer.sample(n_trajectories=config["batch_size"])
    else:
        training_objects = training_samples

    optimizer.zero_grad()
    loss = loss_fn(training_objects)
    loss.backward()
    optimizer.step()
print("done")
