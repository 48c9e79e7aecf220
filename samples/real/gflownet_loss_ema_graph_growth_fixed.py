# source: https://github.com/alexhernandezgarcia/gflownet/pull/133 — GFlowNetAgent.train keeps an early-stopping moving average of the loss with torch tensors and no detach, so "the whole pytorch computational graph is maintained in memory ... and grows very fast with every iteration" (memory leak, no exception)
# fix-source: https://github.com/alexhernandezgarcia/gflownet/commit/5c73856159a357c67f3faf865dd737096b9f7184 — maintainers' merged fix "Compute EMAs outside of pytorch": the EMAs use losses[1].item() / losses[2].item() instead of the loss tensors
# expect-kind: none
# fix: keep the early-stopping loss EMAs as Python floats (losses[1].item(), losses[2].item()) so they no longer chain each iteration's autograd graph
import dataclasses
import time

import torch
import torch.nn as nn

from _device import DEVICE


class Grid:
    """Tiny hyper-grid: actions (i,) increment dimension i, (n_dim,) is the end-of-sequence action."""

    def __init__(self, n_dim=2, length=3):
        self.n_dim = n_dim
        self.length = length
        self.eos = (n_dim,)
        self.action_space = [(i,) for i in range(n_dim)] + [self.eos]
        self.source = [0] * n_dim
        self.policy_input_dim = n_dim * length
        self.policy_output_dim = len(self.action_space)
        self.reset()

    def copy(self):
        return Grid(self.n_dim, self.length)

    def reset(self, env_id=None):
        self.state = list(self.source)
        self.n_actions = 0
        self.done = False
        self.id = env_id
        return self

    def get_mask_invalid_actions_forward(self, state=None, done=None):
        state = self.state if state is None else state
        done = self.done if done is None else done
        if done:
            return [True] * len(self.action_space)
        return [state[i] >= self.length - 1 for i in range(self.n_dim)] + [False]

    def get_parents(self, state=None, done=None, action=None):
        state = self.state if state is None else state
        done = self.done if done is None else done
        if done:
            return [state], [self.eos]
        parents, actions = [], []
        for i in range(self.n_dim):
            if state[i] > 0:
                parent = list(state)
                parent[i] -= 1
                parents.append(parent)
                actions.append((i,))
        return parents, actions

    def get_mask_invalid_actions_backward(self, state, done, parents_a):
        return [a not in parents_a for a in self.action_space]

    def step(self, action):
        if self.done or self.get_mask_invalid_actions_forward()[self.action_space.index(action)]:
            return self.state, action, False
        if action == self.eos:
            self.done = True
        else:
            self.state[action[0]] += 1
        self.n_actions += 1
        return self.state, action, True

    def statetorch2policy(self, states):
        return nn.functional.one_hot(states.long(), self.length).flatten(1).float()

    def reward_torchbatch(self, states, done):
        target = torch.full((self.n_dim,), self.length - 1.0, device=states.device)
        reward = 0.05 + torch.exp(-((states - target) ** 2).sum(dim=1))
        return torch.where(done, reward, torch.zeros_like(reward))

    def get_logprobs(self, policy_outputs, is_forward, actions, states, masks, loginf):
        logits = torch.where(masks, -loginf, policy_outputs)
        action_indices = actions[:, 0].long()
        logprobs = torch.log_softmax(logits, dim=1)
        return logprobs[torch.arange(logprobs.shape[0], device=logprobs.device), action_indices]


class Policy:
    def __init__(self, config, env, device):
        self.n_hid = config["n_hid"]
        self.input_dim = env.policy_input_dim
        self.output_dim = env.policy_output_dim
        self.is_model = True
        self.model = self.make_mlp(nn.LeakyReLU()).to(device)

    def __call__(self, states):
        return self.model(states)

    def make_mlp(self, activation):
        return nn.Sequential(
            nn.Linear(self.input_dim, self.n_hid), activation, nn.Linear(self.n_hid, self.output_dim)
        )


@dataclasses.dataclass
class OptimizerConfig:
    method: str = "adam"
    lr: float = 1e-3
    lr_z_mult: float = 10.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    lr_decay_period: int = 1000
    lr_decay_gamma: float = 0.5
    z_dim: int = 4
    n_train_steps: int = 5
    batch_size: int = 4
    train_to_sample_ratio: float = 1
    clip_grad_norm: float = 0.0
    ema_alpha: float = 0.5
    early_stopping: float = 0.0


