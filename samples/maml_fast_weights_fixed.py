# expect-kind: none
# fix: every task makes its fast weights afresh from the model's current weights
import torch
import torch.nn.functional as F
from _device import DEVICE

# MAML on sine-wave regression: a few inner steps adapt "fast weights" to each task with
# create_graph=True, then the meta-loss on the task's query set trains the model through them.
# Every task starts its fast weights afresh from the model's current weights.
model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(DEVICE)
meta_optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
inner_lr = 0.05


def forward(x, weights):
    hidden = torch.tanh(F.linear(x, weights[0], weights[1]))
    return F.linear(hidden, weights[2], weights[3])


for task in range(4):
    fast = [p.clone() for p in model.parameters()]
    amplitude, phase = 1.0 + 0.5 * task, 0.3 * task
    x = torch.linspace(-3, 3, 20, device=DEVICE).view(-1, 1)
    x_query = x + 0.1
    y, y_query = amplitude * torch.sin(x + phase), amplitude * torch.sin(x_query + phase)
    for _ in range(2):
        loss = F.mse_loss(forward(x, fast), y)
        grads = torch.autograd.grad(loss, fast, create_graph=True)
        fast = [w - inner_lr * g for w, g in zip(fast, grads)]
    meta_loss = F.mse_loss(forward(x_query, fast), y_query)
    meta_optimizer.zero_grad()
    meta_loss.backward()
    meta_optimizer.step()
print("done")
