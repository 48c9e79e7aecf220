# source: https://github.com/facebookresearch/fairseq/issues/2255 — issue "memory leakage caused by logging_output in criterion masked_lm": MaskedLmLoss.forward puts the loss tensor itself into logging_output, reduce_metrics sums it into metrics.log_scalar, and every active AverageMeter keeps `self.sum = self.sum + val * n` with the graph of every step
# fix-source: https://github.com/facebookresearch/fairseq/commit/8eb9123f560d32940f96a01369d61c1684dce085 — maintainers' fix "Patch masked_lm memory leak on GPUs": logging_output gets `'loss': loss if self.tpu else loss.data`
# expect-kind: none
# fix: MaskedLmLoss.forward logs `'loss': loss if self.tpu else loss.data`, so the meters sum a tensor without history
import contextlib
import math
import uuid
from collections import OrderedDict, defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# ---- fairseq/logging/meters.py (trimmed) ----
def safe_round(number, ndigits):
    if torch.is_tensor(number) and number.numel() == 1:
        return round(number.item(), ndigits)
    return round(number, ndigits)


def type_as(a, b):
    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.to(b)
    else:
        return a


class AverageMeter(object):
    """Computes and stores the average and current value"""

    def __init__(self, round=None):
        self.round = round
        self.reset()

    def reset(self):
        self.val = None  # most recent update
        self.sum = 0  # sum from all updates
        self.count = 0  # total n from all updates

    def update(self, val, n=1):
        if val is not None:
            self.val = val
            if n > 0:
                self.sum = type_as(self.sum, val) + (val * n)
                self.count = type_as(self.count, n) + n

    @property
    def avg(self):
        return self.sum / self.count if self.count > 0 else self.val

    @property
    def smoothed_value(self):
        val = self.avg
        if self.round is not None and val is not None:
            val = safe_round(val, self.round)
        return val


class MetersDict(OrderedDict):
    def add_meter(self, key, meter):
        self[key] = meter

    def get_smoothed_values(self):
        return {k: m.smoothed_value for k, m in self.items()}


# ---- fairseq/logging/metrics.py (trimmed) ----
_aggregators = OrderedDict()
_active_aggregators = OrderedDict()
_active_aggregators_cnt = defaultdict(lambda: 0)


def reset():
    _aggregators.clear()
    _active_aggregators.clear()
    _active_aggregators_cnt.clear()
    # The "default" aggregator observes all logged values.
    _aggregators["default"] = MetersDict()
    _active_aggregators["default"] = _aggregators["default"]
    _active_aggregators_cnt["default"] = 1


reset()


@contextlib.contextmanager
def aggregate(name=None):
    if name is None:
        name = str(uuid.uuid4())
        agg = MetersDict()
    else:
        agg = _aggregators.setdefault(name, MetersDict())
    _active_aggregators[name] = agg
    _active_aggregators_cnt[name] += 1
    yield agg
    _active_aggregators_cnt[name] -= 1
    if _active_aggregators_cnt[name] == 0 and name in _active_aggregators:
        del _active_aggregators[name]


def log_scalar(key, value, weight=1, round=None):
    for agg in list(_active_aggregators.values()):
        if key not in agg:
            agg.add_meter(key, AverageMeter(round=round))
        agg[key].update(value, weight)


# ---- fairseq/criterions/masked_lm.py (trimmed) ----
class MaskedLmLoss(nn.Module):
    def __init__(self, padding_idx, tpu=False):
        super().__init__()
        self.padding_idx = padding_idx
        self.tpu = tpu

    def forward(self, model, sample, reduce=True):
        masked_tokens = sample['target'].ne(self.padding_idx)
        sample_size = masked_tokens.int().sum()

        logits = model(sample['net_input']['src_tokens'], masked_tokens=masked_tokens)
        targets = sample['target'][masked_tokens]

        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)),
            targets.view(-1),
            reduction='sum',
            ignore_index=self.padding_idx,
        )

        logging_output = {
            'loss': loss if self.tpu else loss.data,
            'ntokens': sample['ntokens'],
            'nsentences': sample['nsentences'],
            'sample_size': sample_size,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs):
        loss_sum = sum(log.get('loss', 0) for log in logging_outputs)
        sample_size = sum(log.get('sample_size', 0) for log in logging_outputs)
        log_scalar('loss', loss_sum / sample_size / math.log(2), sample_size, round=3)


# ---- a tiny masked LM (stands in for RobertaModel) ----
class TinyMaskedLM(nn.Module):
    def __init__(self, vocab=12, dim=8):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layer = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, src_tokens, masked_tokens=None):
        x = torch.tanh(self.layer(self.embed_tokens(src_tokens)))
        if masked_tokens is not None:
            x = x[masked_tokens, :]
        return self.lm_head(x)


# ---- fairseq/trainer.py + tasks/fairseq_task.py (trimmed) ----
class Trainer(object):
    def __init__(self, model, criterion, optimizer):
        self.model = model
        self.criterion = criterion
        self.optimizer = optimizer

    def task_train_step(self, sample):
        self.model.train()
        loss, sample_size, logging_output = self.criterion(self.model, sample)
        loss.backward()
        return loss, sample_size, logging_output

    def train_step(self, samples):
        with aggregate("train"):
            self.optimizer.zero_grad()
            logging_outputs, sample_size = [], 0
            for sample in samples:
                loss, sample_size_i, logging_output = self.task_train_step(sample)
                del loss
                logging_outputs.append(logging_output)
                sample_size += sample_size_i
            self.optimizer.step()
            return self._reduce_and_log_stats(logging_outputs, sample_size)

    def _reduce_and_log_stats(self, logging_outputs, sample_size):
        with aggregate() as agg:
            self.criterion.reduce_metrics(logging_outputs)
            del logging_outputs
            logging_output = agg.get_smoothed_values()
            logging_output["sample_size"] = sample_size
            return logging_output


PAD = 1
model = TinyMaskedLM().to(DEVICE)
criterion = MaskedLmLoss(padding_idx=PAD, tpu=False)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
trainer = Trainer(model, criterion, optimizer)

for num_updates in range(3):
    src_tokens = torch.randint(2, 12, (2, 6), device=DEVICE)
    target = torch.full_like(src_tokens, PAD)
    target[:, 1] = src_tokens[:, 1]
    target[:, 4] = src_tokens[:, 4]
    sample = {
        'net_input': {'src_tokens': src_tokens},
        'target': target,
        'ntokens': src_tokens.numel(),
        'nsentences': src_tokens.size(0),
    }
    log = trainer.train_step([sample])
    print(num_updates, log['loss'])

print("done")
