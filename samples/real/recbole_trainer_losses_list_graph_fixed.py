# source: https://github.com/RUCAIBox/RecBole/pull/307 — merged PR "FIX: bug of storing loss in each batch cause out of memory in Trainer": Trainer._train_epoch (recbox/trainer/trainer.py) appends every batch's loss tensor to `losses_list`, keeping each batch's graph alive until the epoch ends
# fix-source: https://github.com/RUCAIBox/RecBole/commit/f8d87147f7a971901bd6d4d19ddf07af34f76db5 — maintainers' fix: accumulate `losses.item()` (per-loss `.item()` for tuples) into `total_loss` instead of storing the tensors
# expect-kind: none
# fix: `_train_epoch` keeps a running float `total_loss` built from `losses.item()` (per-loss `.item()` for tuple losses) instead of appending the loss tensors to `losses_list`
import torch
import torch.nn as nn
import torch.optim as optim
from torch.nn.init import xavier_normal_
from _device import DEVICE


class BPRLoss(nn.Module):
    def __init__(self, gamma=1e-10):
        super(BPRLoss, self).__init__()
        self.gamma = gamma

    def forward(self, pos_score, neg_score):
        loss = - torch.log(self.gamma + torch.sigmoid(pos_score - neg_score)).mean()
        return loss


def xavier_normal_initialization(module):
    if isinstance(module, nn.Embedding):
        xavier_normal_(module.weight.data)


class BPRMF(nn.Module):
    def __init__(self, config, n_users, n_items):
        super(BPRMF, self).__init__()
        self.USER_ID = config['USER_ID_FIELD']
        self.ITEM_ID = config['ITEM_ID_FIELD']
        self.NEG_ITEM_ID = config['NEG_PREFIX'] + self.ITEM_ID
        self.embedding_size = config['embedding_size']
        self.user_embedding = nn.Embedding(n_users, self.embedding_size)
        self.item_embedding = nn.Embedding(n_items, self.embedding_size)
        self.loss = BPRLoss()
        self.apply(xavier_normal_initialization)

    def get_user_embedding(self, user):
        return self.user_embedding(user)

    def get_item_embedding(self, item):
        return self.item_embedding(item)

    def forward(self, user, item):
        user_e = self.get_user_embedding(user)
        item_e = self.get_item_embedding(item)
        return user_e, item_e

    def calculate_loss(self, interaction):
        user = interaction[self.USER_ID]
        pos_item = interaction[self.ITEM_ID]
        neg_item = interaction[self.NEG_ITEM_ID]

        user_e, pos_e = self.forward(user, pos_item)
        neg_e = self.get_item_embedding(neg_item)
        pos_item_score, neg_item_score = torch.mul(user_e, pos_e).sum(dim=1), torch.mul(user_e, neg_e).sum(dim=1)
        loss = self.loss(pos_item_score, neg_item_score)
        return loss


class Trainer(object):
    def __init__(self, config, model):
        self.config = config
        self.model = model
        self.learning_rate = config['learning_rate']
        self.epochs = config['epochs']
        self.device = config['device']
        self.train_loss_dict = dict()
        self.optimizer = optim.Adam(self.model.parameters(), lr=self.learning_rate)

    def _check_nan(self, loss):
        if torch.isnan(loss):
            raise ValueError('Training loss is nan')

    def _train_epoch(self, train_data, epoch_idx):
        self.model.train()
        total_loss = None
        for batch_idx, interaction in enumerate(train_data):
            interaction = {k: v.to(self.device) for k, v in interaction.items()}
            self.optimizer.zero_grad()
            losses = self.model.calculate_loss(interaction)
            if isinstance(losses, tuple):
                loss = sum(losses)
                loss_tuple = tuple(per_loss.item() for per_loss in losses)
                total_loss = loss_tuple if total_loss is None else tuple(map(sum, zip(total_loss, loss_tuple)))
            else:
                loss = losses
                total_loss = losses.item() if total_loss is None else total_loss + losses.item()
            self._check_nan(loss)
            loss.backward()
            self.optimizer.step()
        return total_loss

    def fit(self, train_data):
        for epoch_idx in range(self.epochs):
            train_loss = self._train_epoch(train_data, epoch_idx)
            self.train_loss_dict[epoch_idx] = sum(train_loss) if isinstance(train_loss, tuple) else train_loss


config = {
    'USER_ID_FIELD': 'user_id', 'ITEM_ID_FIELD': 'item_id', 'NEG_PREFIX': 'neg_',
    'embedding_size': 8, 'learning_rate': 0.001, 'epochs': 2, 'device': DEVICE,
}
n_users, n_items = 10, 20
train_data = [{'user_id': torch.randint(0, n_users, (6,)),
               'item_id': torch.randint(0, n_items, (6,)),
               'neg_item_id': torch.randint(0, n_items, (6,))} for _ in range(4)]

model = BPRMF(config, n_users, n_items).to(DEVICE)
trainer = Trainer(config, model)
trainer.fit(train_data)
print("done")