def make_opt(params, logZ, config):
    """Set up the optimizer."""
    opt = torch.optim.Adam(params, config.lr, betas=(config.adam_beta1, config.adam_beta2))
    if logZ is not None:
        opt.add_param_group({"params": logZ, "lr": config.lr * config.lr_z_mult})
    lr_scheduler = torch.optim.lr_scheduler.StepLR(
        opt, step_size=config.lr_decay_period, gamma=config.lr_decay_gamma
    )
    return opt, lr_scheduler


class GFlowNetAgent:
    def __init__(self, env, device, optimizer, policy):
        self.device = device
        self.float = torch.float32
        self.env = env
        self.mask_source = self._tbool([self.env.get_mask_invalid_actions_forward()])
        self.loss = "trajectorybalance"
        self.logZ = nn.Parameter(torch.ones(optimizer.z_dim, device=device) * 0.5)
        self.forward_policy = Policy(policy, self.env, self.device)
        self.backward_policy = Policy(policy, self.env, self.device)
        self.opt, self.lr_scheduler = make_opt(self.parameters(), self.logZ, optimizer)
        self.n_train_steps = optimizer.n_train_steps
        self.batch_size = optimizer.batch_size
        self.ttsr = max(int(optimizer.train_to_sample_ratio), 1)
        self.sttr = max(int(1 / optimizer.train_to_sample_ratio), 1)
        self.clip_grad_norm = optimizer.clip_grad_norm
        self.ema_alpha = optimizer.ema_alpha
        self.early_stopping = optimizer.early_stopping

    def _tfloat(self, x):
        return torch.tensor(x, dtype=self.float, device=self.device)

    def _tlong(self, x):
        return torch.tensor(x, dtype=torch.long, device=self.device)

    def _tbool(self, x):
        return torch.tensor(x, dtype=torch.bool, device=self.device)

    def parameters(self):
        return list(self.forward_policy.model.parameters()) + list(self.backward_policy.model.parameters())

    def sample_actions(self, envs, model, loginf=1000.0):
        states = self._tfloat([env.state for env in envs])
        masks = self._tbool([env.get_mask_invalid_actions_forward() for env in envs])
        policy_outputs = model(self.env.statetorch2policy(states))
        logits = torch.where(masks, -loginf, policy_outputs)
        action_indices = torch.distributions.Categorical(logits=logits).sample()
        return [self.env.action_space[idx] for idx in action_indices.tolist()]

    def step(self, envs, actions):
        valids = []
        for env, action in zip(envs, actions):
            _, _, valid = env.step(action)
            valids.append(valid)
        return envs, actions, valids

    def sample_batch(self, envs):
        """Each item: [state, action, parents, parents_a, done, traj id, state id, mask_f, mask_b]."""

        def _add_to_batch(batch, envs, actions, valids):
            for env, action, valid in zip(envs, actions, valids):
                if valid is False:
                    continue
                parents, parents_a = env.get_parents(action=action)
                mask_f = env.get_mask_invalid_actions_forward()
                mask_b = env.get_mask_invalid_actions_backward(env.state, env.done, parents_a)
                batch.append(
                    [
                        self._tfloat([env.state]),
                        self._tfloat([action]),
                        self._tfloat(parents),
                        self._tfloat(parents_a),
                        self._tbool([env.done]),
                        self._tlong([env.id] * len(parents)),
                        self._tlong([env.n_actions]),
                        self._tbool([mask_f]),
                        self._tbool([mask_b]),
                    ]
                )
            return batch

        times = {"all": 0.0}
        t0_all = time.time()
        batch = []
        envs = [env.reset(idx) for idx, env in enumerate(envs)]
        while envs:
            # Sample forward actions
            with torch.no_grad():
                actions = self.sample_actions(envs, model=self.forward_policy)
            # Update environments with sampled actions
            envs, actions, valids = self.step(envs, actions)
            # Add to batch
            batch = _add_to_batch(batch, envs, actions, valids)
            # Filter out finished trajectories
            envs = [env for env in envs if not env.done]
        times["all"] = time.time() - t0_all
        return batch, times

    def trajectorybalance_loss(self, it, batch, loginf=1000):
        loginf = self._tfloat([loginf])
        # Unpack batch
        (
            states,
            actions,
            parents,
            parents_a,
            done,
            traj_id_parents,
            state_id,
            masks_sf,
            masks_b,
        ) = zip(*batch)
        # Keep only parents in trajectory
        parents = [
            p[torch.where(torch.all(torch.eq(a, p_a), axis=1))]
            for a, p, p_a in zip(actions, parents, parents_a)
        ]
        traj_id = torch.cat([el[:1] for el in traj_id_parents])
        # Concatenate lists of tensors
        states, actions, parents, done, state_id, masks_sf, masks_b = map(
            torch.cat, [states, actions, parents, done, state_id, masks_sf, masks_b]
        )
        # Compute rewards
        rewards = self.env.reward_torchbatch(states, done)
        # Build parents forward masks from state masks
        masks_f = torch.cat(
            [
                masks_sf[torch.where((state_id == sid - 1) & (traj_id == pid))]
                if sid > 1
                else self.mask_source
                for sid, pid in zip(state_id, traj_id)
            ]
        )
        n_trajs = len(torch.unique(traj_id, sorted=True))
        # Forward trajectories
        policy_output_f = self.forward_policy(self.env.statetorch2policy(parents))
        logprobs_f = self.env.get_logprobs(policy_output_f, True, actions, states, masks_f, loginf)
        sumlogprobs_f = torch.zeros(n_trajs, dtype=self.float, device=self.device).index_add(
            0, traj_id, logprobs_f
        )
        # Backward trajectories
        policy_output_b = self.backward_policy(self.env.statetorch2policy(states))
        logprobs_b = self.env.get_logprobs(policy_output_b, False, actions, parents, masks_b, loginf)
        sumlogprobs_b = torch.zeros(n_trajs, dtype=self.float, device=self.device).index_add(
            0, traj_id, logprobs_b
        )
        # Sort rewards of done states by ascending traj id
        rewards = rewards[done.eq(1)][torch.argsort(traj_id[done.eq(1)])]
        # Trajectory balance loss
        loss = (self.logZ.sum() + sumlogprobs_f - sumlogprobs_b - torch.log(rewards)).pow(2).mean()
        return (loss, loss, loss), rewards

    def train(self):
        # Metrics
        all_losses = []
        loss_term_ema = None
        loss_flow_ema = None
        # Generate list of environments
        envs = [self.env.copy().reset() for _ in range(self.batch_size)]
        # Train loop
        for it in range(1, self.n_train_steps + 1):
            t0_iter = time.time()
            data = []
            for j in range(self.sttr):
                batch, times = self.sample_batch(envs)
                data += batch
            for j in range(self.ttsr):
                losses, rewards = self.trajectorybalance_loss(it * self.ttsr + j, data)
                if not all([torch.isfinite(loss) for loss in losses]):
                    if len(all_losses) > 0:
                        all_losses.append([loss for loss in all_losses[-1]])
                else:
                    losses[0].backward()
                    if self.clip_grad_norm > 0:
                        torch.nn.utils.clip_grad_norm_(self.parameters(), self.clip_grad_norm)
                    self.opt.step()
                    self.lr_scheduler.step()
                    self.opt.zero_grad()
                    all_losses.append([i.item() for i in losses])

            # Moving average of the loss for early stopping
            if loss_term_ema and loss_flow_ema:
                loss_term_ema = self.ema_alpha * losses[1].item() + (1.0 - self.ema_alpha) * loss_term_ema
                loss_flow_ema = self.ema_alpha * losses[2].item() + (1.0 - self.ema_alpha) * loss_flow_ema
                if loss_term_ema < self.early_stopping and loss_flow_ema < self.early_stopping:
                    break
            else:
                loss_term_ema = losses[1].item()
                loss_flow_ema = losses[2].item()
            # Log times
            times.update({"iter": time.time() - t0_iter})


def main():
    env = Grid(n_dim=2, length=3)
    agent = GFlowNetAgent(env, DEVICE, OptimizerConfig(), policy={"n_hid": 16})
    agent.train()
    print("done")


if __name__ == "__main__":
    main()
