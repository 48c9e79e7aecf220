# source: https://github.com/seanie12/SWEP/issues/3 — issue (labelled bug): run_squad.py fails at loss.backward() with "one of the variables needed for gradient computation has been modified by an inplace operation: [torch.cuda.LongTensor [8]]" (models.py at 0c8b754: VariationalBert.forward runs BertForQuestionAnswering twice on the same start/end positions, and the transformers head clamps them in place, so the second call bumps the targets the first call's cross-entropy saved)
# fix-source: https://github.com/huggingface/transformers/pull/12026 — merged fix of the same error in transformers' question-answering heads (teacher and student clamping the same positions): `start_positions = start_positions.clamp(0, ignored_index)`, out of place
# expect-kind: none
# fix: the head clamps the positions out of place, as transformers' QA heads have since PR #12026, so the second call no longer changes the targets the first call's cross-entropy saved (the same loss as the two calls of the buggy script)
from math import sqrt

import torch
import torch.nn as nn
from torch.nn import CrossEntropyLoss
from _device import DEVICE


# --- stand-in for transformers' BertForQuestionAnswering (its QA head as in transformers 4.x) ---
class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, hidden_size, max_len):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings = nn.Embedding(max_len, hidden_size)
        self.token_type_embeddings = nn.Embedding(2, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size)

    def forward(self, input_ids=None, token_type_ids=None, inputs_embeds=None):
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        seq_len = inputs_embeds.size(1)
        position_ids = torch.arange(seq_len, device=inputs_embeds.device).unsqueeze(0)
        embeddings = inputs_embeds + self.position_embeddings(position_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(embeddings)


class BertModel(nn.Module):
    def __init__(self, vocab_size, hidden_size, max_len):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab_size, hidden_size, max_len)
        self.layer = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.Linear(hidden_size, hidden_size))

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, inputs_embeds=None):
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
        sequence_output = self.layer(hidden) * attention_mask.unsqueeze(-1)
        return (sequence_output,)


class BertForQuestionAnswering(nn.Module):
    def __init__(self, vocab_size=30, hidden_size=16, max_len=12):
        super().__init__()
        self.bert = BertModel(vocab_size, hidden_size, max_len)
        self.qa_outputs = nn.Linear(hidden_size, 2)
        self.config = type("BertConfig", (), {"hidden_dropout_prob": 0.1})()

    def get_input_embeddings(self):
        return self.bert.embeddings.word_embeddings

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None):
        outputs = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            inputs_embeds=inputs_embeds)
        sequence_output = outputs[0]
        logits = self.qa_outputs(sequence_output)
        start_logits, end_logits = logits.split(1, dim=-1)
        start_logits = start_logits.squeeze(-1).contiguous()
        end_logits = end_logits.squeeze(-1).contiguous()

        total_loss = None
        if start_positions is not None and end_positions is not None:
            if len(start_positions.size()) > 1:
                start_positions = start_positions.squeeze(-1)
            if len(end_positions.size()) > 1:
                end_positions = end_positions.squeeze(-1)
            # sometimes the start/end positions are outside our model inputs, we ignore these terms
            ignored_index = start_logits.size(1)
            start_positions = start_positions.clamp(0, ignored_index)
            end_positions = end_positions.clamp(0, ignored_index)

            loss_fct = CrossEntropyLoss(ignore_index=ignored_index)
            start_loss = loss_fct(start_logits, start_positions)
            end_loss = loss_fct(end_logits, end_positions)
            total_loss = (start_loss + end_loss) / 2
        return (total_loss, start_logits, end_logits)


# --- models.py ---
class GaussianKLLoss(nn.Module):
    def __init__(self):
        super(GaussianKLLoss, self).__init__()

    def forward(self, mu1, logvar1, mu2, logvar2):
        numerator = logvar1.exp() + torch.pow(mu1 - mu2, 2)
        fraction = torch.div(numerator, (logvar2.exp()))
        kl = 0.5 * torch.sum(logvar2 - logvar1 + fraction - 1, dim=1)
        return kl.mean(dim=0)


