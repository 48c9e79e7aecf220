# source: https://github.com/LibCity/Bigscity-LibCity/issues/303 — STSGCN training fails with "one of the variables needed for gradient computation has been modified by an inplace operation": PositionEmbedding.forward does `data += self.temporal_emb` on the ReLU output of first_layer_embedding that STSGCN.forward passes straight into the first STSGCL layer
# fix-source: https://github.com/LibCity/Bigscity-LibCity/commit/cf801a226ef17d82e1d9057edde009c38c3c0083 — maintainers' "fix bug (#305)": STSGCN.forward calls stsgcl_layer(data.clone(), self.adj), so the in-place position embedding writes into a copy
# expect-kind: inplace-modified
# expect-culprit: data
import numpy as np
import torch
import torch.nn as nn
from torch.nn.init import xavier_uniform_
from _device import DEVICE


class PositionEmbedding(nn.Module):
    def __init__(self, input_length, num_of_vertices, embedding_size, temporal=True, spatial=True, config=None):
        super(PositionEmbedding, self).__init__()
        self.temporal = temporal
        self.spatial = spatial
        self.temporal_emb = torch.nn.Parameter(torch.zeros((1, input_length, 1, embedding_size)).to(config['device']))
        xavier_uniform_(self.temporal_emb)
        self.spatial_emb = torch.nn.Parameter(torch.zeros((1, 1, num_of_vertices, embedding_size)).to(config['device']))
        xavier_uniform_(self.spatial_emb)

    def forward(self, data):
        if self.temporal:
            data += self.temporal_emb  # step
        if self.spatial:
            data += self.spatial_emb
        return data


class GcnOperation(nn.Module):
    def __init__(self, num_of_filter, num_of_features, num_of_vertices, activation):
        super().__init__()
        self.num_of_filter = num_of_filter
        self.activation = activation
        if activation == "GLU":
            self.layer = nn.Linear(num_of_features, 2 * num_of_filter)
        elif activation == "relu":
            self.layer = nn.Linear(num_of_features, num_of_filter)

    def forward(self, data, adj):
        data = torch.matmul(adj, data)
        if self.activation == "GLU":
            data = self.layer(data)
            lhs, rhs = data.split(self.num_of_filter, -1)
            data = lhs * torch.sigmoid(rhs)
        elif self.activation == "relu":
            data = torch.relu(self.layer(data))
        return data


class Stsgcm(nn.Module):
    def __init__(self, filters, num_of_features, num_of_vertices, activation):
        super().__init__()
        self.num_of_vertices = num_of_vertices
        self.layers = nn.ModuleList()
        for i in range(len(filters)):
            self.layers.append(GcnOperation(filters[i], num_of_features, num_of_vertices, activation))
            num_of_features = filters[i]

    def forward(self, data, adj):
        need_concat = []
        for i in range(len(self.layers)):
            data = self.layers[i](data, adj)
            need_concat.append(torch.transpose(data, 1, 0))
        need_concat = [
            torch.unsqueeze(i[self.num_of_vertices:2 * self.num_of_vertices, :, :], dim=0)
            for i in need_concat
        ]
        return torch.max(torch.cat(need_concat, dim=0), dim=0)[0]


class STSGCNLayerIndividual(nn.Module):
    def __init__(self, t, num_of_vertices, num_of_features, filters,
                 activation, temporal_emb=True, spatial_emb=True, config=None):
        super().__init__()
        self.T = t
        self.num_of_vertices = num_of_vertices
        self.num_of_features = num_of_features
        self.position_embedding = PositionEmbedding(t, num_of_vertices, num_of_features,
                                                    temporal_emb, spatial_emb, config)
        self.gcms = nn.ModuleList()
        for i in range(self.T - 2):
            self.gcms.append(Stsgcm(filters, num_of_features, num_of_vertices, activation=activation))

    def forward(self, data, adj):
        data = self.position_embedding(data)
        need_concat = []
        for i in range(self.T - 2):
            t = data[:, i:i + 3, :, :]
            t = torch.reshape(t, (-1, 3 * self.num_of_vertices, self.num_of_features))
            t = self.gcms[i](t, adj)
            t = torch.transpose(t, 0, 1)
            need_concat.append(torch.unsqueeze(t, dim=1))
        return torch.cat(need_concat, dim=1)


class STSGCL(nn.Module):
    def __init__(self, t, num_of_vertices, num_of_features, filters, module_type, activation,
                 temporal_emb=True, spatial_emb=True, config=None):
        super().__init__()
        self.layer = STSGCNLayerIndividual(t, num_of_vertices, num_of_features, filters,
                                           activation, temporal_emb, spatial_emb, config)

    def forward(self, data, adj):
        return self.layer(data, adj)


