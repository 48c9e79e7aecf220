# source: https://github.com/goodfire-ai/spd/pull/252 — PR "fix: Graph freed by pgd loss before backward": the PGD recon loss's last forward goes through _pgd_fwd_bwd, whose torch.autograd.grad frees the graph that the total loss back-propagates later
# fix-source: https://github.com/goodfire-ai/spd/commit/c9cf47d213e283765f5628c45c320923adb63399 — merged fix: a forward-only _forward_with_adv_sources; autograd.grad only in the PGD steps; the final loss is a plain forward
# expect-kind: second-backward
# expect-culprit: sum_loss
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn as nn
from _device import DEVICE


def all_reduce(tensor, op="sum"):
    return tensor  # one process: nothing to reduce


def calc_sum_recon_loss_lm(pred, target, loss_type):
    match loss_type:
        case "mse":
            return ((pred - target) ** 2).sum()
        case "kl":
            return torch.nn.functional.kl_div(pred.log_softmax(-1), target.log_softmax(-1), log_target=True, reduction="sum")


@dataclass
class ComponentsMaskInfo:
    component_mask: torch.Tensor
    weight_delta_and_mask: tuple | None = None


def make_mask_infos(component_masks, routing_masks="all", weight_deltas_and_masks=None):
    return {name: ComponentsMaskInfo(component_masks[name],
                                     None if weight_deltas_and_masks is None else weight_deltas_and_masks[name])
            for name in component_masks}


class LinearComponents(nn.Module):
    def __init__(self, C, d_in, d_out):
        super().__init__()
        self.C = C
        self.V = nn.Parameter(torch.randn(d_in, C) / d_in ** 0.5)
        self.U = nn.Parameter(torch.randn(C, d_out) / C ** 0.5)

    @property
    def weight(self):
        return (self.V @ self.U).T  # (d_out, d_in), like nn.Linear

    def get_inner_acts(self, x):
        return x @ self.V

    def forward(self, x, mask):
        return (self.get_inner_acts(x) * mask) @ self.U


class MLPCiFn(nn.Module):
    def __init__(self, C, hidden):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(C, hidden) * 0.5)
        self.w2 = nn.Parameter(torch.randn(C, hidden) * 0.5)

    def forward(self, x):
        h = torch.nn.functional.gelu(x.unsqueeze(-1) * self.w1)
        return (h * self.w2).sum(-1)


@dataclass
class CIOutputs:
    lower_leaky: dict
    upper_leaky: dict


@dataclass
class OutputWithCache:
    output: torch.Tensor
    cache: dict


class ComponentModel(nn.Module):
    def __init__(self, target_model, target_module_paths, C):
        super().__init__()
        self.target_model = target_model
        self.target_module_paths = target_module_paths
        self.C = C
        self.components = nn.ModuleDict({p: LinearComponents(C, getattr(target_model, p).in_features,
                                                             getattr(target_model, p).out_features)
                                         for p in target_module_paths})
        self.ci_fns = nn.ModuleDict({p: MLPCiFn(C, 4) for p in target_module_paths})

    def _layer(self, name, x, mask_infos):
        target = getattr(self.target_model, name)
        if mask_infos is None:
            return target(x)
        info = mask_infos[name]
        out = self.components[name](x, info.component_mask) + target.bias
        if info.weight_delta_and_mask is not None:
            weight_delta, delta_mask = info.weight_delta_and_mask
            out = out + delta_mask.unsqueeze(-1) * (x @ weight_delta.T)
        return out

    def forward(self, batch, mask_infos=None, cache_type=None):
        cache = {}
        x = batch
        for i, name in enumerate(self.target_module_paths):
            cache[name] = x
            x = self._layer(name, x, mask_infos)
            if i < len(self.target_module_paths) - 1:
                x = torch.relu(x)
        if cache_type == "input":
            return OutputWithCache(output=x, cache=cache)
        return x

    def calc_weight_deltas(self):
        return {p: getattr(self.target_model, p).weight - self.components[p].weight for p in self.target_module_paths}

    def calc_causal_importances(self, pre_weight_acts, sampling, detach_inputs=False):
        lower, upper = {}, {}
        for name in pre_weight_acts:
            ci_fn_input = self.components[name].get_inner_acts(pre_weight_acts[name])
            if detach_inputs:
                ci_fn_input = ci_fn_input.detach()
            out = self.ci_fns[name](ci_fn_input)
            lower[name] = out.clamp(0.0, 1.0)
            upper[name] = out.clamp(min=0.0)
        return CIOutputs(lower_leaky=lower, upper_leaky=upper)


