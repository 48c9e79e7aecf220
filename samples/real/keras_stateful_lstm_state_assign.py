# source: https://github.com/keras-team/keras/issues/20875 — issue: stateful keras.layers.LSTM on the torch backend fails in backward: "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [32, 50]] is at version 1; expected version 0 instead"
# fix-source: https://github.com/keras-team/keras/pull/20916 — merged fix: RNN.inner_loop's step() copies the states (tree.map_structure(ops.copy, states)) on torch when stateful=True
# expect-kind: inplace-modified
# expect-culprit: self.states
import torch
import torch.nn as nn
from _device import DEVICE


class Variable:
    """What keras' torch backend makes of a non-trainable weight: a tensor that assign() overwrites."""

    def __init__(self, value, trainable=False):
        self._value = value.clone()
        self._value.requires_grad_(trainable)

    @property
    def value(self):
        return self._value

    def assign(self, value):
        with torch.no_grad():
            self._value.copy_(value)


def convert_to_tensor(x):
    return x.value if isinstance(x, Variable) else x


def backend_rnn(step_function, inputs, initial_states):
    states = initial_states
    outputs = []
    for t in range(inputs.shape[1]):
        output, states = step_function(inputs[:, t], states)
        outputs.append(output)
    return outputs[-1], torch.stack(outputs, dim=1), states


class LSTMCell(nn.Module):
    def __init__(self, input_dim, units):
        super().__init__()
        self.units = units
        self.state_size = [units, units]
        self.kernel = nn.Parameter(torch.randn(input_dim, 4 * units) * 0.3)
        self.recurrent_kernel = nn.Parameter(torch.randn(units, 4 * units) * 0.3)
        self.bias = nn.Parameter(torch.zeros(4 * units))

    def _compute_carry_and_output_fused(self, z, c_tm1):
        z0, z1, z2, z3 = z
        i = torch.sigmoid(z0)
        f = torch.sigmoid(z1)
        c = f * c_tm1 + i * torch.tanh(z2)
        o = torch.sigmoid(z3)
        return c, o

    def forward(self, inputs, states):
        h_tm1, c_tm1 = states[0], states[1]
        z = torch.matmul(inputs, self.kernel)
        z = z + torch.matmul(h_tm1, self.recurrent_kernel)
        z = z + self.bias
        z = torch.split(z, self.units, dim=1)
        c, o = self._compute_carry_and_output_fused(z, c_tm1)
        h = o * torch.tanh(c)
        return h, [h, c]


class LSTM(nn.Module):
    def __init__(self, input_dim, units, stateful=False, batch_size=None):
        super().__init__()
        self.cell = LSTMCell(input_dim, units)
        self.stateful = stateful
        self.states = None
        if self.stateful:
            self._create_state_variables(batch_size)

    def _create_state_variables(self, batch_size):
        self.states = [Variable(s) for s in self.get_initial_state(batch_size)]

    def get_initial_state(self, batch_size):
        return [torch.zeros(batch_size, d, device=DEVICE) for d in self.cell.state_size]

    def reset_state(self):
        for v in self.states:
            v.assign(torch.zeros_like(v.value))

    def inner_loop(self, sequences, initial_state):
        def step(inputs, states):
            output, new_states = self.cell(inputs, states)  # culprit
            return output, new_states

        return backend_rnn(step, sequences, initial_state)

    def forward(self, sequences):
        if self.stateful:
            initial_state = self.states
        else:
            initial_state = self.get_initial_state(sequences.shape[0])
        initial_state = [convert_to_tensor(x) for x in initial_state]
        last_output, outputs, states = self.inner_loop(sequences, initial_state)
        if self.stateful:
            for self_state, state in zip(self.states, states):
                self_state.assign(state)  # step
        return last_output


class Sequential(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def generate_time_series_data(batch_size, time_steps, num_features):
    while True:
        x = torch.randn(batch_size, time_steps, num_features, device=DEVICE)
        y = x.sum(dim=(1, 2)).unsqueeze(1) * 0.1
        yield x, y


batch_size, time_steps, num_features = 4, 5, 3
model = Sequential(
    LSTM(num_features, 6, stateful=True, batch_size=batch_size),
    nn.Linear(6, 1),
).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
loss_fn = nn.MSELoss()


def train_step(data):
    x, y = data
    y_pred = model(x)
    loss = loss_fn(y_pred, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


data = generate_time_series_data(batch_size, time_steps, num_features)
for epoch in range(2):
    for _ in range(3):
        train_step(next(data))
    model.layers[0].reset_state()
print("done")
