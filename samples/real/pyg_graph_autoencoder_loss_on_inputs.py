# source: https://github.com/pyg-team/pytorch_geometric/issues/874 — issue "Graph Autoencoder": a two-layer GCNConv net trained with loss = F.mse_loss(data.x, data.x) fails at loss.backward() with "element 0 of tensors does not require grad and does not have a grad_fn"
# fix-source: https://github.com/pyg-team/pytorch_geometric/issues/874 — maintainer's answer (rusty1s): "You need to compute mse based on out and data.y", accepted by the reporter
# expect-kind: no-grad
# expect-culprit: loss
import torch
import torch.nn.functional as F
from _device import DEVICE


class GCNConv(torch.nn.Module):
    """Kipf-Welling propagation D^-1/2 (A + I) D^-1/2 X W + b on an edge_index (dense, for tiny graphs)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(out_channels))

    def forward(self, x, edge_index):
        n = x.size(0)
        adj = torch.eye(n, device=x.device)
        adj[edge_index[0], edge_index[1]] = 1.0
        deg_inv_sqrt = adj.sum(1).pow(-0.5)
        adj = deg_inv_sqrt[:, None] * adj * deg_inv_sqrt[None, :]
        return adj @ self.lin(x) + self.bias


class Data:
    def __init__(self, x, edge_index, y):
        self.x, self.edge_index, self.y = x, edge_index, y

    def to(self, device):
        return Data(self.x.to(device), self.edge_index.to(device), self.y.to(device))


class Net(torch.nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = GCNConv(3, 16)
        self.conv2 = GCNConv(16, 3)

    def forward(self, data):
        x, edge_index = data.x, data.edge_index
        x = self.conv1(x, edge_index)
        x = self.conv2(x, edge_index)
        return x


edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
loader = [Data(torch.randn(4, 3), edge_index, torch.randn(4, 3)) for _ in range(3)]

device = DEVICE
model = Net().to(device)
optimizer = torch.optim.Adam(model.parameters())

epochs = 2

for e in range(epochs):
    running_loss = 0
    for data in loader:
        data = data.to(device)
        optimizer.zero_grad()
        out = model(data)
        loss = F.mse_loss(data.x, data.x)  # culprit
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
print("done")
