# source: https://github.com/facebookresearch/moco/issues/21 — issue: "is it necessary to make a copy of the queue?" about l_neg = torch.einsum('nc,ck->nk', [q, self.queue.clone().detach()]); without the copy, _dequeue_and_enqueue overwrites the queue saved for backward
# fix-source: maintainer's comment in the issue ("self.queue is in-place modified in self._dequeue_and_enqueue, so a clone is necessary. If not cloned, you should see an error raised by pytorch")
# expect-kind: none
# fix: use a copy of the queue for the negatives: torch.einsum('nc,ck->nk', [q, self.queue.clone().detach()]) (the official code)
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=8, K=16, m=0.999, T=0.07):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = nn.functional.normalize(self.queue, dim=0)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        self.queue[:, ptr:ptr + batch_size] = keys.T
        ptr = (ptr + batch_size) % self.K
        self.queue_ptr[0] = ptr

    def forward(self, im_q, im_k):
        q = nn.functional.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k = nn.functional.normalize(self.encoder_k(im_k), dim=1)
        l_pos = torch.einsum('nc,nc->n', [q, k]).unsqueeze(-1)
        l_neg = torch.einsum('nc,ck->nk', [q, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        self._dequeue_and_enqueue(k)
        return logits, labels


def base_encoder(num_classes):
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, num_classes))


model = MoCo(base_encoder).to(DEVICE)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)

for i in range(4):
    images = torch.randn(4, 12, device=DEVICE)
    im_q = images + 0.1 * torch.randn_like(images)
    im_k = images + 0.1 * torch.randn_like(images)
    output, target = model(im_q=im_q, im_k=im_k)
    loss = criterion(output, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
