# source: https://github.com/xiangking/ark-nlp/issues/46 — PGD adversarial training added to _on_backward recomputes loss_adv from the clean forward's `outputs`
# fix-source: maintainers' PGD recipe (ark_nlp/factory/utils/attack.py docstring) and the repo's _pfg_attack (commit 48663cf): `outputs = self.module(**inputs)` per attack step
# expect-kind: second-backward
# expect-culprit: outputs
import torch
import torch.nn as nn
from _device import DEVICE


class PGD(object):
    def __init__(self, module):
        self.module = module
        self.emb_backup = {}
        self.grad_backup = {}

    def attack(self, epsilon=1., alpha=0.3, emb_name='emb.', is_first_attack=False):
        for name, param in self.module.named_parameters():
            if param.requires_grad and emb_name in name:
                if is_first_attack:
                    self.emb_backup[name] = param.data.clone()
                norm = torch.norm(param.grad)
                if norm != 0 and not torch.isnan(norm):
                    r_at = alpha * param.grad / norm
                    param.data.add_(r_at)
                    param.data = self.project(name, param.data, epsilon)

    def restore(self, emb_name='emb.'):
        for name, param in self.module.named_parameters():
            if param.requires_grad and emb_name in name:
                assert name in self.emb_backup
                param.data = self.emb_backup[name]
        self.emb_backup = {}

    def project(self, param_name, param_data, epsilon):
        r = param_data - self.emb_backup[param_name]
        if torch.norm(r) > epsilon:
            r = epsilon * r / torch.norm(r)
        return self.emb_backup[param_name] + r

    def backup_grad(self):
        for name, param in self.module.named_parameters():
            if param.requires_grad and param.grad is not None:
                self.grad_backup[name] = param.grad.clone()

    def restore_grad(self):
        for name, param in self.module.named_parameters():
            if param.requires_grad and param.grad is not None:
                param.grad = self.grad_backup[name]


class TextCNN(nn.Module):
    def __init__(self, vocab_size=30, emb_dim=8, class_num=3):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, emb_dim)
        self.conv = nn.Conv1d(emb_dim, 8, kernel_size=3, padding=1)
        self.classifier = nn.Linear(8, class_num)

    def forward(self, input_ids, **kwargs):
        h = torch.relu(self.conv(self.emb(input_ids).transpose(1, 2)))
        return self.classifier(h.max(dim=-1).values)


class SequenceClassificationTask(object):
    def __init__(self, module, optimizer, loss_function, n_gpu=1):
        self.module = module
        self.optimizer = optimizer
        self.loss_function = loss_function
        self.n_gpu = n_gpu
        self.K = 3
        self.pgd = PGD(self.module)
        self.logs = {'global_loss': 0, 'epoch_loss': 0}

    def fit(self, train_data, epochs=1, gradient_accumulation_steps=1, **kwargs):
        self.module.train()
        self.optimizer.zero_grad()
        for epoch in range(epochs):
            for step, inputs in enumerate(train_data):
                inputs = self._get_module_inputs_on_train(inputs, **kwargs)
                outputs = self.module(**inputs)  # culprit
                logits, loss = self._get_train_loss(inputs, outputs, **kwargs)
                loss = self._on_backward(inputs, outputs, logits, loss, **kwargs)
                if (step + 1) % gradient_accumulation_steps == 0:
                    self._on_optimize(inputs, outputs, logits, loss, **kwargs)

    def _get_module_inputs_on_train(self, inputs, **kwargs):
        return {col: value.to(DEVICE) for col, value in inputs.items()}

    def _get_train_loss(self, inputs, outputs, **kwargs):
        if type(outputs) == tuple:
            logits, loss = outputs
        else:
            logits = outputs
            loss = self._compute_loss(inputs, logits, **kwargs)
        return logits, loss

    def _compute_loss(self, inputs, logits, **kwargs):
        return self.loss_function(logits, inputs['label_ids'])

    def _on_backward(self, inputs, outputs, logits, loss, gradient_accumulation_steps=1, **kwargs):
        if self.n_gpu > 1:
            loss = loss.mean()
        if gradient_accumulation_steps > 1:
            loss = loss / gradient_accumulation_steps

        loss.backward()
        self.pgd.backup_grad()
        for t in range(self.K):
            self.pgd.attack(is_first_attack=(t == 0))
            if t != self.K - 1:
                self.module.zero_grad()
            else:
                self.pgd.restore_grad()
            logits = self.module(**inputs)
            logits, loss_adv = self._get_train_loss(inputs, outputs, **kwargs)
            if self.n_gpu > 1:
                loss_adv = loss_adv.mean()
            if gradient_accumulation_steps > 1:
                loss_adv = loss_adv / gradient_accumulation_steps
            loss_adv.backward()
        self.pgd.restore()

        self._on_backward_record(loss, **kwargs)
        return loss

    def _on_backward_record(self, loss, **kwargs):
        self.logs['global_loss'] += loss.item()
        self.logs['epoch_loss'] += loss.item()

    def _on_optimize(self, inputs, outputs, logits, loss, **kwargs):
        self.optimizer.step()
        self.optimizer.zero_grad()


module = TextCNN().to(DEVICE)
optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
train_data = [{'input_ids': torch.randint(0, 30, (4, 6)), 'label_ids': torch.randint(0, 3, (4,))}
              for _ in range(4)]
model = SequenceClassificationTask(module, optimizer, nn.CrossEntropyLoss())
model.fit(train_data, epochs=1)
print("done")
