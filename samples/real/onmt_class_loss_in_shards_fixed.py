# source: https://github.com/OpenNMT/OpenNMT-py/issues/2153 — issue "Extra custom loss": class_loss.backward() added inside LossComputeBase.__call__, before the sharded NMT loss back-propagates through the model
# fix-source: expert fix (no patch in the thread): the classification loss shares the encoder graph with the deferred sharded backward, so retain it on the first backward
# expect-kind: none
# fix: class_loss.backward(retain_graph=True): the sharded NMT backward still has to go through the encoder graph it shares
import torch
import torch.nn as nn
from _device import DEVICE

PAD, VOCAB, HIDDEN, N_CLASSES = 0, 12, 16, 3


class Statistics:
    def __init__(self, loss=0.0, n_words=0, n_correct=0):
        self.loss, self.n_words, self.n_correct = loss, n_words, n_correct

    def update(self, stat):
        self.loss += stat.loss
        self.n_words += stat.n_words
        self.n_correct += stat.n_correct


class RNNEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.rnn = nn.GRU(HIDDEN, HIDDEN)

    def forward(self, src, lengths=None):
        memory_bank, enc_state = self.rnn(self.embeddings(src.squeeze(2)))
        return enc_state, memory_bank, lengths


class InputFeedDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.rnn = nn.GRU(HIDDEN, HIDDEN)
        self.out = nn.Linear(2 * HIDDEN, HIDDEN)

    def init_state(self, src, memory_bank, enc_state):
        self.state = {"hidden": enc_state}

    def forward(self, tgt, memory_bank, memory_lengths=None):
        dec_out, _ = self.rnn(self.embeddings(tgt.squeeze(2)), self.state["hidden"])
        align = torch.softmax(torch.einsum("tbh,sbh->bts", dec_out, memory_bank), dim=-1)
        context = torch.einsum("bts,sbh->tbh", align, memory_bank)
        return torch.tanh(self.out(torch.cat([dec_out, context], dim=-1))), {"std": align}


class NMTModel(nn.Module):
    def __init__(self, encoder, decoder, classifier):
        super().__init__()
        self.encoder, self.decoder, self.classifier = encoder, decoder, classifier

    def forward(self, src, tgt, lengths, bptt=False):
        dec_in = tgt[:-1]
        enc_state, memory_bank, lengths = self.encoder(src, lengths)
        stargets_logits = self.classifier(memory_bank.mean(0))  # the added classification head
        if not bptt:
            self.decoder.init_state(src, memory_bank, enc_state)
        dec_out, attns = self.decoder(dec_in, memory_bank, memory_lengths=lengths)
        return dec_out, attns, stargets_logits


def filter_shard_state(state, shard_size=None):
    for k, v in state.items():
        if v is not None:
            v_split = []
            for v_chunk in torch.split(v, shard_size):
                v_chunk = v_chunk.data.clone()
                v_chunk.requires_grad = v.requires_grad
                v_split.append(v_chunk)
            yield k, (v, v_split)


def shards(state, shard_size):
    non_none = dict(filter_shard_state(state, shard_size))
    keys, values = zip(*((k, v_split) for k, (_, v_split) in non_none.items()))
    for shard_tensors in zip(*values):
        yield dict(zip(keys, shard_tensors))
    # Assumed backprop'd: now back-propagate the shards' gradients through the whole model
    variables = []
    for k, (v, v_split) in non_none.items():
        if state[k].requires_grad:
            variables.extend(zip(torch.split(state[k], shard_size), [v_chunk.grad for v_chunk in v_split]))
    inputs, grads = zip(*variables)
    torch.autograd.backward(inputs, grads)


class NMTLossCompute(nn.Module):
    def __init__(self, criterion, generator):
        super().__init__()
        self.criterion, self.generator = criterion, generator
        self.class_criterion = nn.CrossEntropyLoss(reduction="sum")
        self.padding_idx = PAD

    def __call__(self, batch, output, attns, stargets_logits, normalization=1.0, shard_size=0):
        shard_state = self._make_shard_state(batch, output)
        batch_stats = Statistics()
        class_loss, class_stats = self._compute_class_loss(stargets_logits, batch.stargets)
        class_loss.backward(retain_graph=True)
        batch_stats.update(class_stats)
        for shard in shards(shard_state, shard_size):
            loss, stats = self._compute_loss(batch, **shard)
            loss.div(float(normalization)).backward()
            batch_stats.update(stats)
        return None, batch_stats

    def _make_shard_state(self, batch, output):
        return {"output": output, "target": batch.tgt[1:, :, 0]}

    def _compute_loss(self, batch, output, target):
        scores = self.generator(output.reshape(-1, output.size(2)))
        gtruth = target.reshape(-1)
        loss = self.criterion(scores, gtruth)
        return loss, self._stats(loss.clone(), scores, gtruth)

    def _compute_class_loss(self, stargets_logits, stargets_refs):
        class_loss = self.class_criterion(stargets_logits, stargets_refs)
        n_correct = (stargets_logits.argmax(1) == stargets_refs).sum().item()
        return class_loss, Statistics(class_loss.item(), len(stargets_refs), n_correct)

    def _stats(self, loss, scores, target):
        non_padding = target.ne(self.padding_idx)
        num_correct = scores.max(1)[1].eq(target).masked_select(non_padding).sum().item()
        return Statistics(loss.item(), non_padding.sum().item(), num_correct)


class Batch:
    def __init__(self):
        self.src = torch.randint(1, VOCAB, (7, 4, 1), device=DEVICE)
        self.tgt = torch.randint(1, VOCAB, (6, 4, 1), device=DEVICE)
        self.stargets = torch.randint(0, N_CLASSES, (4,), device=DEVICE)
        self.src_lengths = torch.full((4,), 7, device=DEVICE)


class Trainer:
    def __init__(self, model, train_loss, optim, shard_size=2):
        self.model, self.train_loss, self.optim, self.shard_size = model, train_loss, optim, shard_size

    def train(self, train_iter):
        total_stats = Statistics()
        for batch in train_iter:
            self._gradient_accumulation([batch], normalization=batch.tgt[1:].ne(PAD).sum().item(),
                                        total_stats=total_stats)

    def _gradient_accumulation(self, true_batches, normalization, total_stats):
        for batch in true_batches:
            self.optim.zero_grad()
            outputs, attns, stargets_logits = self.model(batch.src, batch.tgt, batch.src_lengths)
            loss, batch_stats = self.train_loss(batch, outputs, attns, stargets_logits,
                                                normalization=normalization, shard_size=self.shard_size)
            if loss is not None:
                loss.backward()
            total_stats.update(batch_stats)
        self.optim.step()


generator = nn.Sequential(nn.Linear(HIDDEN, VOCAB), nn.LogSoftmax(dim=-1)).to(DEVICE)
model = NMTModel(RNNEncoder(), InputFeedDecoder(), nn.Linear(HIDDEN, N_CLASSES)).to(DEVICE)
train_loss = NMTLossCompute(nn.NLLLoss(ignore_index=PAD, reduction="sum"), generator)
optim = torch.optim.Adam([*model.parameters(), *generator.parameters()], lr=1e-3)
trainer = Trainer(model, train_loss, optim)
trainer.train([Batch() for _ in range(3)])
print("done")