class VariationalBert(nn.Module):
    def __init__(self, args):
        super(VariationalBert, self).__init__()
        self.bert_model = BertForQuestionAnswering(hidden_size=args["hidden_size"])
        self.noise_net = nn.Sequential(nn.Linear(args["hidden_size"], args["hidden_size"]),
                                       nn.ReLU(),
                                       nn.Linear(args["hidden_size"], args["hidden_size"] * 2))
        config = self.bert_model.config
        self.dropout = config.hidden_dropout_prob  # 0.1

    def forward(self, input_ids, attention_mask, token_type_ids, start_positions=None, end_positions=None):
        if start_positions is not None and end_positions is not None:
            embeddings = self.bert_model.get_input_embeddings()
            encoder = self.bert_model.bert
            with torch.no_grad():
                encoder_inputs = {"input_ids": input_ids,
                                  "attention_mask": attention_mask,
                                  "token_type_ids": token_type_ids}
                outputs = encoder(**encoder_inputs)
                hiddens = outputs[0]

            mask = attention_mask.view(-1)
            indices = (mask == 1)
            mu_logvar = self.noise_net(hiddens)
            mu, log_var = torch.chunk(mu_logvar, 2, dim=-1)
            zs = mu + torch.randn_like(mu) * torch.exp(0.5 * log_var)
            noise = zs

            prior_mu = torch.ones_like(mu)
            prior_var = torch.ones_like(mu) * sqrt(self.dropout / (1 - self.dropout))
            prior_logvar = torch.log(prior_var)

            kl_criterion = GaussianKLLoss()
            h = hiddens.size(-1)
            _mu = mu.view(-1, h)[indices]
            _log_var = log_var.view(-1, h)[indices]
            _prior_mu = prior_mu.view(-1, h)[indices]
            _prior_logvar = prior_logvar.view(-1, h)[indices]
            kl = kl_criterion(_mu, _log_var, _prior_mu, _prior_logvar)

            inputs_embeds = embeddings(input_ids)
            inputs = {"inputs_embeds": inputs_embeds * noise,
                      "attention_mask": attention_mask,
                      "token_type_ids": token_type_ids,
                      "start_positions": start_positions,
                      "end_positions": end_positions}
            noise_outputs = self.bert_model(**inputs)
            noise_loss = noise_outputs[0]

            new_inputs = {"inputs_embeds": inputs_embeds,
                          "attention_mask": attention_mask,
                          "token_type_ids": token_type_ids,
                          "start_positions": start_positions,
                          "end_positions": end_positions}
            outputs = self.bert_model(**new_inputs)
            nll = outputs[0]
            loss = 0.5 * (nll + noise_loss)
            return (loss, kl)

        inputs = {"input_ids": input_ids,
                  "attention_mask": attention_mask,
                  "token_type_ids": token_type_ids}
        return self.bert_model(**inputs)


# --- run_squad.py ---
def process_batch(batch, device):
    input_ids, mask, seg_ids, start, end = batch

    length = torch.sum(mask, 1)
    max_length = torch.max(length)

    input_ids = input_ids[:, :max_length].to(device)
    mask = mask[:, :max_length].to(device)
    seg_ids = seg_ids[:, :max_length].to(device)

    start = start.to(device)
    end = end.to(device)

    inputs = {"input_ids": input_ids,
              "attention_mask": mask,
              "token_type_ids": seg_ids,
              "start_positions": start,
              "end_positions": end,
              }
    return inputs


def get_dataloader(num_batches, batch_size=4, seq_len=8):
    batches = []
    for _ in range(num_batches):
        input_ids = torch.randint(1, 30, (batch_size, seq_len))
        mask = torch.ones(batch_size, seq_len, dtype=torch.long)
        mask[0, 7:] = 0
        seg_ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
        seg_ids[:, 4:] = 1
        start = torch.randint(4, 6, (batch_size,))
        end = start + torch.randint(0, 2, (batch_size,))
        batches.append((input_ids, mask, seg_ids, start, end))
    return batches


args = {"hidden_size": 16, "beta": 1.0, "learning_rate": 3e-3, "num_train_epochs": 1}
device = DEVICE
train_loader = get_dataloader(num_batches=4)
model = VariationalBert(args)
model = model.to(device)

t_total = len(train_loader) * args["num_train_epochs"]
optimizer = torch.optim.AdamW(model.parameters(), lr=args["learning_rate"], eps=1e-8)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / t_total))

for _ in range(args["num_train_epochs"]):
    model.train()
    for batch in train_loader:
        inputs = process_batch(batch, device)
        outputs = model(**inputs)
        nll, kl = outputs[0], outputs[1]
        loss = nll + kl * args["beta"]
        loss.backward()

        nn.utils.clip_grad_norm_(model.parameters(), 1.0)

        optimizer.step()
        scheduler.step()
        model.zero_grad()
print("done")
