# source: https://github.com/by2101/OpenASR/issues/12 — issue "训练的时候存在内存泄露" (memory keeps rising during training): Trainer.iter_one_epoch (src/trainer.py) sums each batch's loss tensor into `tot_loss = tot_loss + batch_loss` for the "avg_token_loss" log metric, so every batch's graph is chained into tot_loss for the whole epoch
# fix-source: https://github.com/by2101/OpenASR/issues/12 — the maintainer (by2101) in the thread: tot_loss is only for logging, so accumulate `batch_loss.item()` (a float) instead of the tensor
# expect-kind: none
# fix: `tot_loss = tot_loss + batch_loss.item()`, so the epoch total used for logging is a float with no history
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import clip_grad_norm_
from _device import DEVICE


class MetricSummarizer(object):
    def __init__(self):
        self.metrics = {}
        self.metric_names = []
        self.summarized = {}

    def register_metric(self, name, display=False, visual=False, optim=False):
        self.metric_names.append({"name": name, "display": display, "visual": visual, "optim": optim})

    def reset_metrics(self):
        self.metrics = {}
        for item in self.metric_names:
            self.metrics[item["name"]] = None
        self.summarized = {}

    def update_metric(self, name, loss, weight=1.0):
        if name in self.metrics:
            self.metrics[name] = (loss, weight)
        else:
            raise ValueError("The metric {} is not registered.".format(name))

    def summarize(self):
        self.summarized = {}
        for key in self.metrics.keys():
            if self.metrics[key] is None:
                continue
            item = self.metrics[key]
            self.summarized[key] = item[0] * item[1]

    def collect_loss(self):
        loss = 0
        for item in self.metric_names:
            key = item['name']
            if item["optim"] == True:
                v = self.metrics[key]
                loss += v[0] * v[1]
        return loss


class Model(nn.Module):
    def __init__(self, frame=16, d_model=8, vocab=10):
        super(Model, self).__init__()
        self.frame = frame
        self.splayer = nn.Linear(frame, d_model)
        self.encoder = nn.GRU(d_model, d_model, batch_first=True)
        self.embed = nn.Embedding(vocab, d_model)
        self.out = nn.Linear(2 * d_model, vocab)

    def get_logits(self, batch_wave, lengths, target_ids, target_lengths):
        B = batch_wave.shape[0]
        sp_outputs = self.splayer(batch_wave.view(B, -1, self.frame))
        encoder_outputs, _ = self.encoder(sp_outputs)
        dec = self.embed(target_ids)
        att = torch.softmax(dec @ encoder_outputs.transpose(1, 2), dim=-1)
        ctx = att @ encoder_outputs
        return self.out(torch.cat([dec, ctx], dim=-1))

    def forward(self, batch_wave, lengths, target_ids, target_labels=None, target_paddings=None,
                label_smooth=0., lst_w=0., lst_t=1.0):
        target_lengths = torch.sum(1-target_paddings, dim=-1).long()
        logits = self.get_logits(batch_wave, lengths, target_ids, target_lengths)
        losses = self._compute_cross_entropy_losses(logits, target_labels, target_paddings)
        loss = torch.sum(losses)
        if label_smooth > 0:
            loss = loss*(1-label_smooth) + self._uniform_label_smooth(logits, target_paddings)*label_smooth
        return loss

    def _uniform_label_smooth(self, logits, paddings):
        log_probs = F.log_softmax(logits, dim=-1)
        nlabel = log_probs.shape[-1]
        ent_uniform = -torch.sum(log_probs, dim=-1)/nlabel
        return torch.sum(ent_uniform*(1-paddings).float())

    def _compute_cross_entropy_losses(self, logits, labels, paddings):
        B, T, V = logits.shape
        losses = F.cross_entropy(logits.view(-1, V), labels.view(-1), reduction="none").view(B, T) * (1-paddings).float()
        return losses


class Trainer(object):
    def __init__(self, model, tr_loader):
        self.model = model
        self.tr_loader = tr_loader
        self.accumulate_grad_batch = 1
        self.grad_max_norm = 5.
        self.label_smooth = 0.1
        self.lst_w = 0.
        self.lst_t = 1.0
        self.step = 0
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.metric_summarizer = MetricSummarizer()
        self.metric_summarizer.register_metric("per_token_loss", display=True, visual=True, optim=True)
        self.metric_summarizer.register_metric("avg_token_loss", display=True, visual=True, optim=False)
        self.metric_summarizer.register_metric("learning_rate", display=True, visual=True, optim=False)
        self.metric_summarizer.reset_metrics()

    def iter_one_epoch(self, cross_valid=False):
        niter = 0
        loader = self.tr_loader
        self.model.train()
        tot_loss = 0.
        tot_token = 0
        tot_sequence = 0
        n_accu_batch = self.accumulate_grad_batch
        loader_iter = iter(loader)
        tot_iter_num = len(loader)
        while True:
            try:
                data = next(loader_iter)
                niter += 1
            except StopIteration:
                break
            (utts, padded_waveforms, wave_lengths, ids, labels, paddings) = data
            this_loss = self.model(padded_waveforms.to(DEVICE), wave_lengths.to(DEVICE), ids.to(DEVICE),
                                   labels.to(DEVICE), paddings.to(DEVICE),
                                   label_smooth=self.label_smooth, lst_w=self.lst_w, lst_t=self.lst_t)

            batch_loss = torch.sum(this_loss)
            n_token = torch.sum(1-paddings).float()
            n_sequence = len(utts)

            tot_loss = tot_loss + batch_loss.item()
            tot_token = tot_token + n_token
            tot_sequence = tot_sequence + n_sequence

            self.metric_summarizer.reset_metrics()
            self.metric_summarizer.update_metric("per_token_loss", batch_loss, 1.0/n_token)
            self.metric_summarizer.update_metric("avg_token_loss", tot_loss, 1.0/tot_token)
            self.metric_summarizer.update_metric("learning_rate", list(self.optimizer.param_groups)[0]["lr"], 1.0)
            self.metric_summarizer.summarize()

            loss = self.metric_summarizer.collect_loss()
            loss = loss/self.accumulate_grad_batch

            if not cross_valid:
                if n_accu_batch == self.accumulate_grad_batch:
                    self.optimizer.zero_grad()
                loss.backward()
                n_accu_batch -= 1
                if n_accu_batch == 0 or niter == tot_iter_num:
                    self.step += 1
                    clip_grad_norm_(self.model.parameters(), self.grad_max_norm)
                    self.optimizer.step()
                    n_accu_batch = self.accumulate_grad_batch
                else:
                    continue
        self.metric_summarizer.reset_metrics()
        return (tot_loss/tot_token).item()


B, n_frames, frame, T, vocab = 2, 5, 16, 4, 10
tr_loader = []
for i in range(3):
    paddings = torch.zeros(B, T, device=DEVICE)
    paddings[1, -1] = 1
    tr_loader.append((["utt%d_%d" % (i, b) for b in range(B)],
                      torch.randn(B, n_frames * frame, device=DEVICE),
                      torch.full((B,), n_frames * frame, device=DEVICE),
                      torch.randint(0, vocab, (B, T), device=DEVICE),
                      torch.randint(0, vocab, (B, T), device=DEVICE),
                      paddings))
model = Model(frame=frame, vocab=vocab).to(DEVICE)
trainer = Trainer(model, tr_loader)
for epoch in range(2):
    tr_loss = trainer.iter_one_epoch()
print("done")
