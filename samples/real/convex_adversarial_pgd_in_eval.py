# source: https://github.com/locuslab/convex_adversarial/issues/34 — issue "PGD attack error": with `_,pgd_err = _pgd(model, Variable(X), Variable(y), epsilon)` uncommented in evaluate_robust, loss.backward() in _pgd fails with "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"
# fix-source: https://github.com/locuslab/convex_adversarial/issues/34 — maintainer's comment (riceric22): gradients are disabled in evaluate_robust (torch.set_grad_enabled(False)); re-enable them, e.g. with torch.enable_grad(), before running the PGD attack
# expect-kind: no-grad
# expect-culprit: loss
import io

import torch
import torch.nn as nn
import torch.optim as optim
from torch.autograd import Variable
from _device import DEVICE


class Flatten(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1)


def mnist_500():
    return nn.Sequential(Flatten(), nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 3))


def robust_loss(net, epsilon, X, y, size_average=True):
    """Wong & Kolter's dual bound for a Linear-ReLU-Linear net (stands in for convex_adversarial.robust_loss)."""
    x = net[0](X)
    W1, b1, W2, b2 = net[1].weight, net[1].bias, net[3].weight, net[3].bias
    zhat = nn.functional.linear(x, W1, b1)
    radius = epsilon * W1.abs().sum(1)
    l, u = zhat - radius, zhat + radius
    I = (l < 0) & (u > 0)
    d = (l >= 0).float() + I.float() * u / (u - l).clamp(min=1e-12)

    n_classes = W2.shape[0]
    eye = torch.eye(n_classes, device=X.device)
    c = eye[y].unsqueeze(1) - eye.unsqueeze(0)  # c[:, j] = e_y - e_j
    nu_2 = -c
    nu_hat_1 = nu_2.matmul(W2)
    nu_1 = d.unsqueeze(1) * nu_hat_1
    nu_hat_0 = nu_1.matmul(W1)
    J = (-nu_2.matmul(b2) - nu_1.matmul(b1) - nu_hat_0.matmul(x.unsqueeze(-1)).squeeze(-1)
         - epsilon * nu_hat_0.abs().sum(-1) + (I.float() * l).unsqueeze(1).mul(nu_1.clamp(min=0)).sum(-1))
    f = -J
    err = (f.max(1)[1] != y).float()
    if size_average:
        err = err.mean()
    ce = nn.CrossEntropyLoss(reduction='mean' if size_average else 'none')(f, y)
    return ce, err


def _pgd(model, X, y, epsilon, niters=20, alpha=0.01):
    out = model(X)
    ce = nn.CrossEntropyLoss()(out, y)
    err = (out.data.max(1)[1] != y.data).float().sum() / X.size(0)

    X_pgd = Variable(X.data, requires_grad=True)
    for i in range(niters):
        opt = optim.Adam([X_pgd], lr=1e-3)
        opt.zero_grad()
        loss = nn.CrossEntropyLoss()(model(X_pgd), y)  # culprit
        loss.backward()
        eta = alpha * X_pgd.grad.data.sign()
        X_pgd = Variable(X_pgd.data + eta, requires_grad=True)

        # adjust to be within [-epsilon, epsilon]
        eta = torch.clamp(X_pgd.data - X.data, -epsilon, epsilon)
        X_pgd = Variable(X.data + eta, requires_grad=True)

    err_pgd = (model(X_pgd).data.max(1)[1] != y.data).float().sum() / X.size(0)
    return err, err_pgd


def train_robust(loader, model, opt, epsilon, epoch, log, verbose, clip_grad=None, **kwargs):
    model.train()
    for i, (X, y) in enumerate(loader):
        X, y = X.to(DEVICE), y.to(DEVICE).long()
        with torch.no_grad():
            out = model(Variable(X))
            ce = nn.CrossEntropyLoss()(out, Variable(y))
            err = (out.max(1)[1] != y).float().sum() / X.size(0)

        robust_ce, robust_err = robust_loss(model, epsilon, Variable(X), Variable(y), **kwargs)
        opt.zero_grad()
        robust_ce.backward()
        if clip_grad:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        opt.step()
        print(epoch, i, robust_ce.detach().item(), robust_err.item(), ce.item(), err.item(), file=log)


def evaluate_robust(loader, model, epsilon, epoch, log, verbose, **kwargs):
    model.eval()
    torch.set_grad_enabled(False)
    for i, (X, y) in enumerate(loader):
        X, y = X.to(DEVICE), y.to(DEVICE).long()
        robust_ce, robust_err = robust_loss(model, epsilon, X, y, **kwargs)
        out = model(Variable(X))
        ce = nn.CrossEntropyLoss()(out, Variable(y))
        err = (out.max(1)[1] != y).float().sum() / X.size(0)

        _, pgd_err = _pgd(model, Variable(X), Variable(y), epsilon)

        print(epoch, i, robust_ce.item(), robust_err.item(), ce.item(), err.item(), pgd_err.item(), file=log)
    torch.set_grad_enabled(True)
    return robust_err


def make_loader(n_batches, batch_size):
    batches = []
    for _ in range(n_batches):
        y = torch.randint(0, 3, (batch_size,))
        X = torch.rand(batch_size, 1, 4, 4) * 0.5
        X[:, 0, 0, :3] += nn.functional.one_hot(y, 3).float() * 0.5
        batches.append((X, y))
    return batches


train_loader = make_loader(2, 8)
test_loader = make_loader(1, 8)
model = mnist_500().to(DEVICE)
opt = optim.Adam(model.parameters(), lr=1e-3)
train_log, test_log = io.StringIO(), io.StringIO()
epsilon_final, starting_epsilon, epochs = 0.1, 0.01, 3
eps_schedule = torch.linspace(starting_epsilon, epsilon_final, epochs).tolist()
for t in range(epochs):
    epsilon = float(eps_schedule[t])
    train_robust(train_loader, model, opt, epsilon, t, train_log, verbose=False)
    err = evaluate_robust(test_loader, model, epsilon_final, t, test_log, verbose=False)
print("done")
