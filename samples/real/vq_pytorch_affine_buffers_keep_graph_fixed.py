# source: https://github.com/lucidrains/vector-quantize-pytorch/pull/57 — PR "detach buffer before registering": with affine_param and a learnable codebook, EuclideanCodebook.update_with_decay re-registers batch_mean/codebook_mean/... as `old_value * decay + new_value * (1 - decay)`, so each buffer keeps the step's graph and chains it to the previous one until OOM
# fix-source: https://github.com/lucidrains/vector-quantize-pytorch/commit/16c56b5c96d34f7763864142977b171b1f107111 — merged PR #57 (theAdamColton): register new_value.detach() and use new_value.detach() in the decayed update
# expect-kind: none
# fix: update_with_decay detaches new_value before registering it and before the decayed sum, so the affine buffers hold plain tensors
from functools import partial

import torch
from torch import nn, einsum
import torch.nn.functional as F
from _device import DEVICE


def exists(val):
    return val is not None


def default(val, d):
    return val if exists(val) else d


def identity(t):
    return t


def log(t, eps=1e-20):
    return torch.log(t.clamp(min=eps))


def ema_inplace(old, new, decay):
    is_mps = str(old.device) == 'mps'

    if not is_mps:
        old.lerp_(new, 1 - decay)
    else:
        old.mul_(decay).add_(new * (1 - decay))


def uniform_init(*shape):
    t = torch.empty(shape)
    nn.init.kaiming_uniform_(t)
    return t


def gumbel_sample(logits, temperature=1., stochastic=False, straight_through=False,
                  dim=-1, training=True):
    dtype, size = logits.dtype, logits.shape[dim]
    sampling_logits = logits
    ind = sampling_logits.argmax(dim=dim)
    one_hot = F.one_hot(ind, size).type(dtype)
    if not straight_through or temperature <= 0. or not training:
        return ind, one_hot, None
    raise NotImplementedError


def laplace_smoothing(x, n_categories, eps=1e-5, dim=-1):
    denom = x.sum(dim=dim, keepdim=True)
    return (x + eps) / (denom + n_categories * eps)


def sample_vectors(samples, num):
    num_samples, device = samples.shape[0], samples.device
    if num_samples >= num:
        indices = torch.randperm(num_samples, device=device)[:num]
    else:
        indices = torch.randint(0, num_samples, (num,), device=device)
    return samples[indices]


def batched_sample_vectors(samples, num):
    return torch.stack([sample_vectors(sample, num) for sample in samples.unbind(dim=0)], dim=0)


def batched_embedding(indices, embeds):
    batch, dim = indices.shape[1], embeds.shape[-1]
    indices = indices.unsqueeze(-1).expand(*indices.shape, dim)
    embeds = embeds.unsqueeze(1).expand(embeds.shape[0], batch, *embeds.shape[1:])
    return embeds.gather(2, indices)


