# source: https://github.com/lucidrains/titans-pytorch/issues/34 — issue "Can't backprop when passing NeuralMemState": a TitanDecoderLayer grafts NeuralMemory onto a Mistral-style decoder layer and feeds the returned NeuralMemState into the next training step; the state's last updated memory weights and momentum (titans_pytorch/neural_memory.py at f4444d4^) still hang on the previous step's graph, freed by its backward
# fix-source: https://github.com/lucidrains/titans-pytorch/commit/f4444d4ad87e2bd16b5a64c8148025613cf26bf8 — maintainer's "add a function for detaching the neural mem state" (same day, v0.4.5): `mem_state_detach(state)` detaches every tensor of the NeuralMemState, used as its new test does, `state = mem_state_detach(state)` after each forward
# expect-kind: none
# fix: neural_memory gains the maintainer's mem_state_detach (every tensor of the NeuralMemState detached), and the loop applies it to the returned state, `mem_state = mem_state_detach(mem_state)`, before the state is fed to the next step
import math
from collections import namedtuple
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn, stack, cat, is_tensor, Tensor
from torch.nn import Linear, Module, Parameter, ParameterList
from torch.func import functional_call, vmap, grad
from torch.utils._pytree import tree_map
from _device import DEVICE

# --- titans_pytorch/neural_memory.py (heads = 1, tensordict / einops written out with dicts and views) ---
LinearNoBias = partial(Linear, bias=False)

NeuralMemState = namedtuple('NeuralMemState', [
    'seq_index',
    'weights',
    'cache_store_segment',
    'states',
    'updates',
])


def mem_state_detach(state: NeuralMemState):
    assert isinstance(state, NeuralMemState)
    state = tree_map(lambda t: t.detach() if is_tensor(t) else t, tuple(state))
    return NeuralMemState(*state)


def exists(v):
    return v is not None


def default(*args):
    for arg in args:
        if exists(arg):
            return arg
    return None


def safe_cat(inputs, dim=-2):
    inputs = tuple(filter(exists, inputs))
    if len(inputs) == 0:
        return None
    elif len(inputs) == 1:
        return inputs[0]
    return cat(inputs, dim=dim)


def round_down_multiple(seq, mult):
    return seq // mult * mult


def round_up_multiple(seq, mult):
    return math.ceil(seq / mult) * mult


def pad_at_dim(t, pad, dim=-1, value=0.):
    dims_from_right = (- dim - 1) if dim < 0 else (t.ndim - dim - 1)
    zeros = ((0, 0) * dims_from_right)
    return F.pad(t, (*zeros, *pad), value=value)


def dict_get_value_shapes(td):
    return [v.shape for k, v in td.items()]


class LayerNorm(Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim, elementwise_affine=False)
        self.gamma = Parameter(torch.zeros(dim))

    def forward(self, x):
        gamma = self.gamma
        if gamma.ndim == 2:
            gamma = gamma.unsqueeze(1)
        return self.ln(x) * (gamma + 1.)


class ResidualNorm(Module):
    def __init__(self, dim, model: Module):
        super().__init__()
        self.norm = LayerNorm(dim)
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return self.norm(out) + x


class MemoryMLP(Module):
    def __init__(self, dim, depth, expansion_factor=2.):
        super().__init__()
        dim_hidden = int(dim * expansion_factor)
        dims = (dim, *((dim_hidden,) * (depth - 1)), dim)
        self.weights = ParameterList([Parameter(torch.randn(dim_in, dim_out)) for dim_in, dim_out in zip(dims[:-1], dims[1:])])
        for weight in self.weights:
            nn.init.xavier_uniform_(weight)

    def forward(self, x):
        for ind, weight in enumerate(self.weights):
            if ind != 0:
                x = F.gelu(x)
            x = x @ weight
        return x


class AssocScan(Module):
    # h_t = gate_t * h_{t-1} + x_t, written as a loop (the repository's associative_scan computes the same)
    def forward(self, gates, inputs, prev=None, remove_prev=None):
        remove_prev = default(remove_prev, exists(prev))
        b, n = inputs.shape[:2]
        weight_shape = inputs.shape[2:]
        inputs = inputs.reshape(b, n, -1)
        gates = gates.reshape(b, n, -1)
        if exists(prev):
            inputs = cat((prev.reshape(b, 1, -1), inputs), dim=1)
            gates = pad_at_dim(gates, (1, 0), value=1., dim=-2)
        out, h = [], None
        for t in range(inputs.shape[1]):
            h = inputs[:, t] if h is None else gates[:, t] * h + inputs[:, t]
            out.append(h)
        out = stack(out, dim=1)
        if remove_prev:
            out = out[:, 1:]
        return out.reshape(b, out.shape[1], *weight_shape)


