# source: https://github.com/jocpae/clDice/issues/21 — vessel segmentation: the UNet output is turned into a binary mask before soft_dice_cldice, and "I lost the grad on the tensor"
# fix-source: maintainer's comment (jocpae) in the issue: "you should not convert the output to a binary mask" (feed the soft prediction)
# expect-kind: no-grad
# expect-culprit: y_pred
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


def soft_erode(img):
    if len(img.shape)==4:
        p1 = -F.max_pool2d(-img, (3,1), (1,1), (1,0))
        p2 = -F.max_pool2d(-img, (1,3), (1,1), (0,1))
        return torch.min(p1,p2)
    elif len(img.shape)==5:
        p1 = -F.max_pool3d(-img,(3,1,1),(1,1,1),(1,0,0))
        p2 = -F.max_pool3d(-img,(1,3,1),(1,1,1),(0,1,0))
        p3 = -F.max_pool3d(-img,(1,1,3),(1,1,1),(0,0,1))
        return torch.min(torch.min(p1, p2), p3)


def soft_dilate(img):
    if len(img.shape)==4:
        return F.max_pool2d(img, (3,3), (1,1), (1,1))
    elif len(img.shape)==5:
        return F.max_pool3d(img,(3,3,3),(1,1,1),(1,1,1))


def soft_open(img):
    return soft_dilate(soft_erode(img))


def soft_skel(img, iter_):
    img1  =  soft_open(img)
    skel  =  F.relu(img-img1)
    for j in range(iter_):
        img  =  soft_erode(img)
        img1  =  soft_open(img)
        delta  =  F.relu(img-img1)
        skel  =  skel +  F.relu(delta-skel*delta)
    return skel


def soft_dice(y_true, y_pred):
    """[function to compute dice loss]

    Args:
        y_true ([float32]): [ground truth image]
        y_pred ([float32]): [predicted image]

    Returns:
        [float32]: [loss value]
    """
    smooth = 1
    intersection = torch.sum((y_true * y_pred)[:,1:,...])
    coeff = (2. *  intersection + smooth) / (torch.sum(y_true[:,1:,...]) + torch.sum(y_pred[:,1:,...]) + smooth)
    return (1. - coeff)


class soft_dice_cldice(nn.Module):
    def __init__(self, iter_=3, alpha=0.5, smooth = 1.):
        super(soft_dice_cldice, self).__init__()
        self.iter = iter_
        self.smooth = smooth
        self.alpha = alpha

    def forward(self, y_true, y_pred):
        dice = soft_dice(y_true, y_pred)
        skel_pred = soft_skel(y_pred, self.iter)
        skel_true = soft_skel(y_true, self.iter)
        tprec = (torch.sum(torch.multiply(skel_pred, y_true)[:,1:,...])+self.smooth)/(torch.sum(skel_pred[:,1:,...])+self.smooth)
        tsens = (torch.sum(torch.multiply(skel_true, y_pred)[:,1:,...])+self.smooth)/(torch.sum(skel_true[:,1:,...])+self.smooth)
        cl_dice = 1.- 2.0*(tprec*tsens)/(tprec+tsens)
        return (1.0-self.alpha)*dice+self.alpha*cl_dice


class UNet(nn.Module):
    def __init__(self, n_channels=1, n_classes=2):
        super().__init__()
        self.inc = nn.Sequential(nn.Conv2d(n_channels, 8, 3, padding=1), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.outc = nn.Conv2d(16, n_classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down(x1)
        x3 = self.up(x2)
        return self.outc(torch.cat([x1, x3], dim=1))


net = UNet(n_channels=1, n_classes=2).to(DEVICE)
criterion = soft_dice_cldice(iter_=3, alpha=0.5)
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

for step in range(4):
    image = torch.randn(2, 1, 16, 16, device=DEVICE)
    mask = (torch.rand(2, 16, 16, device=DEVICE) > 0.7).long()

    logits = net(image)
    y_pred = (torch.softmax(logits, dim=1) > 0.5).float()  # culprit
    y_true = F.one_hot(mask, 2).permute(0, 3, 1, 2).float()
    loss = criterion(y_true, y_pred)

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
