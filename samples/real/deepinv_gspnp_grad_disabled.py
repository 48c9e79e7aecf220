# source: https://github.com/deepinv/deepinv/issues/166 — "Calling GSDRUNet disables gradient computations": GSPnP.potential_grad ends with torch.set_grad_enabled(False), so later training forwards build no graph
# fix-source: https://github.com/deepinv/deepinv/pull/167 — maintainers' fix (commit 9ac59ae): the gradient computation runs inside `with torch.enable_grad():`, leaving the global grad mode alone
# expect-kind: no-grad
# expect-culprit: out
import torch
import torch.nn as nn
from _device import DEVICE


class DRUNet(nn.Module):
    """Tiny stand-in for deepinv's DRUNet: same call (x, sigma), noise-level map as an extra channel."""

    def __init__(self, in_channels=1, out_channels=1, nc=4, pretrained=None, train=False, device=None):
        super(DRUNet, self).__init__()
        self.m_head = nn.Conv2d(in_channels + 1, nc, 3, padding=1, bias=False)
        self.m_body = nn.Sequential(nn.ELU(), nn.Conv2d(nc, nc, 3, padding=1, bias=False), nn.ELU())
        self.m_tail = nn.Conv2d(nc, out_channels, 3, padding=1, bias=False)
        if not train:
            self.eval()
            for _, v in self.named_parameters():
                v.requires_grad = False
        if device is not None:
            self.to(device)

    def forward(self, x, sigma):
        noise_level_map = torch.ones(x.size(0), 1, x.size(2), x.size(3), device=x.device) * sigma
        x = torch.cat((x, noise_level_map), 1)
        x1 = self.m_head(x)
        return self.m_tail(self.m_body(x1) + x1)


class StudentGrad(nn.Module):
    def __init__(self, denoiser):
        super().__init__()
        self.model = denoiser

    def forward(self, x, sigma):
        return self.model(x, sigma)


class GSPnP(nn.Module):
    r"""
    Gradient Step module to use a denoiser architecture as a Gradient Step Denoiser.
    """

    def __init__(self, denoiser, alpha=1.0, train=False):
        super().__init__()
        self.student_grad = StudentGrad(denoiser)
        self.alpha = alpha
        self.train = train

    def potential(self, x, sigma):
        N = self.student_grad(x, sigma)
        return (
            0.5
            * self.alpha
            * torch.norm((x - N).view(x.shape[0], -1), p=2, dim=-1) ** 2
        )

    def potential_grad(self, x, sigma):
        torch.set_grad_enabled(True)
        x = x.float()
        x = x.requires_grad_()
        N = self.student_grad(x, sigma)
        JN = torch.autograd.grad(
            N, x, grad_outputs=x - N, create_graph=True, only_inputs=True
        )[0]
        if not self.train:
            torch.set_grad_enabled(False)
        Dg = x - N - JN
        return self.alpha * Dg

    def forward(self, x, sigma):
        Dg = self.potential_grad(x, sigma)
        x_hat = x - Dg
        return x_hat


def GSDRUNet(alpha=1.0, in_channels=1, out_channels=1, nc=4, pretrained=None,
             train=False, device=torch.device("cpu")):
    denoiser = DRUNet(in_channels=in_channels, out_channels=out_channels, nc=nc,
                      pretrained=None, train=train, device=device)
    GSmodel = GSPnP(denoiser, alpha=alpha, train=train)
    return GSmodel  # (pretrained weights are not downloaded here)


# A frozen Gradient-Step denoiser gives a first estimate; a small refinement network is trained on top.
denoiser = GSDRUNet(device=DEVICE)
model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 3, padding=1)).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
sigma = 0.1

for step in range(4):
    x = torch.rand(2, 1, 8, 8, device=DEVICE)
    y = x + sigma * torch.randn_like(x)
    x_den = denoiser(y, sigma)
    out = model(x_den)  # culprit
    loss = nn.functional.mse_loss(out, x)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
