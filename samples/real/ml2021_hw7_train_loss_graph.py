# source: https://github.com/pai4451/ML2021/issues/2 — issue: HW7 (BERT QA) training loop's `train_loss += output.loss` keeps every step's graph until CPU RAM runs out
# fix-source: https://github.com/pai4451/ML2021/issues/2 — reporter's fix (`train_loss += output.loss.detach()` or `.item()`), confirmed by the repository owner ("detach ... helps prevent memory leak")
# expect-kind: graph-growth
# expect-culprit: train_loss
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from _device import DEVICE


@dataclass
class QuestionAnsweringModelOutput:
    loss: Optional[torch.Tensor] = None
    start_logits: torch.Tensor = None
    end_logits: torch.Tensor = None


class BertForQuestionAnswering(nn.Module):
    # a tiny stand-in for transformers' BertForQuestionAnswering (same call signature and output fields)
    def __init__(self, vocab_size=30, hidden_size=16):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.token_type_embeddings = nn.Embedding(2, hidden_size)
        self.encoder = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.Tanh())
        self.qa_outputs = nn.Linear(hidden_size, 2)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None, end_positions=None):
        hidden = self.encoder(self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids))
        hidden = hidden * attention_mask.unsqueeze(-1)
        logits = self.qa_outputs(hidden)
        start_logits, end_logits = logits.split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1), end_logits.squeeze(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss_fct = nn.CrossEntropyLoss()
            loss = (loss_fct(start_logits, start_positions) + loss_fct(end_logits, end_positions)) / 2
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


device = DEVICE
model = BertForQuestionAnswering().to(device)
seq_len, train_batch_size = 12, 4
train_loader = [(torch.randint(0, 30, (train_batch_size, seq_len)),
                 torch.randint(0, 2, (train_batch_size, seq_len)),
                 torch.ones(train_batch_size, seq_len, dtype=torch.long),
                 torch.randint(0, seq_len, (train_batch_size,)),
                 torch.randint(0, seq_len, (train_batch_size,))) for _ in range(5)]

num_epoch = 1
logging_step = 100
learning_rate = 1e-5

optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

# Total number of training steps
total_steps = len(train_loader) * num_epoch
# Set up the learning rate scheduler
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0,  # Default value
                                            num_training_steps=total_steps)

model.train()

for epoch in range(num_epoch):
    step = 1
    train_loss = train_acc = 0

    for idx, data in enumerate(train_loader):
        # Load all data into GPU
        data = [i.to(device) for i in data]

        # Model inputs: input_ids, token_type_ids, attention_mask, start_positions, end_positions (Note: only "input_ids" is mandatory)
        # Model outputs: start_logits, end_logits, loss (return when start_positions/end_positions are provided)
        output = model(input_ids=data[0], token_type_ids=data[1], attention_mask=data[2], start_positions=data[3], end_positions=data[4])

        # Choose the most probable start position / end position
        start_index = torch.argmax(output.start_logits, dim=1)
        end_index = torch.argmax(output.end_logits, dim=1)

        # Prediction is correct only if both start_index and end_index are correct
        train_acc += ((start_index == data[3]) & (end_index == data[4])).float().mean()
        train_loss += output.loss  # culprit

        output.loss.backward()

        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

        step += 1

        # Print training loss and accuracy over past logging step
        if step % logging_step == 0:
            print(f"Epoch {epoch + 1} | Step {step} | loss = {train_loss.item() / logging_step:.3f}, acc = {train_acc / logging_step:.3f}")
            train_loss = train_acc = 0
print("done")
