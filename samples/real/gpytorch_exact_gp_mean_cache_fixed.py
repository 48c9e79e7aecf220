# source: https://github.com/cornellius-gp/gpytorch/pull/228 — maintainer's report (fixes #175): optimising an acquisition input x with Adam through ExactGP predictions fails on the second backward, because the test-time mean cache keeps the graph to the model's hyperparameters
# fix-source: https://github.com/cornellius-gp/gpytorch/pull/228 (commit c6139a7) — maintainer's fix: exact_predictive_mean returns precomputed_cache.detach()
# expect-kind: none
# fix: exact_predictive_mean returns precomputed_cache.detach(), so self.mean_cache holds no graph to the hyperparameters
import torch
from torch import nn
from _device import DEVICE


class RBFKernel(nn.Module):
    def __init__(self):
        super().__init__()
        self.log_lengthscale = nn.Parameter(torch.zeros(1))
        self.log_outputscale = nn.Parameter(torch.zeros(1))

    def forward(self, x1, x2):
        dist = torch.cdist(x1 / self.log_lengthscale.exp(), x2 / self.log_lengthscale.exp()).pow(2)
        return self.log_outputscale.exp() * torch.exp(-0.5 * dist)


class GaussianLikelihood(nn.Module):
    def __init__(self):
        super().__init__()
        self.log_noise = nn.Parameter(torch.tensor([-2.0]))

    def forward(self, mean, covar):
        return mean, covar + self.log_noise.exp() * torch.eye(covar.shape[-1], device=covar.device)


def exact_predictive_mean(full_covar, full_mean, train_labels, n_train, likelihood, precomputed_cache=None):
    if precomputed_cache is None:
        train_mean = full_mean[:n_train]
        train_train_covar = full_covar[:n_train, :n_train]
        train_mean, train_train_covar = likelihood(train_mean, train_train_covar)
        train_labels_offset = train_labels - train_mean
        precomputed_cache = torch.linalg.solve(train_train_covar, train_labels_offset.unsqueeze(-1))

    test_mean = full_mean[n_train:]
    test_train_covar = full_covar[n_train:, :n_train]
    res = test_train_covar.matmul(precomputed_cache).squeeze(-1)
    res = res + test_mean
    return res, precomputed_cache.detach()


def exact_predictive_covar(full_covar, n_train, likelihood, precomputed_cache=None):
    train_train_covar = full_covar[:n_train, :n_train]
    test_train_covar = full_covar[n_train:, :n_train]
    test_test_covar = full_covar[n_train:, n_train:]
    _, train_train_covar = likelihood(torch.zeros(n_train, device=full_covar.device), train_train_covar)
    # fast_pred_var is off: no cache for the covariance
    covar_correction_rhs = torch.linalg.solve(train_train_covar, test_train_covar.transpose(-1, -2)).mul(-1)
    res = test_test_covar + test_train_covar.matmul(covar_correction_rhs)
    return res, None


class ExactGP(nn.Module):
    def __init__(self, train_inputs, train_targets, likelihood):
        super().__init__()
        self.train_inputs = train_inputs
        self.train_targets = train_targets
        self.likelihood = likelihood
        self.mean_cache = None
        self.covar_cache = None

    def train(self, mode=True):
        if mode:
            self.mean_cache = None
            self.covar_cache = None
        return super().train(mode)

    def __call__(self, inputs):
        if self.training:
            return super().__call__(self.train_inputs)

        # Posterior mode
        full_inputs = torch.cat([self.train_inputs, inputs], dim=-2)
        full_mean, full_covar = super().__call__(full_inputs)
        n_train = self.train_targets.size(-1)

        predictive_mean, mean_cache = exact_predictive_mean(
            full_covar=full_covar,
            full_mean=full_mean,
            train_labels=self.train_targets,
            n_train=n_train,
            likelihood=self.likelihood,
            precomputed_cache=self.mean_cache,
        )
        predictive_covar, covar_cache = exact_predictive_covar(
            full_covar=full_covar, n_train=n_train, likelihood=self.likelihood, precomputed_cache=self.covar_cache
        )

        self.mean_cache = mean_cache
        self.covar_cache = covar_cache
        return predictive_mean, predictive_covar


class ExactGPModel(ExactGP):
    def __init__(self, train_x, train_y, likelihood):
        super().__init__(train_x, train_y, likelihood)
        self.constant_mean = nn.Parameter(torch.zeros(1))
        self.covar_module = RBFKernel()

    def forward(self, x):
        return self.constant_mean.expand(x.shape[0]), self.covar_module(x, x)


def batch_expected_improvement(x, model, best_f):
    mean, covar = model(x)
    sigma = covar.diagonal().clamp_min(1e-9).sqrt()
    u = (mean - best_f) / sigma
    normal = torch.distributions.Normal(torch.zeros_like(u), torch.ones_like(u))
    ei = sigma * (u * normal.cdf(u) + normal.log_prob(u).exp())
    return ei.sum()


train_x = torch.rand(8, 1, device=DEVICE)
train_y = torch.sin(6 * train_x).squeeze(-1)
likelihood = GaussianLikelihood().to(DEVICE)
model = ExactGPModel(train_x, train_y, likelihood).to(DEVICE)
model.eval()

x = torch.tensor([[0.25]], device=DEVICE, requires_grad=True)
optimizer = torch.optim.Adam([x], lr=0.1)
for i in range(4):
    optimizer.zero_grad()
    loss = -batch_expected_improvement(x, model, 0)
    loss.backward()
    optimizer.step()
print("done")
