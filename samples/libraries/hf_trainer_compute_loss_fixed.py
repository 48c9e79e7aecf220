# expect-kind: none
# fix: `compute_loss` stores the last batch's summary detached
# A Hugging Face `Trainer` subclass whose `compute_loss` adds a smoothness penalty against the
# last batch's mean hidden state, kept on the trainer detached: the penalty trains through this
# batch only. A tiny random GPT-2, no downloaded weights.
import tempfile

import torch
from _device import DEVICE
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class SmoothedTrainer(Trainer):
    previous = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, output_hidden_states=True)
        summary = outputs.hidden_states[-1].mean()
        loss = outputs.loss
        if self.previous is not None:
            loss = loss + 0.1 * (summary - self.previous) ** 2
        self.previous = summary.detach()
        return (loss, outputs) if return_outputs else loss


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.randint(0, 50, (8,))
        return {"input_ids": ids, "labels": ids}


model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=2, max_steps=3, report_to=[],
                         use_cpu=DEVICE.type == "cpu", save_strategy="no", logging_strategy="no", disable_tqdm=True)
trainer = SmoothedTrainer(model=model, args=args, train_dataset=Tokens())
trainer.train()
