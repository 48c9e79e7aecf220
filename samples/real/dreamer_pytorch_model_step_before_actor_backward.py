# source: https://github.com/juliusfrost/dreamer-pytorch/issues/52 — issue "main.py does not run on pytorch==1.5.0": Dreamer.optimize_agent steps the model optimizer and then calls actor_loss.backward(), "one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [300, 1]], which is output 0 of TBackward" (dreamer/algos/dreamer_algo.py at f07d244)
# fix-source: https://github.com/juliusfrost/dreamer-pytorch/commit/4a09f002dc2f2f806cba61184ee710d8f64458ac — maintainers' "fix gradients to run on new pytorch": actor backward+step, then value backward+step, then model zero_grad/backward/step last; parameter lists rebuilt for clipping
# expect-kind: inplace-modified
# expect-culprit: model.reward_model.model[6].weight
from collections import namedtuple

import numpy as np
import torch
import torch.distributions as td
import torch.nn as nn
import torch.nn.functional as tf
from _device import DEVICE

RSSMState = namedtuple('RSSMState', ['mean', 'std', 'stoch', 'deter'])


def buffer_method(state, method, *args):
    return RSSMState(*(getattr(x, method)(*args) for x in state))


def stack_states(rssm_states, dim):
    return RSSMState(*(torch.stack([getattr(s, f) for s in rssm_states], dim=dim) for f in RSSMState._fields))


def get_feat(rssm_state):
    return torch.cat((rssm_state.stoch, rssm_state.deter), dim=-1)


def get_dist(rssm_state):
    return td.Normal(rssm_state.mean, rssm_state.std)


class DenseModel(nn.Module):
    def __init__(self, feature_size, output_shape, layers, hidden_size, activation=nn.ELU):
        super().__init__()
        self._output_shape = output_shape
        model = [nn.Linear(feature_size, hidden_size), activation()]
        for i in range(layers - 1):
            model += [nn.Linear(hidden_size, hidden_size), activation()]
        model += [nn.Linear(hidden_size, int(np.prod(output_shape)))]
        self.model = nn.Sequential(*model)

    def forward(self, features):
        x = self.model(features)
        x = torch.reshape(x, features.shape[:-1] + self._output_shape)
        return td.independent.Independent(td.Normal(x, 1), len(self._output_shape))


class ObservationEncoder(nn.Module):
    def __init__(self, shape, embed_size):
        super().__init__()
        self.embed_size = embed_size
        self.net = nn.Sequential(nn.Flatten(-3), nn.Linear(int(np.prod(shape)), embed_size), nn.ReLU())

    def forward(self, obs):
        return self.net(obs)


class ObservationDecoder(nn.Module):
    def __init__(self, embed_size, shape):
        super().__init__()
        self.shape = shape
        self.net = nn.Linear(embed_size, int(np.prod(shape)))

    def forward(self, x):
        mean = self.net(x).reshape(x.shape[:-1] + self.shape)
        return td.Independent(td.Normal(mean, 1), len(self.shape))


class ActionDecoder(nn.Module):
    def __init__(self, action_size, feature_size, hidden_size):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(feature_size, hidden_size), nn.ELU(), nn.Linear(hidden_size, 2 * action_size))

    def forward(self, feat):
        mean, std = torch.chunk(self.net(feat), 2, -1)
        return td.Normal(torch.tanh(mean), tf.softplus(std) + 1e-4)


class RSSMTransition(nn.Module):
    def __init__(self, action_size, stochastic_size, deterministic_size, hidden_size):
        super().__init__()
        self._stoch_size, self._deter_size = stochastic_size, deterministic_size
        self._cell = nn.GRUCell(hidden_size, deterministic_size)
        self._rnn_input_model = nn.Sequential(nn.Linear(action_size + stochastic_size, hidden_size), nn.ELU())
        self._stochastic_prior_model = nn.Sequential(nn.Linear(deterministic_size, hidden_size), nn.ELU(),
                                                     nn.Linear(hidden_size, 2 * stochastic_size))

    def initial_state(self, batch_size, **kwargs):
        return RSSMState(torch.zeros(batch_size, self._stoch_size, **kwargs),
                         torch.zeros(batch_size, self._stoch_size, **kwargs),
                         torch.zeros(batch_size, self._stoch_size, **kwargs),
                         torch.zeros(batch_size, self._deter_size, **kwargs))

    def forward(self, prev_action, prev_state):
        rnn_input = self._rnn_input_model(torch.cat([prev_action, prev_state.stoch], dim=-1))
        deter_state = self._cell(rnn_input, prev_state.deter)
        mean, std = torch.chunk(self._stochastic_prior_model(deter_state), 2, dim=-1)
        std = tf.softplus(std) + 0.1
        stoch_state = td.Normal(mean, std).rsample()
        return RSSMState(mean, std, stoch_state, deter_state)