@dataclass
class PGDReconLossConfig:
    coeff: float = 1.0
    init: Literal["random", "ones", "zeroes"] = "random"
    step_size: float = 0.1
    n_steps: int = 2
    mask_scope: Literal["unique_per_datapoint", "shared_across_batch"] = "shared_across_batch"
    classname: str = "PGDReconLoss"


@dataclass
class ImportanceMinimalityLossConfig:
    coeff: float = 3e-3
    pnorm: float = 1.0
    classname: str = "ImportanceMinimalityLoss"


@dataclass
class FaithfulnessLossConfig:
    coeff: float = 1.0
    classname: str = "FaithfulnessLoss"


def _get_pgd_init_tensor(init, shape, device):
    match init:
        case "random":
            return torch.rand(shape, device=device)
        case "ones":
            return torch.ones(shape, device=device)
        case "zeroes":
            return torch.zeros(shape, device=device)


def _interpolate_component_mask(ci, adv_sources_components):
    component_masks = {}
    for i, module_name in enumerate(ci):
        scaled_noise_to_add = (1 - ci[module_name]) * adv_sources_components[i]
        component_masks[module_name] = ci[module_name] + scaled_noise_to_add
    return component_masks


def _pgd_fwd_bwd(adv_sources, batch, ci, weight_deltas, routing_masks, target_out, model, output_loss_type, batch_dims):
    C2 = model.C if weight_deltas is None else model.C + 1
    n_layers = len(model.target_module_paths)
    with torch.enable_grad():
        expanded_adv_sources = adv_sources.expand(n_layers, *batch_dims, C2)
        match weight_deltas:
            case None:
                weight_deltas_and_masks = None
                adv_sources_components = expanded_adv_sources
            case dict():
                weight_deltas_and_masks = {k: (weight_deltas[k], expanded_adv_sources[i, ..., -1])
                                           for i, k in enumerate(weight_deltas)}
                adv_sources_components = expanded_adv_sources[..., :-1]
        mask_infos = make_mask_infos(component_masks=_interpolate_component_mask(ci, adv_sources_components),
                                     weight_deltas_and_masks=weight_deltas_and_masks, routing_masks=routing_masks)
        out = model(batch, mask_infos=mask_infos)
        sum_loss = calc_sum_recon_loss_lm(pred=out, target=target_out, loss_type=output_loss_type)

    # take the gradient wrt the unexpanded adv_sources
    (adv_sources_grads,) = torch.autograd.grad(sum_loss, adv_sources)  # culprit
    adv_sources_grads = all_reduce(adv_sources_grads, op="sum")
    sum_loss = all_reduce(sum_loss, op="sum")
    n_examples = target_out.shape.numel() if output_loss_type == "mse" else target_out.shape[:-1].numel()
    return sum_loss, n_examples, adv_sources_grads


