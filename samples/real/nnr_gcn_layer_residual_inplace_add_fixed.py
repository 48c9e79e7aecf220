# source: https://github.com/Veason-silverbullet/NNR/issues/3 — issue "Bug report": training NNR on torch 1.10 fails at trainer.py `loss.backward()` with "one of the variables needed for gradient computation has been modified by an inplace operation"; the maintainer traced it to GCNLayer.forward (layers.py), whose residual `out += feature` writes into the ReLU output that ReluBackward0 saved
# fix-source: https://github.com/Veason-silverbullet/NNR/commit/5dd9f16c8cbe8ecec21ae3d77afde52af440399b — maintainer's commit "update to be compatible with pytorch-11.1": `out += feature` becomes `out = out + feature` in GCNLayer.forward
# expect-kind: none
# fix: GCNLayer.forward adds the residual out of place, `out = out + feature`, so the ReLU output ReluBackward0 saved is left as it was
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from _device import DEVICE

news_num_total, news_embedding_dim, attention_dim = 20, 8, 4
category_num, max_history_num, batch_size, negative_sample_num = 3, 5, 2, 2
gcn_layer_num, dropout_rate = 4, 0.2


class GCNLayer(nn.Module):
    def __init__(self, in_dim, out_dim, residual=False, layer_norm=False):
        super(GCNLayer, self).__init__()
        self.residual = residual
        self.layer_norm = layer_norm
        if self.residual and in_dim != out_dim:
            raise Exception('To facilitate residual connection, in_dim must equal to out_dim')
        self.W = nn.Linear(in_features=in_dim, out_features=out_dim, bias=True)
        if self.layer_norm:
            self.layer_normalization = nn.LayerNorm(normalized_shape=[out_dim])

    def initialize(self):
        nn.init.xavier_uniform_(self.W.weight, gain=nn.init.calculate_gain('relu'))
        nn.init.zeros_(self.W.bias)

    def forward(self, feature, graph):
        out = self.W(torch.bmm(graph, feature))  # [batch_size, node_num, feature_num]
        if self.layer_norm:
            out = self.layer_normalization(out)
        out = F.relu(out)
        if self.residual:
            out = out + feature
        return out


class GCN(nn.Module):
    def __init__(self, in_dim, out_dim, hidden_dim=0, num_layers=1, dropout=0.1, residual=False, layer_norm=False):
        super(GCN, self).__init__()
        self.num_layers = num_layers
        self.gcn_layers = []
        if self.num_layers == 1:
            self.gcn_layers.append(GCNLayer(in_dim, out_dim, residual=residual, layer_norm=layer_norm))
        else:
            self.dropout = nn.Dropout(dropout, inplace=True)
            self.gcn_layers.append(GCNLayer(in_dim, hidden_dim, residual=residual, layer_norm=layer_norm))
            for i in range(1, self.num_layers - 1):
                self.gcn_layers.append(GCNLayer(hidden_dim, hidden_dim, residual=residual, layer_norm=layer_norm))
            self.gcn_layers.append(GCNLayer(hidden_dim, out_dim, residual=residual, layer_norm=layer_norm))
        self.gcn_layers = nn.ModuleList(self.gcn_layers)

    def initialize(self):
        for gcn_layer in self.gcn_layers:
            gcn_layer.initialize()

    def forward(self, feature, graph):
        out = feature
        for i in range(self.num_layers - 1):
            out = self.dropout(self.gcn_layers[i](out, graph))
        out = self.gcn_layers[self.num_layers - 1](out, graph)
        return out


class NewsEncoder(nn.Module):
    # stands in for NNR's title/content news encoders: one embedding per news ID
    def __init__(self):
        super(NewsEncoder, self).__init__()
        self.news_embedding_dim = news_embedding_dim
        self.embedding = nn.Embedding(news_num_total, news_embedding_dim)
        self.auxiliary_loss = None

    def forward(self, news_ID):
        return self.embedding(news_ID)