class RSSMRepresentation(nn.Module):
    def __init__(self, transition_model, obs_embed_size, stochastic_size, deterministic_size, hidden_size):
        super().__init__()
        self._transition_model = transition_model
        self._stochastic_posterior_model = nn.Sequential(
            nn.Linear(deterministic_size + obs_embed_size, hidden_size), nn.ELU(),
            nn.Linear(hidden_size, 2 * stochastic_size))

    def initial_state(self, batch_size, **kwargs):
        return self._transition_model.initial_state(batch_size, **kwargs)

    def forward(self, obs_embed, prev_action, prev_state):
        prior_state = self._transition_model(prev_action, prev_state)
        x = torch.cat([prior_state.deter, obs_embed], -1)
        mean, std = torch.chunk(self._stochastic_posterior_model(x), 2, dim=-1)
        std = tf.softplus(std) + 0.1
        stoch_state = td.Normal(mean, std).rsample()
        return prior_state, RSSMState(mean, std, stoch_state, prior_state.deter)


class RSSMRollout(nn.Module):
    def __init__(self, representation_model, transition_model):
        super().__init__()
        self.representation_model = representation_model
        self.transition_model = transition_model

    def rollout_representation(self, steps, obs_embed, action, prev_state):
        priors, posteriors = [], []
        for t in range(steps):
            prior_state, posterior_state = self.representation_model(obs_embed[t], action[t], prev_state)
            priors.append(prior_state)
            posteriors.append(posterior_state)
            prev_state = posterior_state
        return stack_states(priors, dim=0), stack_states(posteriors, dim=0)

    def rollout_policy(self, steps, policy, prev_action, prev_state):
        state, action = prev_state, prev_action
        priors, actions = [], []
        for t in range(steps):
            with torch.no_grad():  # stop gradients here to only optimize policy
                state = self.transition_model(action, state)
            action, _ = policy(state)
            priors.append(state)
            actions.append(action)
        return stack_states(priors, dim=0), torch.stack(actions, dim=0)


class AgentModel(nn.Module):
    def __init__(self, action_size=2, stochastic_size=3, deterministic_size=5, hidden_size=6,
                 image_shape=(1, 4, 4), reward_layers=3, reward_hidden=7, value_layers=3, value_hidden=6):
        super().__init__()
        self.observation_encoder = ObservationEncoder(image_shape, 8)
        feature_size = stochastic_size + deterministic_size
        self.observation_decoder = ObservationDecoder(feature_size, image_shape)
        self.transition = RSSMTransition(action_size, stochastic_size, deterministic_size, hidden_size)
        self.representation = RSSMRepresentation(self.transition, 8, stochastic_size, deterministic_size, hidden_size)
        self.rollout = RSSMRollout(self.representation, self.transition)
        self.action_decoder = ActionDecoder(action_size, feature_size, hidden_size)
        self.reward_model = DenseModel(feature_size, (1,), reward_layers, reward_hidden)
        self.value_model = DenseModel(feature_size, (1,), value_layers, value_hidden)

    def policy(self, state):
        action_dist = self.action_decoder(get_feat(state))
        action = action_dist.sample()
        return action, action_dist


