# expect-kind: none
# fix: keep the result of detach() (it returns a new tensor; it does not change hidden)
import torch
from _device import DEVICE

# Sequence tagger over one long sensor stream, trained window by window.
model = torch.nn.GRU(input_size=3, hidden_size=8, batch_first=True).to(DEVICE)
classifier = torch.nn.Linear(8, 2).to(DEVICE)
optimizer = torch.optim.Adam([*model.parameters(), *classifier.parameters()], lr=1e-2)

stream = torch.randn(4, 24, 3, device=DEVICE)
labels = (stream.sum(-1) > 0).long()
hidden = torch.zeros(1, 4, 8, device=DEVICE)

for start in range(0, 24, 6):
    x = stream[:, start : start + 6]
    hidden = hidden.detach()
    out, hidden = model(x, hidden)
    logits = classifier(out)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), labels[:, start : start + 6].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