class EuclideanCodebook(nn.Module):
    def __init__(self, dim, codebook_size, num_codebooks=1, decay=0.8, eps=1e-5,
                 threshold_ema_dead_code=2, reset_cluster_size=None,
                 learnable_codebook=False, gumbel_sample=gumbel_sample,
                 sample_codebook_temp=1., ema_update=True, affine_param=False,
                 affine_param_batch_decay=0.99, affine_param_codebook_decay=0.9):
        super().__init__()
        self.transform_input = identity
        self.decay = decay
        self.ema_update = ema_update

        embed = uniform_init(num_codebooks, codebook_size, dim)

        self.codebook_size = codebook_size
        self.num_codebooks = num_codebooks
        self.eps = eps
        self.threshold_ema_dead_code = threshold_ema_dead_code
        self.reset_cluster_size = default(reset_cluster_size, threshold_ema_dead_code)

        self.gumbel_sample = gumbel_sample
        self.sample_codebook_temp = sample_codebook_temp
        self.sample_fn = batched_sample_vectors

        self.register_buffer('initted', torch.Tensor([True]))
        self.register_buffer('cluster_size', torch.zeros(num_codebooks, codebook_size))
        self.register_buffer('embed_avg', embed.clone())

        self.learnable_codebook = learnable_codebook
        if learnable_codebook:
            self.embed = nn.Parameter(embed)
        else:
            self.register_buffer('embed', embed)

        # affine related params

        self.affine_param = affine_param

        if not affine_param:
            return

        self.affine_param_batch_decay = affine_param_batch_decay
        self.affine_param_codebook_decay = affine_param_codebook_decay

        self.register_buffer('batch_mean', None)
        self.register_buffer('batch_variance', None)

        self.register_buffer('codebook_mean', None)
        self.register_buffer('codebook_variance', None)

    def update_with_decay(self, buffer_name, new_value, decay):
        old_value = getattr(self, buffer_name)

        if not exists(old_value):
            self.register_buffer(buffer_name, new_value.detach())
            return

        value = old_value * decay + new_value.detach() * (1 - decay)
        self.register_buffer(buffer_name, value)

    def update_affine(self, data, embed):
        assert self.affine_param

        var_fn = partial(torch.var, unbiased=False)

        data, embed = map(lambda t: t.reshape(t.shape[0], -1, t.shape[-1]), (data, embed))

        self.update_with_decay('codebook_mean', embed.mean(dim=-2, keepdim=True), self.affine_param_codebook_decay)
        self.update_with_decay('codebook_variance', var_fn(embed, dim=-2, keepdim=True), self.affine_param_codebook_decay)

        self.update_with_decay('batch_mean', data.mean(dim=-2, keepdim=True), self.affine_param_batch_decay)
        self.update_with_decay('batch_variance', var_fn(data, dim=-2, keepdim=True), self.affine_param_batch_decay)

    def replace(self, batch_samples, batch_mask):
        for ind, (samples, mask) in enumerate(zip(batch_samples.unbind(dim=0), batch_mask.unbind(dim=0))):
            if not torch.any(mask):
                continue

            sampled = self.sample_fn(samples.unsqueeze(0), mask.sum().item())
            sampled = sampled.squeeze(0)

            self.embed.data[ind][mask] = sampled

            self.cluster_size.data[ind][mask] = self.reset_cluster_size
            self.embed_avg.data[ind][mask] = sampled * self.reset_cluster_size

    def expire_codes_(self, batch_samples):
        if self.threshold_ema_dead_code == 0:
            return

        expired_codes = self.cluster_size < self.threshold_ema_dead_code

        if not torch.any(expired_codes):
            return

        batch_samples = batch_samples.reshape(batch_samples.shape[0], -1, batch_samples.shape[-1])
        self.replace(batch_samples, batch_mask=expired_codes)

    def forward(self, x, sample_codebook_temp=None):
        needs_codebook_dim = x.ndim < 4
        sample_codebook_temp = default(sample_codebook_temp, self.sample_codebook_temp)

        x = x.float()

        if needs_codebook_dim:
            x = x.unsqueeze(0)

        dtype = x.dtype
        ps = x.shape[1:-1]
        flatten = x.reshape(x.shape[0], -1, x.shape[-1])

        if self.affine_param:
            self.update_affine(flatten, self.embed)

        embed = self.embed if self.learnable_codebook else self.embed.detach()

        if self.affine_param:
            codebook_std = self.codebook_variance.clamp(min=1e-5).sqrt()
            batch_std = self.batch_variance.clamp(min=1e-5).sqrt()
            embed = (embed - self.codebook_mean) * (batch_std / codebook_std) + self.batch_mean

        dist = -torch.cdist(flatten, embed, p=2)

        embed_ind, embed_onehot, straight_through_mult = self.gumbel_sample(
            dist, dim=-1, temperature=sample_codebook_temp, training=self.training)

        embed_ind = embed_ind.reshape(embed_ind.shape[0], *ps)

        quantize = batched_embedding(embed_ind, self.embed)

        if self.training and self.ema_update:
            if self.affine_param:
                flatten = (flatten - self.batch_mean) * (codebook_std / batch_std) + self.codebook_mean

            cluster_size = embed_onehot.sum(dim=1)

            ema_inplace(self.cluster_size.data, cluster_size, self.decay)

            embed_sum = einsum('h n d, h n c -> h c d', flatten, embed_onehot)
            ema_inplace(self.embed_avg.data, embed_sum, self.decay)

            cluster_size = laplace_smoothing(self.cluster_size, self.codebook_size, self.eps) * self.cluster_size.sum(dim=-1, keepdim=True)

            embed_normalized = self.embed_avg / cluster_size.unsqueeze(-1)
            self.embed.data.copy_(embed_normalized)
            self.expire_codes_(x)

        if needs_codebook_dim:
            quantize, embed_ind = map(lambda t: t.squeeze(0), (quantize, embed_ind))

        dist = dist.reshape(dist.shape[0], *ps, dist.shape[-1])

        return quantize, embed_ind, dist


