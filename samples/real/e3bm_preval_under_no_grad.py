# source: https://github.com/yaoyao-liu/e3bm/issues/4 — pre-train phase: meta-style validation under torch.no_grad() fails in torch.autograd.grad
# fix-source: maintainer's commit https://github.com/yaoyao-liu/e3bm/commit/01c9946957ba5eec9e64a83b84ee5c73785ea35d (drops the no_grad around the validation loop)
# expect-kind: no-grad
# expect-culprit: logits
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class Args:
    way = 2
    shot = 1
    query = 2
    num_class = 4
    temperature = 12.5
    base_lr = 0.1
    base_epoch = 2
    lr = 0.1
    step_size = 10
    gamma = 0.5
    max_epoch = 3
    val_epoch = 2
    num_gpu = 1


def count_acc(logits, label):
    pred = F.softmax(logits, dim=1).argmax(dim=1)
    return (pred == label).float().mean().item()


class Averager():
    def __init__(self):
        self.n = 0
        self.v = 0

    def add(self, x):
        self.v = (self.v * self.n + x) / (self.n + 1)
        self.n += 1

    def item(self):
        return self.v


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(F.relu(self.conv(x))).flatten(1)


class BaseLearner(nn.Module):
    def __init__(self, args, z_dim):
        super().__init__()
        self.args = args
        self.z_dim = z_dim
        self.vars = nn.ParameterList()
        self.fc1_w = nn.Parameter(torch.ones([self.args.way, self.z_dim]))
        torch.nn.init.kaiming_normal_(self.fc1_w)
        self.vars.append(self.fc1_w)

    def forward(self, input_x, the_vars=None):
        if the_vars is None:
            the_vars = self.vars
        fc1_w = the_vars[0]
        net = F.linear(F.normalize(input_x, p=2, dim=1), F.normalize(fc1_w, p=2, dim=1))
        return net

    def parameters(self):
        return self.vars


class MetaModel(nn.Module):
    def __init__(self, args, dropout=0.2, mode='meta'):
        super().__init__()
        self.args = args
        self.mode = mode
        self.init_backbone()
        self.base_learner = BaseLearner(args, self.z_dim)
        self.update_lr = self.args.base_lr
        self.update_step = self.args.base_epoch
        self.label_shot = torch.arange(self.args.way).repeat(self.args.shot).to(DEVICE)

    def init_backbone(self):
        self.encoder = ResNet()
        self.z_dim = 16
        if self.mode == 'pre':
            self.fc = nn.Sequential(nn.Linear(self.z_dim, self.args.num_class))

    def forward(self, inputs):
        return self.pretrain_forward(inputs)

    def pretrain_forward(self, input):
        return self.fc(self.encoder(input))

    def normalize_feature(self, x):
        x = x - x.mean(-1).unsqueeze(-1)
        return x

    def preval_forward(self, data_shot, data_query):
        data_query = data_query.squeeze(0)
        data_shot = data_shot.squeeze(0)

        embedding_query = self.encoder(data_query)
        embedding_shot = self.encoder(data_shot)
        embedding_shot = self.normalize_feature(embedding_shot)
        embedding_query = self.normalize_feature(embedding_query)

        with torch.no_grad():
            proto = embedding_shot
            self.base_learner.fc1_w.data = proto

        fast_weights = self.base_learner.vars
        logits_q = self.base_learner(embedding_query, fast_weights)
        total_logits = 0.0 * logits_q

        for k in range(0, self.update_step):
            batch_shot = embedding_shot
            batch_label = self.label_shot
            logits = self.base_learner(batch_shot, fast_weights) * self.args.temperature  # culprit
            loss = F.cross_entropy(logits, batch_label)
            grad = torch.autograd.grad(loss, fast_weights)
            fast_weights = list(map(lambda p: p[1] - 0.1 * p[0], zip(grad, fast_weights)))
            logits_q = self.base_learner(embedding_query, fast_weights)
            logits_q = logits_q * self.args.temperature
            total_logits += logits_q
        return total_logits


class MetaTrainer(object):
    def __init__(self, args):
        self.args = args
        self.model = MetaModel(args, mode='pre').to(DEVICE)
        self.train_loader = [(torch.randn(8, 3, 8, 8), torch.randint(0, args.num_class, (8,))) for _ in range(3)]
        self.val_loader = [(torch.randn(args.way * (args.shot + args.query), 3, 8, 8), None) for _ in range(2)]
        self.optimizer = torch.optim.SGD([{'params': self.model.encoder.parameters(), 'lr': args.lr},
                                          {'params': self.model.fc.parameters(), 'lr': args.lr}],
                                         momentum=0.9, nesterov=True, weight_decay=0.0005)
        self.lr_scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=args.step_size, gamma=args.gamma)

    def pre_train(self):
        model = self.model
        args = self.args
        lr_scheduler = self.lr_scheduler
        optimizer = self.optimizer
        trlog = {'train_loss': [], 'val_loss': [], 'train_acc': [], 'val_acc': [], 'max_acc': 0.0}

        label = torch.arange(args.way).repeat(args.query).to(DEVICE)

        for epoch in range(1, args.max_epoch + 1):
            model = model.train()
            model.mode = 'pre'
            tl = Averager()
            ta = Averager()
            for i, batch in enumerate(self.train_loader, 1):
                data, train_label = [_.to(DEVICE) for _ in batch]
                logits = model(data)
                loss = F.cross_entropy(logits, train_label)
                acc = count_acc(logits, train_label)
                total_loss = loss
                tl.add(total_loss.item())
                ta.add(acc)
                optimizer.zero_grad()
                total_loss.backward()
                optimizer.step()
            tl = tl.item()
            ta = ta.item()

            model = model.eval()
            model.mode = 'meta'
            vl = Averager()
            va = Averager()
            if epoch < args.val_epoch:
                vl = 0
                va = 0
            else:
                with torch.no_grad():
                    for i, batch in enumerate(self.val_loader, 1):
                        data = batch[0].to(DEVICE)
                        p = args.shot * args.way
                        data_shot, data_query = data[:p], data[p:]
                        data_shot = data_shot.unsqueeze(0).repeat(args.num_gpu, 1, 1, 1, 1)
                        logits = model.preval_forward(data_shot, data_query)
                        loss = F.cross_entropy(logits, label)
                        acc = count_acc(logits, label)
                        vl.add(loss.item())
                        va.add(acc)
                vl = vl.item()
                va = va.item()
            if va >= trlog['max_acc']:
                trlog['max_acc'] = va
            trlog['train_loss'].append(tl)
            trlog['train_acc'].append(ta)
            trlog['val_loss'].append(vl)
            trlog['val_acc'].append(va)
            lr_scheduler.step()


trainer = MetaTrainer(Args())
trainer.pre_train()
print("done")
