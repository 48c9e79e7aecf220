# source: https://github.com/horovod/horovod/pull/641 — merged PR "Fix memory leak in pytorch_imagenet_resnet50.py example": Metric.update sums hvd.allreduce(val.cpu()) of the training loss, which still carries its graph, so every batch's graph stays reachable from train_loss.sum
# fix-source: https://github.com/horovod/horovod/commit/6bac3dde71a7c5335932eba725c547a3b447e8d7 — the merged fix: `self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)`
# expect-kind: none
# fix: Metric.update sums hvd.allreduce(val.detach().cpu(), ...), so train_loss.sum holds numbers, not the batches' graphs
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from _device import DEVICE


class _HorovodAllreduce(torch.autograd.Function):
    """One worker's stand-in for horovod.torch's allreduce: averaging over one rank, and
    differentiable like horovod's own (its backward allreduces the gradient)."""

    @staticmethod
    def forward(ctx, tensor, name):
        return tensor.clone()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class hvd:
    @staticmethod
    def size():
        return 1

    @staticmethod
    def allreduce(tensor, name=None):
        return _HorovodAllreduce.apply(tensor, name)


class Args:
    batch_size = 8
    val_batch_size = 8
    epochs = 2
    base_lr = 0.0125
    warmup_epochs = 5
    momentum = 0.9
    wd = 0.00005


args = Args()

train_loader = [(torch.randn(args.batch_size, 3, 8, 8), torch.randint(0, 4, (args.batch_size,)))
                for _ in range(3)]
val_loader = [(torch.randn(args.val_batch_size, 3, 8, 8), torch.randint(0, 4, (args.val_batch_size,)))
              for _ in range(2)]

# Set up a (tiny) stand-in for the standard ResNet-50 model.
model = nn.Sequential(
    nn.Conv2d(3, 4, 3, padding=1),
    nn.BatchNorm2d(4),
    nn.ReLU(inplace=True),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(4, 4),
).to(DEVICE)

# Horovod: scale learning rate by the number of GPUs.
optimizer = optim.SGD(model.parameters(), lr=args.base_lr * hvd.size(),
                      momentum=args.momentum, weight_decay=args.wd)


def train(epoch):
    model.train()
    train_loss = Metric('train_loss')
    train_accuracy = Metric('train_accuracy')

    for batch_idx, (data, target) in enumerate(train_loader):
        adjust_learning_rate(epoch, batch_idx)

        data, target = data.to(DEVICE), target.to(DEVICE)
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()

        train_loss.update(loss)
        train_accuracy.update(accuracy(output, target))
        postfix = {'loss': train_loss.avg.item(),
                   'accuracy': 100. * train_accuracy.avg.item()}
    print('Train Epoch #{}'.format(epoch + 1), postfix)


def validate(epoch):
    model.eval()
    val_loss = Metric('val_loss')
    val_accuracy = Metric('val_accuracy')

    with torch.no_grad():
        for data, target in val_loader:
            data, target = data.to(DEVICE), target.to(DEVICE)
            output = model(data)

            val_loss.update(F.cross_entropy(output, target))
            val_accuracy.update(accuracy(output, target))
            postfix = {'loss': val_loss.avg.item(),
                       'accuracy': 100. * val_accuracy.avg.item()}
    print('Validate Epoch #{}'.format(epoch + 1), postfix)


def adjust_learning_rate(epoch, batch_idx):
    if epoch < args.warmup_epochs:
        epoch += float(batch_idx + 1) / len(train_loader)
        lr_adj = 1. / hvd.size() * (epoch * (hvd.size() - 1) / args.warmup_epochs + 1)
    elif epoch < 30:
        lr_adj = 1.
    else:
        lr_adj = 1e-1
    for param_group in optimizer.param_groups:
        param_group['lr'] = args.base_lr * hvd.size() * lr_adj


def accuracy(output, target):
    # get the index of the max log-probability
    pred = output.max(1, keepdim=True)[1]
    return pred.eq(target.view_as(pred)).cpu().float().mean()


# Horovod: average metrics from distributed training.
class Metric(object):
    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.)
        self.n = torch.tensor(0.)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


for epoch in range(0, args.epochs):
    train(epoch)
    validate(epoch)

print("done")
