# source: https://github.com/idiap/fast-transformers/pull/10 — training through the recurrent (step-by-step) linear-attention transformer and chaining its output into other modules fails in backward with "one of the variables needed for gradient computation has been modified by an inplace operation": RecurrentLinearAttention updates its state with Zi += K and Si += einsum(...)
# fix-source: https://github.com/idiap/fast-transformers/commit/f60d7ad2886f5bafdcbbb76b522e836dbdf69607 — maintainer's fix ("Fixes #10 without compromising performance"): when K or value has a grad_fn the state is updated out of place (Zi = Zi + K, Si = Si + einsum(...)); the in-place update is kept only for gradient-free inference
# expect-kind: none
# fix: as in f60d7ad, the recurrent state is updated out of place (Zi = Zi + K, Si = Si + einsum) whenever K or value has a grad_fn; in place only without gradients
import torch
import torch.nn.functional as F
from torch.nn import Dropout, Embedding, LayerNorm, Linear, Module, ModuleList
from _device import DEVICE


# --- fast_transformers/recurrent/attention/linear_attention.py (at f60d7ad^) ---
def elu_feature_map(x):
    return torch.nn.functional.elu(x) + 1


class RecurrentLinearAttention(Module):
    def __init__(self, feature_map=None, eps=1e-6):
        super(RecurrentLinearAttention, self).__init__()
        self.feature_map = feature_map or elu_feature_map
        self.eps = eps

    def forward(self, query, key, value, memory=None):
        # Apply the feature map to the query and key
        Q = self.feature_map(query)
        K = self.feature_map(key)

        # Extract some shapes
        N, H, D = Q.shape
        _, _, M = value.shape

        # Extract the memory or initialize it
        if memory is None:
            Si = query.new_zeros((N, H, D, M))
            Zi = query.new_zeros((N, H, D))
        else:
            Si, Zi = memory

        # Ensure the batch size did not change
        if len(Si) != N:
            raise ValueError("The batch size changed during iteration")

        # Update the internal state
        if K.grad_fn is not None or value.grad_fn is not None:
            Zi = Zi + K
            Si = Si + torch.einsum("nhd,nhm->nhdm", K, value)
        else:
            Zi += K
            Si += torch.einsum("nhd,nhm->nhdm", K, value)

        # Compute the output
        Z = 1. / (torch.einsum("nhd,nhd->nh", Q, Zi) + self.eps)
        V = torch.einsum("nhd,nhdm,nh->nhm", Q, Si, Z)

        return V, [Si, Zi]


# --- fast_transformers/recurrent/attention/attention_layer.py ---
class RecurrentAttentionLayer(Module):
    def __init__(self, attention, d_model, n_heads, d_keys=None, d_values=None):
        super(RecurrentAttentionLayer, self).__init__()
        d_keys = d_keys or (d_model//n_heads)
        d_values = d_values or (d_model//n_heads)
        self.inner_attention = attention
        self.query_projection = Linear(d_model, d_keys * n_heads)
        self.key_projection = Linear(d_model, d_keys * n_heads)
        self.value_projection = Linear(d_model, d_values * n_heads)
        self.out_projection = Linear(d_values * n_heads, d_model)
        self.n_heads = n_heads

    def forward(self, query, key, value, memory=None):
        # Project the queries/keys/values
        query = self.query_projection(query)
        key = self.key_projection(key)
        value = self.value_projection(value)

        # Reshape them into many heads and compute the attention
        N, D = query.shape
        H = self.n_heads
        new_value, memory = self.inner_attention(
            query.view(N, H, -1),
            key.view(N, H, -1),
            value.view(N, H, -1),
            memory
        )
        new_value = new_value.view(N, -1)

        # Project the output and return
        return self.out_projection(new_value), memory


# --- fast_transformers/recurrent/transformers.py ---
class RecurrentTransformerEncoderLayer(Module):
    def __init__(self, attention, d_model, n_heads, d_ff=None, dropout=0.1,
                 activation="relu"):
        super(RecurrentTransformerEncoderLayer, self).__init__()
        d_ff = d_ff or 4*d_model
        self.attention = attention
        self.linear1 = Linear(d_model, d_ff)
        self.linear2 = Linear(d_ff, d_model)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.activation = F.relu if activation == "relu" else F.gelu

    def forward(self, x, memory=None):
        # Run the self attention and add it to the input
        x2, memory = self.attention(x, x, x, memory)
        x = x + self.dropout(x2)

        # Run the fully connected part of the layer
        y = x = self.norm1(x)
        y = self.dropout(self.activation(self.linear1(y)))
        y = self.dropout(self.linear2(y))

        return self.norm2(x+y), memory


class RecurrentTransformerEncoder(Module):
    def __init__(self, layers, norm_layer=None):
        super(RecurrentTransformerEncoder, self).__init__()
        self.layers = ModuleList(layers)
        self.norm = norm_layer

    def forward(self, x, memory=None):
        # Initialize the memory to None if not given
        if memory is None:
            memory = [None]*len(self.layers)

        # Apply all the transformers
        for i, layer in enumerate(self.layers):
            x, m = layer(x, memory[i])
            memory[i] = m

        # Apply the normalization if needed
        if self.norm is not None:
            x = self.norm(x)

        return x, memory


# --- user side (stand-in for the PR author's model): token embedding -> recurrent
# linear transformer run one step at a time -> next-token head, trained end to end ---
if __name__ == "__main__":
    torch.manual_seed(0)
    vocab, d_model, n_heads, N, L = 11, 16, 2, 2, 5
    embedding = Embedding(vocab, d_model).to(DEVICE)
    encoder = RecurrentTransformerEncoder(
        [RecurrentTransformerEncoderLayer(
            RecurrentAttentionLayer(RecurrentLinearAttention(), d_model, n_heads),
            d_model, n_heads, dropout=0.1)],
        LayerNorm(d_model),
    ).to(DEVICE)
    head = Linear(d_model, vocab).to(DEVICE)
    params = list(embedding.parameters()) + list(encoder.parameters()) + list(head.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3)

    for it in range(3):
        tokens = torch.randint(0, vocab, (N, L + 1), device=DEVICE)
        memory = None
        loss = 0.
        for t in range(L):
            y, memory = encoder(embedding(tokens[:, t]), memory)
            loss = loss + F.cross_entropy(head(y), tokens[:, t + 1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("done")
