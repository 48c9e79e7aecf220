# source: https://github.com/rballester/tntorch/pull/19 — merged PR "Fixed errors on GPU. Removed annoying memory leak.": in tntorch.optimize "there was a dangerous memory leak in loss_history. Every added loss used to be a full computational graph" (losses.append(...) of the undetached total loss, backward(retain_graph=True) on it), so memory grows every iteration; no error is raised
# fix-source: https://github.com/rballester/tntorch/commit/67f8679d11dab834e945de0fb114237b7b197e2c — "Fixed memory leak in loss history" (PR #19, merged by the maintainer): total_loss = sum(loss); backward and step right away; losses.append(total_loss.detach())
# expect-kind: graph-growth
# expect-culprit: losses
import time
from functools import reduce

import torch
from _device import DEVICE


class Tensor:
    # stand-in for tn.Tensor: a tensor train with `cores` (and no Tucker factors `Us`)
    def __init__(self, cores):
        self.cores = cores
        self.Us = [None] * len(cores)

    def dim(self):
        return len(self.cores)

    def full(self):
        result = self.cores[0][0]
        for core in self.cores[1:]:
            result = torch.tensordot(result, core, dims=([-1], [0]))
        return result[..., 0]


def optimize(tensors, loss_function, optimizer=torch.optim.Adam, tol=1e-4, max_iter=1e4, print_freq=500, verbose=True):
    """
    High-level wrapper for iterative learning.

    Default stopping criterion: either the absolute (or relative) loss improvement must fall below `tol`.
    In addition, the rate loss improvement must be slowing down.
    """

    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    parameters = []
    for t in tensors:
        if isinstance(t, Tensor):
            parameters.extend([c for c in t.cores if c.requires_grad])
            parameters.extend([U for U in t.Us if U is not None and U.requires_grad])
        elif t.requires_grad:
            parameters.append(t)
    if len(parameters) == 0:
        raise ValueError("There are no parameters to optimize. Did you forget a requires_grad=True somewhere?")

    optimizer = optimizer(parameters)
    losses = []
    converged = False
    start = time.time()
    iter = 0
    while True:
        optimizer.zero_grad()
        loss = loss_function(*tensors)
        if not isinstance(loss, (tuple, list)):
            loss = [loss]
        losses.append(reduce(lambda x, y: x + y, loss))  # culprit
        if len(losses) >= 2:
            delta_loss = (losses[-1] - losses[-2])
        else:
            delta_loss = float('-inf')
        if iter >= 2 and tol is not None and (losses[-1] <= tol or -delta_loss / losses[-1] <= tol) and losses[-2] - \
                losses[-1] < losses[-3] - losses[-2]:
            converged = True
            break
        if iter == max_iter:
            break
        if verbose and iter % print_freq == 0:
            print('iter: {: <{}} | loss: '.format(iter, len('{}'.format(max_iter))), end='')
            print(' + '.join(['{:10.6f}'.format(l.item()) for l in loss]), end='')
            if len(loss) > 1:
                print(' = {:10.4}'.format(losses[-1].item()), end='')
            print(' | total time: {:9.4f}'.format(time.time() - start))
        losses[-1].backward(retain_graph=True)
        optimizer.step()
        iter += 1
    if verbose:
        print('iter: {: <{}} | loss: '.format(iter, len('{}'.format(max_iter))), end='')
        print(' + '.join(['{:10.6f}'.format(l.item()) for l in loss]), end='')
        if len(loss) > 1:
            print(' = {:10.4}'.format(losses[-1].item()), end='')
        print(' | total time: {:9.4f}'.format(time.time() - start), end='')
        if converged:
            print(' <- converged (tol={})'.format(tol))
        else:
            print(' <- max_iter was reached: {}'.format(max_iter))


if __name__ == "__main__":
    torch.manual_seed(0)
    gt = torch.randn(4, 4, 4, device=DEVICE)
    t = Tensor([torch.randn(1, 4, 2, device=DEVICE, requires_grad=True),
                torch.randn(2, 4, 2, device=DEVICE, requires_grad=True),
                torch.randn(2, 4, 1, device=DEVICE, requires_grad=True)])

    def loss_function(t):
        # tensor-train fit of gt, plus a small penalty on the cores (a tuple of loss terms)
        return torch.norm(t.full() - gt) ** 2, 1e-3 * sum(torch.sum(c ** 2) for c in t.cores)

    optimize(t, loss_function, tol=None, max_iter=5, verbose=False)
    print("done")
