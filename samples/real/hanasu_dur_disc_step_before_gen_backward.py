# source: https://github.com/yukiarimo/hanasu/issues/3 — issue "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation" (hanasu/train.py at a7679e4^: the VITS2 duration discriminator's real and generated scores come from one net_dur_disc call, optim_dur_disc steps on loss_dur, and loss_dur_hat from that same, now stale, forward is then added to the generator loss and backpropagated)
# fix-source: https://github.com/yukiarimo/hanasu/commit/a7679e49c5b06add29834f05aadd8a8b3042c234 — maintainer's "Everything Fixed!": the generator loss adds loss_dur_hat.detach() instead of loss_dur_hat (the same commit rewrites modules.LayerNorm to compute mean/var by hand)
# expect-kind: inplace-modified
# expect-culprit: net_dur_disc.output_layer[0].weight
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.amp import autocast, GradScaler
from _device import DEVICE


# --- hanasu/modules.py, trimmed ---
class LayerNorm(nn.Module):
    def __init__(self, channels, eps=1e-5):
        super().__init__()
        self.channels = channels
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        # x: [B, C, T]
        # Transpose to [B, T, C] and clone to prevent in-place issues on MPS
        x_t = x.transpose(1, 2).clone()
        x_norm = F.layer_norm(x_t, (self.channels,), self.gamma, self.beta, self.eps)
        return x_norm.transpose(1, 2)


# --- hanasu/commons.py, trimmed ---
def sequence_mask(length, max_length=None):
    if max_length is None:
        max_length = length.max()
    x = torch.arange(max_length, dtype=length.dtype, device=length.device)
    return x.unsqueeze(0) < length.unsqueeze(1)


def slice_segments(x, ids_str, segment_size=4):
    ret = torch.zeros_like(x[:, :, :segment_size])
    for i in range(x.size(0)):
        idx_str = ids_str[i]
        idx_end = idx_str + segment_size
        ret[i] = x[i, :, idx_str:idx_end]
    return ret


def rand_slice_segments(x, x_lengths=None, segment_size=4):
    b, d, t = x.size()
    if x_lengths is None:
        x_lengths = t
    ids_str_max = x_lengths - segment_size + 1
    ids_str = (torch.rand([b]).to(device=x.device) * ids_str_max).to(dtype=torch.long)
    ret = slice_segments(x, ids_str, segment_size)
    return ret, ids_str


def clip_grad_value_(parameters, clip_value, norm_type=2):
    parameters = list(filter(lambda p: p.grad is not None, parameters))
    total_norm = 0
    for p in parameters:
        param_norm = p.grad.data.norm(norm_type)
        total_norm += param_norm.item() ** norm_type
    return total_norm ** (1.0 / norm_type)


def maximum_path(neg_cent, mask):
    """monotonic_align.maximum_path stand-in: spread the frames evenly over the tokens."""
    b, t_y, t_x = neg_cent.shape
    path = torch.zeros_like(neg_cent)
    for j in range(t_y):
        path[:, j, j * t_x // t_y] = 1.0
    return path * mask


# --- hanasu/mel_processing.py, trimmed: a fixed mel basis instead of librosa's ---
mel_basis = torch.rand(8, 17, device=DEVICE)


def spec_to_mel_torch(spec, n_fft, num_mels, sampling_rate, fmin, fmax):
    return torch.matmul(mel_basis, spec)


def mel_spectrogram_torch(y, n_fft, num_mels, sampling_rate, hop_size, win_size, fmin, fmax):
    spec = torch.stft(y, n_fft, hop_length=hop_size, win_length=win_size,
                      window=torch.hann_window(win_size, device=y.device), center=False, return_complex=True)
    spec = torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-6)
    return torch.matmul(mel_basis, spec)


# --- hanasu/losses.py, trimmed ---
def feature_loss(fmap_r, fmap_g):
    loss = 0
    for dr, dg in zip(fmap_r, fmap_g):
        for rl, gl in zip(dr, dg):
            loss = loss + torch.mean(torch.abs(rl - gl))
    return loss * 2


def discriminator_loss(disc_real_outputs, disc_generated_outputs):
    loss = 0
    r_losses = []
    g_losses = []
    for dr, dg in zip(disc_real_outputs, disc_generated_outputs):
        r_loss = torch.mean((1 - dr) ** 2)
        g_loss = torch.mean(dg**2)
        loss += r_loss + g_loss
        r_losses.append(r_loss.item())
        g_losses.append(g_loss.item())
    return loss, r_losses, g_losses


