# source: https://github.com/davda54/sam/issues/10 — a commenter's multi-task SAM loop sums the task losses into `loss` in both passes
# fix-source: expert fix (the thread gives no patch): start the second pass's sum from 0 again
# expect-kind: none
# fix: reset the accumulator (`loss = 0`) before summing the second pass's task losses
import torch
import torch.nn.functional as F
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
                p.add_(e_w)  # climb to the local maximum "w + e(w)"
                self.state[p]["e_w"] = e_w
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(self.state[p]["e_w"])  # back to "w"
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()


class Classifier(torch.nn.Module):
    def __init__(self, num_tasks):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU())
        self.heads = torch.nn.ModuleList(torch.nn.Linear(16, 1) for _ in range(num_tasks))

    def forward(self, image):
        feat = self.backbone(image)
        logit_map = feat.mean(1, keepdim=True)
        return [head(feat) for head in self.heads], logit_map


def get_loss(output, target, index, device, cfg):
    target = target[:, index].to(device)
    loss = F.binary_cross_entropy_with_logits(output[index].view(-1), target) * cfg["weight"]
    acc = ((output[index].view(-1) > 0).float() == target).float().mean()
    return loss, acc


num_tasks = 3
cfg = {"weight": 1.0}
device = DEVICE
model = Classifier(num_tasks).to(DEVICE)
optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
loss_sum = [0.0] * num_tasks
acc_sum = [0.0] * num_tasks

for step in range(4):
    image = torch.randn(8, 10, device=DEVICE)
    target = (torch.rand(8, num_tasks, device=DEVICE) > 0.5).float()
    output, logit_map = model(image)

    loss = 0
    for t in range(num_tasks):
        loss_t, acc_t = get_loss(output, target, t, device, cfg)
        loss += loss_t
        loss_sum[t] += loss_t.item()
        acc_sum[t] += acc_t.item()

    optimizer.zero_grad()
    loss.backward()
    optimizer.first_step(zero_grad=True)
    output, logit_map = model(image)
    loss = 0
    for t in range(num_tasks):
        loss_t, acc_t = get_loss(output, target, t, device, cfg)
        loss += loss_t
        loss_sum[t] += loss_t.item()
        acc_sum[t] += acc_t.item()
    loss.backward()
    optimizer.second_step(zero_grad=True)
print("done")
