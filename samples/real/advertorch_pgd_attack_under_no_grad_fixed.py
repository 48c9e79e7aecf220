# source: https://github.com/BorealisAI/advertorch/issues/79 — adversarial training works, but the test loop runs LinfPGDAttack.perturb inside `with torch.no_grad()`
# fix-source: maintainer's comment (gwding) in the issue: a gradient-based attack needs autograd, remove `with torch.no_grad()` (confirmed by the reporter)
# expect-kind: none
# fix: the test loop runs the attack (and the evaluation) without `with torch.no_grad()`, as the maintainer advised
import numpy as np
import torch
import torch.nn as nn
from _device import DEVICE


def replicate_input(x):
    return x.detach().clone()


def clamp(input, min=None, max=None):
    return torch.clamp(input, min=min, max=max)


def batch_multiply(float_or_vector, tensor):
    tensor *= float_or_vector
    return tensor


def batch_clamp(float_or_vector, tensor):
    return clamp(tensor, -float_or_vector, float_or_vector)


def rand_init_delta(delta, x, ord, eps, clip_min, clip_max):
    if ord == np.inf:
        delta.data.uniform_(-1, 1)
        delta.data = batch_multiply(eps, delta.data)


def perturb_iterative(xvar, yvar, predict, nb_iter, eps, eps_iter, loss_fn,
                      delta_init=None, minimize=False, ord=np.inf,
                      clip_min=0.0, clip_max=1.0, l1_sparsity=None):
    if delta_init is not None:
        delta = delta_init
    else:
        delta = torch.zeros_like(xvar)

    delta.requires_grad_()
    for ii in range(nb_iter):
        outputs = predict(xvar + delta)
        loss = loss_fn(outputs, yvar)
        if minimize:
            loss = -loss

        loss.backward()
        if ord == np.inf:
            grad_sign = delta.grad.data.sign()
            delta.data = delta.data + batch_multiply(eps_iter, grad_sign)
            delta.data = batch_clamp(eps, delta.data)
            delta.data = clamp(xvar.data + delta.data, clip_min, clip_max) - xvar.data
        delta.grad.data.zero_()

    x_adv = clamp(xvar + delta, clip_min, clip_max)
    return x_adv


class Attack(object):
    def __init__(self, predict, loss_fn, clip_min, clip_max):
        self.predict = predict
        self.loss_fn = loss_fn
        self.clip_min = clip_min
        self.clip_max = clip_max


class LabelMixin(object):
    def _get_predicted_label(self, x):
        with torch.no_grad():
            outputs = self.predict(x)
        _, y = torch.max(outputs, dim=1)
        return y

    def _verify_and_process_inputs(self, x, y):
        if not self.targeted:
            if y is None:
                y = self._get_predicted_label(x)
        x = replicate_input(x)
        y = replicate_input(y)
        return x, y


class PGDAttack(Attack, LabelMixin):
    def __init__(self, predict, loss_fn=None, eps=0.3, nb_iter=40, eps_iter=0.01, rand_init=True,
                 clip_min=0., clip_max=1., ord=np.inf, l1_sparsity=None, targeted=False):
        super(PGDAttack, self).__init__(predict, loss_fn, clip_min, clip_max)
        self.eps = eps
        self.nb_iter = nb_iter
        self.eps_iter = eps_iter
        self.rand_init = rand_init
        self.ord = ord
        self.targeted = targeted
        if self.loss_fn is None:
            self.loss_fn = nn.CrossEntropyLoss(reduction="sum")
        self.l1_sparsity = l1_sparsity

    def perturb(self, x, y=None):
        x, y = self._verify_and_process_inputs(x, y)
        delta = torch.zeros_like(x)
        delta = nn.Parameter(delta)
        if self.rand_init:
            rand_init_delta(delta, x, self.ord, self.eps, self.clip_min, self.clip_max)
            delta.data = clamp(x + delta.data, min=self.clip_min, max=self.clip_max) - x

        rval = perturb_iterative(
            x, y, self.predict, nb_iter=self.nb_iter,
            eps=self.eps, eps_iter=self.eps_iter,
            loss_fn=self.loss_fn, minimize=self.targeted,
            ord=self.ord, clip_min=self.clip_min,
            clip_max=self.clip_max, delta_init=delta,
            l1_sparsity=self.l1_sparsity,
        )
        return rval.data


class LinfPGDAttack(PGDAttack):
    def __init__(self, predict, loss_fn=None, eps=0.3, nb_iter=40, eps_iter=0.01, rand_init=True,
                 clip_min=0., clip_max=1., targeted=False):
        super(LinfPGDAttack, self).__init__(
            predict=predict, loss_fn=loss_fn, eps=eps, nb_iter=nb_iter, eps_iter=eps_iter,
            rand_init=rand_init, clip_min=clip_min, clip_max=clip_max, targeted=targeted, ord=np.inf)


net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                    nn.Flatten(), nn.Linear(16, 10)).to(DEVICE)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
adversary = LinfPGDAttack(
    net, loss_fn=nn.CrossEntropyLoss(reduction="sum"), eps=8 / 255, nb_iter=3,
    eps_iter=2 / 255, rand_init=True, clip_min=0.0, clip_max=1.0, targeted=False)
trainloader = [(torch.rand(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(2)]
testloader = [(torch.rand(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(2)]


def train(epoch):
    net.train()
    for batch_idx, (inputs, targets) in enumerate(trainloader):
        inputs, targets = inputs.to(DEVICE), targets.to(DEVICE)
        adv_untargeted = adversary.perturb(inputs, targets)
        optimizer.zero_grad()
        outputs = net(adv_untargeted)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()


def test(epoch):
    net.eval()
    correct = total = 0
    for batch_idx, (inputs, targets) in enumerate(testloader):
        inputs, targets = inputs.to(DEVICE), targets.to(DEVICE)
        adv_untargeted = adversary.perturb(inputs, targets)
        inputs = adv_untargeted

        outputs = net(inputs)
        _, predicted = outputs.max(1)
        total += targets.size(0)
        correct += predicted.eq(targets).sum().item()


for epoch in range(2):
    train(epoch)
    test(epoch)
print("done")
