# source: https://github.com/mosaicml/composer/pull/1240 — PR "Support sequence of losses in backwards pass": Trainer._train_microbatch calls backward on each loss of a model's loss tuple
# fix-source: https://github.com/mosaicml/composer/commit/d3bfbfc0b85ee24da5d0381ee2298c5712a52bca — merged fix: sum the losses into final_loss and back-propagate once
# expect-kind: second-backward
# expect-culprit: features
import torch
import torch.nn.functional as F
from _device import DEVICE


def ensure_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class ComposerModel(torch.nn.Module):
    """A model whose loss() returns one loss per head, all from the same shared features."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.cls_head = torch.nn.Linear(16, 3)
        self.box_head = torch.nn.Linear(16, 4)

    def forward(self, batch):
        features = self.trunk(batch[0])  # culprit
        return self.cls_head(features), self.box_head(features)

    def loss(self, outputs, batch):
        _, labels, boxes = batch
        return F.cross_entropy(outputs[0], labels), F.smooth_l1_loss(outputs[1], boxes)


class State:
    def __init__(self, model, optimizers):
        self.model = model
        self.optimizers = optimizers
        self.batch = None
        self.outputs = None
        self.loss = None


class Trainer:
    def __init__(self, model, optimizers, train_dataloader):
        self.state = State(model, optimizers)
        self._original_model = model
        self.train_dataloader = train_dataloader
        self._backwards_create_graph = False

    def fit(self):
        for batch in self.train_dataloader:
            microbatches = [tuple(t[i::2] for t in batch) for i in range(2)]  # grad_accum = 2
            self._train_microbatches(microbatches)
            for optimizer in ensure_tuple(self.state.optimizers):
                optimizer.step()

    def _train_microbatches(self, microbatches):
        for optimizer in ensure_tuple(self.state.optimizers):
            optimizer.zero_grad()
        total_loss = torch.zeros(size=(1,), device=DEVICE)
        current_batch_size = sum(len(batch[0]) for batch in microbatches)
        for microbatch_idx, self.state.batch in enumerate(microbatches):
            self._train_microbatch(current_batch_size, total_loss)
        return total_loss

    def _train_microbatch(self, current_batch_size, total_loss):
        microbatch_num_samples = len(self.state.batch[0])
        # forward pass
        self.state.outputs = self.state.model(self.state.batch)
        # loss
        self.state.loss = self._original_model.loss(self.state.outputs, self.state.batch)
        for loss in ensure_tuple(self.state.loss):
            loss.mul_(microbatch_num_samples / current_batch_size)
            total_loss += loss.detach().clone()
        # backward
        for loss in ensure_tuple(self.state.loss):
            loss.backward(create_graph=self._backwards_create_graph)


model = ComposerModel().to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_dataloader = [(torch.randn(8, 8, device=DEVICE), torch.randint(0, 3, (8,), device=DEVICE),
                     torch.randn(8, 4, device=DEVICE)) for _ in range(3)]
trainer = Trainer(model, optimizer, train_dataloader)
trainer.fit()
print("done")
