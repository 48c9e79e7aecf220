# source: https://github.com/dropreg/R-Drop/issues/8 — summarization task: RDropTranslationTask.train_step back-propagates the loss that criterion.forward_reg already back-propagated
# fix-source: https://github.com/dropreg/R-Drop/commit/4ff517462a408b9d299cf2aa47386e8d8ad43440 — maintainer's fix "fix the bug #8": train_step only calls forward_reg, which does the backward
# expect-kind: second-backward
# expect-culprit: loss
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


def label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=None, reduce=True):
    if target.dim() == lprobs.dim() - 1:
        target = target.unsqueeze(-1)
    nll_loss = -lprobs.gather(dim=-1, index=target)
    smooth_loss = -lprobs.sum(dim=-1, keepdim=True)
    if ignore_index is not None:
        pad_mask = target.eq(ignore_index)
        nll_loss.masked_fill_(pad_mask, 0.)
        smooth_loss.masked_fill_(pad_mask, 0.)
    if reduce:
        nll_loss = nll_loss.sum()
        smooth_loss = smooth_loss.sum()
    eps_i = epsilon / lprobs.size(-1)
    loss = (1. - epsilon) * nll_loss + eps_i * smooth_loss
    return loss, nll_loss


class TinyBart(nn.Module):
    def __init__(self, vocab=12, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.1)
        self.output_projection = nn.Linear(dim, vocab)
        self.num_updates = 0

    def set_num_updates(self, num_updates):
        self.num_updates = num_updates

    def forward(self, src_tokens, src_lengths, prev_output_tokens):
        enc = self.dropout(torch.tanh(self.encoder(self.embed(src_tokens)))).mean(1, keepdim=True)
        dec = self.dropout(self.embed(prev_output_tokens) + enc)
        return self.output_projection(dec), {"attn": None}

    def get_normalized_probs(self, net_output, log_probs):
        logits = net_output[0]
        return F.log_softmax(logits, dim=-1) if log_probs else F.softmax(logits, dim=-1)

    def get_targets(self, sample, net_output):
        return sample["target"]


class FairseqOptimizer:
    def __init__(self, params, lr):
        self.optimizer = torch.optim.Adam(params, lr=lr)

    def backward(self, loss):
        loss.backward()

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        self.optimizer.step()


class RegLabelSmoothedCrossEntropyCriterion:
    def __init__(self, padding_idx, label_smoothing):
        self.padding_idx = padding_idx
        self.eps = label_smoothing

    def compute_kl_loss(self, model, net_output, pad_mask=None, reduce=True):
        net_prob = model.get_normalized_probs(net_output, log_probs=True)
        net_prob_tec = model.get_normalized_probs(net_output, log_probs=False)
        p, q = torch.split(net_prob, net_prob.size(0) // 2, dim=0)
        p_tec, q_tec = torch.split(net_prob_tec, net_prob_tec.size(0) // 2, dim=0)
        p_loss = F.kl_div(p, q_tec, reduction='none')
        q_loss = F.kl_div(q, p_tec, reduction='none')
        if pad_mask is not None:
            p_loss.masked_fill_(pad_mask, 0.)
            q_loss.masked_fill_(pad_mask, 0.)
        if reduce:
            p_loss = p_loss.sum()
            q_loss = q_loss.sum()
        return (p_loss + q_loss) / 2

    def forward_reg(self, model, sample, optimizer, reg_alpha, ignore_grad, reduce=True):
        sample_input = sample['net_input']
        sample_concat_input = {
            'src_tokens': torch.cat([sample_input['src_tokens'], sample_input['src_tokens'].clone()], 0),
            'src_lengths': torch.cat([sample_input['src_lengths'], sample_input['src_lengths'].clone()], 0),
            'prev_output_tokens': torch.cat([sample_input['prev_output_tokens'],
                                             sample_input['prev_output_tokens'].clone()], 0),
        }
        net_output = model(**sample_concat_input)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        lprobs = lprobs.view(-1, lprobs.size(-1))
        target = model.get_targets(sample, net_output)
        pad_mask = target.unsqueeze(-1).eq(self.padding_idx)
        target = torch.cat([target, target.clone()], dim=0)
        loss, nll_loss = label_smoothed_nll_loss(
            lprobs, target.view(-1, 1), self.eps, ignore_index=self.padding_idx, reduce=reduce,
        )
        kl_loss = self.compute_kl_loss(model, net_output, pad_mask)
        loss += reg_alpha * kl_loss
        if ignore_grad:
            loss *= 0
        with torch.autograd.profiler.record_function("backward"):
            optimizer.backward(loss)
        logging_output = {
            'loss': loss.data.item(),
            'nll_loss': nll_loss.data.item(),
            'ntokens': sample['ntokens'],
            'sample_size': sample['ntokens'],
        }
        return loss, sample['ntokens'], logging_output


class RDropTranslationTask:
    def __init__(self, reg_alpha):
        self.criterion_reg_alpha = reg_alpha

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        model.train()
        model.set_num_updates(update_num)
        with torch.autograd.profiler.record_function("forward"):
            loss, sample_size, logging_output = criterion.forward_reg(model, sample, optimizer, self.criterion_reg_alpha, ignore_grad)  # culprit
        if ignore_grad:
            loss *= 0
        with torch.autograd.profiler.record_function("backward"):
            optimizer.backward(loss)
        return loss, sample_size, logging_output


model = TinyBart().to(DEVICE)
criterion = RegLabelSmoothedCrossEntropyCriterion(padding_idx=1, label_smoothing=0.1)
optimizer = FairseqOptimizer(model.parameters(), lr=1e-3)
task = RDropTranslationTask(reg_alpha=0.7)

for update_num in range(4):
    src_tokens = torch.randint(2, 12, (2, 5), device=DEVICE)
    target = torch.randint(2, 12, (2, 4), device=DEVICE)
    sample = {
        'net_input': {
            'src_tokens': src_tokens,
            'src_lengths': torch.full((2,), 5, device=DEVICE),
            'prev_output_tokens': torch.cat([torch.full((2, 1), 2, device=DEVICE), target[:, :-1]], 1),
        },
        'target': target,
        'ntokens': target.numel(),
    }
    optimizer.zero_grad()
    task.train_step(sample, model, criterion, optimizer, update_num)
    optimizer.step()
print("done")
