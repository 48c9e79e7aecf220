# expect-kind: none
# fix: empty the log-probabilities after the update that used them, as the rewards are
import torch
from _device import DEVICE

# REINFORCE on a toy task (reward 1 when the action matches the sign of the observation): the
# log-probabilities of an episode's actions are kept for the policy update at its end. The
# rewards are reset every episode; the log-probabilities never are.
policy = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(DEVICE)
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
log_probs = []

for episode in range(3):
    rewards = []
    for t in range(8):
        obs = torch.randn(4, device=DEVICE)
        dist = torch.distributions.Categorical(logits=policy(obs))
        action = dist.sample()
        log_probs.append(dist.log_prob(action))
        rewards.append(float(action.item() == int(obs.sum().item() > 0)))
    episode_return = sum(rewards) / len(rewards)
    loss = -torch.stack(log_probs).sum() * episode_return
    optimizer.zero_grad()
    loss.backward()
    log_probs.clear()
    optimizer.step()
print("done")
