# source: https://github.com/databricks/megablocks/pull/70 — MoE training with moe_normalize_expert_weights set fails in backward: "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.cuda.FloatTensor [8192, 2]], which is output 0 of DivBackward0, is at version 1; expected version 0 instead"
# fix-source: https://github.com/databricks/megablocks/commit/46567ec7f461e8727334f918437ac87ed5ab9d9c — maintainers' merged fix (#70): LearnedRouter.forward normalizes with `expert_weights = expert_weights / torch.norm(...)` instead of the in-place `/=`
# expect-kind: inplace-modified
# expect-culprit: expert_weights
import dataclasses
from functools import partial
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F

from _device import DEVICE

# Type annotation for in-place Tensor initialization function.
InitFn = Callable[[torch.Tensor], None]

DEFAULT_ACTIVATION_FN = partial(F.gelu, approximate="tanh")


@dataclasses.dataclass
class Arguments:
    # Model arguments.
    hidden_size: int = 16
    ffn_hidden_size: int = 32
    num_layers: int = 1
    bias: bool = True
    return_bias: bool = False
    activation_fn: Optional[Callable] = DEFAULT_ACTIVATION_FN

    # MoE arguments.
    moe_num_experts: int = 4
    moe_top_k: int = 2
    moe_capacity_factor: int = 0
    moe_normalize_expert_weights: Optional[Union[int, float]] = 1
    moe_loss_weight: float = 0.1
    moe_jitter_eps: Optional[float] = 0.01

    # Initialization arguments.
    device: torch.device = DEVICE
    init_method: InitFn = partial(torch.nn.init.normal_, mean=0.0, std=0.02)
    output_layer_init_method: InitFn = init_method

    # Benchmarking arguments.
    uniform_expert_assignment: bool = False


_LOAD_BALANCING_LOSS = []


def save_load_balancing_loss(loss):
    _LOAD_BALANCING_LOSS.append(loss)


def get_load_balancing_loss():
    return _LOAD_BALANCING_LOSS


def clear_load_balancing_loss():
    _LOAD_BALANCING_LOSS.clear()


def batched_load_balancing_loss(args: Arguments):
    # tokens_per_expert[i].shape = (num_experts)
    # expert_scores[i].shape = (tokens, num_experts)
    tokens_per_expert, expert_scores = zip(*get_load_balancing_loss())
    assert len(tokens_per_expert) == args.num_layers
    tokens = expert_scores[0].shape[0]
    expert_scores = torch.cat(expert_scores, dim=1).mean(dim=0)
    tokens_per_expert = torch.cat(tokens_per_expert).to(expert_scores.dtype)
    # loss_weight * num_experts / (num_layers * tokens * top_k)
    scale = (args.moe_num_experts * args.moe_loss_weight) / (args.num_layers * tokens * args.moe_top_k)
    return scale * torch.dot(tokens_per_expert, expert_scores)


class _UniformExpertAssignment(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, num_experts):
        out = torch.arange(x.numel(), dtype=x.dtype, device=x.device)
        out = torch.remainder(out, num_experts)
        return out.view(x.shape)


_uniform_expert_assignment = _UniformExpertAssignment.apply


class LearnedRouter(torch.nn.Module):
    def __init__(self, args: Arguments):
        super().__init__()
        self.args = args
        # Learned router parameters (not parallelized with expert model parallelism).
        self.layer = torch.nn.Linear(args.hidden_size, args.moe_num_experts, bias=False, device=args.device)
        args.init_method(self.layer.weight)

    def jitter(self, x):
        low = 1.0 - self.args.moe_jitter_eps
        high = 1.0 + self.args.moe_jitter_eps
        noise = torch.rand(x.size(), dtype=x.dtype, device=x.device)
        return low + noise * (high - low)

    def _top_k(self, scores):
        if self.args.moe_top_k == 1:
            return scores.max(dim=-1)
        return torch.topk(scores, self.args.moe_top_k, dim=-1)

    def forward(self, x):
        if self.training and self.args.moe_jitter_eps is not None:
            x = x * self.jitter(x)

        scores = self.layer(x.view(-1, x.shape[-1])).softmax(dim=-1)
        expert_weights, expert_indices = self._top_k(scores)  # culprit
        if self.args.moe_normalize_expert_weights:
            expert_weights /= torch.norm(
                expert_weights, p=self.args.moe_normalize_expert_weights, dim=-1, keepdim=True)

        expert_indices = (
            _uniform_expert_assignment(expert_indices, self.args.moe_num_experts)
            if self.args.uniform_expert_assignment else expert_indices
        )
        return scores, expert_weights, expert_indices


class MLP(torch.nn.Module):
    def __init__(self, args: Arguments):
        super().__init__()
        self.args = args
        self.w1 = torch.nn.Parameter(torch.empty(
            args.moe_num_experts, args.hidden_size, args.ffn_hidden_size, device=args.device))
        self.w2 = torch.nn.Parameter(torch.empty(
            args.moe_num_experts, args.ffn_hidden_size, args.hidden_size, device=args.device))
        with torch.no_grad():
            args.init_method(self.w1)
            args.output_layer_init_method(self.w2)

    def forward(self, x):
        x = torch.bmm(x, self.w1)
        x = self.args.activation_fn(x)
        return torch.bmm(x, self.w2)


