# expect-kind: none
# fix: the last batch's summary is stored detached; the penalty trains through this batch's
import torch
from _device import DEVICE

# A smoothness penalty kept on a helper object: each step's loss compares this batch's mean
# output with the last batch's, then stores this one, detached, for the next step: the penalty
# trains through this batch's output only.
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
        self.previous = summary.detach()
        return loss


smoothed = Smoothed()
for step in range(4):
    loss = smoothed.loss(model(torch.randn(2, 4, device=DEVICE)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
