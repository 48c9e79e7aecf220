# source: https://github.com/davda54/sam/issues/45 — SAM's second backward takes the loss from the first pass's `output`
# fix-source: maintainer's comment / README usage: the second forward-backward pass must run the model again
# expect-kind: none
# fix: a full forward pass for the second step: criterion(model(images), target).backward()
import torch
from _device import DEVICE


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = torch.norm(torch.stack([p.grad.norm(p=2) for g in self.param_groups
                                            for p in g["params"] if p.grad is not None]), p=2)
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                e_w = p.grad * scale
                p.add_(e_w)
                self.state[p]["e_w"] = e_w
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(self.state[p]["e_w"])
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n


def accuracy(output, target):
    return [(output.argmax(1) == target).float().mean() * 100]


def train(train_loader, model, criterion, optimizer, epoch):
    losses, top1 = AverageMeter(), AverageMeter()
    model.train()
    for i, (images, target) in enumerate(train_loader):
        images, target = images.to(DEVICE), target.to(DEVICE)
        # compute output
        output = model(images)
        # SAM
        # first forward-backward pass
        loss = criterion(output, target)
        loss.backward()
        optimizer.first_step(zero_grad=True)

        # second forward-backward pass
        criterion(model(images), target).backward()
        optimizer.second_step(zero_grad=True)

        acc1 = accuracy(output, target)
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0].item(), images.size(0))
    return top1.sum / top1.count, losses.sum / losses.count


model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.ReLU(), torch.nn.Linear(24, 4)).to(DEVICE)
criterion = torch.nn.CrossEntropyLoss()
optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
train_loader = [(torch.randn(8, 12), torch.randint(0, 4, (8,))) for _ in range(4)]
for epoch in range(1):
    train(train_loader, model, criterion, optimizer, epoch)
print("done")