class AveragePool(Module):
    def __init__(self, chunk_size):
        super().__init__()
        self.chunk_size = chunk_size

    def forward(self, x, chunk_size=None):
        chunk_size = default(chunk_size, self.chunk_size)
        b, n, d = x.shape
        return x.reshape(b, n // chunk_size, chunk_size, d).mean(dim=2)


def default_adaptive_step_transform(adaptive_step, max_lr=1e-2):
    return adaptive_step.sigmoid() * max_lr


def default_loss_fn(pred, target):
    return (pred - target).pow(2).mean(dim=-1)


class NeuralMemory(Module):
    def __init__(self, dim, chunk_size=1, heads=1, model: Module | None = None,
                 store_memory_loss_fn=default_loss_fn, default_step_transform_max_lr=1.,
                 default_model_kwargs: dict = dict(depth=2, expansion_factor=4.)):
        super().__init__()
        self.retrieve_chunk_size, self.store_chunk_size = chunk_size, chunk_size
        self.assoc_scan = AssocScan()
        self.retrieve_norm = nn.RMSNorm(dim)
        self.store_norm = nn.RMSNorm(dim)
        self.heads = heads

        if not exists(model):
            model = MemoryMLP(dim, **default_model_kwargs)
        model = ResidualNorm(dim=dim, model=model)
        self.memory_model = model

        mem_model_params = dict(model.named_parameters())
        self.memory_model_parameter_names = [*mem_model_params.keys()]
        memory_model_parameters = [p.detach().unsqueeze(0).repeat(heads, *((1,) * p.ndim)) for p in mem_model_params.values()]
        self.init_weight_shape = [p.shape for p in memory_model_parameters]
        self.memory_model_parameters = ParameterList(memory_model_parameters)

        def forward_and_loss(params, inputs, loss_weights, target):
            pred = functional_call(self.memory_model, params, inputs)
            loss = self.store_memory_loss_fn(pred, target)  # simple mse loss in paper - eq (12) - |M(k) - v|²
            weighted_loss = loss * loss_weights
            return weighted_loss.sum(), loss

        grad_fn = grad(forward_and_loss, has_aux=True)
        self.per_sample_grad_fn = vmap(grad_fn, in_dims=(0, 0, 0, 0))

        self.to_queries = LinearNoBias(dim, dim)
        self.to_keys = LinearNoBias(dim, dim)
        self.to_values = LinearNoBias(dim, dim)
        self.store_memory_loss_fn = store_memory_loss_fn

        self.reduce_to_chunk_rep = AveragePool(chunk_size=self.store_chunk_size)
        self.to_adaptive_step = nn.Linear(dim, heads)
        self.adaptive_step_transform = partial(default_adaptive_step_transform, max_lr=default_step_transform_max_lr)
        self.to_momentum = nn.Linear(dim, heads)
        self.to_decay_factor = nn.Linear(dim, heads)

    @property
    def memory_model_parameter_dict(self):
        return dict(zip(self.memory_model_parameter_names, self.memory_model_parameters))

    def init_weights(self, batch):
        return {k: v.repeat(batch, *((1,) * (v.ndim - 1))) for k, v in self.memory_model_parameter_dict.items()}

    def init_momentum(self, batch):
        return {k: torch.zeros_like(v).repeat(batch, *((1,) * (v.ndim - 1))).unsqueeze(0) for k, v in self.memory_model_parameter_dict.items()}

    def store_memories(self, seq, weights=None, past_state=None, seq_index=0, return_surprises=True):
        batch, seq_len = seq.shape[:2]
        chunk_size = self.store_chunk_size

        round_down_seq_len = round_down_multiple(seq_len, chunk_size)
        num_chunks = round_down_seq_len // chunk_size
        seq, remainder = seq[..., :round_down_seq_len, :], seq[..., round_down_seq_len:, :]
        next_seq_len_index = seq_index + round_down_seq_len

        if not exists(weights):
            weights = self.init_weights(batch)
        weights = dict(weights)
        weights_for_surprise = {k: v.unsqueeze(1).expand(v.shape[0], num_chunks, *v.shape[1:]).reshape(-1, *v.shape[1:])
                                for k, v in weights.items()}

        seq = self.store_norm(seq)

        adaptive_lr = self.adaptive_step_transform(self.to_adaptive_step(seq)).squeeze(-1)
        chunked_seq = self.reduce_to_chunk_rep(seq, chunk_size=chunk_size)
        decay_factor = self.to_decay_factor(chunked_seq).sigmoid()
        adaptive_momentum = self.to_momentum(chunked_seq).sigmoid().unsqueeze(0)

        keys = self.to_keys(seq)
        values = self.to_values(seq)
        keys, values = tuple(t.reshape(batch * num_chunks, chunk_size, -1) for t in (keys, values))
        adaptive_lr = adaptive_lr.reshape(batch * num_chunks, chunk_size)

        grads, unweighted_mem_model_loss = self.per_sample_grad_fn(weights_for_surprise, keys, adaptive_lr, values)
        grads = {k: g.reshape(batch, num_chunks, *g.shape[1:]) for k, g in grads.items()}

        # negative gradients, adaptive lr already applied as loss weight
        surprises = {k: g.mul(-1) for k, g in grads.items()}

        if not exists(past_state):
            minibatch_init_weight = weights
            init_momentum = self.init_momentum(batch)
            past_state = (minibatch_init_weight, init_momentum)

        past_last_update, past_last_momentum = past_state

        updates = dict()
        next_last_update = dict()
        next_last_momentum = dict()

        for (param_name, surprise), (_, last_update) in zip(surprises.items(), past_last_update.items()):
            momentum = surprise
            momentums = []
            last_momentum = past_last_momentum[param_name]
            for one_adaptive_momentum, one_last_momentum in zip(adaptive_momentum, last_momentum):
                momentum = self.assoc_scan(one_adaptive_momentum, momentum, prev=one_last_momentum)  # momentum is S / surprise in the paper
                momentums.append(momentum)
            momentums = stack(momentums)
            next_last_momentum[param_name] = momentums[:, :, -1]
            update = momentums[-1]

            # use associative scan again for learned forgetting (weight decay) - eq (13)
            update = self.assoc_scan(1. - decay_factor, update, prev=last_update, remove_prev=False)
            updates[param_name] = update
            next_last_update[param_name] = update[:, -1]

        next_state = (next_last_update, next_last_momentum)
        next_store_state = NeuralMemState(next_seq_len_index, weights, remainder, next_state, updates)

        if not return_surprises:
            return updates, next_store_state
        return updates, next_store_state, (unweighted_mem_model_loss, adaptive_lr)

    def retrieve_memories(self, seq, weights):
        chunk_size = self.retrieve_chunk_size
        weights_have_expanded_shape = dict_get_value_shapes(weights) != self.init_weight_shape
        batch, seq_len = seq.shape[:2]

        seq = pad_at_dim(seq, (1, 0), dim=1)
        seq_len_plus_one = seq.shape[-2]
        next_seq_len = round_up_multiple(seq_len_plus_one, chunk_size)
        padding = next_seq_len - seq_len_plus_one
        seq = pad_at_dim(seq, (0, padding), dim=1)

        seq = self.retrieve_norm(seq)
        queries = self.to_queries(seq)

        if weights_have_expanded_shape:
            weights = {k: v.reshape(-1, *v.shape[2:]) for k, v in weights.items()}

        queries = queries.reshape(-1, chunk_size, queries.shape[-1])
        values = functional_call(self.memory_model, dict(weights), queries)
        values = values.reshape(batch, -1, values.shape[-1])

        values = values[:, 1:]
        return values[:, :seq_len]

    def forward(self, seq, store_seq=None, state: NeuralMemState | None = None, return_surprises=False):
        retrieve_seq = seq

        if not exists(state):
            state = (0, None, None, None, None)

        seq_index, weights, cache_store_seq, past_state, updates = state

        store_seq = default(store_seq, seq)
        if exists(cache_store_seq):
            store_seq = safe_cat((cache_store_seq, store_seq))

        next_updates, next_neural_mem_state, surprises = self.store_memories(
            store_seq,
            weights,
            seq_index=seq_index,
            past_state=past_state,
            return_surprises=True
        )
        updates = next_updates
        next_neural_mem_state = next_neural_mem_state._replace(updates=updates)

        retrieved = self.retrieve_memories(retrieve_seq, updates)

        if not return_surprises:
            return retrieved, next_neural_mem_state
        return retrieved, next_neural_mem_state, surprises


# --- the decoder layer (MistralAttention stood in by a small causal self-attention) ---
class MistralAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.attn = nn.MultiheadAttention(config.hidden_size, config.num_attention_heads, batch_first=True)

    def forward(self, hidden_states):
        n = hidden_states.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=hidden_states.device).triu(1)
        out, _ = self.attn(hidden_states, hidden_states, hidden_states, attn_mask=causal, need_weights=False)
        return out


class TitanDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, gated: bool, segment_size: int):
        super().__init__()
        self.gated = gated
        self.hidden_size = config.hidden_size
        self.chunk_size = segment_size

        config.sliding_window = self.chunk_size
        self.self_attn = MistralAttention(config=config, layer_idx=layer_idx)

        self.memory = NeuralMemory(
            dim=config.hidden_size,
            chunk_size=self.chunk_size
        )
        self.input_layernorm = nn.RMSNorm(config.hidden_size)

    def forward(self, hidden_states, mem_state=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        retrieved, next_mem_state = self.memory(hidden_states, state=mem_state)
        if self.gated:  # memory as a gate (MAG)
            hidden_states = self.self_attn(hidden_states) * retrieved.sigmoid()
        else:  # memory as a layer (MAL)
            hidden_states = self.self_attn(hidden_states + retrieved)
        return residual + hidden_states, next_mem_state


class TitanModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layer = TitanDecoderLayer(config, layer_idx=0, gated=True, segment_size=2)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids, mem_state=None):
        hidden_states, mem_state = self.layer(self.embed_tokens(input_ids), mem_state)
        return self.lm_head(hidden_states), mem_state


config = type("MistralConfig", (), dict(hidden_size=8, num_attention_heads=2, vocab_size=16))()
model = TitanModel(config).to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

tokens = torch.randint(0, config.vocab_size, (2, 4 * 8 + 1), device=DEVICE)
mem_state = None
for step in range(4):
    segment = tokens[:, step * 8:(step + 1) * 8 + 1]
    logits, mem_state = model(segment[:, :-1], mem_state)
    mem_state = mem_state_detach(mem_state)
    loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), segment[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
