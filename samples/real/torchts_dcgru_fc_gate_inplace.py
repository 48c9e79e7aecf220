# source: https://github.com/Rose-STL-Lab/torchTS/issues/50 — issue (at 600b8c3): DCGRUCell with fully-connected reset/update gates (use_gc_for_ru=False, NotImplementedError guard lifted) fails: "one of the variables needed for gradient computation has been modified by an inplace operation", caused by `value += self._ru_biases` in _fc
# fix-source: https://github.com/Rose-STL-Lab/torchTS/pull/59 — maintainers' fix 6b04b6d: _fc returns torch.matmul(x, self._ru_weights) + self._ru_biases (no in-place add, no redundant sigmoid)
# expect-kind: inplace-modified
# expect-culprit: value
import numpy as np
import torch
from torch import nn
from _device import DEVICE


def scaled_laplacian(adj_mx):
    adj = torch.maximum(adj_mx, adj_mx.T)
    d = adj.sum(1)
    d_inv_sqrt = torch.where(d > 0, d.pow(-0.5), torch.zeros_like(d))
    lap = torch.eye(adj.shape[0]) - d_inv_sqrt[:, None] * adj * d_inv_sqrt[None, :]
    lambda_max = torch.linalg.eigvalsh(lap).max()
    return (2 / lambda_max) * lap - torch.eye(adj.shape[0])


def concat(x, x_):
    return torch.cat([x, x_.unsqueeze(0)], dim=0)


class DCGRUCell(nn.Module):
    def __init__(self, num_units, adj_mx, max_diffusion_step, num_nodes, input_dim,
                 activation=torch.tanh, filter_type="laplacian", use_gc_for_ru=True):
        super().__init__()
        self._activation = activation
        self._num_nodes = num_nodes
        self._num_units = num_units
        self._max_diffusion_step = max_diffusion_step
        self._use_gc_for_ru = use_gc_for_ru

        supports = [scaled_laplacian(adj_mx)]
        supports = torch.cat([s.unsqueeze(dim=0) for s in supports])
        self.register_buffer("_supports", supports)

        num_matrices = len(supports) * self._max_diffusion_step + 1
        input_size_gconv = (self._num_units + input_dim) * num_matrices

        if self._use_gc_for_ru:
            input_size_ru = input_size_gconv
        else:
            input_size_ru = self._num_units + input_dim

        output_size = 2 * self._num_units
        self._ru_weights = nn.Parameter(torch.empty(input_size_ru, output_size))
        self._ru_biases = nn.Parameter(torch.empty(output_size))
        nn.init.xavier_normal_(self._ru_weights, gain=1.0)
        nn.init.constant_(self._ru_biases, val=1.0)

        output_size = self._num_units
        self._gconv_weights = nn.Parameter(torch.empty(input_size_gconv, output_size))
        self._gconv_biases = nn.Parameter(torch.empty(output_size))
        nn.init.xavier_normal_(self._gconv_weights, gain=1.0)
        nn.init.constant_(self._gconv_biases, val=0.0)

    def forward(self, inputs, hx):
        fn = self._gconv if self._use_gc_for_ru else self._fc
        output_size = 2 * self._num_units
        value = torch.sigmoid(fn(inputs, hx, output_size, bias_start=1.0, reset=True))
        value = torch.reshape(value, (-1, self._num_nodes, output_size))
        r, u = torch.split(tensor=value, split_size_or_sections=self._num_units, dim=-1)
        r = torch.reshape(r, (-1, self._num_nodes * self._num_units))
        u = torch.reshape(u, (-1, self._num_nodes * self._num_units))
        c = self._gconv(inputs, r * hx, self._num_units)
        if self._activation is not None:
            c = self._activation(c)
        return u * hx + (1.0 - u) * c

    def _fc(self, inputs, state, output_size, bias_start=0.0, reset=True):
        batch_size = inputs.shape[0]
        shape = (batch_size * self._num_nodes, -1)
        inputs = torch.reshape(inputs, shape)
        state = torch.reshape(state, shape)
        inputs_and_state = torch.cat([inputs, state], dim=-1)

        value = torch.sigmoid(torch.matmul(inputs_and_state, self._ru_weights))  # culprit
        value += self._ru_biases  # step

        return value

    def _gconv(self, inputs, state, output_size, bias_start=0.0, reset=False):
        batch_size = inputs.shape[0]
        shape = (batch_size, self._num_nodes, -1)
        inputs = torch.reshape(inputs, shape)
        state = torch.reshape(state, shape)
        inputs_and_state = torch.cat([inputs, state], dim=2)
        input_size = inputs_and_state.size(2)

        x = inputs_and_state
        x0 = x.permute(1, 2, 0)
        x0 = torch.reshape(x0, shape=[self._num_nodes, input_size * batch_size])
        x = torch.unsqueeze(x0, 0)

        if self._max_diffusion_step > 0:
            for support in self._supports:
                x1 = torch.mm(support, x0)
                x = concat(x, x1)
                for _ in range(2, self._max_diffusion_step + 1):
                    x2 = 2 * torch.mm(support, x1) - x0
                    x = concat(x, x2)
                    x1, x0 = x2, x1

        num_matrices = len(self._supports) * self._max_diffusion_step + 1
        x = torch.reshape(x, shape=[num_matrices, self._num_nodes, input_size, batch_size])
        x = x.permute(3, 1, 2, 0)
        x = torch.reshape(x, shape=[batch_size * self._num_nodes, input_size * num_matrices])

        if reset:
            weights, biases = self._ru_weights, self._ru_biases
        else:
            weights, biases = self._gconv_weights, self._gconv_biases

        x = torch.matmul(x, weights) + biases
        return torch.reshape(x, [batch_size, self._num_nodes * output_size])