class Dreamer:
    def __init__(self, agent, batch_size=3, batch_length=4, train_steps=2, model_lr=6e-4, value_lr=8e-5,
                 actor_lr=8e-5, grad_clip=100.0, discount=0.99, discount_lambda=0.95, horizon=4, free_nats=3,
                 kl_scale=1):
        self.agent = agent
        self._batch_size, self.batch_length, self.train_steps = batch_size, batch_length, train_steps
        self.model_lr, self.value_lr, self.actor_lr, self.grad_clip = model_lr, value_lr, actor_lr, grad_clip
        self.discount, self.discount_lambda, self.horizon = discount, discount_lambda, horizon
        self.free_nats, self.kl_scale, self.type = free_nats, kl_scale, torch.float
        self.optim_kwargs = {}
        self.optim_initialize()

    def optim_initialize(self):
        model = self.agent.model
        self.model_parameters = model_parameters = \
            list(model.observation_encoder.parameters()) + \
            list(model.observation_decoder.parameters()) + \
            list(model.reward_model.parameters()) + \
            list(model.representation.parameters()) + \
            list(model.transition.parameters())
        self.actor_parameters = model.action_decoder.parameters()
        self.value_parameters = model.value_model.parameters()
        self.model_optimizer = torch.optim.Adam(self.model_parameters, lr=self.model_lr, **self.optim_kwargs)
        self.actor_optimizer = torch.optim.Adam(self.actor_parameters, lr=self.actor_lr, **self.optim_kwargs)
        self.value_optimizer = torch.optim.Adam(self.value_parameters, lr=self.value_lr, **self.optim_kwargs)

    def sample_batch(self):
        T, B = self.batch_length, self._batch_size
        observation = torch.randint(0, 256, (T, B, 1, 4, 4), device=DEVICE).float()
        action = torch.rand(T, B, 2, device=DEVICE) * 2 - 1
        reward = torch.randn(T, B, 1, device=DEVICE)
        return observation, action, reward

    def optimize_agent(self, itr):
        for i in range(self.train_steps):

            self.model_optimizer.zero_grad()
            self.actor_optimizer.zero_grad()
            self.value_optimizer.zero_grad()
            observation, action, reward = self.sample_batch()
            model_loss, actor_loss, value_loss = self.loss(observation, action, reward, itr, i)

            model_loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model_parameters, self.grad_clip)
            self.model_optimizer.step()  # step

            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            torch.nn.utils.clip_grad_norm_(self.actor_parameters, self.grad_clip)
            self.actor_optimizer.step()

            self.value_optimizer.zero_grad()
            value_loss.backward()
            torch.nn.utils.clip_grad_norm_(self.value_parameters, self.grad_clip)
            self.value_optimizer.step()

            loss = model_loss + actor_loss + value_loss
            print(f"itr {itr} step {i} loss {loss.item():.3f}")

    def loss(self, observation, action, reward, sample_itr, opt_itr):
        model = self.agent.model
        batch_t, batch_b = observation.shape[:2]
        batch_size = batch_t * batch_b

        observation = observation.type(self.type) / 255.0 - 0.5
        embed = model.observation_encoder(observation)
        prev_state = model.representation.initial_state(batch_b, device=action.device, dtype=action.dtype)
        prior, post = model.rollout.rollout_representation(batch_t, embed, action, prev_state)

        # Model Loss
        feat = get_feat(post)
        image_pred = model.observation_decoder(feat)
        reward_pred = model.reward_model(feat)
        reward_loss = -torch.mean(reward_pred.log_prob(reward))
        img_count = np.prod(observation.shape[-3:])
        image_loss = -torch.mean(image_pred.log_prob(observation))
        image_loss = image_loss * img_count
        prior_dist = get_dist(prior)
        post_dist = get_dist(post)
        div = torch.mean(torch.distributions.kl.kl_divergence(post_dist, prior_dist))
        div = torch.clamp(div, -float('inf'), self.free_nats)
        model_loss = self.kl_scale * div + reward_loss + image_loss

        # Actor Loss
        with torch.no_grad():
            flat_post = buffer_method(post, 'reshape', batch_size, -1)
            flat_action = action.reshape(batch_size, -1)
        imag_dist, _ = model.rollout.rollout_policy(self.horizon, model.policy, flat_action, flat_post)
        imag_feat = get_feat(imag_dist)
        imag_reward = model.reward_model(imag_feat).mean  # culprit
        value = model.value_model(imag_feat).mean

        discount_arr = self.discount * torch.ones_like(imag_reward)
        returns = self.compute_return(imag_reward[:-1], value[:-1], discount_arr[:-1],
                                      bootstrap=value[-1], lambda_=self.discount_lambda)
        discount = torch.cumprod(discount_arr[:-1], 1)
        actor_loss = -torch.mean(discount * returns)

        # Value Loss
        with torch.no_grad():
            value_feat = imag_feat[:-1].detach()
            value_discount = discount.detach()
            value_target = returns.detach()
        value_pred = model.value_model(value_feat)
        log_prob = value_pred.log_prob(value_target)
        value_loss = -torch.mean(value_discount * log_prob.unsqueeze(2))

        return model_loss, actor_loss, value_loss

    def compute_return(self, reward, value, discount, bootstrap, lambda_):
        next_values = torch.cat([value[1:], bootstrap[None]], 0)
        target = reward + discount * next_values * (1 - lambda_)
        timesteps = list(range(reward.shape[0] - 1, -1, -1))
        outputs = []
        accumulated_reward = bootstrap
        for t in timesteps:
            inp = target[t]
            discount_factor = discount[t]
            accumulated_reward = inp + discount_factor * lambda_ * accumulated_reward
            outputs.append(accumulated_reward)
        returns = torch.flip(torch.stack(outputs), [0])
        return returns


class Agent:
    def __init__(self):
        self.model = AgentModel().to(DEVICE)


algo = Dreamer(Agent())
for itr in range(2):
    algo.optimize_agent(itr)
print("done")
