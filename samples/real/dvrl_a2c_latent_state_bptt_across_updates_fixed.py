# source: https://github.com/maximilianigl/DVRL/issues/5 — issue: on a current PyTorch, training (code/main.py) fails in total_loss.backward with "one of the variables needed for gradient computation has been modified by an inplace operation"; the latent state is detached only every multiplier_backprop_length updates, so the next update back-propagates through the previous update's graph after optimizer.step() changed its weights
# fix-source: https://github.com/maximilianigl/DVRL/issues/5 — maintainer's comment (maximilianigl): set algorithm.multiplier_backprop_length=1 (raise num_steps to make up for the shorter BPTT); the reporter confirmed it removes the error
# expect-kind: none
# fix: multiplier_backprop_length=1, as the maintainer advised: every update runs backward without retain_graph and then detaches current_memory['states'], so no update back-propagates into a graph whose weights optimizer.step() has already changed
import collections

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

from _device import DEVICE

# ---- code/conf/default.yaml (+ an 'fc' environment's model_adaptation), cut down ----------------
opt = {'optimizer': 'RMSProp', 'alpha': 0.99, 'lr': 3.0e-04, 'eps': 1.0e-05, 'max_grad_norm': 0.5}
rl_setting = {'gamma': 0.99, 'num_processes': 4, 'num_steps': 5}
loss_function = {'num_frames': 80, 'action_loss_coef': 1., 'entropy_coef': 0.01,
                 'value_loss_coef': 0.5, 'encoding_loss_coef': 0.0}
environment = {'p_blank': 0.5}
algorithm = {
    'use_particle_filter': False,
    # BPTT for num_steps * multiplier_backprop_length
    'multiplier_backprop_length': 1,
    'model': {'cnn_channels': [16, 16], 'observation_type': 'fc', 'action_encoding': 8, 'h_dim': 16,
              'init_function': 'orthogonal_', 'encoder_batch_norm': False, 'policy_batch_norm': False,
              'detach_encoder': False, 'obs_loss_coef': 0.0},
}


# ---- a small vectorised environment in place of the gym envs -----------------------------------
class Discrete:
    def __init__(self, n):
        self.n = n


class Box:
    def __init__(self, shape):
        self.shape = shape


class FakeVecEnv:
    def __init__(self, num_processes, obs_dim=4, n_actions=3, seed=0):
        self.num_envs = num_processes
        self.observation_space = Box((obs_dim,))
        self.action_space = Discrete(n_actions)
        self.rng = np.random.RandomState(seed)

    def reset(self):
        return self.rng.randn(self.num_envs, *self.observation_space.shape).astype(np.float32)

    def step(self, actions):
        obs = self.rng.randn(self.num_envs, *self.observation_space.shape).astype(np.float32)
        reward = list((actions == 1).astype(np.float32) + 0.1 * self.rng.randn(self.num_envs))
        done = self.rng.rand(self.num_envs) < 0.1
        return obs, reward, done, [{} for _ in range(self.num_envs)]


# ---- code/utils.py, code/storage.py, code/policy.py --------------------------------------------
def toOneHot(action_space, actions):
    if action_space.__class__.__name__ == "Discrete":
        nr_actions = action_space.n
        actions = actions.view(-1, 1).long()
        action_onehot = torch.zeros(actions.size(0), nr_actions, device=actions.device)
        action_onehot.scatter_(1, actions, 1)
        return action_onehot
    else:
        return actions.detach()


class RolloutStorage(object):
    def __init__(self, num_steps, num_processes, obs_shape, action_space):
        self.masks = torch.ones(num_steps + 1, num_processes, 1)
        self.rewards = torch.zeros(num_steps + 1, num_processes, 1)
        self.value_preds = torch.zeros(num_steps + 1, num_processes, 1)
        self.returns = torch.zeros(num_steps + 1, num_processes, 1)

    def to(self, device):
        self.rewards = self.rewards.to(device)
        self.value_preds = self.value_preds.to(device)
        self.returns = self.returns.to(device)
        self.masks = self.masks.to(device)

    def insert(self, step, reward, mask):
        self.masks[step + 1].copy_(mask)
        self.rewards[step + 1].copy_(reward)

    def after_update(self):
        self.masks[0].copy_(self.masks[-1])
        self.rewards[0].copy_(self.rewards[-1])

    def compute_returns(self, next_value, gamma):
        self.returns[-1] = next_value
        for step in reversed(range(self.rewards.size(0) - 1)):
            self.returns[step] = self.returns[step + 1] * gamma * self.masks[step + 1] + self.rewards[step + 1]


