# source: https://github.com/NeuroTorch/NeuroTorch/issues/134 — issue: TBPTT on a SequentialRNN with more than one layer raises "Trying to backward through the graph a second time"
# fix-source: https://github.com/NeuroTorch/NeuroTorch/pull/137 — maintainer's merged fix (33ecf3e): TBPTT also decorates the non-output layers, whose forward now returns the hidden state detached
# expect-kind: second-backward
# expect-culprit: hh
from collections import defaultdict
from types import SimpleNamespace

import torch
from torch import nn
from _device import DEVICE


def list_insert_replace_at(__list, idx, value):
    if idx < len(__list):
        __list[idx] = value
    else:
        __list.extend([None] * (idx - len(__list)))
        __list.append(value)


def sequence_get(__sequence, idx=-1, default=None):
    return __sequence[idx] if len(__sequence) > 0 else default


def unpack_out_hh(out):
    if isinstance(out, (tuple, list)):
        return (out[0], out[1]) if len(out) == 2 else (out[0], None)
    return out, None


def recursive_detach(tensors):
    if isinstance(tensors, tuple):
        return tuple(recursive_detach(o) for o in tensors)
    if isinstance(tensors, list):
        return [recursive_detach(o) for o in tensors]
    return tensors.detach() if isinstance(tensors, torch.Tensor) else tensors


class WilsonCowanLayer(nn.Module):
    def __init__(self, input_size, output_size, name, dt=1e-3, tau=1e-2, r=0.1, mu=0.0):
        super().__init__()
        self.name = name
        self.output_size = output_size
        self.dt, self.tau, self.r = dt, tau, r
        self.forward_weights = nn.Parameter(torch.randn(input_size, output_size) / input_size ** 0.5)
        self.recurrent_weights = nn.Parameter(torch.randn(output_size, output_size) / output_size ** 0.5)
        self.mu = nn.Parameter(torch.full((output_size,), mu))
        self.register_buffer("rec_mask", 1.0 - torch.eye(output_size))

    def _init_forward_state(self, state, batch_size, inputs):
        if state is None:
            state = (torch.zeros(batch_size, self.output_size, device=inputs.device),)
        return state

    def forward(self, inputs, state=None, **kwargs):
        batch_size, _ = inputs.shape
        hh, = self._init_forward_state(state, batch_size, inputs=inputs)
        ratio_dt_tau = self.dt / self.tau
        rec_inputs = torch.matmul(hh, torch.mul(self.recurrent_weights, self.rec_mask))
        transition_rate = 1 - hh * self.r
        activation = torch.sigmoid(rec_inputs + torch.matmul(inputs, self.forward_weights) - self.mu)
        output = hh * (1 - ratio_dt_tau) + transition_rate * activation * ratio_dt_tau
        return output, (output,)


class SequentialRNN(nn.Module):
    def __init__(self, input_layers, output_layers, hh_memory_size=1):
        super().__init__()
        self.input_layers = nn.ModuleDict({layer.name: layer for layer in input_layers})
        self.hidden_layers = nn.ModuleList()
        self.output_layers = nn.ModuleDict({layer.name: layer for layer in output_layers})
        self._hh_memory_size = hh_memory_size

    def get_all_layers(self):
        return [*self.input_layers.values(), *self.hidden_layers, *self.output_layers.values()]

    def _inputs_forward_(self, inputs, hidden_states, idx, t):
        features_list = []
        for layer_name, layer in self.input_layers.items():
            hh = sequence_get(hidden_states[layer_name], idx=-1, default=None)
            features, hh = unpack_out_hh(layer(inputs[layer_name][:, idx], hh, t=t))  # culprit
            hidden_states[layer_name].append(hh)
            features_list.append(features)
        return torch.concat(features_list, dim=1)

    def _hidden_forward_(self, forward_tensor, hidden_states, t):
        for layer in self.hidden_layers:
            hh = sequence_get(hidden_states[layer.name], idx=-1, default=None)
            forward_tensor, hh = unpack_out_hh(layer(forward_tensor, hh, t=t))
            hidden_states[layer.name].append(hh)
        return forward_tensor

    def _outputs_forward_(self, forward_tensor, hidden_states, outputs_trace, t):
        for layer_name, layer in self.output_layers.items():
            hh = sequence_get(hidden_states[layer_name], idx=-1, default=None)
            out, hh = unpack_out_hh(layer(forward_tensor, hh, t=t))
            outputs_trace[layer_name].append(out)
            hidden_states[layer_name].append(hh)
        return outputs_trace

    def _integrate_inputs_(self, inputs, hidden_states, outputs_trace, time_steps):
        for t in range(time_steps):
            forward_tensor = self._inputs_forward_(inputs, hidden_states, idx=t, t=t)
            forward_tensor = self._hidden_forward_(forward_tensor, hidden_states, t=t)
            outputs_trace = self._outputs_forward_(forward_tensor, hidden_states, outputs_trace, t=t)
            hidden_states = {name: trace[-self._hh_memory_size:] for name, trace in hidden_states.items()}
        return outputs_trace, hidden_states

    def forward(self, inputs):
        if isinstance(inputs, torch.Tensor):
            inputs = {name: inputs for name in self.input_layers}
        time_steps = next(iter(inputs.values())).shape[1]
        hidden_states = {layer.name: [] for layer in self.get_all_layers()}
        outputs_trace = defaultdict(list)
        outputs_trace, hidden_states = self._integrate_inputs_(inputs, hidden_states, outputs_trace, time_steps)
        return {name: torch.stack(trace, dim=1) for name, trace in outputs_trace.items()}, hidden_states

    def get_prediction_trace(self, inputs):
        outputs_trace, _ = self(inputs)
        return outputs_trace[next(iter(self.output_layers))] if len(outputs_trace) == 1 else outputs_trace


