# expect-kind: second-backward
# expect-culprit: self.previous
import torch
from _device import DEVICE

# A smoothness penalty kept on a helper object: each step's loss compares this batch's mean
# output with the last batch's, then stores this one for the next step. Stored with its graph,
# the last batch's value is replaced before the backward runs, so no variable holds the stale
# tensor when the error comes: only the attribute that held it, one step ago.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


class Smoothed:
    previous = None

    def loss(self, out):
        summary = out.mean()
        loss = out.pow(2).mean()
        if self.previous is not None:
            loss = loss + 0.1 * (summary - self.previous) ** 2
        self.previous = summary  # culprit
        return loss


smoothed = Smoothed()
for step in range(4):
    loss = smoothed.loss(model(torch.randn(2, 4, device=DEVICE)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