class Categorical(nn.Module):
    def __init__(self, num_inputs, num_outputs):
        super(Categorical, self).__init__()
        self.linear = nn.Linear(num_inputs, num_outputs)

    def forward(self, x):
        return self.linear(x)

    def sample(self, x, deterministic):
        probs = F.softmax(self(x), dim=-1)
        if deterministic is False:
            action = probs.multinomial(1)
        else:
            action = probs.max(1, keepdim=True)[1]
        return action

    def logprobs_and_entropy(self, x, actions):
        x = self(x)
        log_probs = F.log_softmax(x, dim=-1)
        probs = F.softmax(x, dim=-1)
        action_log_probs = log_probs.gather(1, actions)
        dist_entropy = -(log_probs * probs).sum(-1).mean()
        return action_log_probs, dist_entropy


# ---- code/model.py ------------------------------------------------------------------------------
PolicyReturn = collections.namedtuple('PolicyReturn', [
    'latent_state', 'value_estimate', 'action', 'action_log_probs', 'dist_entropy',
    'total_encoding_loss', 'encoding_losses', 'num_killed_particles'])


class Policy(nn.Module):
    def __init__(self, action_space, encoding_dimension):
        super().__init__()
        self.critic_linear = nn.Linear(encoding_dimension, 1)
        self.dist = Categorical(encoding_dimension, action_space.n)
        self.encoding_bn = nn.BatchNorm1d(encoding_dimension)

    def forward(self, current_memory, deterministic=False, predicted_times=None):
        device = next(self.parameters()).device
        latent_state, total_encoding_loss, encoding_losses, n_killed_p = self.encode(
            observation=current_memory['current_obs'].to(device),
            reward=current_memory['rewards'].to(device),
            actions=current_memory['oneHotActions'].to(device).detach(),
            previous_latent_state=current_memory['states'].to(device),
            predicted_times=predicted_times,
        )
        latent_state_for_encoding = latent_state.detach() if self.detach_encoder else latent_state
        encoded_state = latent_state_for_encoding
        if self.policy_batch_norm:
            encoded_state = self.encoding_bn(encoded_state)

        value_estimate = self.critic_linear(encoded_state)
        action = self.dist.sample(encoded_state, deterministic=deterministic)
        action_log_probs, dist_entropy = self.dist.logprobs_and_entropy(encoded_state, action.detach())
        return PolicyReturn(latent_state, value_estimate, action, action_log_probs, dist_entropy,
                            total_encoding_loss, encoding_losses, n_killed_p)


class RNNPolicy(Policy):
    def __init__(self, action_space, nr_inputs, observation_type, action_encoding, cnn_channels, h_dim,
                 init_function, encoder_batch_norm, policy_batch_norm, obs_loss_coef, detach_encoder,
                 batch_size):
        super().__init__(action_space, encoding_dimension=h_dim)
        self.h_dim = h_dim
        self.init_function = init_function
        self.batch_size = batch_size
        self.obs_loss_coef = float(obs_loss_coef)
        self.policy_batch_norm = policy_batch_norm
        self.observation_type = observation_type
        self.detach_encoder = detach_encoder

        # encoder_decoder.get_encoder('fc', ...)
        self.encoder = nn.Sequential(
            nn.Linear(nr_inputs, cnn_channels[0]), nn.ReLU(),
            nn.Linear(cnn_channels[0], cnn_channels[1]), nn.ReLU())
        self.cnn_output_number = cnn_channels[1]

        self.action_encoder = nn.Sequential(nn.Linear(action_space.n, action_encoding), nn.ReLU())
        self.gru = nn.GRUCell(self.cnn_output_number + action_encoding, h_dim)
        self.train()
        self.reset_parameters()

    def new_latent_state(self):
        return torch.zeros(self.batch_size, self.h_dim)

    def vec_conditional_new_latent_state(self, latent_states, masks):
        return latent_states * masks

    def reset_parameters(self):
        def weights_init(gain):
            def fn(m):
                classname = m.__class__.__name__
                init_func = getattr(torch.nn.init, self.init_function)
                if classname.find('Linear') != -1:
                    init_func(m.weight.data, gain=gain)
                    if m.bias is not None:
                        m.bias.data.fill_(0)
                if classname.find('GRUCell') != -1:
                    init_func(m.weight_ih.data)
                    init_func(m.weight_hh.data)
                    m.bias_ih.data.fill_(0)
                    m.bias_hh.data.fill_(0)
            return fn

        self.apply(weights_init(nn.init.calculate_gain('relu')))

    def encode(self, observation, reward, actions, previous_latent_state, predicted_times):
        x = self.encoder(observation)
        x = x.view(-1, self.cnn_output_number)
        encoded_actions = self.action_encoder(actions)
        encoded_actions = F.relu(encoded_actions)
        x = torch.cat([x, encoded_actions], dim=1)
        latent_state = self.gru(x, previous_latent_state)
        predicted_obs_loss = torch.zeros(1).to(previous_latent_state.device)
        encoding_loss = (self.obs_loss_coef * predicted_obs_loss)
        return latent_state, encoding_loss, (torch.tensor(0), predicted_obs_loss), 0


