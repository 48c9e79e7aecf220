# source: https://github.com/k2-fsa/k2/pull/1106 — PR "Removing inplace grad multiplication to allow retain_graph in backprop": an rnnt loss back-propagated twice (retain_graph=True, one backward per optimizer) fails with "[2, 8, 17] is at version 1; expected version 0"
# fix-source: https://github.com/k2-fsa/k2/commit/ee99cc4440f31c745de766771a7a245008d27019 — merged fix: px_grad = px_grad * ans_grad (and py_grad) in MutualInformationRecursionFunction.backward
# expect-kind: none
# fix: MutualInformationRecursionFunction.backward scales out of place (px_grad = px_grad * ans_grad, py_grad likewise), as k2 did in ee99cc4
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from _device import DEVICE


def _mutual_information_forward(px, py, boundary, p):
    # stands in for the C++/CUDA kernel _k2.mutual_information_forward (boundary=None only)
    B, S, T1 = px.shape
    T = py.shape[-1]
    p[:, 0, 0] = 0.0
    for s in range(S + 1):
        for t in range(T + 1):
            if s == 0 and t == 0:
                continue
            if s == 0:
                p[:, s, t] = p[:, s, t - 1] + py[:, s, t - 1]
            elif t == 0:
                p[:, s, t] = p[:, s - 1, t] + px[:, s - 1, t]
            else:
                p[:, s, t] = torch.logaddexp(p[:, s - 1, t] + px[:, s - 1, t], p[:, s, t - 1] + py[:, s, t - 1])
    return p[:, S, T].clone()


def _mutual_information_backward(px, py, boundary, p, ans_grad):
    # stands in for the C++/CUDA kernel _k2.mutual_information_backward: occupation probabilities
    with torch.enable_grad():
        px_, py_ = px.detach().requires_grad_(), py.detach().requires_grad_()
        ans = _mutual_information_forward(px_, py_, boundary, torch.empty_like(p))
        px_grad, py_grad = torch.autograd.grad((ans * ans_grad).sum(), [px_, py_])
    return px_grad.clone(), py_grad.clone()  # new tensors, as the kernel returns


class MutualInformationRecursionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, px: torch.Tensor, py: torch.Tensor, pxy_grads: List[Optional[torch.Tensor]],
                boundary: Optional[torch.Tensor] = None, return_grad: bool = False) -> torch.Tensor:
        (B, S, T1) = px.shape
        T = py.shape[-1]
        assert T1 in [T, T + 1], (T1, T)
        assert py.shape == (B, S + 1, T), (py.shape, S, T)

        p = torch.empty(B, S + 1, T + 1, device=px.device, dtype=px.dtype)

        ans = _mutual_information_forward(px, py, boundary, p)

        px_grad, py_grad = None, None
        if return_grad or px.requires_grad or py.requires_grad:
            ans_grad = torch.ones(B, device=px.device, dtype=px.dtype)
            (px_grad, py_grad) = _mutual_information_backward(px, py, boundary, p, ans_grad)
            ctx.save_for_backward(px_grad, py_grad)
        assert len(pxy_grads) == 2, len(pxy_grads)
        pxy_grads[0] = px_grad
        pxy_grads[1] = py_grad

        return ans

    @staticmethod
    def backward(ctx, ans_grad: Tensor) -> Tuple[torch.Tensor, torch.Tensor, None, None, None]:
        (px_grad, py_grad) = ctx.saved_tensors
        (B,) = ans_grad.shape
        ans_grad = ans_grad.reshape(B, 1, 1)  # (B, 1, 1)
        px_grad = px_grad * ans_grad
        py_grad = py_grad * ans_grad
        return (px_grad, py_grad, None, None, None)