class OutputLayer(nn.Module):
    def __init__(self, num_of_vertices, input_length, num_of_features,
                 num_of_filters=8, predict_length=1, output_dim=1):
        super().__init__()
        self.num_of_vertices = num_of_vertices
        self.input_length = input_length
        self.num_of_features = num_of_features
        self.predict_length = predict_length
        self.output_dim = output_dim
        self.hidden_layer = nn.Linear(input_length * num_of_features, num_of_filters)
        self.ouput_layer = nn.Linear(num_of_filters, predict_length * output_dim)

    def forward(self, data):
        data = torch.transpose(data, 1, 2)
        data = torch.reshape(data, (-1, self.num_of_vertices, self.input_length * self.num_of_features))
        data = torch.relu(self.hidden_layer(data))
        data = self.ouput_layer(data).reshape((-1, self.num_of_vertices, self.predict_length, self.output_dim))
        return data.permute(0, 2, 1, 3)


def construct_adj(a, steps):
    n = len(a)
    adj = np.zeros([n * steps] * 2)
    for i in range(steps):
        adj[i * n: (i + 1) * n, i * n: (i + 1) * n] = a
    for i in range(n):
        for k in range(steps - 1):
            adj[k * n + i, (k + 1) * n + i] = 1
            adj[(k + 1) * n + i, k * n + i] = 1
    for i in range(len(adj)):
        adj[i, i] = 1
    return adj


def huber_loss(preds, labels, delta=1.0):
    residual = torch.abs(preds - labels)
    condition = torch.le(residual, delta)
    small_res = 0.5 * torch.square(residual)
    large_res = delta * residual - 0.5 * delta * delta
    return torch.mean(torch.where(condition, small_res, large_res))


class StandardScaler:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def inverse_transform(self, data):
        return data * self.std + self.mean


class STSGCN(nn.Module):
    def __init__(self, config, data_feature):
        super().__init__()
        self.num_nodes = data_feature.get('num_nodes', 1)
        self._scaler = data_feature.get('scaler')
        self.feature_dim = data_feature.get('feature_dim', 1)
        self.output_dim = data_feature.get('output_dim', 1)
        self.device = config.get('device', torch.device('cpu'))
        self.input_length = config.get('input_window', 1)
        self.predict_length = config.get('output_window', 1)
        self.num_of_vertices = self.num_nodes

        self.adj = construct_adj(data_feature.get("adj_mx"), 3)
        self.adj = torch.tensor(self.adj, requires_grad=False, dtype=torch.float32).to(self.device)

        self.embedding_dim = self.feature_dim
        self.num_of_features = self.feature_dim
        first_layer_embedding_size = config.get("first_layer_embedding_size", 64)
        self.first_layer_embedding = nn.Linear(self.num_of_features, first_layer_embedding_size)
        self.num_of_features = first_layer_embedding_size

        self.filter_list = config.get("filters")
        self.stsgcl_layers = nn.ModuleList()
        for filters in self.filter_list:
            self.stsgcl_layers.append(STSGCL(self.input_length, self.num_of_vertices, self.num_of_features,
                                             filters, 'individual', activation='GLU', config=config))
            self.input_length -= 2
            self.num_of_features = filters[-1]

        self.outputs = nn.ModuleList()
        for i in range(self.predict_length):
            self.outputs.append(OutputLayer(self.num_of_vertices, self.input_length, self.num_of_features,
                                            num_of_filters=8, predict_length=1, output_dim=self.output_dim))

    def forward(self, batch):
        data = batch['X']
        if data.shape[-1] > self.embedding_dim:
            data = data[:, :, :, 0:self.embedding_dim]
        if self.first_layer_embedding:
            data = torch.relu(self.first_layer_embedding(data))  # culprit

        for stsgcl_layer in self.stsgcl_layers:
            data = stsgcl_layer(data, self.adj)

        need_concat = []
        for output_layer in self.outputs:
            need_concat.append(output_layer(data))
        return torch.cat(need_concat, dim=1)

    def calculate_loss(self, batch):
        y_true = batch['y']
        y_predicted = self.predict(batch)
        y_true = self._scaler.inverse_transform(y_true[..., :self.output_dim])
        y_predicted = self._scaler.inverse_transform(y_predicted[..., :self.output_dim])
        return huber_loss(y_predicted, y_true)

    def predict(self, batch):
        return self.forward(batch)


num_nodes = 3
adj_mx = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=np.float32)
config = {'device': DEVICE, 'input_window': 6, 'output_window': 2, 'first_layer_embedding_size': 4,
          'filters': [[4, 4, 4], [4, 4, 4]]}
data_feature = {'num_nodes': num_nodes, 'feature_dim': 2, 'output_dim': 1, 'adj_mx': adj_mx,
                'scaler': StandardScaler(5.0, 2.0)}
model = STSGCN(config, data_feature).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for step in range(3):
    batch = {'X': torch.randn(2, 6, num_nodes, 2, device=DEVICE),
             'y': torch.randn(2, 2, num_nodes, 2, device=DEVICE)}
    optimizer.zero_grad()
    loss = model.calculate_loss(batch)
    loss.backward()
    optimizer.step()
print("done")
