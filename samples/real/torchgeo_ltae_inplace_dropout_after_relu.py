# source: https://github.com/torchgeo/torchgeo/issues/3735 — issue: training torchgeo's L-TAE (satellite image time series encoder) fails in backward with "modified by an inplace operation ... output 0 of ReluBackward0" (torchgeo/models/ltae.py: nn.Dropout(inplace=True) applied to the MLP's in-place ReLU output)
# fix-source: https://github.com/torchgeo/torchgeo/pull/3737 — merged PR "Fix inplace operations in LTAE causing backpropagation failure": the Dropout is no longer in-place (nn.Dropout(dropout))
# expect-kind: inplace-modified
# expect-culprit: self.mlp
import math
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor
from _device import DEVICE


class LTAE(nn.Module):
    """Lightweight Temporal Attention Encoder: a time series of embeddings -> one embedding."""

    def __init__(
        self,
        in_channels: int = 128,
        n_head: int = 16,
        n_neurons: Sequence[int] = (256, 128),
        dropout: float = 0.2,
        d_model: int | None = 256,
        T: int = 1000,
        len_max_seq: int = 24,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.n_neurons = n_neurons
        self.d_model = d_model if d_model is not None else in_channels
        self.inconv: nn.Sequential | None = None

        if d_model is not None:
            self.inconv = nn.Sequential(
                nn.Conv1d(in_channels, d_model, 1), nn.LayerNorm([d_model, len_max_seq])
            )

        self.pos_encoder = PositionalEncoding(self.d_model, dropout, T)
        self.attention = nn.MultiheadAttention(
            embed_dim=self.d_model, num_heads=n_head, dropout=dropout, batch_first=True
        )

        self.inlayernorm = nn.LayerNorm(self.in_channels)
        self.outlayernorm = nn.LayerNorm(n_neurons[-1])

        assert self.n_neurons[0] == self.d_model

        activation = nn.ReLU(inplace=True)

        layers = []
        for i in range(len(self.n_neurons) - 1):
            layers.extend(
                [
                    nn.Linear(self.n_neurons[i], self.n_neurons[i + 1]),
                    nn.BatchNorm1d(self.n_neurons[i + 1]),
                    activation,
                ]
            )

        self.mlp = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout, inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        sz_b, seq_len, d = x.shape

        x = self.inlayernorm(x)

        if self.inconv is not None:
            x = self.inconv(x.permute(0, 2, 1)).permute(0, 2, 1)

        x = self.pos_encoder(x)

        attention_output, _ = self.attention(x, x, x)

        # mean over the sequence dimension: a fixed-size representation
        mlp_input = attention_output.mean(dim=1)
        output: Tensor = self.outlayernorm(self.dropout(self.mlp(mlp_input)))  # culprit

        return output


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, T: int = 1000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)

        position = torch.arange(T).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(T) / d_model))
        pe = torch.zeros(1, T, d_model)
        pe[0, :, 0::2] = torch.sin(position * div_term)
        pe[0, :, 1::2] = torch.cos(position * div_term)
        self.register_buffer('pe', pe)

    def forward(self, x: Tensor) -> Tensor:
        pe = self.pe[:, : x.size(1)]
        output: Tensor = self.dropout(x + pe)
        return output


model = LTAE(in_channels=16, d_model=16, n_head=4, n_neurons=(16, 32), len_max_seq=5).to(DEVICE)
head = nn.Linear(32, 3).to(DEVICE)
optimizer = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=1e-3)
model.train()
for step in range(2):
    x = torch.randn(2, 5, 16, device=DEVICE)
    target = torch.randint(0, 3, (2,), device=DEVICE)
    y = model(x)
    loss = nn.functional.cross_entropy(head(y), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
