# expect-kind: inplace-modified
# expect-culprit: gru.weight_hh_l0_reverse
# expect-culprit-cuda: gru.weight_ih_l0
import torch
from _device import DEVICE

gru = torch.nn.GRU(input_size=4, hidden_size=6, bidirectional=True).to(DEVICE)
optimizer = torch.optim.Adam(gru.parameters(), lr=1e-3)
mse_loss = torch.nn.MSELoss()
l1_loss = torch.nn.L1Loss()

for epoch in range(3):
    input_seq = torch.randn(7, 2, 4, device=DEVICE)
    target = torch.randn(7, 2, 12, device=DEVICE)
    optimizer.zero_grad()
    output, _ = gru(input_seq)  # culprit
    loss1 = mse_loss(output, target)
    loss1.backward(retain_graph=True)
    optimizer.step()  # step
    loss2 = l1_loss(output, target)
    loss2.backward()
    optimizer.step()
print("done")
