# expect-kind: none
# fix: keep the stored states as plain values (detached); only the current step is trained
import torch
from _device import DEVICE


class SessionModel(torch.nn.Module):
    """Next-item model that attends over the GRU states of the last few steps."""

    def __init__(self, n_items=20, dim=8, n_keep=4):
        super().__init__()
        self.dim = dim
        self.embed = torch.nn.Embedding(n_items, dim)
        self.gru = torch.nn.GRU(dim, dim)
        self.score = torch.nn.Linear(2 * dim, n_items)
        self.rnn_states = torch.zeros(n_keep, dim, device=DEVICE)

    def forward(self, item):
        state = self.rnn_states[-1].view(1, 1, self.dim)
        rnn_input = self.embed(item).view(1, 1, self.dim)
        output, state = self.gru(rnn_input, state)
        self.rnn_states = self.rnn_states[1:]
        self.rnn_states = torch.cat((self.rnn_states, state.view(1, self.dim).detach()))
        attn = torch.softmax(self.rnn_states @ state.view(self.dim), dim=0)
        context = attn @ self.rnn_states
        return self.score(torch.cat((state.view(self.dim), context)))


model = SessionModel().to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
session = torch.tensor([3, 7, 1, 12, 5, 9], device=DEVICE)

for step in range(len(session) - 1):
    logits = model(session[step : step + 1])
    loss = torch.nn.functional.cross_entropy(logits.view(1, -1), session[step + 1 : step + 2])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