class SUE(nn.Module):
    def __init__(self, news_encoder):
        super(SUE, self).__init__()
        self.news_embedding_dim = news_encoder.news_embedding_dim
        self.news_encoder = news_encoder
        self.auxiliary_loss = None
        self.proxy_node_embedding = nn.Parameter(torch.zeros([category_num, self.news_embedding_dim]))
        self.gcn = GCN(in_dim=self.news_embedding_dim, out_dim=self.news_embedding_dim, hidden_dim=self.news_embedding_dim,
                       num_layers=gcn_layer_num, dropout=dropout_rate / 2, residual=True, layer_norm=False)
        self.intraCluster_K = nn.Linear(in_features=self.news_embedding_dim, out_features=attention_dim, bias=False)
        self.intraCluster_Q = nn.Linear(in_features=self.news_embedding_dim, out_features=attention_dim, bias=True)
        self.dropout_ = nn.Dropout(p=dropout_rate, inplace=False)
        self.max_history_num = max_history_num

    def initialize(self):
        self.gcn.initialize()
        nn.init.zeros_(self.proxy_node_embedding)

    def forward(self, user_history, user_history_graph, candidate_news_representaion):
        batch_size = user_history.size(0)
        history_embedding = self.news_encoder(user_history)  # [batch_size, max_history_num, news_embedding_dim]
        # 1. GCN
        history_embedding = torch.cat([history_embedding, self.dropout_(self.proxy_node_embedding.unsqueeze(dim=0).expand(batch_size, -1, -1))], dim=1)
        gcn_feature = self.gcn(history_embedding, user_history_graph) + history_embedding
        gcn_feature = gcn_feature[:, :self.max_history_num, :]  # [batch_size, max_history_num, news_embedding_dim]
        # 2. candidate-aware attention over the history (NNR clusters by category first)
        K = self.intraCluster_K(gcn_feature)  # [batch_size, max_history_num, attention_dim]
        Q = self.intraCluster_Q(candidate_news_representaion)  # [batch_size, news_num, attention_dim]
        alpha = F.softmax(torch.bmm(Q, K.transpose(1, 2)), dim=2)  # [batch_size, news_num, max_history_num]
        return torch.bmm(alpha, gcn_feature)  # [batch_size, news_num, news_embedding_dim]


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()
        self.news_encoder = NewsEncoder()
        self.user_encoder = SUE(self.news_encoder)

    def initialize(self):
        self.user_encoder.initialize()

    def forward(self, user_history, user_history_graph, news_ID):
        news_representation = self.news_encoder(news_ID)  # [batch_size, news_num, news_embedding_dim]
        user_representation = self.user_encoder(user_history, user_history_graph, news_representation)
        logits = (user_representation * news_representation).sum(dim=2)  # dot_product click predictor
        return logits


def negative_log_softmax(logits):
    loss = (-torch.log_softmax(logits, dim=1).select(dim=1, index=0)).mean()
    return loss


model = Model().to(DEVICE)
model.initialize()
model.train()
optimizer = optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=1e-3)
node_num = max_history_num + category_num
for e in range(2):
    user_history = torch.randint(0, news_num_total, (batch_size, max_history_num), device=DEVICE)
    adjacency = (torch.rand(batch_size, node_num, node_num, device=DEVICE) > 0.5).float() + torch.eye(node_num, device=DEVICE)
    user_history_graph = adjacency / adjacency.sum(dim=2, keepdim=True)
    news_ID = torch.randint(0, news_num_total, (batch_size, 1 + negative_sample_num), device=DEVICE)
    logits = model(user_history, user_history_graph, news_ID)
    loss = negative_log_softmax(logits)
    if model.news_encoder.auxiliary_loss is not None:
        loss += model.news_encoder.auxiliary_loss.mean()
    if model.user_encoder.auxiliary_loss is not None:
        loss += model.user_encoder.auxiliary_loss.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
