# source: https://github.com/lucidrains/rotary-embedding-torch/issues/18 — caching the rotary frequencies fails at the second loss.backward() of training
# fix-source: https://github.com/lucidrains/rotary-embedding-torch/commit/783d17820ac1e75e918ae2128ab8bbcbe4985362 — maintainer's fix: cache (and return) freqs.detach()
# expect-kind: none
# fix: cache a detached copy of the frequencies: self.tmp_store('cached_freqs', freqs.detach()) (and return the cache detached)
import torch
from torch import nn, einsum
from _device import DEVICE


def exists(val):
    return val is not None


def rotate_half(x):
    x = x.unflatten(-1, (-1, 2))
    x1, x2 = x.unbind(dim=-1)
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_emb(freqs, t, start_index=0, scale=1., seq_dim=-2):
    seq_len = t.shape[seq_dim]
    freqs = freqs[-seq_len:].to(t)
    rot_dim = freqs.shape[-1]
    end_index = start_index + rot_dim
    t_left, t, t_right = t[..., :start_index], t[..., start_index:end_index], t[..., end_index:]
    t = (t * freqs.cos() * scale) + (rotate_half(t) * freqs.sin() * scale)
    return torch.cat((t_left, t, t_right), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, theta=10000, learned_freq=False):
        super().__init__()
        freqs = 1. / (theta ** (torch.arange(0, dim, 2)[:(dim // 2)].float() / dim))
        self.tmp_store('cached_freqs', None)
        self.freqs = nn.Parameter(freqs, requires_grad=learned_freq)
        self.learned_freq = learned_freq
        self.default_seq_dim = -2

    def tmp_store(self, key, value):
        self.register_buffer(key, value, persistent=False)

    def get_seq_pos(self, seq_len, device, dtype, offset=0):
        return torch.arange(seq_len, device=device, dtype=dtype) + offset

    def rotate_queries_or_keys(self, t, seq_dim=None, offset=0):
        seq_dim = seq_dim if exists(seq_dim) else self.default_seq_dim
        device, dtype, seq_len = t.device, t.dtype, t.shape[seq_dim]
        freqs = self.forward(self.get_seq_pos(seq_len, device=device, dtype=dtype, offset=offset),
                             seq_len=seq_len, offset=offset)
        return apply_rotary_emb(freqs, t, seq_dim=seq_dim)

    def forward(self, t, seq_len=None, offset=0):
        should_cache = not self.learned_freq and exists(seq_len)
        if should_cache and exists(self.cached_freqs) and (offset + seq_len) <= self.cached_freqs.shape[0]:
            return self.cached_freqs[offset:(offset + seq_len)].detach()

        freqs = self.freqs
        freqs = einsum('..., f -> ... f', t.type(freqs.dtype), freqs)
        freqs = freqs.repeat_interleave(2, dim=-1)

        if should_cache:
            self.tmp_store('cached_freqs', freqs.detach())
        return freqs


class Attention(nn.Module):
    def __init__(self, dim, heads=2):
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.to_out = nn.Linear(dim, dim)
        self.rotary_emb = RotaryEmbedding(dim=dim // heads)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        q = self.rotary_emb.rotate_queries_or_keys(q)
        k = self.rotary_emb.rotate_queries_or_keys(k)
        attn = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, d)
        return self.to_out(out)


model = nn.Sequential(Attention(dim=16), nn.Linear(16, 1)).to(DEVICE)
model.requires_grad_(True)  # fine-tune everything
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for step in range(4):
    x = torch.randn(2, 6, 16, device=DEVICE)
    y = torch.randn(2, 6, 1, device=DEVICE)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
