# source: https://github.com/yl4579/StyleTTS2/issues/11 — train_second.py fails at loss_gen_lm.backward() with "modified by an inplace operation" once SLM adversarial training starts (joint_epoch)
# fix-source: https://github.com/yl4579/StyleTTS2/pull/15 + commit e2fabb3 (maintainer, "fix buggy logic from #15 per #74") — back-propagate loss_gen_lm and step the generator modules first, then run the SLM discriminator's backward and optimizer.step('wd')
# expect-kind: inplace-modified
# expect-culprit: model['wd'].conv_post.weight
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

LRELU_SLOPE = 0.1


class Munch(dict):
    def __getattr__(self, key):
        return self[key]


class MultiOptimizer:
    def __init__(self, optimizers={}):
        self.optimizers = optimizers
        self.keys = list(optimizers.keys())

    def step(self, key=None):
        keys = [key] if key is not None else self.keys
        _ = [self.optimizers[key].step() for key in keys]

    def zero_grad(self, key=None):
        if key is not None:
            self.optimizers[key].zero_grad()
        else:
            _ = [self.optimizers[key].zero_grad() for key in self.keys]


class TinyBert(nn.Module):
    def __init__(self, vocab=12, dim=8):
        super().__init__()
        self.embeddings = nn.Embedding(vocab, dim)
        self.layer = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask=None):
        return torch.tanh(self.layer(self.embeddings(input_ids)))


class ProsodyPredictor(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.duration_proj = nn.Linear(dim, 1)

    def forward(self, d_en, s):
        x, _ = self.lstm(d_en + s.unsqueeze(1))
        return self.duration_proj(x).squeeze(-1), x


class Decoder(nn.Module):
    def __init__(self, dim=8, samples=80):
        super().__init__()
        self.proj = nn.Linear(dim, samples)

    def forward(self, en, s):
        return torch.tanh(self.proj(en.mean(1) + s)).unsqueeze(1)  # B x 1 x samples


class TinyWavLM(nn.Module):
    """Stands in for the pretrained WavLM: returns its hidden states."""

    def __init__(self, hidden=8, layers=2):
        super().__init__()
        self.feature_extractor = nn.Conv1d(1, hidden, kernel_size=10, stride=5)
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))

    def forward(self, input_values, output_hidden_states=True):
        h = self.feature_extractor(input_values.unsqueeze(1)).transpose(1, 2)
        hidden_states = [h]
        for layer in self.layers:
            h = torch.tanh(layer(h))
            hidden_states.append(h)
        return SimpleNamespace(hidden_states=tuple(hidden_states))


class WavLMDiscriminator(nn.Module):
    def __init__(self, slm_hidden=8, slm_layers=3, initial_channel=4):
        super().__init__()
        self.pre = nn.Conv1d(slm_hidden * slm_layers, initial_channel, 1, 1, padding=0)
        self.convs = nn.ModuleList([
            nn.Conv1d(initial_channel, initial_channel * 2, kernel_size=5, padding=2),
            nn.Conv1d(initial_channel * 2, initial_channel * 4, kernel_size=5, padding=2),
        ])
        self.conv_post = nn.Conv1d(initial_channel * 4, 1, 3, 1, padding=1)

    def forward(self, x):
        x = self.pre(x)
        fmap = []
        for l in self.convs:
            x = l(x)
            x = F.leaky_relu(x, LRELU_SLOPE)
            fmap.append(x)
        x = self.conv_post(x)
        x = torch.flatten(x, 1, -1)
        return x


class WavLMLoss(nn.Module):
    def __init__(self, wavlm, wd):
        super().__init__()
        self.wavlm = wavlm
        self.wd = wd

    def generator(self, y_rec):
        y_rec_embeddings = self.wavlm(input_values=y_rec, output_hidden_states=True).hidden_states
        y_rec_embeddings = torch.stack(y_rec_embeddings, dim=1).transpose(-1, -2).flatten(start_dim=1, end_dim=2)
        y_df_hat_g = self.wd(y_rec_embeddings)  # culprit
        loss_gen = torch.mean((1 - y_df_hat_g) ** 2)
        return loss_gen

    def discriminator(self, wav, y_rec):
        with torch.no_grad():
            wav_embeddings = self.wavlm(input_values=wav, output_hidden_states=True).hidden_states
            y_rec_embeddings = self.wavlm(input_values=y_rec, output_hidden_states=True).hidden_states
            y_embeddings = torch.stack(wav_embeddings, dim=1).transpose(-1, -2).flatten(start_dim=1, end_dim=2)
            y_rec_embeddings = torch.stack(y_rec_embeddings, dim=1).transpose(-1, -2).flatten(start_dim=1, end_dim=2)
        y_d_rs = self.wd(y_embeddings)
        y_d_gs = self.wd(y_rec_embeddings)
        r_loss = torch.mean((1 - y_d_rs) ** 2)
        g_loss = torch.mean((y_d_gs) ** 2)
        loss_disc_f = r_loss + g_loss
        return loss_disc_f.mean()


