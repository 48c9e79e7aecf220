# source: https://github.com/sigeisler/robustness_of_gnns_at_scale/issues/4 — issue "self.attacked_model.train() leads to autograd error": with the attacked GCN in train mode, PRBCD's grad_with_checkpoint fails with "RuntimeError: Trying to backward through the graph a second time"
# fix-source: https://github.com/sigeisler/robustness_of_gnns_at_scale/issues/4 — maintainer's comment: switch off the caching of the preprocessed adjacency (do_cache_adj_prep) in gcn.py; the reporter confirmed it fixed the error
# expect-kind: none
# fix: build the GCN with do_cache_adj_prep=False, so a forward in train mode never reuses the adjacency normalized (with its graph) in an earlier attack step
import collections
from copy import deepcopy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from _device import DEVICE


def coalesce(edge_index, edge_weight, m, n):
    """Sum duplicate edges (stands in for torch_sparse.coalesce(..., op='sum'))."""
    linear = edge_index[0] * n + edge_index[1]
    unique, inverse = torch.unique(linear, sorted=True, return_inverse=True)
    weight = torch.zeros(unique.numel(), device=edge_weight.device).index_add(0, inverse, edge_weight)
    return torch.stack([unique // n, unique % n]), weight


def accuracy(logits, labels, split_idx):
    return (logits.argmax(1)[split_idx] == labels[split_idx]).float().mean().item()


def grad_with_checkpoint(outputs, inputs):
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    for input in inputs:
        if not input.is_leaf:
            input.retain_grad()
    torch.autograd.backward(outputs)
    grad_outputs = []
    for input in inputs:
        grad_outputs.append(input.grad.clone())
        input.grad.zero_()
    return grad_outputs


class ChainableGCNConv(nn.Module):
    def __init__(self, in_channels, out_channels, bias=True):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.normalize = True

    def forward(self, arguments):
        x, edge_index, edge_weight = arguments
        if self.normalize:
            edge_index, edge_weight = GCN.normalize(edge_index, x.shape[0], edge_weight)
        x = self.lin(x)
        row, col = edge_index
        out = torch.zeros_like(x).index_add(0, col, x[row] * edge_weight.unsqueeze(-1))
        return out + self.bias if self.bias is not None else out


class GCN(nn.Module):
    def __init__(self, n_features, n_classes, activation=nn.ReLU(), n_filters=16, bias=True, dropout=0.5,
                 do_cache_adj_prep=True, do_normalize_adj_once=True, add_self_loops=True, **kwargs):
        super().__init__()
        self.n_filters = [n_filters]
        self.activation = activation
        self.n_features, self.n_classes = n_features, n_classes
        self.bias, self.dropout = bias, dropout
        self.do_cache_adj_prep = do_cache_adj_prep
        self.do_normalize_adj_once = do_normalize_adj_once
        self.add_self_loops = add_self_loops
        self.adj_preped = None
        self.layers = self._build_layers()

    def _build_layers(self):
        filter_dimensions = [self.n_features] + self.n_filters
        modules = nn.ModuleList([
            nn.Sequential(collections.OrderedDict([
                (f'gcn_{idx}', ChainableGCNConv(in_channels, out_channels, bias=self.bias)),
                (f'activation_{idx}', self.activation),
                (f'dropout_{idx}', nn.Dropout(p=self.dropout))]))
            for idx, (in_channels, out_channels) in enumerate(zip(filter_dimensions[:-1], self.n_filters))
        ])
        idx = len(modules)
        modules.append(nn.Sequential(collections.OrderedDict([
            (f'gcn_{idx}', ChainableGCNConv(filter_dimensions[-1], self.n_classes, bias=self.bias))])))
        return modules

    def forward(self, data, adj):
        x = data
        edge_idx, edge_weight = adj
        edge_idx, edge_weight = self._cache_if_option_is_set(self._preprocess_adjacency_matrix,
                                                             x, edge_idx, edge_weight)
        for layer in self.layers:
            x = layer((x, edge_idx, edge_weight))
        return x

    def release_cache(self):
        self.adj_preped = None

    def _preprocess_adjacency_matrix(self, x, edge_idx, edge_weight):
        return self._convert_and_normalize(x, edge_idx, edge_weight)

    def _cache_if_option_is_set(self, callable, *inputs):
        if self.training and self.adj_preped is not None:
            return self.adj_preped
        else:
            adj_preped = callable(*inputs)

        if self.training and self.do_cache_adj_prep and self.do_normalize_adj_once:
            self.adj_preped = adj_preped

        return adj_preped

    def _convert_and_normalize(self, x, edge_idx, edge_weight):
        if self.do_normalize_adj_once:
            self._deactivate_normalization()
            edge_idx, edge_weight = GCN.normalize(edge_idx, x.shape[0], edge_weight, self.add_self_loops)
        return edge_idx, edge_weight

    def _deactivate_normalization(self):
        for layer in self.layers:
            layer[0].normalize = False

    @staticmethod
    def normalize(edge_idx, n, edge_weight=None, add_self_loops=True):
        if edge_weight is None:
            edge_weight = torch.ones(edge_idx.size(1), device=edge_idx.device)
        if add_self_loops:
            loops = torch.arange(n, device=edge_idx.device)
            edge_idx = torch.cat([edge_idx, torch.stack([loops, loops])], dim=1)
            edge_weight = torch.cat([edge_weight, torch.ones(n, device=edge_weight.device)])
        row, col = edge_idx
        deg = torch.zeros(n, device=edge_weight.device).index_add(0, col, edge_weight)
        deg_inv_sqrt = deg.pow(-0.5).masked_fill(deg == 0, 0)
        edge_weight = deg_inv_sqrt[row] * edge_weight * deg_inv_sqrt[col]
        return edge_idx, edge_weight


def train(model, attr, adj, labels, idx_train, idx_val, lr, weight_decay, patience, max_epochs):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    best_loss = np.inf
    model.train()
    for it in range(max_epochs):
        optimizer.zero_grad()
        logits = model(attr, adj)
        loss_train = F.cross_entropy(logits[idx_train], labels[idx_train])
        loss_val = F.cross_entropy(logits[idx_val], labels[idx_val])
        loss_train.backward()
        optimizer.step()
        if loss_val < best_loss:
            best_loss = loss_val
            best_epoch = it
            best_state = {key: value.clone() for key, value in model.state_dict().items()}
        elif it >= best_epoch + patience:
            break
    model.load_state_dict(best_state)


class Attack:
    def __init__(self, adj, attr, labels, idx_attack, model, device, make_undirected=False, loss_type='CE', **kwargs):
        self.device = device
        self.idx_attack = idx_attack
        self.loss_type = loss_type
        self.make_undirected = make_undirected
        self.attacked_model = deepcopy(model).to(self.device)
        self.attacked_model.train()
        for p in self.attacked_model.parameters():
            p.requires_grad = False
        self.labels = labels.to(self.device)
        self.attr = attr.to(self.device)
        self.edge_index, self.edge_weight = adj
        self.n = attr.shape[0]

    def calculate_loss(self, logits, labels):
        return F.cross_entropy(logits, labels)

    @staticmethod
    def project(n_perturbations, values, eps, inplace=False):
        if not inplace:
            values = values.clone()
        if torch.clamp(values, 0, 1).sum() > n_perturbations:
            left = (values - 1).min()
            right = values.max()
            miu = Attack.bisection(values, left, right, n_perturbations)
            values.data.copy_(torch.clamp(values - miu, min=eps, max=1 - eps))
        else:
            values.data.copy_(torch.clamp(values, min=eps, max=1 - eps))
        return values

    @staticmethod
    def bisection(edge_weights, a, b, n_perturbations, epsilon=1e-5, iter_max=100):
        def func(x):
            return torch.clamp(edge_weights - x, 0, 1).sum() - n_perturbations
        miu = a
        for _ in range(iter_max):
            miu = (a + b) / 2
            if func(miu) == 0.0:
                break
            if func(miu) * func(a) < 0:
                b = miu
            else:
                a = miu
            if b - a <= epsilon:
                break
        return miu


class PRBCD(Attack):
    def __init__(self, lr_factor=100, epochs=4, fine_tune_epochs=3, search_space_size=24,
                 with_early_stopping=True, eps=1e-7, **kwargs):
        super().__init__(**kwargs)
        self.epochs = epochs
        self.fine_tune_epochs = fine_tune_epochs
        self.epochs_resampling = epochs - fine_tune_epochs
        self.search_space_size = search_space_size
        self.with_early_stopping = with_early_stopping
        self.eps = eps
        self.current_search_space = None
        self.modified_edge_index = None
        self.perturbed_edge_weight = None
        self.n_possible_edges = self.n ** 2
        self.lr_factor = lr_factor * max(np.log2(self.n_possible_edges / self.search_space_size), 1.)

    def _attack(self, n_perturbations):
        best_accuracy = float('Inf')
        self.sample_random_block(n_perturbations)
        for epoch in range(self.epochs):
            self.perturbed_edge_weight.requires_grad = True
            edge_index, edge_weight = self.get_modified_adj()
            logits = self._get_logits(self.attr, edge_index, edge_weight)
            loss = self.calculate_loss(logits[self.idx_attack], self.labels[self.idx_attack])
            gradient = grad_with_checkpoint(loss, self.perturbed_edge_weight)[0]

            with torch.no_grad():
                edge_weight = self.update_edge_weights(n_perturbations, epoch, gradient)[1]
                self.perturbed_edge_weight = Attack.project(n_perturbations, self.perturbed_edge_weight, self.eps)
                edge_index, edge_weight = self.get_modified_adj()
                logits = self.attacked_model(data=self.attr, adj=(edge_index, edge_weight))
                accuracy_ = accuracy(logits, self.labels, self.idx_attack)
                if self.with_early_stopping and best_accuracy > accuracy_:
                    best_accuracy = accuracy_
                    best_search_space = self.current_search_space.clone()
                    best_edge_index = self.modified_edge_index.clone()
                    best_edge_weight_diff = self.perturbed_edge_weight.detach().clone()
                if epoch < self.epochs_resampling - 1:
                    self.resample_random_block(n_perturbations)
                elif self.with_early_stopping and epoch == self.epochs_resampling - 1:
                    self.current_search_space = best_search_space.to(self.device)
                    self.modified_edge_index = best_edge_index.to(self.device)
                    self.perturbed_edge_weight = best_edge_weight_diff.to(self.device)
                    self.perturbed_edge_weight.requires_grad = True
        return self.perturbed_edge_weight.detach()

    def _get_logits(self, attr, edge_index, edge_weight):
        return self.attacked_model(data=attr.to(self.device), adj=(edge_index.to(self.device), edge_weight.to(self.device)))

    def get_modified_adj(self):
        edge_index = torch.cat((self.edge_index.to(self.device), self.modified_edge_index), dim=-1)
        edge_weight = torch.cat((self.edge_weight.to(self.device), self.perturbed_edge_weight))
        edge_index, edge_weight = coalesce(edge_index, edge_weight, m=self.n, n=self.n)
        edge_weight[edge_weight > 1] = 2 - edge_weight[edge_weight > 1]
        return edge_index, edge_weight

    def update_edge_weights(self, n_perturbations, epoch, gradient):
        lr_factor = n_perturbations / self.n / 2 * self.lr_factor
        lr = lr_factor / np.sqrt(max(0, epoch - self.epochs_resampling) + 1)
        self.perturbed_edge_weight.data.add_(lr * gradient)
        self.perturbed_edge_weight.data[self.perturbed_edge_weight < self.eps] = self.eps
        return self.get_modified_adj()

    def sample_random_block(self, n_perturbations=0):
        self.current_search_space = torch.randint(self.n_possible_edges, (self.search_space_size,), device=self.device)
        self.current_search_space = torch.unique(self.current_search_space, sorted=True)
        self.modified_edge_index = torch.stack([self.current_search_space // self.n, self.current_search_space % self.n])
        is_not_self_loop = self.modified_edge_index[0] != self.modified_edge_index[1]
        self.current_search_space = self.current_search_space[is_not_self_loop]
        self.modified_edge_index = self.modified_edge_index[:, is_not_self_loop]
        self.perturbed_edge_weight = torch.full_like(self.current_search_space, self.eps, dtype=torch.float32,
                                                     requires_grad=True)

    def resample_random_block(self, n_perturbations):
        sorted_idx = torch.argsort(self.perturbed_edge_weight)[self.perturbed_edge_weight.numel() // 2:]
        self.current_search_space = self.current_search_space[sorted_idx]
        self.modified_edge_index = self.modified_edge_index[:, sorted_idx]
        self.perturbed_edge_weight = self.perturbed_edge_weight[sorted_idx]


n, d, c = 12, 6, 3
labels = torch.randint(0, c, (n,), device=DEVICE)
attr = torch.randn(n, d, device=DEVICE) + F.one_hot(labels, d).float()
pairs = torch.randint(0, n, (2, 20), device=DEVICE)
pairs = pairs[:, pairs[0] != pairs[1]]
edge_index, edge_weight = coalesce(torch.cat([pairs, pairs.flip(0)], dim=1),
                                   torch.ones(2 * pairs.shape[1], device=DEVICE), m=n, n=n)
edge_weight = torch.ones_like(edge_weight)
idx_train, idx_val, idx_test = torch.arange(0, 6), torch.arange(6, 9), torch.arange(9, 12)

model_params = dict(n_features=d, n_classes=c, n_filters=16, dropout=0.5, do_cache_adj_prep=False)
model = GCN(**model_params).to(DEVICE)
train(model=model, attr=attr, adj=(edge_index, edge_weight), labels=labels, idx_train=idx_train,
      idx_val=idx_val, lr=1e-2, weight_decay=5e-4, patience=10, max_epochs=5)

storage = {'gcn': {k: v.clone() for k, v in model.state_dict().items()}}
pretrained = GCN(**model_params).to(DEVICE)
pretrained.load_state_dict(storage['gcn'])

adversary = PRBCD(adj=(edge_index, edge_weight), attr=attr, labels=labels, idx_attack=idx_test,
                  model=pretrained, device=DEVICE)
perturbed = adversary._attack(n_perturbations=3)
print("done")