class VectorQuantize(nn.Module):
    def __init__(self, dim, codebook_size, decay=0.8, eps=1e-5, threshold_ema_dead_code=0,
                 commitment_weight=1., stochastic_sample_codes=False,
                 sample_codebook_temp=1., straight_through=False,
                 ema_update=True, learnable_codebook=False, affine_param=False,
                 affine_param_batch_decay=0.99, affine_param_codebook_decay=0.9):
        super().__init__()
        self.dim = dim
        self.heads = 1
        self.project_in = nn.Identity()
        self.project_out = nn.Identity()

        self.eps = eps
        self.commitment_weight = commitment_weight

        self.learnable_codebook = learnable_codebook

        assert not (ema_update and learnable_codebook), 'learnable codebook not compatible with EMA update'

        gumbel_sample_fn = partial(gumbel_sample, stochastic=stochastic_sample_codes,
                                   straight_through=straight_through)

        self._codebook = EuclideanCodebook(
            dim=dim, num_codebooks=1, codebook_size=codebook_size, decay=decay, eps=eps,
            threshold_ema_dead_code=threshold_ema_dead_code,
            learnable_codebook=learnable_codebook,
            sample_codebook_temp=sample_codebook_temp,
            gumbel_sample=gumbel_sample_fn, ema_update=ema_update,
            affine_param=affine_param, affine_param_batch_decay=affine_param_batch_decay,
            affine_param_codebook_decay=affine_param_codebook_decay)

        self.codebook_size = codebook_size

    def forward(self, x, sample_codebook_temp=None):
        device = x.device

        x = self.project_in(x)

        x = self._codebook.transform_input(x)

        quantize, embed_ind, distances = self._codebook(x, sample_codebook_temp=sample_codebook_temp)

        if self.training:
            # determine code to use for commitment loss

            if not self.learnable_codebook:
                commit_quantize = quantize.detach()
            else:
                commit_quantize = quantize

            # straight through

            quantize = x + (quantize - x).detach()

        loss = torch.tensor([0.], device=device, requires_grad=self.training)

        if self.training:
            if self.commitment_weight > 0:
                commit_loss = F.mse_loss(commit_quantize, x)
                loss = loss + commit_loss * self.commitment_weight

        quantize = self.project_out(quantize)

        return quantize, embed_ind, loss


class Model(nn.Module):
    def __init__(self, dim_in=6, dim_emb=4, n_emb=8):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim_in, 8), nn.ReLU(), nn.Linear(8, dim_emb))
        self.vq = VectorQuantize(dim=dim_emb, codebook_size=n_emb, commitment_weight=0.25,
                                 ema_update=False, learnable_codebook=True, affine_param=True)
        self.decoder = nn.Sequential(nn.Linear(dim_emb, 8), nn.ReLU(), nn.Linear(8, dim_in))


model = Model().to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for step in range(3):
    batch = torch.randn(2, 5, 6, device=DEVICE)
    x = model.encoder(batch)
    quantized, _, commit_loss = model.vq(x)
    recon_x = model.decoder(quantized)
    loss = F.mse_loss(recon_x, batch) + commit_loss.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("done")
