# source: https://github.com/open-mmlab/Amphion/issues/263 — issue: CPU memory grows every epoch while training valle_v2 (VALL-E AR codec-token model); models/tts/valle_v2/base_trainer.py at f96a153 sums the step loss tensor into epoch_sum_loss in _train_epoch
# fix-source: https://github.com/open-mmlab/Amphion/issues/263 — maintainer's answer (jiaqili3, author of valle_v2): change "epoch_sum_loss += loss" to "epoch_sum_loss += loss.item()"
# expect-kind: none
# fix: _train_epoch accumulates the float value, epoch_sum_loss += loss.item(), so the running sum no longer chains every step's graph
import math
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class TinyCausalLM(nn.Module):
    """Stand-in for the LlamaForCausalLM inside ValleAR: token embedding, one causal self-attention block, LM head."""

    def __init__(self, vocab_size, hidden_size):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.attn = nn.MultiheadAttention(hidden_size, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, hidden_size * 2), nn.SiLU(), nn.Linear(hidden_size * 2, hidden_size))
        self.lm_head = nn.Linear(hidden_size, vocab_size)

    def forward(self, input_ids, attention_mask, labels):
        h = self.embed_tokens(input_ids)
        L = input_ids.shape[1]
        causal = torch.triu(torch.ones(L, L, dtype=torch.bool, device=input_ids.device), 1)
        a, _ = self.attn(h, h, h, attn_mask=causal, key_padding_mask=attention_mask == 0)
        h = h + a
        h = h + self.mlp(h)
        logits = self.lm_head(h)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        return SimpleNamespace(loss=loss, logits=logits)


class ValleAR(nn.Module):
    def __init__(self, phone_vocab_size=10, target_vocab_size=12, hidden_size=16, pad_token_id=-100):
        super().__init__()
        self.phone_vocab_size = phone_vocab_size
        self.pad_token_id = pad_token_id
        self.model = TinyCausalLM(phone_vocab_size + target_vocab_size, hidden_size)

    def forward(self, phone_ids, phone_mask, target_ids, target_mask):
        target_ids = target_ids + self.phone_vocab_size
        phone_label = torch.full_like(phone_ids, -100)  # loss for entire phone is not computed
        target_label = target_ids.masked_fill(target_mask == 0, -100)  # loss for target on unmasked tokens
        input_token_ids = torch.cat([phone_ids, target_ids], dim=-1)
        attention_mask = torch.cat([phone_mask, target_mask], dim=-1)
        labels = torch.cat([phone_label, target_label], dim=-1)
        return self.model(input_token_ids, attention_mask=attention_mask, labels=labels)


class VALLETrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.model = ValleAR().to(DEVICE)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.adamw.lr)
        self.train_dataloader = [
            {"phone_ids": torch.randint(0, 10, (2, 5), device=DEVICE),
             "phone_lens": torch.tensor([5, 4], device=DEVICE),
             "speech": torch.randint(0, 12, (2, 7), device=DEVICE),
             "speech_len": torch.tensor([7, 6], device=DEVICE)}
            for _ in range(4)
        ]
        self.epoch, self.step, self.batch_count = 0, 0, 0

    def get_lr(self, it):
        if it < self.cfg.train.scheduler.warmup_steps:
            return self.cfg.train.adamw.lr * it / self.cfg.train.scheduler.warmup_steps
        if it > self.cfg.train.scheduler.total_steps:
            return self.cfg.train.scheduler.min_lr
        decay_ratio = (it - self.cfg.train.scheduler.warmup_steps) / (
            self.cfg.train.scheduler.total_steps - self.cfg.train.scheduler.warmup_steps
        )
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return self.cfg.train.scheduler.min_lr + coeff * (self.cfg.train.adamw.lr - self.cfg.train.scheduler.min_lr)

    def _train_step(self, batch):
        phone_mask = (torch.arange(batch["phone_ids"].size(1), device=DEVICE)[None] < batch["phone_lens"][:, None]).long()
        speech_mask = (torch.arange(batch["speech"].size(1), device=DEVICE)[None] < batch["speech_len"][:, None]).long()
        out = self.model(
            phone_ids=batch["phone_ids"],
            phone_mask=phone_mask,
            target_ids=batch["speech"],
            target_mask=speech_mask,
        )
        loss = out.loss
        return loss

    def _train_epoch(self):
        self.model.train()
        epoch_sum_loss: float = 0.0
        ema_loss = None

        for batch in self.train_dataloader:
            # update learning rate
            lr = self.get_lr(self.step)
            for param_group in self.optimizer.param_groups:
                param_group["lr"] = lr

            # Do training step and BP
            loss = self._train_step(batch)
            self.current_loss = loss.item()
            ema_loss = (
                0.99 * ema_loss + 0.01 * self.current_loss
                if ema_loss is not None
                else self.current_loss
            )
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.batch_count += 1

            epoch_sum_loss += loss.item()
            self.step += 1

        return (
            epoch_sum_loss
            / len(self.train_dataloader)
            * self.cfg.train.gradient_accumulation_step
        )

    def train_loop(self, num_epochs):
        for _ in range(num_epochs):
            train_loss = self._train_epoch()
            print("  |- Train/Loss: {:.6f}".format(train_loss))
            self.epoch += 1


cfg = SimpleNamespace(train=SimpleNamespace(
    adamw=SimpleNamespace(lr=1e-3),
    scheduler=SimpleNamespace(warmup_steps=2, total_steps=20, min_lr=1e-5),
    gradient_accumulation_step=1,
))
VALLETrainer(cfg).train_loop(2)
print("done")