def pgd_masked_recon_loss_update(model, batch, ci, weight_deltas, target_out, output_loss_type, routing, pgd_config):
    batch_dims = next(iter(ci.values())).shape[:-1]
    n_layers = len(ci)
    C2 = model.C if weight_deltas is None else model.C + 1
    routing_masks = "all"
    match pgd_config.mask_scope:
        case "unique_per_datapoint":
            adv_source_shape = torch.Size([n_layers, *batch_dims, C2])
        case "shared_across_batch":
            adv_source_shape = torch.Size([n_layers, *[1 for _ in batch_dims], C2])
    adv_sources = _get_pgd_init_tensor(pgd_config.init, adv_source_shape, batch.device).requires_grad_(True)

    fwd_bwd_fn = partial(_pgd_fwd_bwd, adv_sources=adv_sources, batch=batch, ci=ci, weight_deltas=weight_deltas,
                         routing_masks=routing_masks, target_out=target_out, model=model,
                         output_loss_type=output_loss_type, batch_dims=batch_dims)

    for _ in range(pgd_config.n_steps):
        assert adv_sources.grad is None
        _, _, adv_sources_grads = fwd_bwd_fn()
        with torch.no_grad():
            adv_sources.add_(pgd_config.step_size * adv_sources_grads.sign())
            adv_sources.clamp_(0.0, 1.0)

    sum_loss, total_n_examples, _ = fwd_bwd_fn()
    return sum_loss, total_n_examples


def pgd_recon_loss(*, model, batch, target_out, output_loss_type, ci, weight_deltas, pgd_config):
    sum_loss, n_examples = pgd_masked_recon_loss_update(model=model, batch=batch, ci=ci, weight_deltas=weight_deltas,
                                                        target_out=target_out, output_loss_type=output_loss_type,
                                                        routing="all", pgd_config=pgd_config)
    return sum_loss / n_examples


def importance_minimality_loss(ci_upper_leaky, pnorm, eps=1e-12):
    return sum(((ci + eps) ** pnorm).sum(-1).mean() for ci in ci_upper_leaky.values())


def faithfulness_loss(weight_deltas):
    return sum((d ** 2).sum() for d in weight_deltas.values()) / sum(d.numel() for d in weight_deltas.values())


def compute_total_loss(loss_metric_configs, model, batch, ci, target_out, weight_deltas, use_delta_component,
                       output_loss_type):
    total = torch.tensor(0.0, device=batch.device)
    terms = {}
    for cfg in loss_metric_configs:
        match cfg:
            case ImportanceMinimalityLossConfig():
                loss = importance_minimality_loss(ci_upper_leaky=ci.upper_leaky, pnorm=cfg.pnorm)
            case FaithfulnessLossConfig():
                loss = faithfulness_loss(weight_deltas=weight_deltas)
            case PGDReconLossConfig():
                loss = pgd_recon_loss(model=model, output_loss_type=output_loss_type, batch=batch,
                                      target_out=target_out, ci=ci.lower_leaky,
                                      weight_deltas=weight_deltas if use_delta_component else None, pgd_config=cfg)
        terms[f"loss/{cfg.classname}"] = loss.item()
        total = total + cfg.coeff * loss
    return total, terms


class TargetMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 5)


target_model = TargetMLP().to(DEVICE)
target_model.requires_grad_(False)
component_model = ComponentModel(target_model, ["fc1", "fc2"], C=6).to(DEVICE)
loss_metric_configs = [ImportanceMinimalityLossConfig(), FaithfulnessLossConfig(), PGDReconLossConfig()]
params = list(component_model.components.parameters()) + list(component_model.ci_fns.parameters())
optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
gradient_accumulation_steps = 1

for step in range(4):
    optimizer.zero_grad()
    weight_deltas = component_model.calc_weight_deltas()
    for _ in range(gradient_accumulation_steps):
        microbatch = torch.randn(8, 6, device=DEVICE)
        target_model_output = component_model(microbatch, cache_type="input")
        ci = component_model.calc_causal_importances(pre_weight_acts=target_model_output.cache,
                                                     detach_inputs=False, sampling="continuous")
        microbatch_total_loss, microbatch_loss_terms = compute_total_loss(
            loss_metric_configs=loss_metric_configs, model=component_model, batch=microbatch, ci=ci,
            target_out=target_model_output.output, weight_deltas=weight_deltas, use_delta_component=True,
            output_loss_type="mse")
        microbatch_total_loss.div_(gradient_accumulation_steps).backward()
    optimizer.step()
print("done")
