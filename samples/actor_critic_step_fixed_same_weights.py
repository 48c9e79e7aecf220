# expect-kind: none
# fix: both gradients at the weights the forward ran with: the actor's update first (its graph kept for the critic's loss), then the critic's, its backward kept off the stepped actor with inputs=
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
    q = critic(torch.cat([state, actor(state)], 1))
    critic_loss = torch.nn.functional.mse_loss(q, target_q)
    actor_loss = -q.mean()

    actor_opt.zero_grad()
    actor_loss.backward(retain_graph=True)
    actor_opt.step()

    critic_opt.zero_grad()
    critic_loss.backward(inputs=list(critic.parameters()))
    critic_opt.step()
print("done")
