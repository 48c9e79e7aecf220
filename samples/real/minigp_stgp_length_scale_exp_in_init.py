# source: https://github.com/IceLab-X/MiniGP/issues/13 — stgp_demo.py's SE_kernel sets self.length_scale = torch.exp(nn.Parameter(...)) once in __init__
# fix-source: https://github.com/IceLab-X/MiniGP/commit/38c004fe87851a79a15c0669f105aab2a737ee19 — maintainer made length_scale the nn.Parameter itself ("fix bug in stgp")
# expect-kind: second-backward
# expect-culprit: self.length_scale
import torch
import torch.nn as nn
from _device import DEVICE
JITTER = 1e-1

def kronecker(A, B):
    AB = torch.einsum("ab,cd->acbd", A, B)
    AB = AB.view(A.size(0) * B.size(0), A.size(1) * B.size(1))
    return AB

class SE_kernel(nn.Module):
    def __init__(self, length_scale=1.0):
        super().__init__()
        self.length_scale = torch.exp(nn.Parameter(torch.log(torch.tensor(length_scale, device=DEVICE))))  # culprit
    def forward(self, X, X2):
        X = X / self.length_scale.expand(X.size(0), X.size(1))
        X2 = X2 / self.length_scale.expand(X2.size(0), X2.size(1))

        X_norm2 = torch.sum(X * X, dim=1).view(-1, 1)
        X2_norm2 = torch.sum(X2 * X2, dim=1).view(-1, 1)

        # compute effective distance
        K = -2.0 * X @ X2.t() + X_norm2.expand(X.size(0), X2.size(0)) + X2_norm2.t().expand(X.size(0), X2.size(0))
        K = torch.exp(-K) * 1.0
        return K

class stgp(nn.Module):
    def __init__(self, latlong_length_scale=4300., elevation_length_scale=30., time_length_scale=0.25,
                 noise_variance=0.1, signal_variance=1.):
        super(stgp, self).__init__()

        self.log_noise_variance = nn.Parameter(torch.log(torch.tensor(noise_variance)))
        self.log_signal_variance = nn.Parameter(torch.log(torch.tensor(signal_variance)))

        self.latlong_kernel = SE_kernel(latlong_length_scale)
        self.elevation_kernel = SE_kernel(elevation_length_scale)
        self.temporal_kernel = SE_kernel(time_length_scale)

    def negative_log_likelihood(self, space_coordinates, time_coordinates, stData):

        latlong_K = self.latlong_kernel(space_coordinates[:, 0:2], space_coordinates[:, 0:2])
        elevation_K = self.elevation_kernel(space_coordinates[:, 2:3], space_coordinates[:, 2:3])

        spatial_K = latlong_K * elevation_K + torch.eye(latlong_K.size(0), device=DEVICE) * JITTER
        temporal_K = self.temporal_kernel(time_coordinates, time_coordinates) + torch.eye(time_coordinates.size(0), device=DEVICE) * JITTER

        eigen_value_s, eigen_vector_s = torch.linalg.eigh(spatial_K, UPLO='L')
        eigen_value_t, eigen_vector_t = torch.linalg.eigh(temporal_K, UPLO='L')

        eigen_vector_st = kronecker(eigen_vector_t, eigen_vector_s)
        eigen_value_st = kronecker(eigen_value_t.view(-1, 1), eigen_value_s.view(-1, 1)).view(-1)
        eigen_value_st_plus_noise_inverse = 1. / (eigen_value_st + torch.exp(self.log_noise_variance))

        sigma_inverse = eigen_vector_st @ eigen_value_st_plus_noise_inverse.diag_embed() @ eigen_vector_st.transpose(-2, -1)

        # detach.cpu()?
        self.sigma_inverse = sigma_inverse.detach()
        self.alpha = sigma_inverse @ stData.transpose(-2, -1).reshape(-1, 1).detach()

        nll = 0
        nll += 0.5 * (eigen_value_st + torch.exp(self.log_noise_variance)).log().sum()
        nll += 0.5 * (stData.transpose(-2, -1).reshape(1, -1) @ self.alpha).sum()
        return nll

def train_stgp(model, train_space_coordinates, train_time_coordinates, train_stData, lr=0.1, epochs=5):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for i in range(epochs):
        optimizer.zero_grad()
        loss = model.negative_log_likelihood(train_space_coordinates, train_time_coordinates, train_stData)
        loss.backward()
        optimizer.step()


if __name__ == '__main__':
    # stations: (lat, long, elevation); time stamps; pm2.5 readings (stations x times)
    str = torch.cat([torch.rand(5, 2, device=DEVICE) * 8000., torch.rand(5, 1, device=DEVICE) * 60.], dim=1)
    time = torch.linspace(0., 1., 4, device=DEVICE).view(-1, 1)
    pm25 = torch.randn(5, 4, device=DEVICE)

    model = stgp().to(DEVICE)
    train_stgp(model, str, time, pm25, lr=0.01, epochs=5)
    print("done")
