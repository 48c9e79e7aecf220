# source: https://github.com/fastai/fastai/pull/761 — courses/dl2/style-transfer.ipynb: the "Style transfer" section reads features from SaveFeatures hooks the "Style match" section already closed
# fix-source: https://github.com/fastai/fastai/pull/761 (merged) — "fix RuntimeError: Trying to backward through the graph a second time ... by reinitializing sfs"
# expect-kind: none
# fix: reinitialize sfs (new SaveFeatures hooks) at the start of the "Style transfer" section, as the merged PR did
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from _device import DEVICE


def children(m): return list(m.children())
def set_trainable(m, b):
    for p in m.parameters(): p.requires_grad_(b)
def V(x, requires_grad=False):
    x = torch.as_tensor(x, device=DEVICE)
    return x.requires_grad_() if requires_grad else x
def VV(x): return torch.as_tensor(x, device=DEVICE).detach()
def val_tfms(x): return (x - 0.45) / 0.25


def vgg16():
    layers, c_in = [], 3
    for c_out in (4, 4, 8, 8, 8):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        c_in = c_out
    return nn.Sequential(*layers)


img = torch.rand(3, 32, 32)
img_tfm = val_tfms(img)
max_iter = 3
show_iter = 100


def step(loss_fn):
    global n_iter
    optimizer.zero_grad()
    loss = loss_fn(opt_img_v)
    loss.backward()
    n_iter += 1
    if n_iter % show_iter == 0: print(f'Iteration: {n_iter}, loss: {loss.item()}')
    return loss


# ## forward hook
class SaveFeatures():
    features = None
    def __init__(self, m): self.hook = m.register_forward_hook(self.hook_fn)
    def hook_fn(self, module, input, output): self.features = output
    def close(self): self.hook.remove()


m_vgg = vgg16().to(DEVICE).eval()
set_trainable(m_vgg, False)
block_ends = [i - 1 for i, o in enumerate(children(m_vgg)) if isinstance(o, nn.MaxPool2d)]
sf = SaveFeatures(children(m_vgg)[block_ends[3]])


def get_opt():
    opt_img = torch.rand(*img.shape)
    opt_img_v = V(val_tfms(opt_img / 2)[None], requires_grad=True)
    return opt_img_v, optim.LBFGS([opt_img_v])


opt_img_v, optimizer = get_opt()
m_vgg(VV(img_tfm[None]))
targ_v = V(sf.features.clone())


def actn_loss2(x):
    m_vgg(x)
    out = V(sf.features)
    return F.mse_loss(out, targ_v) * 1000


n_iter = 0
while n_iter <= max_iter: optimizer.step(partial(step, actn_loss2))
sf.close()

# ## Style match
style_img = torch.rand(3, 32, 32)
opt_img_v, optimizer = get_opt()
sfs = [SaveFeatures(children(m_vgg)[idx]) for idx in block_ends]
m_vgg(VV(img_tfm[None]))
targ_vs = [V(o.features.clone()) for o in sfs]
style_tfm = val_tfms(style_img)
m_vgg(VV(style_tfm[None]))
targ_styles = [V(o.features.clone()) for o in sfs]


def gram(input):
    b, c, h, w = input.size()
    x = input.view(b * c, -1)
    return torch.mm(x, x.t()) / input.numel() * 1e6


def gram_mse_loss(input, target): return F.mse_loss(gram(input), gram(target))


def style_loss(x):
    m_vgg(opt_img_v)
    outs = [V(o.features) for o in sfs]
    losses = [gram_mse_loss(o, s) for o, s in zip(outs, targ_styles)]
    return sum(losses)


n_iter = 0
while n_iter <= max_iter: optimizer.step(partial(step, style_loss))
for sf in sfs: sf.close()

# ## Style transfer
opt_img_v, optimizer = get_opt()
sfs = [SaveFeatures(children(m_vgg)[idx]) for idx in block_ends]


def comb_loss(x):
    m_vgg(opt_img_v)
    outs = [V(o.features) for o in sfs]
    losses = [gram_mse_loss(o, s) for o, s in zip(outs, targ_styles)]
    cnt_loss = F.mse_loss(outs[3], targ_vs[3]) * 1000000
    style_loss = sum(losses)
    return cnt_loss + style_loss


n_iter = 0
while n_iter <= max_iter: optimizer.step(partial(step, comb_loss))
for sf in sfs: sf.close()
print("done")