class TBPTT:
    """Truncated BPTT as a trainer callback: it decorates the output layers' forward to back-propagate
    (and step) every `backward_time_steps` time steps, inside the model's time loop."""

    def __init__(self, *, optimizer=None, criterion=None, backward_time_steps=None, optim_time_steps=None):
        self.optimizer = optimizer
        self.criterion = criterion or nn.MSELoss()
        self.backward_time_steps = backward_time_steps
        self.optim_time_steps = optim_time_steps
        self.output_layers = None
        self._original_forwards = {}  # {layer_name: (layer, layer.forward)}
        self._layers_buffer = defaultdict(list)
        self._forwards_decorated = False
        self._optim_counter = 0
        self._data_n_time_steps = 0

    def start(self, trainer):
        self.trainer = trainer
        self.params = list(trainer.model.parameters())
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(self.params, lr=1e-2, weight_decay=1e-2)
        self.output_layers = trainer.model.output_layers
        self._initialize_original_forwards()

    def on_batch_begin(self, trainer):
        self._data_n_time_steps = trainer.current_training_state.y_batch.shape[1]
        self.optimizer.zero_grad()
        self.decorate_forwards()

    def on_optimization_begin(self, trainer):
        state = trainer.current_training_state
        trainer.update_state_(batch_loss=self.criterion(state.pred_batch, state.y_batch).detach())

    def on_optimization_end(self, trainer):
        self.optimizer.zero_grad()
        self._layers_buffer.clear()

    def on_batch_end(self, trainer):
        for layer_name in self._layers_buffer:
            backward_t = len(self._layers_buffer[layer_name])
            if backward_t > 0:
                self._backward_at_t(self._data_n_time_steps - 1, backward_t, layer_name)
                self.optimizer.step()
        self.undecorate_forwards()
        self._layers_buffer.clear()
        self.optimizer.zero_grad()

    def _initialize_original_forwards(self):
        for layer in self.output_layers.values():
            self._original_forwards[layer.name] = (layer, layer.forward)

    def decorate_forwards(self):
        if not self._forwards_decorated:
            self._initialize_original_forwards()
        for layer in self.output_layers.values():
            layer.forward = self._decorate_forward(layer.forward, layer.name)
        self._forwards_decorated = True

    def undecorate_forwards(self):
        for name, (layer, original_forward) in self._original_forwards.items():
            layer.forward = original_forward
        self._forwards_decorated = False

    def _decorate_forward(self, forward, layer_name):
        def _forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            t = kwargs.get("t", None)
            if t is None:
                return out
            out_tensor, hh = unpack_out_hh(out)
            list_insert_replace_at(self._layers_buffer[layer_name], t % self.backward_time_steps, out_tensor)
            self._optim_counter += 1
            if len(self._layers_buffer[layer_name]) == self.backward_time_steps:
                self._backward_at_t(t, self.backward_time_steps, layer_name)
                out = recursive_detach(out)
            if self._optim_counter >= self.optim_time_steps:
                self._make_optim_step()
            return out
        return _forward

    def _backward_at_t(self, t, backward_t, layer_name):
        y_batch = self.trainer.current_training_state.y_batch[:, (t + 1) - backward_t: t + 1]
        pred_batch = torch.stack(self._layers_buffer[layer_name], dim=1)
        batch_loss = self.criterion(pred_batch, y_batch)
        batch_loss.backward()
        self._layers_buffer[layer_name].clear()

    def _make_optim_step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        self._optim_counter = 0


class Trainer:
    def __init__(self, model, callbacks, predict_method="get_prediction_trace"):
        self.model = model
        self.callbacks = callbacks
        self.predict_method = predict_method
        self.current_training_state = SimpleNamespace(x_batch=None, y_batch=None, pred_batch=None, batch_loss=None)

    def update_state_(self, **kwargs):
        for key, value in kwargs.items():
            setattr(self.current_training_state, key, value)

    def train(self, dataloader, n_iterations):
        self.model.train()
        for callback in self.callbacks:
            callback.start(self)
        for _ in range(n_iterations):
            for x_batch, y_batch in dataloader:
                self._exec_batch(x_batch, y_batch)

    def _exec_batch(self, x_batch, y_batch):
        self.update_state_(x_batch=x_batch, y_batch=y_batch)
        for callback in self.callbacks:
            callback.on_batch_begin(self)
        pred_batch = getattr(self.model, self.predict_method)(x_batch)
        self.update_state_(pred_batch=pred_batch)
        for callback in self.callbacks:
            callback.on_optimization_begin(self)
            callback.on_optimization_end(self)
        for callback in self.callbacks:
            callback.on_batch_end(self)
        return self.current_training_state.batch_loss.item()


n_units, T = 3, 6
model = SequentialRNN(
    input_layers=[WilsonCowanLayer(n_units, n_units, name="input")],
    output_layers=[WilsonCowanLayer(n_units, n_units, name="output")],
).to(DEVICE)
series = torch.rand(2, 2, T + 1, n_units, device=DEVICE)
dataloader = [(s[:, :-1], s[:, 1:]) for s in series]
trainer = Trainer(model, callbacks=[TBPTT(backward_time_steps=2, optim_time_steps=2)])
trainer.train(dataloader, n_iterations=2)
print("done")
