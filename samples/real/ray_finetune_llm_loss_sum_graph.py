# source: https://github.com/ray-project/ray/issues/40714 — issue: Ray's LLM fine-tuning template 04 (finetune_hf_llm.py) fills GPU memory linearly with steps until OOM; the loop adds each step's loss tensor into loss_sum (also reported as #40984)
# fix-source: https://github.com/ray-project/ray/pull/40940 — merged PR "Make sure that loss can be freed after every iteration": loss_sum += loss.item()
# expect-kind: graph-growth
# expect-culprit: loss_sum
import contextlib
import time
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class TinyCausalLM(nn.Module):
    """Stand-in for AutoModelForCausalLM: model(**batch) returns an object with .loss."""

    def __init__(self, vocab_size=32, hidden=16):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden)
        self.block = nn.TransformerEncoderLayer(hidden, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)

    def forward(self, input_ids, attention_mask, labels):
        seq_len = input_ids.shape[1]
        causal = torch.triu(torch.full((seq_len, seq_len), float("-inf"), device=input_ids.device), diagonal=1)
        hidden_states = self.block(self.embed_tokens(input_ids), src_mask=causal)
        logits = self.lm_head(hidden_states)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        return SimpleNamespace(loss=loss, logits=logits)


class Accelerator:
    """The two calls of accelerate.Accelerator the loop uses."""

    device = DEVICE

    @contextlib.contextmanager
    def accumulate(self, model):
        yield

    def backward(self, loss):
        loss.backward()


def collate_fn(batch, device):
    input_ids = torch.stack(batch).to(device)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}


accelerator = Accelerator()
model = TinyCausalLM().to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-6)
lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
train_ds = [torch.randint(0, 32, (8,)) for _ in range(8)]
batch_size, num_epochs = 2, 1

for epoch in range(num_epochs):
    fwd_time_sum, bwd_time_sum, optim_step_time_sum = 0, 0, 0
    model.train()
    loss_sum = torch.tensor(0.0).to(accelerator.device)

    train_dataloader = [collate_fn(train_ds[i:i + batch_size], accelerator.device)
                        for i in range(0, len(train_ds), batch_size)]

    for step, batch in enumerate(train_dataloader):
        with accelerator.accumulate(model):
            s_fwd = time.time()
            outputs = model(**batch)
            loss = outputs.loss
            loss_sum += loss  # culprit
            e_fwd = time.time()
            fwd_time_sum += e_fwd - s_fwd
            s_bwd = time.time()
            accelerator.backward(loss)
            bwd_time_sum += time.time() - s_bwd

            s_opt_step = time.time()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            optim_step_time_sum += time.time() - s_opt_step

        print(f"[epoch {epoch} step {step}] loss: {loss.item():.4f}")

    print("avg_train_loss_epoch", loss_sum.item() / (step + 1))
print("done")
