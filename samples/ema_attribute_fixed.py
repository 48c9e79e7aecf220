# expect-kind: none
# fix: update the moving average from detached features, so it carries no graph
import torch
from _device import DEVICE


class CenteredEncoder(torch.nn.Module):
    """Encoder that subtracts a moving average of its own features."""

    def __init__(self, in_dim=4, feat_dim=8):
        super().__init__()
        self.proj = torch.nn.Linear(in_dim, feat_dim)
        self.register_buffer("running_mean", torch.zeros(feat_dim))

    def forward(self, x):
        h = torch.relu(self.proj(x))
        self.running_mean = 0.9 * self.running_mean + 0.1 * h.detach().mean(0)
        return h - self.running_mean


encoder = CenteredEncoder().to(DEVICE)
head = torch.nn.Linear(8, 1).to(DEVICE)
optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.05)

for step in range(4):
    x = torch.randn(16, 4, device=DEVICE)
    y = torch.randn(16, 1, device=DEVICE)
    loss = torch.nn.functional.mse_loss(head(encoder(x)), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
