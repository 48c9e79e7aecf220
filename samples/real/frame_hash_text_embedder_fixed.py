# source: https://github.com/pyg-team/pytorch-frame/pull/229 — PR "Add detach() to HashTextEmbedder": text columns pre-encoded once at materialization make rtb training fail in its second iteration
# fix-source: https://github.com/pyg-team/pytorch-frame/commit/4e350e3d959954779c6fce0a94aace63abf4c8f3 — merged fix: the embedder returns self.embedding(idx).detach()
# expect-kind: none
# fix: the text embedder is not part of the model: return self.embedding(idx).detach(), so the pre-encoded column keeps no graph
import zlib

import torch
from torch import Tensor
from torch.nn import Embedding
from _device import DEVICE


class HashTextEmbedder:
    """Hashes each sentence into a bin and looks the bin up in an Embedding (a light text encoder for tests)."""

    def __init__(self, out_channels, num_hash_bins=64, device=None):
        self.out_channels = out_channels
        self.num_hash_bins = num_hash_bins
        self.device = device
        self.embedding = Embedding(num_hash_bins, out_channels).to(device)

    def __call__(self, sentences) -> Tensor:
        idx = torch.tensor([zlib.crc32(s.encode()) % self.num_hash_bins for s in sentences],
                           dtype=torch.long, device=self.device)
        return self.embedding(idx).detach()


class TextEmbeddingTensorMapper:
    def __init__(self, text_embedder, batch_size=None):
        self.text_embedder = text_embedder
        self.batch_size = batch_size

    def forward(self, ser_list, *, device=None) -> Tensor:
        emb = self.text_embedder(ser_list)
        return emb.to(device)


class TensorFrame:
    def __init__(self, feat_dict, y):
        self.feat_dict, self.y = feat_dict, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, index):
        return TensorFrame({k: v[index] for k, v in self.feat_dict.items()}, self.y[index])


class Dataset:
    def __init__(self, num_rows, text_embedder):
        self.numerical = torch.randn(num_rows, 3, device=DEVICE)
        self.texts = [f"item {i % 5} color {i % 3}" for i in range(num_rows)]
        self.y = torch.randn(num_rows, 1, device=DEVICE)
        self.text_mapper = TextEmbeddingTensorMapper(text_embedder)

    def materialize(self):
        feat_dict = {"numerical": self.numerical,
                     "embedding": self.text_mapper.forward(self.texts, device=DEVICE)}
        self.tensor_frame = TensorFrame(feat_dict, self.y)
        return self


class Model(torch.nn.Module):
    def __init__(self, text_channels, channels=16):
        super().__init__()
        self.num_encoder = torch.nn.Linear(3, channels)
        self.emb_encoder = torch.nn.Linear(text_channels, channels)
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(channels, 1))

    def forward(self, tf):
        x = self.num_encoder(tf.feat_dict["numerical"]) + self.emb_encoder(tf.feat_dict["embedding"])
        return self.head(x)


dataset = Dataset(32, HashTextEmbedder(out_channels=8, device=DEVICE)).materialize()
train_loader = [dataset.tensor_frame[i:i + 8] for i in range(0, len(dataset.tensor_frame), 8)]
model = Model(text_channels=8).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

for epoch in range(1):
    for tf in train_loader:
        pred = model(tf)
        loss = torch.nn.functional.mse_loss(pred, tf.y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print("done")
