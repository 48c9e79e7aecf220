# expect-kind: second-backward
# expect-culprit: self.hidden
import torch
from _device import DEVICE


class StreamTagger(torch.nn.Module):
    """GRU tagger that keeps its hidden state between calls."""

    def __init__(self, in_dim=3, hidden_dim=8, n_tags=2):
        super().__init__()
        self.gru = torch.nn.GRU(in_dim, hidden_dim, batch_first=True)
        self.out = torch.nn.Linear(hidden_dim, n_tags)
        self.hidden = None

    def forward(self, x):
        if self.hidden is None:
            self.hidden = torch.zeros(1, x.size(0), self.gru.hidden_size, device=x.device)
        out, self.hidden = self.gru(x, self.hidden)  # culprit
        return self.out(out)


tagger = StreamTagger().to(DEVICE)
optimizer = torch.optim.Adam(tagger.parameters(), lr=1e-2)

for step in range(4):
    x = torch.randn(2, 5, 3, device=DEVICE)
    tags = (x[..., 0] > 0).long()
    logits = tagger(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), tags.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
