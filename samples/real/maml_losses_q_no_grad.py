# source: https://github.com/dragen1860/MAML-Pytorch/issues/40 — issue: with update_step=1, Meta.forward's loss_q = losses_q[-1] / task_num is the query loss accumulated under torch.no_grad(), so loss_q.backward() raises "element 0 of tensors does not require grad"
# fix-source: commenter's diagnosis in the issue (losses_q[-1] is the loss computed under torch.no_grad() when the k-loop is skipped); fix: compute the post-update query loss with grad, as the k-loop does
# expect-kind: no-grad
# expect-culprit: logits_q
import argparse

import numpy as np
import torch
from torch import nn
from torch import optim
from torch.nn import functional as F
from _device import DEVICE


class Learner(nn.Module):
    def __init__(self, config, imgc, imgsz):
        super(Learner, self).__init__()
        self.config = config
        self.vars = nn.ParameterList()
        for name, param in self.config:
            if name == 'linear':
                w = nn.Parameter(torch.ones(*param))
                torch.nn.init.kaiming_normal_(w)
                self.vars.append(w)
                self.vars.append(nn.Parameter(torch.zeros(param[0])))

    def forward(self, x, vars=None, bn_training=True):
        if vars is None:
            vars = self.vars
        idx = 0
        for name, param in self.config:
            if name == 'flatten':
                x = x.view(x.size(0), -1)
            elif name == 'linear':
                w, b = vars[idx], vars[idx + 1]
                x = F.linear(x, w, b)
                idx += 2
            elif name == 'relu':
                x = F.relu(x, inplace=param[0])
        return x

    def parameters(self):
        return self.vars


class Meta(nn.Module):
    def __init__(self, args, config):
        super(Meta, self).__init__()
        self.update_lr = args.update_lr
        self.meta_lr = args.meta_lr
        self.n_way = args.n_way
        self.k_spt = args.k_spt
        self.k_qry = args.k_qry
        self.task_num = args.task_num
        self.update_step = args.update_step
        self.update_step_test = args.update_step_test
        self.net = Learner(config, args.imgc, args.imgsz)
        self.meta_optim = optim.Adam(self.net.parameters(), lr=self.meta_lr)

    def forward(self, x_spt, y_spt, x_qry, y_qry):
        task_num, setsz, c_, h, w = x_spt.size()
        querysz = x_qry.size(1)

        losses_q = [0 for _ in range(self.update_step + 1)]  # losses_q[i] is the loss on step i
        corrects = [0 for _ in range(self.update_step + 1)]

        for i in range(task_num):
            logits = self.net(x_spt[i], vars=None, bn_training=True)
            loss = F.cross_entropy(logits, y_spt[i])
            grad = torch.autograd.grad(loss, self.net.parameters())
            fast_weights = list(map(lambda p: p[1] - self.update_lr * p[0], zip(grad, self.net.parameters())))

            # this is the loss and accuracy before first update
            with torch.no_grad():
                logits_q = self.net(x_qry[i], self.net.parameters(), bn_training=True)
                loss_q = F.cross_entropy(logits_q, y_qry[i])
                losses_q[0] += loss_q
                pred_q = F.softmax(logits_q, dim=1).argmax(dim=1)
                correct = torch.eq(pred_q, y_qry[i]).sum().item()
                corrects[0] = corrects[0] + correct

            # this is the loss and accuracy after the first update
            with torch.no_grad():
                logits_q = self.net(x_qry[i], fast_weights, bn_training=True)  # culprit
                loss_q = F.cross_entropy(logits_q, y_qry[i])
                losses_q[1] += loss_q
                pred_q = F.softmax(logits_q, dim=1).argmax(dim=1)
                correct = torch.eq(pred_q, y_qry[i]).sum().item()
                corrects[1] = corrects[1] + correct

            for k in range(1, self.update_step):
                logits = self.net(x_spt[i], fast_weights, bn_training=True)
                loss = F.cross_entropy(logits, y_spt[i])
                grad = torch.autograd.grad(loss, fast_weights)
                fast_weights = list(map(lambda p: p[1] - self.update_lr * p[0], zip(grad, fast_weights)))

                logits_q = self.net(x_qry[i], fast_weights, bn_training=True)
                loss_q = F.cross_entropy(logits_q, y_qry[i])
                losses_q[k + 1] += loss_q

                with torch.no_grad():
                    pred_q = F.softmax(logits_q, dim=1).argmax(dim=1)
                    correct = torch.eq(pred_q, y_qry[i]).sum().item()
                    corrects[k + 1] = corrects[k + 1] + correct

        # end of all tasks
        # sum over all losses on query set across all tasks
        loss_q = losses_q[-1] / task_num

        # optimize theta parameters
        self.meta_optim.zero_grad()
        loss_q.backward()
        self.meta_optim.step()

        accs = np.array(corrects) / (querysz * task_num)
        return accs


args = argparse.Namespace(update_lr=0.4, meta_lr=1e-2, n_way=3, k_spt=1, k_qry=2, task_num=2,
                          update_step=1, update_step_test=2, imgc=1, imgsz=3)
config = [('flatten', []), ('linear', [16, args.imgc * args.imgsz * args.imgsz]), ('relu', [True]),
          ('linear', [args.n_way, 16])]
maml = Meta(args, config).to(DEVICE)

for step in range(4):
    x_spt = torch.randn(args.task_num, args.n_way * args.k_spt, args.imgc, args.imgsz, args.imgsz, device=DEVICE)
    y_spt = torch.arange(args.n_way, device=DEVICE).repeat(args.task_num, args.k_spt)
    x_qry = torch.randn(args.task_num, args.n_way * args.k_qry, args.imgc, args.imgsz, args.imgsz, device=DEVICE)
    y_qry = torch.arange(args.n_way, device=DEVICE).repeat(args.task_num, args.k_qry)
    accs = maml(x_spt, y_spt, x_qry, y_qry)
print("done")
