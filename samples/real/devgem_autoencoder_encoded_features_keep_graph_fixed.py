# source: https://devgem.io/posts/understanding-pytorch-s-runtimeerror-backward-through-the-graph-a-second-time — Q&A post (republished Stack Overflow question): a model trained on batches sliced from autoencoder encodings computed once, outside torch.no_grad, fails at the second loss.backward() with "Trying to backward through the graph a second time"
# fix-source: https://devgem.io/posts/understanding-pytorch-s-runtimeerror-backward-through-the-graph-a-second-time — the answer: put the autoencoder in eval mode and compute the encodings under `with torch.no_grad():` ("This line is crucial")
# expect-kind: none
# fix: the three autoencoder encodings run under torch.no_grad(), so X_train_encoded is plain data with no autoencoder graph for every batch's backward to reach
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

n_features, n_latent, n_classes = 12, 4, 3
batch_size = 8
max_iters = 3


class Autoencoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(n_features, 8), nn.ReLU(), nn.Linear(8, n_latent))
        self.decoder = nn.Sequential(nn.Linear(n_latent, 8), nn.ReLU(), nn.Linear(8, n_features))

    def forward(self, x):
        encoded = self.encoder(x)
        decoded = self.decoder(encoded)
        loss = F.mse_loss(decoded, x)
        return encoded, loss


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_latent, 16), nn.ReLU(), nn.Linear(16, n_classes))

    def forward(self, x, y=None):
        out = self.net(x)
        loss = None
        accuracy = None
        if y is not None:
            loss = F.cross_entropy(out, y)
            accuracy = (out.argmax(dim=1) == y).float().mean()
        return out, loss, accuracy


def train(model, optimizer, X_train_tensor, y_train_tensor):
    for iter in range(max_iters):
        start_ix = 0
        loss = None
        while start_ix < len(X_train_tensor):
            loss = None
            end_ix = min(start_ix + batch_size, len(X_train_tensor))
            out, loss, accuracy = model(X_train_tensor[start_ix:end_ix], y_train_tensor[start_ix:end_ix])

            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            start_ix = end_ix + 1


X_train_tensor = torch.randn(30, n_features, device=DEVICE)
y_train_tensor = torch.randint(0, n_classes, (30,), device=DEVICE)
X_val_tensor = torch.randn(10, n_features, device=DEVICE)
X_test_tensor = torch.randn(10, n_features, device=DEVICE)

autoencoder = Autoencoder().to(DEVICE)
autoencoder.eval()
with torch.no_grad():  # This line is crucial
    X_train_encoded, loss = autoencoder(X_train_tensor)
    X_val_encoded, loss = autoencoder(X_val_tensor)
    X_test_encoded, loss = autoencoder(X_test_tensor)

model = Model().to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
train(model, optimizer, X_train_encoded, y_train_tensor)
print("done")