class DCGRU(nn.Module):
    def __init__(self, num_layers, num_units, adj_mx, max_diffusion_step, num_nodes, input_dim,
                 activation=torch.tanh, filter_type="laplacian", use_gc_for_ru=True):
        super().__init__()
        self.layers = nn.ModuleList(
            DCGRUCell(num_units, adj_mx, max_diffusion_step, num_nodes,
                      input_dim if i == 0 else num_units,
                      filter_type=filter_type, use_gc_for_ru=use_gc_for_ru)
            for i in range(num_layers)
        )

    def forward(self, inputs, hidden_state):
        hidden_states = []
        output = inputs
        for i, layer in enumerate(self.layers):
            output = layer(output, hidden_state[i])
            hidden_states.append(output)
        return output, torch.stack(hidden_states)


class Encoder(nn.Module):
    def __init__(self, input_dim, seq_len, **kwargs):
        super().__init__()
        self.input_dim = input_dim
        self.seq_len = seq_len
        self.dcgru = DCGRU(input_dim=self.input_dim, **kwargs)

    def forward(self, inputs, hidden_state):
        output, hidden = self.dcgru(inputs, hidden_state)
        return output, hidden


class Decoder(nn.Module):
    def __init__(self, output_dim, horizon, **kwargs):
        super().__init__()
        self.output_dim = output_dim
        self.horizon = horizon
        self.num_nodes = kwargs["num_nodes"]
        self.num_units = kwargs["num_units"]
        self.dcgru = DCGRU(input_dim=self.output_dim, **kwargs)
        self.projection_layer = nn.Linear(self.num_units, self.output_dim)

    def forward(self, inputs, hidden_state):
        output, hidden = self.dcgru(inputs, hidden_state)
        projected = self.projection_layer(output.view(-1, self.num_units))
        output = projected.view(-1, self.num_nodes * self.output_dim)
        return output, hidden


