# source: https://github.com/lucidrains/vector-quantize-pytorch/issues/56 — issue: "Memory leak on 1.6.14": the EMA codebook update `self.embed_avg = lerp(self.embed_avg, embed_sum, self.decay)` runs `old.lerp_` on the buffer itself, so embed_avg takes the encoder's history and chains it across steps until OOM
# fix-source: https://github.com/lucidrains/vector-quantize-pytorch/commit/dea3bfa6ca28c54fcb4e34f167f7c4f053b040b7 — maintainer's commit "fix memory leak issue, thanks to @fauzanardh": ema_inplace(self.embed_avg.data, ...) / ema_inplace(self.cluster_size.data, ...)
# expect-kind: graph-growth
# expect-culprit: self.embed_avg
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


def lerp(old, new, decay):
    is_mps = getattr(old, 'is_mps', False)

    if not is_mps:
        old.lerp_(new, 1 - decay)
        return old

    return old * decay + new * (1 - decay)


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
                 sample_codebook_temp=1., ema_update=True):
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

        embed = self.embed if self.learnable_codebook else self.embed.detach()

        dist = -torch.cdist(flatten, embed, p=2)

        embed_ind, embed_onehot, straight_through_mult = self.gumbel_sample(
            dist, dim=-1, temperature=sample_codebook_temp, training=self.training)

        embed_ind = embed_ind.reshape(embed_ind.shape[0], *ps)

        quantize = batched_embedding(embed_ind, self.embed)

        if self.training and self.ema_update:
            cluster_size = embed_onehot.sum(dim=1)

            self.cluster_size = lerp(self.cluster_size, cluster_size, self.decay)

            embed_sum = einsum('h n d, h n c -> h c d', flatten, embed_onehot)
            self.embed_avg = lerp(self.embed_avg, embed_sum, self.decay)  # culprit

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
                 ema_update=True, learnable_codebook=False):
        super().__init__()
        self.dim = dim
        self.heads = 1
        self.project_in = nn.Identity()
        self.project_out = nn.Identity()

        self.eps = eps
        self.commitment_weight = commitment_weight

        assert not (ema_update and learnable_codebook), 'learnable codebook not compatible with EMA update'

        gumbel_sample_fn = partial(gumbel_sample, stochastic=stochastic_sample_codes,
                                   straight_through=straight_through)

        self._codebook = EuclideanCodebook(
            dim=dim, num_codebooks=1, codebook_size=codebook_size, decay=decay, eps=eps,
            threshold_ema_dead_code=threshold_ema_dead_code,
            learnable_codebook=learnable_codebook,
            sample_codebook_temp=sample_codebook_temp,
            gumbel_sample=gumbel_sample_fn, ema_update=ema_update)

        self.codebook_size = codebook_size

    def forward(self, x, sample_codebook_temp=None):
        device = x.device

        x = self.project_in(x)

        x = self._codebook.transform_input(x)

        quantize, embed_ind, distances = self._codebook(x, sample_codebook_temp=sample_codebook_temp)

        if self.training:
            orig_quantize = quantize

            quantize = x + (quantize - x).detach()

        loss = torch.tensor([0.], device=device, requires_grad=self.training)

        if self.training:
            if self.commitment_weight > 0:
                commit_loss = F.mse_loss(orig_quantize, x)
                loss = loss + commit_loss * self.commitment_weight

        quantize = self.project_out(quantize)

        return quantize, embed_ind, loss


class Model(nn.Module):
    def __init__(self, dim_in=6, dim_emb=4, n_emb=8):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim_in, 8), nn.ReLU(), nn.Linear(8, dim_emb))
        self.vq = VectorQuantize(dim=dim_emb, codebook_size=n_emb, decay=0.8,
                                 commitment_weight=0.25, threshold_ema_dead_code=2)
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