def mutual_information_recursion(px: Tensor, py: Tensor, boundary: Optional[Tensor] = None,
                                 return_grad: bool = False):
    assert px.ndim == 3, px.shape
    B, S, T1 = px.shape
    T = py.shape[-1]
    assert px.shape[-1] in [T, T + 1], (px.shape, T)
    assert py.shape == (B, S + 1, T), (py.shape, B, S, T)
    px, py = px.contiguous(), py.contiguous()

    pxy_grads = [None, None]
    scores = MutualInformationRecursionFunction.apply(px, py, pxy_grads, boundary, return_grad)
    px_grad, py_grad = pxy_grads
    return (scores, (px_grad, py_grad)) if return_grad else scores


def get_rnnt_logprobs(lm: Tensor, am: Tensor, symbols: Tensor, termination_symbol: int,
                      boundary: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    (B, T, C) = am.shape
    S = lm.shape[1] - 1
    assert symbols.shape == (B, S)

    am_max, _ = torch.max(am, dim=2, keepdim=True)  # (B, T, 1)
    lm_max, _ = torch.max(lm, dim=2, keepdim=True)  # (B, S + 1, 1)
    am_probs = (am - am_max).exp()
    lm_probs = (lm - lm_max).exp()
    normalizers = (torch.matmul(lm_probs, am_probs.transpose(1, 2)) + torch.finfo(am_probs.dtype).tiny).log()
    normalizers = normalizers + lm_max + am_max.transpose(1, 2)  # (B, S + 1, T)

    px_am = torch.gather(am.unsqueeze(1).expand(B, S, T, C), dim=3,
                         index=symbols.reshape(B, S, 1, 1).expand(B, S, T, 1)).squeeze(-1)  # (B, S, T)
    px_am = torch.cat((px_am, torch.full((B, S, 1), float("-inf"), device=am.device, dtype=am.dtype)), dim=2)
    px_lm = torch.gather(lm[:, :S], dim=2, index=symbols.unsqueeze(-1))  # (B, S, 1)
    px = px_am + px_lm  # (B, S, T + 1)
    px[:, :, :T] -= normalizers[:, :S, :]

    py_am = am[:, :, termination_symbol].unsqueeze(1)  # (B, 1, T)
    py_lm = lm[:, :, termination_symbol].unsqueeze(2)  # (B, S + 1, 1)
    py = py_am + py_lm - normalizers  # (B, S + 1, T)
    return (px, py)


def rnnt_loss_simple(lm: Tensor, am: Tensor, symbols: Tensor, termination_symbol: int,
                     boundary: Optional[Tensor] = None, reduction: str = "mean") -> Tensor:
    px, py = get_rnnt_logprobs(lm=lm, am=am, symbols=symbols, termination_symbol=termination_symbol,
                               boundary=boundary)
    scores = mutual_information_recursion(px=px, py=py, boundary=boundary)
    negated_loss = -scores
    if reduction == "sum":
        return torch.sum(negated_loss)
    return torch.mean(negated_loss)


B, S, T, C, F = 2, 3, 4, 5, 6
encoder = torch.nn.Sequential(torch.nn.Linear(F, 8), torch.nn.Tanh(), torch.nn.Linear(8, C)).to(DEVICE)
decoder = torch.nn.Sequential(torch.nn.Embedding(C, 8), torch.nn.Linear(8, C)).to(DEVICE)
optimizer_am = torch.optim.Adam(encoder.parameters(), lr=1e-2)
optimizer_lm = torch.optim.Adam(decoder.parameters(), lr=1e-2)
termination_symbol = 0

for step in range(4):
    features = torch.randn(B, T, F, device=DEVICE)
    symbols = torch.randint(1, C, (B, S), device=DEVICE)
    sos_symbols = torch.cat([torch.full((B, 1), termination_symbol, device=DEVICE, dtype=torch.long), symbols], dim=1)
    am = encoder(features)
    lm = decoder(sos_symbols)
    loss = rnnt_loss_simple(lm=lm, am=am, symbols=symbols, termination_symbol=termination_symbol, reduction="sum")
    optimizer_am.zero_grad()
    loss.backward(retain_graph=True, inputs=list(encoder.parameters()))
    optimizer_lm.zero_grad()
    loss.backward(inputs=list(decoder.parameters()))
    optimizer_am.step()
    optimizer_lm.step()
print("done")
