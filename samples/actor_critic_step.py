# expect-kind: inplace-modified
# expect-culprit: critic[2].weight
import torch
from _device import DEVICE

state_dim, action_dim = 4, 2
actor = torch.nn.Sequential(
    torch.nn.Linear(state_dim, 16), torch.nn.ReLU(), torch.nn.Linear(16, action_dim), torch.nn.Tanh()
).to(DEVICE)
critic = torch.nn.Sequential(
    torch.nn.Linear(state_dim + action_dim, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
).to(DEVICE)
actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)

for it in range(4):
    state = torch.randn(8, state_dim, device=DEVICE)
    target_q = torch.randn(8, 1, device=DEVICE)
    q = critic(torch.cat([state, actor(state)], 1))  # culprit
    critic_loss = torch.nn.functional.mse_loss(q, target_q)
    actor_loss = -q.mean()

    critic_opt.zero_grad()
    critic_loss.backward(retain_graph=True)
    critic_opt.step()  # step

    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
print("done")
