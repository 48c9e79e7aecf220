# source: https://github.com/Liuhong99/Sophia/issues/1 — SophiaG training: loss_sampled.backward() for the Hessian estimate fails with "backward through the graph a second time"
# fix-source: reporter's resolution in the thread: feed the batch to the model again in a separate function for the Hessian update
# expect-kind: none
# fix: run the model on the same batch again for the Hessian estimate instead of reusing the training step's logits
import torch
import torch.nn.functional as F
from torch.optim.optimizer import Optimizer
from _device import DEVICE


class SophiaG(Optimizer):
    def __init__(self, params, lr=1e-2, betas=(0.965, 0.99), rho=0.04, weight_decay=1e-1):
        super().__init__(params, dict(lr=lr, betas=betas, rho=rho, weight_decay=weight_decay))

    @torch.no_grad()
    def update_hessian(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "hessian" not in state:
                    state["hessian"] = torch.zeros_like(p)
                state["hessian"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)

    @torch.no_grad()
    def step(self, bs=512):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state.setdefault("hessian", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                ratio = (state["exp_avg"].abs() / (group["rho"] * bs * state["hessian"] + 1e-15)).clamp(None, 1)
                p.addcmul_(state["exp_avg"].sign(), ratio, value=-group["lr"])


class GPT(torch.nn.Module):
    def __init__(self, vocab_size=11, n_embd=16):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab_size, n_embd)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(n_embd, n_embd), torch.nn.GELU())
        self.lm_head = torch.nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.mlp(self.wte(idx)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def get_batch():
    data = torch.randint(0, 11, (4, 9), device=DEVICE)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


model = GPT().to(DEVICE)
optimizer = SophiaG(model.parameters())
hess_interval = 2
for iter_num in range(4):
    X, Y = get_batch()
    logits, loss = model(X, Y)
    loss.backward()
    optimizer.step(bs=4 * 8)
    optimizer.zero_grad(set_to_none=True)

    if iter_num % hess_interval == hess_interval - 1:
        logits, _ = model(X)
        samp_dist = torch.distributions.Categorical(logits=logits)
        y_sample = samp_dist.sample()
        loss_sampled = F.cross_entropy(logits.view(-1, logits.size(-1)), y_sample.view(-1), ignore_index=-1)
        loss_sampled.backward()
        optimizer.update_hessian()
        optimizer.zero_grad(set_to_none=True)
print("done")