class DCRNN(nn.Module):
    def __init__(self, adj_mx, num_units, seq_len=1, horizon=1, input_dim=1, output_dim=1,
                 max_diffusion_step=2, filter_type="laplacian", num_nodes=1, num_layers=1,
                 use_gc_for_ru=True, use_curriculum_learning=False, cl_decay_steps=1000):
        super().__init__()
        dcgru_args = {
            "adj_mx": adj_mx, "num_nodes": num_nodes, "num_layers": num_layers,
            "num_units": num_units, "max_diffusion_step": max_diffusion_step,
            "filter_type": filter_type, "use_gc_for_ru": use_gc_for_ru,
        }
        self.encoder_model = Encoder(input_dim, seq_len, **dcgru_args)
        self.decoder_model = Decoder(output_dim, horizon, **dcgru_args)
        self.num_nodes = num_nodes
        self.num_layers = num_layers
        self.hidden_state_size = num_nodes * num_units
        self.use_curriculum_learning = use_curriculum_learning
        self.cl_decay_steps = cl_decay_steps
        self.criterion = nn.MSELoss()

    @property
    def device(self):
        return self.decoder_model.projection_layer.weight.device

    def _compute_sampling_threshold(self, batches_seen):
        return self.cl_decay_steps / (self.cl_decay_steps + np.exp(batches_seen / self.cl_decay_steps))

    def encoder(self, inputs):
        batch_size = inputs.size(1)
        shape = self.num_layers, batch_size, self.hidden_state_size
        encoder_hidden_state = torch.zeros(shape, device=self.device)
        for t in range(self.encoder_model.seq_len):
            _, encoder_hidden_state = self.encoder_model(inputs[t], encoder_hidden_state)
        return encoder_hidden_state

    def decoder(self, encoder_hidden_state, labels=None, batches_seen=None):
        batch_size = encoder_hidden_state.size(1)
        shape = batch_size, self.num_nodes * self.decoder_model.output_dim
        go_symbol = torch.zeros(shape, device=self.device)
        decoder_hidden_state = encoder_hidden_state
        decoder_input = go_symbol
        outputs = []
        for t in range(self.decoder_model.horizon):
            decoder_output, decoder_hidden_state = self.decoder_model(decoder_input, decoder_hidden_state)
            decoder_input = decoder_output
            outputs.append(decoder_output)
            if self.training and self.use_curriculum_learning:
                c = np.random.uniform(0, 1)
                if c < self._compute_sampling_threshold(batches_seen):
                    decoder_input = labels[t]
        return torch.stack(outputs)

    def forward(self, inputs, labels=None, batches_seen=None):
        encoder_hidden_state = self.encoder(inputs)
        return self.decoder(encoder_hidden_state, labels, batches_seen=batches_seen)

    def prepare_batch(self, batch):
        x, y = batch
        x = x.permute(1, 0, 2, 3)
        y = y.permute(1, 0, 2, 3)
        batch_size = x.size(1)
        x = x.reshape(self.encoder_model.seq_len, batch_size, self.num_nodes * self.encoder_model.input_dim)
        y = y[..., : self.decoder_model.output_dim].reshape(
            self.decoder_model.horizon, batch_size, self.num_nodes * self.decoder_model.output_dim)
        return x, y

    def training_step(self, batch, batch_idx):
        x, y = self.prepare_batch(batch)
        pred = self(x, y, batches_seen=batch_idx)
        return self.criterion(pred, y)


num_nodes, seq_len, horizon = 5, 3, 2
adj_mx = (torch.rand(num_nodes, num_nodes) > 0.5).float()
model = DCRNN(adj_mx, num_units=4, seq_len=seq_len, horizon=horizon, num_nodes=num_nodes,
              max_diffusion_step=2, use_gc_for_ru=False).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

model.train()
for batch_idx in range(4):
    x = torch.randn(3, seq_len, num_nodes, 1, device=DEVICE)
    y = torch.randn(3, horizon, num_nodes, 1, device=DEVICE)
    loss = model.training_step((x, y), batch_idx)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
