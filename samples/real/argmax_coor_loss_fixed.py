# source: https://github.com/LZGMatrix/BOP19_CDPN_2019ICCV/issues/4 — issue: a train.py written from test.py computes the loss on argmax'ed coordinate bins and loss.backward() fails
# fix-source: maintainer's comment in the issue ("torch.argmax() is nondifferentiable, so you need to take the loss before torch.argmax()")
# expect-kind: none
# fix: take the loss on the bin scores before torch.argmax (cross-entropy against the target's bins); argmax only for the decoded coordinates
import types

import torch
import torch.nn as nn
from _device import DEVICE

cfg = types.SimpleNamespace(network=types.SimpleNamespace(coor_bin=8))


class CDPN(nn.Module):
    def __init__(self, coor_bin):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.rot_head = nn.Conv2d(8, 3 * (coor_bin + 1), 1)

    def forward(self, x):
        return self.rot_head(self.backbone(x))


model = CDPN(cfg.network.coor_bin).to(DEVICE)
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()

for it in range(4):
    inp = torch.randn(1, 3, 6, 6, device=DEVICE)
    target_coor = torch.rand(6, 6, 3, device=DEVICE) * 2.0 - 1.0
    output_coor = model(inp)
    output_coor_x_, output_coor_y_, output_coor_z_ = output_coor.split(cfg.network.coor_bin + 1, dim=1)
    output_coor_x_ = output_coor_x_.squeeze()
    output_coor_y_ = output_coor_y_.squeeze()
    output_coor_z_ = output_coor_z_.squeeze()

    output_coor_ = torch.stack([torch.argmax(output_coor_x_, axis=0), torch.argmax(output_coor_y_, axis=0), torch.argmax(output_coor_z_, axis=0)], axis=2)
    output_coor_[output_coor_ == cfg.network.coor_bin] = 0
    output_coor_ = 2.0 * output_coor_.float() / (cfg.network.coor_bin - 1.0) - 1.0  # [-1,1]

    target_bin = ((target_coor + 1.0) / 2.0 * (cfg.network.coor_bin - 1.0)).round().long()
    loss = criterion(output_coor_x_[None], target_bin[None, :, :, 0]) + criterion(output_coor_y_[None], target_bin[None, :, :, 1]) + criterion(output_coor_z_[None], target_bin[None, :, :, 2])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
