# source: https://github.com/yzhao062/pyod/issues/606 — DeepSVDD.fit had loss.backward() commented out; uncommenting it raises "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed)"
# fix-source: https://github.com/yzhao062/pyod/pull/704 — merged fix (commit 80e9ed85f54fa2dc1ea4b2df8b41fc27db690ac8) recomputes the w_d L2 penalty inside the batch loop instead of once before the epoch loop
# expect-kind: second-backward
# expect-culprit: w_d
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from _device import DEVICE

optimizer_dict = {'sgd': optim.SGD, 'adam': optim.Adam, 'rmsprop': optim.RMSprop}


class InnerDeepSVDD(nn.Module):
    def __init__(self, n_features, use_ae, hidden_neurons, dropout_rate):
        super(InnerDeepSVDD, self).__init__()
        self.n_features = n_features
        self.use_ae = use_ae
        self.hidden_neurons = hidden_neurons or [64, 32]
        self.dropout_rate = dropout_rate
        self.model = self._build_model()

    def _init_c(self, X_norm, eps=0.1):
        intermediate_output = {}
        hook_handle = self.model._modules.get('net_output').register_forward_hook(
            lambda module, input, output: intermediate_output.update({'net_output': output}))
        self.model(X_norm)
        out = intermediate_output['net_output']
        hook_handle.remove()
        self.c = torch.mean(out, dim=0)
        self.c[(torch.abs(self.c) < eps) & (self.c < 0)] = -eps
        self.c[(torch.abs(self.c) < eps) & (self.c > 0)] = eps

    def _build_model(self):
        layers = nn.Sequential()
        layers.add_module('input_layer', nn.Linear(self.n_features, self.hidden_neurons[0], bias=False))
        layers.add_module('hidden_activation_e0', nn.ReLU())
        for i in range(1, len(self.hidden_neurons) - 1):
            layers.add_module(f'hidden_layer_e{i}',
                              nn.Linear(self.hidden_neurons[i - 1], self.hidden_neurons[i], bias=False))
            layers.add_module(f'hidden_activation_e{i}', nn.ReLU())
            layers.add_module(f'hidden_dropout_e{i}', nn.Dropout(self.dropout_rate))
        layers.add_module('net_output', nn.Linear(self.hidden_neurons[-2], self.hidden_neurons[-1], bias=False))
        layers.add_module(f'hidden_activation_e{len(self.hidden_neurons)}', nn.ReLU())
        return layers

    def forward(self, x):
        return self.model(x)


class DeepSVDD:
    def __init__(self, n_features, c=None, use_ae=False, hidden_neurons=None, optimizer='adam',
                 epochs=3, batch_size=16, dropout_rate=0.2, l2_regularizer=0.1):
        self.n_features = n_features
        self.c = c
        self.use_ae = use_ae
        self.hidden_neurons = hidden_neurons
        self.optimizer = optimizer
        self.epochs = epochs
        self.batch_size = batch_size
        self.dropout_rate = dropout_rate
        self.l2_regularizer = l2_regularizer

    def fit(self, X):
        X_norm = (X - X.mean(0)) / X.std(0)
        X_norm = X_norm[torch.randperm(X_norm.shape[0], device=X.device)]

        self.model_ = InnerDeepSVDD(self.n_features, use_ae=self.use_ae, hidden_neurons=self.hidden_neurons,
                                    dropout_rate=self.dropout_rate).to(DEVICE)
        if self.c is None:
            self.c = 0.0
            self.model_._init_c(X_norm)

        X_norm = (X - X.mean(0)) / X.std(0)
        dataset = TensorDataset(X_norm, X_norm)
        dataloader = DataLoader(dataset, batch_size=self.batch_size, shuffle=True)

        best_loss = float('inf')
        best_model_dict = None

        optimizer = optimizer_dict[self.optimizer](self.model_.parameters(), weight_decay=self.l2_regularizer)
        w_d = 1e-6 * sum([torch.linalg.norm(w) for w in self.model_.parameters()])  # culprit

        for epoch in range(self.epochs):
            self.model_.train()
            epoch_loss = 0
            for batch_x, _ in dataloader:
                optimizer.zero_grad()
                outputs = self.model_(batch_x)
                dist = torch.sum((outputs - self.c) ** 2, dim=-1)
                if self.use_ae:
                    loss = torch.mean(dist) + w_d + torch.mean(torch.square(outputs - batch_x))
                else:
                    loss = torch.mean(dist) + w_d

                loss.backward()
                optimizer.step()
                epoch_loss += loss.item()
                if epoch_loss < best_loss:
                    best_loss = epoch_loss
                    best_model_dict = self.model_.state_dict()
        self.best_model_dict = best_model_dict
        return self


X = torch.randn(64, 8, device=DEVICE)
detector = DeepSVDD(n_features=8, hidden_neurons=[16, 8], epochs=3, batch_size=16)
detector.fit(X)

print("done")
