# source: https://github.com/benedekrozemberczki/pytorch_geometric_temporal/issues/305 — EvolveGCNO example fails in loss.backward() from the 2nd epoch (issue)
# fix-source: https://github.com/benedekrozemberczki/pytorch_geometric_temporal/commit/987e43e213bbe8dcf4910eaeea7586b42b657d9e — maintainers' fix "disconnecting backprop graph between epochs"
# expect-kind: none
# fix: cut the graph of the carried recurrent weight between epochs: model.recurrent.weight = model.recurrent.weight.detach()
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.nn import GRU
from _device import DEVICE


class GCNConv_Fixed_W(torch.nn.Module):
    """GCN propagation whose weight is given at call time (dense normalised adjacency)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels

    def forward(self, W, x, edge_index, edge_weight=None):
        n = x.size(0)
        adj = torch.eye(n, device=x.device)
        adj = adj.index_put((edge_index[0], edge_index[1]), edge_weight, accumulate=True)
        deg_inv_sqrt = adj.sum(1).pow(-0.5)
        adj = deg_inv_sqrt[:, None] * adj * deg_inv_sqrt[None, :]
        x = torch.matmul(x, W)
        return adj @ x


class EvolveGCNO(torch.nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.in_channels = in_channels
        self.initial_weight = torch.nn.Parameter(torch.empty(1, in_channels, in_channels))
        self.weight = None
        self._create_layers()
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.xavier_uniform_(self.initial_weight)

    def _create_layers(self):
        self.recurrent_layer = GRU(input_size=self.in_channels, hidden_size=self.in_channels, num_layers=1)
        self.conv_layer = GCNConv_Fixed_W(in_channels=self.in_channels, out_channels=self.in_channels)

    def forward(self, X, edge_index, edge_weight=None):
        if self.weight is None:
            _, self.weight = self.recurrent_layer(self.initial_weight, self.initial_weight)
        else:
            _, self.weight = self.recurrent_layer(self.weight, self.weight)
        X = self.conv_layer(self.weight.squeeze(dim=0), X, edge_index, edge_weight)
        return X


class RecurrentGCN(torch.nn.Module):
    def __init__(self, node_features):
        super().__init__()
        self.recurrent = EvolveGCNO(node_features)
        self.linear = torch.nn.Linear(node_features, 1)

    def forward(self, x, edge_index, edge_weight):
        h = self.recurrent(x, edge_index, edge_weight)
        h = F.relu(h)
        h = self.linear(h)
        return h


# A small dynamic graph signal: 5 nodes, 4 features, 3 snapshots.
edge_index = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4], [1, 0, 2, 1, 3, 2, 4, 3]], device=DEVICE)
train_dataset = [
    SimpleNamespace(
        x=torch.randn(5, 4, device=DEVICE),
        edge_index=edge_index,
        edge_attr=torch.rand(8, device=DEVICE),
        y=torch.randn(5, 1, device=DEVICE),
    )
    for _ in range(3)
]

model = RecurrentGCN(node_features=4).to(DEVICE)
for param in model.parameters():
    param.retain_grad()

optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

model.train()

for epoch in range(4):
    cost = 0
    for time, snapshot in enumerate(train_dataset):
        y_hat = model(snapshot.x, snapshot.edge_index, snapshot.edge_attr)
        cost = cost + torch.mean((y_hat - snapshot.y) ** 2)
    cost = cost / (time + 1)
    cost.backward(retain_graph=True)
    optimizer.step()
    optimizer.zero_grad()
    model.recurrent.weight = model.recurrent.weight.detach()
print("done")
