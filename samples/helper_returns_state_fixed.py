# expect-kind: none
# fix: detach the state where the loop passes it back in (truncated back-propagation through time)
import torch
from _device import DEVICE

# Next-value forecaster on one long series. The training step lives in a helper that returns the
# recurrent state, and the loop feeds it back into the next call.
model = torch.nn.GRU(input_size=1, hidden_size=16, batch_first=True).to(DEVICE)
head = torch.nn.Linear(16, 1).to(DEVICE)
optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.05)


def train_step(window, target, state):
    out, state = model(window, state)
    loss = torch.nn.functional.mse_loss(head(out), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return state


series = torch.sin(torch.linspace(0, 12, 97, device=DEVICE)).reshape(1, -1, 1)
state = torch.zeros(1, 1, 16, device=DEVICE)
for start in range(0, 96, 24):
    window, target = series[:, start : start + 24], series[:, start + 1 : start + 25]
    state = train_step(window, target, state.detach())
print("done")