def binned_gather(x, indices, bins, expert_capacity, top_k):
    # x: [tokens, hs] -> [num_experts, expert_capacity, hs], tokens grouped by expert.
    out = []
    start = 0
    for end in bins.tolist():
        n = min(end - start, expert_capacity)
        out.append(F.pad(x[indices[start:start + n] // top_k], (0, 0, 0, expert_capacity - n)))
        start = end
    return torch.stack(out)


def binned_scatter(x, indices, weights, bins, top_k):
    # x: [num_experts, expert_capacity, hs] -> [tokens, hs], scaled by the router weights.
    num_tokens = indices.numel() // top_k
    out = x.new_zeros(num_tokens, x.shape[2])
    start = 0
    for i, end in enumerate(bins.tolist()):
        n = min(end - start, x.shape[1])
        entries = indices[start:start + n]
        out = out.index_add(0, entries // top_k, x[i, :n] * weights[entries].unsqueeze(1))
        start = end
    return out


class ParallelMLP(torch.nn.Module):
    def __init__(self, args: Arguments):
        super().__init__()
        self.args = args
        self.num_experts = args.moe_num_experts
        self.top_k = self.args.moe_top_k

        # Expert MLP.
        self.mlp = MLP(args)

        if self.args.bias:
            self.bias = torch.nn.Parameter(torch.zeros(args.hidden_size, device=args.device))
        else:
            self.register_parameter('bias', None)

        self.forward_fn = self.forward_once

    def expert_capacity(self, tokens):
        tokens_per_expert = self.top_k * tokens / self.num_experts
        return int(self.args.moe_capacity_factor * tokens_per_expert)

    def indices_and_bins(self, top_expert):
        # Sort the expert ids to produce the scatter/gather indices for the permutation.
        top_expert = top_expert.int()
        bin_ids, indices = torch.sort(top_expert, stable=True)
        # Histogram the expert ids to identify the number of tokens routed to each expert.
        tokens_per_expert = torch.bincount(top_expert, minlength=self.num_experts)
        # Calculate the bin bounds for the sorted tokens.
        bins = torch.cumsum(tokens_per_expert, 0)
        return indices, bin_ids, bins, tokens_per_expert

    def permute_and_compute(self, x, tokens_per_expert, indices, bin_ids, expert_weights, bins,
                            expert_capacity, top_k):
        # Route the tokens for MoE computation.
        x = x.view(-1, x.shape[-1])
        x = binned_gather(x, indices, bins, expert_capacity, top_k)

        # Perform the expert computation.
        x = self.mlp(x)

        # Un-route the data for the MoE output.
        return binned_scatter(x, indices, expert_weights, bins, top_k)

    def forward_once(self, x, expert_weights, top_experts):
        # x: [sl, bs, hs]
        # expert_weights: [sl * bs, top-k]
        # top_experts: [sl * bs, top-k]
        expert_weights = expert_weights.flatten()
        top_experts = top_experts.flatten()
        with torch.no_grad():
            indices, bin_ids, bins, tokens_per_expert = self.indices_and_bins(top_experts)

            # If expert_capacity is set to zero, set the number of tokens
            # per expert to the maximum we need to avoid dropping tokens.
            sl, bs, hs = x.size()
            expert_capacity = self.expert_capacity(sl * bs)
            if expert_capacity == 0:
                expert_capacity = torch.max(tokens_per_expert).item()

        x = self.permute_and_compute(
            x, tokens_per_expert, indices, bin_ids, expert_weights, bins, expert_capacity, self.top_k)
        return x, tokens_per_expert

    def forward(self, x, scores, expert_weights, top_experts):
        in_shape = x.size()

        # Compute the experts.
        x, tokens_per_expert = self.forward_fn(x, expert_weights, top_experts)
        if self.training:
            save_load_balancing_loss((tokens_per_expert, scores))
        x = x.view(in_shape)
        if self.bias is not None:
            if self.args.return_bias:
                return x, self.bias
            return x + self.bias
        return x


class MoE(torch.nn.Module):
    def __init__(self, args: Arguments):
        super().__init__()
        # Token router.
        self.router = LearnedRouter(args)
        # Expert computation helper.
        self.experts = ParallelMLP(args)

    def forward(self, x):
        # Compute the expert scores and assignments.
        scores, expert_weights, top_experts = self.router(x)
        # Compute the experts.
        return self.experts(x, scores, expert_weights, top_experts)


def main():
    args = Arguments()
    model = MoE(args)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sl, bs = 6, 2
    for step in range(4):
        x = torch.randn(sl, bs, args.hidden_size, device=DEVICE)
        target = torch.randn(sl, bs, args.hidden_size, device=DEVICE)
        out = model(x)
        loss = F.mse_loss(out, target) + batched_load_balancing_loss(args)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        clear_load_balancing_loss()
    print("done")


if __name__ == "__main__":
    main()
