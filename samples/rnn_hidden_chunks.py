# expect-kind: second-backward
# expect-culprit: hidden
import torch
from _device import DEVICE

# Sine-wave regression, fed to the RNN in consecutive chunks (truncated BPTT).
model = torch.nn.RNN(input_size=1, hidden_size=8, batch_first=True).to(DEVICE)
head = torch.nn.Linear(8, 1).to(DEVICE)
optimizer = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=0.02)
loss_fn = torch.nn.MSELoss()

steps = torch.linspace(0, 6.28, 41, device=DEVICE)
signal = torch.sin(steps).view(1, -1, 1)
hidden = torch.zeros(1, 1, 8, device=DEVICE)

for start in range(0, 40, 10):
    x = signal[:, start : start + 10]
    y = signal[:, start + 1 : start + 11]
    out, hidden = model(x, hidden)  # culprit
    loss = loss_fn(head(out), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