# ---- code/main.py -------------------------------------------------------------------------------
def setup():
    envs = FakeVecEnv(rl_setting['num_processes'])
    actor_critic = create_model(envs)
    obs_shape = envs.observation_space.shape
    rollouts = RolloutStorage(rl_setting['num_steps'], rl_setting['num_processes'], obs_shape, envs.action_space)
    current_obs = torch.from_numpy(envs.reset()).float()
    init_states = actor_critic.new_latent_state()
    init_rewards = torch.zeros([rl_setting['num_processes'], 1])
    init_actions = torch.zeros(rl_setting['num_processes'], 1)

    actor_critic.to(DEVICE)
    rollouts.to(DEVICE)
    current_memory = {
        'current_obs': current_obs.to(DEVICE),
        'states': init_states.to(DEVICE),
        'oneHotActions': toOneHot(envs.action_space, init_actions.to(DEVICE)),
        'rewards': init_rewards.to(DEVICE),
    }
    return envs, actor_critic, rollouts, current_memory


def create_model(envs):
    nr_inputs = envs.observation_space.shape[0]
    return RNNPolicy(envs.action_space, nr_inputs, batch_size=rl_setting['num_processes'], **algorithm['model'])


def run_model(actor_critic, current_memory, envs, predicted_times=None):
    policy_return = actor_critic(current_memory=current_memory, predicted_times=predicted_times)

    cpu_actions = policy_return.action.detach().squeeze(1).cpu().numpy()
    obs, reward, done, info = envs.step(cpu_actions)

    blank_mask = np.random.choice([0, 1], size=rl_setting['num_processes'],
                                  p=[environment['p_blank'], 1 - environment['p_blank']])
    blank_mask = np.reshape(blank_mask, (rl_setting['num_processes'], 1))
    obs = obs * blank_mask

    reward = torch.from_numpy(np.expand_dims(np.stack(reward), 1)).float()
    masks = torch.FloatTensor([[0.0] if done_ else [1.0] for done_ in done]).to(DEVICE)

    current_memory['current_obs'] = torch.from_numpy(obs).float().to(DEVICE)
    current_memory['states'] = actor_critic.vec_conditional_new_latent_state(policy_return.latent_state, masks)
    current_memory['oneHotActions'] = toOneHot(envs.action_space,
                                               policy_return.action * masks.type(policy_return.action.type()))
    current_memory['rewards'][:] = reward
    return policy_return, current_memory, blank_mask, masks, reward


def track_values(tracked_values, policy_return):
    tracked_values['values'].append(policy_return.value_estimate)
    tracked_values['action_log_probs'].append(policy_return.action_log_probs)
    tracked_values['dist_entropy'].append(policy_return.dist_entropy)
    tracked_values['encoding_loss'].append(policy_return.total_encoding_loss)
    return tracked_values


def main():
    envs, actor_critic, rollouts, current_memory = setup()

    num_updates = int(float(loss_function['num_frames']) // rl_setting['num_steps'] // rl_setting['num_processes'])

    optimizer = optim.RMSprop(actor_critic.parameters(), opt['lr'], eps=opt['eps'], alpha=opt['alpha'])

    for j in range(num_updates):
        tracked_values = collections.defaultdict(lambda: [])
        for step in range(rl_setting['num_steps']):
            policy_return, current_memory, blank_mask, masks, reward = run_model(
                actor_critic=actor_critic, current_memory=current_memory, envs=envs)
            rollouts.insert(step, reward, masks)
            tracked_values = track_values(tracked_values, policy_return)

        with torch.no_grad():
            policy_return = actor_critic(current_memory=current_memory)
        next_value = policy_return.value_estimate
        rollouts.compute_returns(next_value, rl_setting['gamma'])

        values = torch.stack(tuple(tracked_values['values']), dim=0)
        action_log_probs = torch.stack(tuple(tracked_values['action_log_probs']), dim=0)

        advantages = rollouts.returns[:-1] - values
        value_loss = advantages.pow(2).mean()
        action_loss = -(advantages.detach() * action_log_probs).mean()

        avg_encoding_loss = torch.stack(tuple(tracked_values['encoding_loss'])).mean()
        dist_entropy = torch.stack(tuple(tracked_values['dist_entropy'])).mean()

        total_loss = (value_loss * loss_function['value_loss_coef']
                      + action_loss * loss_function['action_loss_coef']
                      - dist_entropy * loss_function['entropy_coef']
                      + avg_encoding_loss * loss_function['encoding_loss_coef'])

        optimizer.zero_grad()

        # Only reset the computation graph every 'multiplier_backprop_length' iterations
        retain_graph = j % algorithm['multiplier_backprop_length'] != 0
        total_loss.backward(retain_graph=retain_graph)

        if opt['max_grad_norm'] > 0:
            nn.utils.clip_grad_norm_(actor_critic.parameters(), opt['max_grad_norm'])

        optimizer.step()

        if not retain_graph:
            current_memory['states'] = current_memory['states'].detach()

        rollouts.after_update()


main()

print("done")
