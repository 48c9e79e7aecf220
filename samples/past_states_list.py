# expect-kind: second-backward
# expect-culprit: memory
import torch
from _device import DEVICE

# Online model that attends over the encodings of earlier batches.
encoder = torch.nn.Linear(4, 8).to(DEVICE)
head = torch.nn.Linear(8, 1).to(DEVICE)
optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.05)
memory = []

for step in range(4):
    x = torch.randn(5, 4, device=DEVICE)
    y = torch.randn(5, 1, device=DEVICE)
    h = torch.tanh(encoder(x))
    if memory:
        past = torch.stack(memory)  # (n_past, batch, dim)
        attn = torch.softmax((past * h).sum(-1), dim=0)
        h = h + (attn.unsqueeze(-1) * past).sum(0)
    memory.append(h)  # culprit
    loss = torch.nn.functional.mse_loss(head(h), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
