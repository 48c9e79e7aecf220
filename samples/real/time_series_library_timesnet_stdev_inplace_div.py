# source: https://github.com/thuml/Time-Series-Library/issues/699 — issue: with a trainable layer in front of TimesNet, Model.forecast's non-stationary normalisation `x_enc /= stdev` raises "one of the variables needed for gradient computation has been modified by an inplace operation"
# fix-source: https://github.com/thuml/Time-Series-Library/commit/4c2fae5cf876be2da36f1ae3288877ad169662c2 — PR #709, merged by the maintainer: `x_enc = x_enc.sub(means)`, `x_enc = x_enc.div(stdev)` (and the de-normalisation written out of place)
# expect-kind: inplace-modified
# expect-culprit: x_enc
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.fft
from types import SimpleNamespace
from _device import DEVICE


def FFT_for_Period(x, k=2):
    # [B, T, C]
    xf = torch.fft.rfft(x, dim=1)
    frequency_list = abs(xf).mean(0).mean(-1)
    frequency_list[0] = 0
    _, top_list = torch.topk(frequency_list, k)
    top_list = top_list.detach().cpu().numpy()
    period = x.shape[1] // top_list
    return period, abs(xf).mean(-1)[:, top_list]


class Inception_Block_V1(nn.Module):
    def __init__(self, in_channels, out_channels, num_kernels=2):
        super().__init__()
        self.kernels = nn.ModuleList(
            nn.Conv2d(in_channels, out_channels, kernel_size=2 * i + 1, padding=i) for i in range(num_kernels))

    def forward(self, x):
        return torch.stack([kernel(x) for kernel in self.kernels], dim=-1).mean(-1)


class DataEmbedding(nn.Module):
    def __init__(self, c_in, d_model, dropout=0.1):
        super().__init__()
        self.value_embedding = nn.Conv1d(c_in, d_model, kernel_size=3, padding=1, padding_mode='circular')
        self.temporal_embedding = nn.Linear(4, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, x_mark):
        x = self.value_embedding(x.permute(0, 2, 1)).transpose(1, 2) + self.temporal_embedding(x_mark)
        return self.dropout(x)


class TimesBlock(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.k = configs.top_k
        self.conv = nn.Sequential(
            Inception_Block_V1(configs.d_model, configs.d_ff, num_kernels=configs.num_kernels),
            nn.GELU(),
            Inception_Block_V1(configs.d_ff, configs.d_model, num_kernels=configs.num_kernels))

    def forward(self, x):
        B, T, N = x.size()
        period_list, period_weight = FFT_for_Period(x, self.k)
        res = []
        for i in range(self.k):
            period = period_list[i]
            if (self.seq_len + self.pred_len) % period != 0:
                length = (((self.seq_len + self.pred_len) // period) + 1) * period
                padding = torch.zeros([x.shape[0], (length - (self.seq_len + self.pred_len)), x.shape[2]]).to(x.device)
                out = torch.cat([x, padding], dim=1)
            else:
                length = (self.seq_len + self.pred_len)
                out = x
            out = out.reshape(B, length // period, period, N).permute(0, 3, 1, 2).contiguous()
            out = self.conv(out)
            out = out.permute(0, 2, 3, 1).reshape(B, -1, N)
            res.append(out[:, :(self.seq_len + self.pred_len), :])
        res = torch.stack(res, dim=-1)
        period_weight = F.softmax(period_weight, dim=1)
        period_weight = period_weight.unsqueeze(1).unsqueeze(1).repeat(1, T, N, 1)
        res = torch.sum(res * period_weight, -1)
        return res + x


class Model(nn.Module):
    def __init__(self, configs):
        super().__init__()
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.model = nn.ModuleList([TimesBlock(configs) for _ in range(configs.e_layers)])
        self.enc_embedding = DataEmbedding(configs.enc_in, configs.d_model, configs.dropout)
        self.layer = configs.e_layers
        self.layer_norm = nn.LayerNorm(configs.d_model)
        self.predict_linear = nn.Linear(self.seq_len, self.pred_len + self.seq_len)
        self.projection = nn.Linear(configs.d_model, configs.c_out, bias=True)

    def forecast(self, x_enc, x_mark_enc, x_dec, x_mark_dec):
        # Normalization from Non-stationary Transformer
        means = x_enc.mean(1, keepdim=True).detach()
        x_enc = x_enc - means
        stdev = torch.sqrt(torch.var(x_enc, dim=1, keepdim=True, unbiased=False) + 1e-5)  # culprit
        x_enc /= stdev  # step

        enc_out = self.enc_embedding(x_enc, x_mark_enc)
        enc_out = self.predict_linear(enc_out.permute(0, 2, 1)).permute(0, 2, 1)
        for i in range(self.layer):
            enc_out = self.layer_norm(self.model[i](enc_out))
        dec_out = self.projection(enc_out)

        # De-Normalization from Non-stationary Transformer
        dec_out = dec_out * (stdev[:, 0, :].unsqueeze(1).repeat(1, self.pred_len + self.seq_len, 1))
        dec_out = dec_out + (means[:, 0, :].unsqueeze(1).repeat(1, self.pred_len + self.seq_len, 1))
        return dec_out

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        dec_out = self.forecast(x_enc, x_mark_enc, x_dec, x_mark_dec)
        return dec_out[:, -self.pred_len:, :]


class ExtendedTimesNet(nn.Module):
    """The reporter's extension: a trainable layer in front of TimesNet, so x_enc carries a graph."""

    def __init__(self, configs):
        super().__init__()
        self.input_mixer = nn.Linear(configs.enc_in, configs.enc_in)
        self.timesnet = Model(configs)

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec):
        return self.timesnet(self.input_mixer(x_enc), x_mark_enc, x_dec, x_mark_dec)


configs = SimpleNamespace(seq_len=8, label_len=4, pred_len=4, top_k=2, d_model=8, d_ff=8, num_kernels=2,
                          e_layers=1, enc_in=3, c_out=3, dropout=0.0)
model = ExtendedTimesNet(configs).to(DEVICE)
model_optim = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.MSELoss()

for i in range(4):
    batch_x = torch.randn(2, configs.seq_len, 3, device=DEVICE)
    batch_y = torch.randn(2, configs.label_len + configs.pred_len, 3, device=DEVICE)
    batch_x_mark = torch.randn(2, configs.seq_len, 4, device=DEVICE)
    batch_y_mark = torch.randn(2, configs.label_len + configs.pred_len, 4, device=DEVICE)
    model_optim.zero_grad()
    dec_inp = torch.zeros_like(batch_y[:, -configs.pred_len:, :])
    dec_inp = torch.cat([batch_y[:, :configs.label_len, :], dec_inp], dim=1)
    outputs = model(batch_x, batch_x_mark, dec_inp, batch_y_mark)
    batch_y = batch_y[:, -configs.pred_len:, :]
    loss = criterion(outputs, batch_y)
    loss.backward()
    model_optim.step()

print("done")
