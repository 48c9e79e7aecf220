# expect-kind: second-backward
# expect-culprit: hidden
import torch
from _device import DEVICE

# Character-level language model trained on one long stream, one window at a time.
vocab_size, embed_dim, hidden_dim = 12, 6, 10
embedding = torch.nn.Embedding(vocab_size, embed_dim).to(DEVICE)
lstm = torch.nn.LSTM(embed_dim, hidden_dim, batch_first=True).to(DEVICE)
decoder = torch.nn.Linear(hidden_dim, vocab_size).to(DEVICE)
params = [*embedding.parameters(), *lstm.parameters(), *decoder.parameters()]
optimizer = torch.optim.SGD(params, lr=0.1)

stream = torch.randint(0, vocab_size, (2, 33), device=DEVICE)
hidden = (
    torch.zeros(1, 2, hidden_dim, device=DEVICE),
    torch.zeros(1, 2, hidden_dim, device=DEVICE),
)

for start in range(0, 32, 8):
    x = embedding(stream[:, start : start + 8])
    targets = stream[:, start + 1 : start + 9]
    out, hidden = lstm(x, hidden)  # culprit
    logits = decoder(out)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