def generator_loss(disc_outputs):
    loss = 0
    gen_losses = []
    for dg in disc_outputs:
        l = torch.mean((1 - dg) ** 2)
        gen_losses.append(l)
        loss += l
    return loss, gen_losses


def kl_loss(z_p, logs_q, m_p, logs_p, z_mask):
    kl = logs_p - logs_q - 0.5
    kl += 0.5 * ((z_p - m_p) ** 2) * torch.exp(-2.0 * logs_p)
    kl = torch.sum(kl * z_mask)
    return kl / torch.sum(z_mask)


# --- hanasu/models.py, trimmed ---
class DurationDiscriminator(nn.Module):
    def __init__(self, in_channels, filter_channels, kernel_size, p_dropout, gin_channels=0):
        super().__init__()
        self.in_channels = in_channels
        self.filter_channels = filter_channels
        self.drop = nn.Dropout(p_dropout)
        self.conv_1 = nn.Conv1d(in_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_1 = LayerNorm(filter_channels)
        self.conv_2 = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_2 = LayerNorm(filter_channels)
        self.dur_proj = nn.Conv1d(1, filter_channels, 1)

        self.pre_out_conv_1 = nn.Conv1d(2 * filter_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.pre_out_norm_1 = LayerNorm(filter_channels)
        self.pre_out_conv_2 = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.pre_out_norm_2 = LayerNorm(filter_channels)

        self.output_layer = nn.Sequential(nn.Linear(filter_channels, 1), nn.Sigmoid())

    def forward_probability(self, x, x_mask, dur, g=None):
        dur_proj = self.dur_proj(dur)
        x_combined = torch.cat([x, dur_proj], dim=1)
        x_conv1 = self.pre_out_conv_1(x_combined * x_mask)
        x_relu1 = F.relu(x_conv1)
        x_norm1 = self.pre_out_norm_1(x_relu1)
        x_drop1 = self.drop(x_norm1)
        x_conv2 = self.pre_out_conv_2(x_drop1 * x_mask)
        x_relu2 = F.relu(x_conv2)
        x_norm2 = self.pre_out_norm_2(x_relu2)
        x_drop2 = self.drop(x_norm2)
        x_masked = x_drop2 * x_mask
        x_transposed = x_masked.permute(0, 2, 1)
        output_prob = self.output_layer(x_transposed)
        return output_prob

    def forward(self, x, x_mask, dur_r, dur_hat, g=None):
        x = torch.detach(x)
        x = self.conv_1(x * x_mask)
        x = torch.relu(x)
        x = self.norm_1(x)
        x = self.drop(x)
        x = self.conv_2(x * x_mask)
        x = torch.relu(x)
        x = self.norm_2(x)
        x = self.drop(x)

        output_probs = []
        for dur in [dur_r, dur_hat]:
            output_prob = self.forward_probability(x, x_mask, dur, g)
            output_probs.append(output_prob)

        return output_probs


class DurationPredictor(nn.Module):
    def __init__(self, in_channels, filter_channels, kernel_size, p_dropout, gin_channels=0):
        super().__init__()
        self.drop = nn.Dropout(p_dropout)
        self.conv_1 = nn.Conv1d(in_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_1 = LayerNorm(filter_channels)
        self.conv_2 = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_2 = LayerNorm(filter_channels)
        self.proj = nn.Conv1d(filter_channels, 1, 1)

    def forward(self, x, x_mask, g=None):
        x = torch.detach(x)
        x = self.conv_1(x * x_mask)
        x = torch.relu(x)
        x = self.norm_1(x)
        x = self.drop(x)
        x = self.conv_2(x * x_mask)
        x = torch.relu(x)
        x = self.norm_2(x)
        x = self.drop(x)
        x = self.proj(x * x_mask)
        return x * x_mask


class TextEncoder(nn.Module):
    def __init__(self, n_vocab, out_channels, hidden_channels):
        super().__init__()
        self.out_channels = out_channels
        self.emb = nn.Embedding(n_vocab, hidden_channels)
        self.encoder = nn.Conv1d(hidden_channels, hidden_channels, 3, padding=1)
        self.proj = nn.Conv1d(hidden_channels, out_channels * 2, 1)

    def forward(self, x, x_lengths):
        x = self.emb(x).transpose(1, -1)
        x_mask = torch.unsqueeze(sequence_mask(x_lengths, x.size(2)), 1).to(x.dtype)
        x = self.encoder(x * x_mask) * x_mask
        stats = self.proj(x) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return x, m, logs, x_mask


class PosteriorEncoder(nn.Module):
    def __init__(self, in_channels, out_channels, hidden_channels):
        super().__init__()
        self.out_channels = out_channels
        self.pre = nn.Conv1d(in_channels, hidden_channels, 1)
        self.proj = nn.Conv1d(hidden_channels, out_channels * 2, 1)

    def forward(self, x, x_lengths):
        x_mask = torch.unsqueeze(sequence_mask(x_lengths, x.size(2)), 1).to(x.dtype)
        x = torch.tanh(self.pre(x)) * x_mask
        stats = self.proj(x) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        z = (m + torch.randn_like(m) * torch.exp(logs)) * x_mask
        return z, m, logs, x_mask


class Generator(nn.Module):
    def __init__(self, initial_channel, upsample_rate):
        super().__init__()
        self.conv_pre = nn.Conv1d(initial_channel, 8, 3, padding=1)
        self.up = nn.ConvTranspose1d(8, 4, upsample_rate, upsample_rate)
        self.conv_post = nn.Conv1d(4, 1, 3, padding=1)

    def forward(self, x, g=None):
        x = self.conv_pre(x)
        x = self.up(F.leaky_relu(x, 0.1))
        x = self.conv_post(F.leaky_relu(x))
        return torch.tanh(x)


class SynthesizerTrn(nn.Module):
    def __init__(self, n_vocab, spec_channels, segment_size, inter_channels, hidden_channels, hop_length):
        super().__init__()
        self.segment_size = segment_size
        self.enc_p = TextEncoder(n_vocab, inter_channels, hidden_channels)
        self.enc_q = PosteriorEncoder(spec_channels, inter_channels, hidden_channels)
        self.flow = nn.Conv1d(inter_channels, inter_channels, 1)
        self.dp = DurationPredictor(hidden_channels, 16, 3, 0.5)
        self.dec = Generator(inter_channels, hop_length)

    def forward(self, x, x_lengths, y, y_lengths, sid, llama_emb):
        g = None
        x, m_p, logs_p, x_mask = self.enc_p(x, x_lengths)
        z, m_q, logs_q, y_mask = self.enc_q(y, y_lengths)
        z_p = self.flow(z) * y_mask

        with torch.no_grad():
            # negative cross-entropy
            s_p_sq_r = torch.exp(-2 * logs_p)
            neg_cent = torch.matmul(-0.5 * (z_p**2).transpose(1, 2), s_p_sq_r) + torch.matmul(
                z_p.transpose(1, 2), (m_p * s_p_sq_r))
            attn_mask = torch.unsqueeze(x_mask, 2) * torch.unsqueeze(y_mask, -1)
            attn = maximum_path(neg_cent, attn_mask.squeeze(1)).unsqueeze(1).detach()

        w = attn.sum(2)
        logw_ = torch.log(w + 1e-6) * x_mask
        logw = self.dp(x, x_mask, g=g)
        l_length = torch.sum((logw - logw_) ** 2, [1, 2]) / torch.sum(x_mask)

        # expand prior
        m_p = torch.matmul(attn.squeeze(1), m_p.transpose(1, 2)).transpose(1, 2)
        logs_p = torch.matmul(attn.squeeze(1), logs_p.transpose(1, 2)).transpose(1, 2)

        z_slice, ids_slice = rand_slice_segments(z, y_lengths, self.segment_size)
        o = self.dec(z_slice, g=g)
        return (
            o,
            l_length,
            attn,
            ids_slice,
            x_mask,
            y_mask,
            (z, z_p, m_p, logs_p, m_q, logs_q),
            (x, logw, logw_),
        )


class MultiPeriodDiscriminator(nn.Module):
    """One scale discriminator standing in for the period/scale discriminators."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(1, 4, 5, 2, padding=2), nn.Conv1d(4, 8, 5, 2, padding=2)])
        self.conv_post = nn.Conv1d(8, 1, 3, 1, padding=1)

    def _d(self, x):
        fmap = []
        for l in self.convs:
            x = F.leaky_relu(l(x), 0.1)
            fmap.append(x)
        x = self.conv_post(x)
        fmap.append(x)
        return torch.flatten(x, 1, -1), fmap

    def forward(self, y, y_hat):
        y_d_r, fmap_r = self._d(y)
        y_d_g, fmap_g = self._d(y_hat)
        return [y_d_r], [y_d_g], [fmap_r], [fmap_g]


# --- hanasu/train.py: train_and_evaluate, trimmed (hps.train.fp16_run = False) ---
hop_length, filter_length, segment_frames = 8, 32, 4
net_g = SynthesizerTrn(10, filter_length // 2 + 1, segment_frames, 4, 16, hop_length).to(DEVICE)
net_d = MultiPeriodDiscriminator().to(DEVICE)
net_dur_disc = DurationDiscriminator(16, 16, 3, 0.1).to(DEVICE)
optim_g = torch.optim.AdamW(filter(lambda p: p.requires_grad, net_g.parameters()), 2e-4, betas=(0.8, 0.99), eps=1e-9)
optim_d = torch.optim.AdamW(net_d.parameters(), 2e-4, betas=(0.8, 0.99), eps=1e-9)
optim_dur_disc = torch.optim.AdamW(net_dur_disc.parameters(), 2e-4, betas=(0.8, 0.99), eps=1e-9)
scaler = GradScaler(DEVICE.type, enabled=False)
device = DEVICE.type

net_g.train()
net_d.train()
net_dur_disc.train()
for batch_idx in range(3):
    x = torch.randint(1, 10, (2, 6), device=DEVICE)
    x_lengths = torch.tensor([6, 6], device=DEVICE)
    spec = torch.rand(2, filter_length // 2 + 1, 12, device=DEVICE)
    spec_lengths = torch.tensor([12, 12], device=DEVICE)
    y = torch.rand(2, 1, 12 * hop_length, device=DEVICE) * 2 - 1
    sid, llama_emb = None, None

    with autocast(device_type=device, enabled=False):
        # Generator forward
        (
            y_hat,
            l_length,
            attn,
            ids_slice,
            x_mask,
            z_mask,
            (z, z_p, m_p, logs_p, m_q, logs_q),
            (x, logw, logw_),
        ) = net_g(x, x_lengths, spec, spec_lengths, sid, llama_emb)

        mel = spec_to_mel_torch(spec, filter_length, 8, 16000, 0.0, None)
        y_mel = slice_segments(mel, ids_slice, segment_frames)
        y = slice_segments(y, ids_slice * hop_length, segment_frames * hop_length)
        y_hat_for_mel = y_hat.squeeze(1)
        y_hat_mel = mel_spectrogram_torch(
            F.pad(y_hat_for_mel, (filter_length // 2 - hop_length // 2, filter_length // 2 - hop_length // 2)),
            filter_length, 8, 16000, hop_length, filter_length, 0.0, None)

        # Duration discriminator
        if net_dur_disc is not None:
            y_dur_hat_r, y_dur_hat_g = net_dur_disc(x, x_mask, logw, logw)  # culprit
            with autocast(device_type=device, enabled=False):
                loss_dur = torch.sum(torch.pow(1 - y_dur_hat_r, 2))
                loss_dur_hat = torch.sum(torch.pow(0 - y_dur_hat_g, 2))

        # Discriminator loss
        y_d_hat_r, y_d_hat_g, _, _ = net_d(y, y_hat.detach())
        with autocast(device_type=device, enabled=False):
            loss_disc, losses_disc_r, losses_disc_g = discriminator_loss(y_d_hat_r, y_d_hat_g)
            loss_disc_all = loss_disc

    # Discriminator backward and optimize
    optim_d.zero_grad()
    scaler.scale(loss_disc_all).backward()
    scaler.unscale_(optim_d)
    grad_norm_d = clip_grad_value_(net_d.parameters(), None)
    scaler.step(optim_d)

    # Duration discriminator backward and optimize
    if net_dur_disc is not None:
        optim_dur_disc.zero_grad()
        scaler.scale(loss_dur).backward()
        scaler.unscale_(optim_dur_disc)
        grad_norm_dur_disc = clip_grad_value_(net_dur_disc.parameters(), None)
        scaler.step(optim_dur_disc)  # step

    with autocast(device_type=device, enabled=False):
        # Generator forward again for adversarial training
        y_d_hat_r, y_d_hat_g, fmap_r, fmap_g = net_d(y, y_hat)
        with autocast(device_type=device, enabled=False):
            loss_mel = F.l1_loss(y_mel, y_hat_mel) * 45
            loss_kl = kl_loss(z_p, logs_q, m_p, logs_p, z_mask) * 1.0
            loss_fm = feature_loss(fmap_r, fmap_g)
            loss_gen, losses_gen = generator_loss(y_d_hat_g)
            loss_gen_all = loss_gen + loss_fm + loss_mel + loss_kl
            if net_dur_disc is not None:
                loss_gen_all += loss_dur_hat

    # Generator backward and optimize
    optim_g.zero_grad()
    scaler.scale(loss_gen_all).backward()
    scaler.unscale_(optim_g)
    grad_norm_g = clip_grad_value_(net_g.parameters(), None)
    scaler.step(optim_g)
    scaler.update()
print("done")
