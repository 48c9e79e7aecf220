# expect-kind: second-backward
# expect-culprit: h
import torch
from _device import DEVICE

# A recurrent cell stepped one observation at a time, updated after every step; the new state is
# kept for the next step at the end of the loop body, after the backward.
cell = torch.nn.RNNCell(4, 12).to(DEVICE)
readout = torch.nn.Linear(12, 1).to(DEVICE)
optimizer = torch.optim.Adam([*cell.parameters(), *readout.parameters()], lr=1e-2)

observations = torch.randn(10, 2, 4, device=DEVICE)
rewards = torch.randn(10, 2, 1, device=DEVICE)
h = torch.zeros(2, 12, device=DEVICE)
for t in range(10):
    new_h = cell(observations[t], h)
    loss = torch.nn.functional.mse_loss(readout(new_h), rewards[t])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    h = new_h  # culprit
print("done")