class SLMAdversarialLoss(nn.Module):
    def __init__(self, model, wl, skip_update=2):
        super().__init__()
        self.model = model
        self.wl = wl
        self.skip_update = skip_update

    def forward(self, iters, waves, ref_text, s_trg):
        bert_dur = self.model.bert(ref_text)
        d_en = self.model.bert_encoder(bert_dur)
        s_preds = s_trg
        d, en = self.model.predictor(d_en, s_preds)
        y_pred = self.model.decoder(en, s_preds)
        wav = waves

        # discriminator loss
        if (iters + 1) % self.skip_update == 0:
            d_loss = self.wl.discriminator(wav.detach().squeeze(), y_pred.detach().squeeze()).mean()
        else:
            d_loss = 0

        # generator loss
        gen_loss = self.wl.generator(y_pred.squeeze())
        gen_loss = gen_loss.mean()
        return d_loss, gen_loss, y_pred.detach().cpu().numpy()


model = Munch(
    bert=TinyBert(), bert_encoder=nn.Linear(8, 8), predictor=ProsodyPredictor(), diffusion=nn.Linear(8, 8),
    style_encoder=nn.Linear(80, 8), decoder=Decoder(), wd=WavLMDiscriminator(),
)
_ = [model[key].to(DEVICE) for key in model]
optimizer = MultiOptimizer({key: torch.optim.Adam(model[key].parameters(), lr=1e-3) for key in model})
wl = WavLMLoss(TinyWavLM(), model.wd).to(DEVICE)
slmadv = SLMAdversarialLoss(model, wl, skip_update=2)

for i in range(4):
    waves = torch.randn(4, 80, device=DEVICE)
    texts = torch.randint(0, 12, (4, 5), device=DEVICE)
    optimizer.zero_grad()

    s = model.style_encoder(waves)
    bert_dur = model.bert(texts)
    d_en = model.bert_encoder(bert_dur)
    d, en = model.predictor(d_en, s)
    y_rec = model.decoder(en, s)
    loss_mel = F.l1_loss(y_rec.squeeze(1), waves)
    loss_dur = d.pow(2).mean()
    loss_diff = F.mse_loss(model.diffusion(bert_dur.mean(1)), s.detach())
    g_loss = loss_mel + loss_dur + loss_diff
    g_loss.backward()

    optimizer.step('bert_encoder')
    optimizer.step('bert')
    optimizer.step('predictor')
    optimizer.step('diffusion')
    optimizer.step('style_encoder')
    optimizer.step('decoder')

    slm_out = slmadv(i, waves, texts, s.detach())
    d_loss_slm, loss_gen_lm, y_pred = slm_out

    # SLM discriminator loss
    if d_loss_slm != 0:
        optimizer.zero_grad()
        d_loss_slm.backward()
        optimizer.step('wd')  # step

    # SLM generator loss
    optimizer.zero_grad()
    loss_gen_lm.backward()

    # compute the gradient norm
    total_norm = {}
    for key in model.keys():
        total_norm[key] = 0
        parameters = [p for p in model[key].parameters() if p.grad is not None and p.requires_grad]
        for p in parameters:
            param_norm = p.grad.detach().data.norm(2)
            total_norm[key] += param_norm.item() ** 2
        total_norm[key] = total_norm[key] ** 0.5

    # gradient scaling
    if total_norm['predictor'] > 1.0:
        for key in model.keys():
            for p in model[key].parameters():
                if p.grad is not None:
                    p.grad *= (1 / total_norm['predictor'])

    for p in model.predictor.duration_proj.parameters():
        if p.grad is not None:
            p.grad *= 0.01

    optimizer.step('bert_encoder')
    optimizer.step('bert')
    optimizer.step('predictor')
    optimizer.step('diffusion')
print("done")
