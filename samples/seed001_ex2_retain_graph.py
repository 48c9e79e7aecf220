# expect-kind: none
import torch
from _device import DEVICE

net1 = torch.nn.Linear(10, 5).to(DEVICE)
net2 = torch.nn.Linear(5, 2).to(DEVICE)
opt1 = torch.optim.SGD(net1.parameters(), lr=0.01)
opt2 = torch.optim.SGD(net2.parameters(), lr=0.01)

for step in range(3):
    input1 = torch.randn(1, 10, device=DEVICE)
    output1 = net1(input1)
    loss1 = output1.mean()
    opt1.zero_grad()
    loss1.backward(retain_graph=True)
    opt1.step()

    input2 = torch.randn(1, 5, device=DEVICE)
    output2 = net2(input2)
    loss2 = output2.mean()
    opt2.zero_grad()
    loss2.backward()
    opt2.step()
print("done")
