# source: https://github.com/meta-pytorch/botorch/pull/3272 — PairwiseGP keeps utility/covar_chol/likelihood_hess/hlcov_eye from the last training _update(); eval-mode forward() reuses them, so DGSM's torch.sum(posterior.mean).backward() runs into the training graph that fit already freed
# fix-source: https://github.com/meta-pytorch/botorch/commit/44e296c89b891779362e3fd8f0289b5de63e6956 — the eval-mode branch of PairwiseGP.forward() detaches the stored Laplace tensors (covar_chol, likelihood_hess, hlcov_eye, utility)
# expect-kind: none
# fix: the eval-mode branch of forward() uses self.covar_chol.detach(), self.likelihood_hess.detach(), self.hlcov_eye.detach() and self.utility.detach(), so predictions no longer reach the training graph
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from _device import DEVICE

DTYPE = torch.double


class PairwiseProbitLikelihood(nn.Module):
    def _calc_z(self, utility, D):
        return (D @ utility.unsqueeze(-1)).squeeze(-1) / math.sqrt(2.0)

    def _ratio(self, z):
        log_pdf = -0.5 * z * z - 0.5 * math.log(2 * math.pi)
        return torch.exp(log_pdf - torch.special.log_ndtr(z))  # pdf / cdf

    def log_p(self, utility, D):
        return torch.special.log_ndtr(self._calc_z(utility, D))

    def negative_log_gradient_sum(self, utility, D):
        z = self._calc_z(utility, D)
        return -(D.transpose(-1, -2) @ self._ratio(z).unsqueeze(-1)).squeeze(-1) / math.sqrt(2.0)

    def negative_log_hessian_sum(self, utility, D):
        z = self._calc_z(utility, D)
        r = self._ratio(z)
        h = r * r + z * r
        return D.transpose(-1, -2) @ (h.unsqueeze(-1) * D) / 2.0


class PairwiseGP(nn.Module):
    def __init__(self, datapoints, comparisons):
        super().__init__()
        self.raw_lengthscale = nn.Parameter(torch.zeros(1, dtype=DTYPE, device=DEVICE))
        self.raw_outputscale = nn.Parameter(torch.zeros(1, dtype=DTYPE, device=DEVICE))
        self.likelihood = PairwiseProbitLikelihood()
        self._jitter = 1e-6
        self.utility = None
        self.set_train_data(datapoints, comparisons, update_model=True)

    @property
    def outputscale(self):
        return F.softplus(self.raw_outputscale)

    def set_train_data(self, datapoints, comparisons, update_model=True):
        self.datapoints = datapoints
        self.comparisons = comparisons
        self.n = datapoints.shape[-2]
        D = torch.zeros(comparisons.shape[0], self.n, dtype=DTYPE, device=DEVICE)
        rows = torch.arange(comparisons.shape[0], device=DEVICE)
        D[rows, comparisons[:, 0]] = 1.0
        D[rows, comparisons[:, 1]] = -1.0
        self.D = D
        if update_model:
            self._update(self.datapoints)

    def _calc_covar(self, X1, X2):
        lengthscale = F.softplus(self.raw_lengthscale)
        sq = torch.cdist(X1 / lengthscale, X2 / lengthscale) ** 2
        return self.outputscale * torch.exp(-0.5 * sq)

    def _prior_mean(self, X):
        return torch.zeros(X.shape[:-1], dtype=X.dtype, device=X.device)

    def _update_covar(self, datapoints):
        self.covar = self._calc_covar(datapoints, datapoints)
        eye = torch.eye(self.n, dtype=DTYPE, device=DEVICE)
        self.covar_chol = torch.linalg.cholesky(self.covar + self._jitter * eye)
        self.covar_inv = torch.cholesky_inverse(self.covar_chol)

    def _grad_posterior_f(self, utility, datapoints, D, covar_chol):
        b = self.likelihood.negative_log_gradient_sum(utility=utility, D=D)
        p = utility - self._prior_mean(datapoints)
        p = torch.cholesky_solve(p.unsqueeze(-1), covar_chol).squeeze(-1)
        return p + b

    def _update_utility_derived_values(self):
        hl = self.likelihood_hess
        hlcov = hl @ self.covar
        eye = torch.eye(hlcov.size(-1), dtype=DTYPE, device=DEVICE).expand(hlcov.shape)
        self.hlcov_eye = hlcov + eye
        self.pred_cov_fac_need_update = False

    def _update(self, datapoints):
        self._update_covar(datapoints)
        # MAP search for f (scipy fsolve in the original), values only
        with torch.no_grad():
            f = torch.zeros(self.n, dtype=DTYPE, device=DEVICE)
            for _ in range(20):
                g = self._grad_posterior_f(f, datapoints, self.D, self.covar_chol)
                hess = self.covar_inv + self.likelihood.negative_log_hessian_sum(f, self.D)
                f = f - torch.linalg.solve(hess, g)
        self.likelihood_hess = self.likelihood.negative_log_hessian_sum(utility=f, D=self.D)
        self.pred_cov_fac_need_update = True
        self.hlcov_eye = torch.empty(self.n, self.n, dtype=DTYPE, device=DEVICE)
        # two Newton steps from f to fill in gradients w.r.t. the hyperparameters
        self.utility = self._util_newton_updates(dp=datapoints, x0=f.clone().requires_grad_(True), max_iter=2)

    def _util_newton_updates(self, dp, x0, max_iter=1):
        D, ch = self.D, self.covar_chol
        covar = self.covar
        x = x0
        eye = None
        for _ in range(max_iter):
            hl = self.likelihood.negative_log_hessian_sum(utility=x, D=D)
            self.likelihood_hess = hl
            cov_hl = covar @ hl
            if eye is None:
                eye = torch.diag_embed(torch.ones(cov_hl.shape[:-1], dtype=DTYPE, device=DEVICE))
            cov_hl = cov_hl + eye
            g = self._grad_posterior_f(utility=x, datapoints=dp, D=D, covar_chol=ch)
            cov_g = covar @ g.unsqueeze(-1)
            x_update = torch.linalg.solve(cov_hl, cov_g).squeeze(-1)
            x = x - x_update
        return x

    def forward(self, datapoints):
        if self.training:
            self.set_train_data(datapoints=datapoints, comparisons=self.comparisons, update_model=True)
            hl = self.likelihood_hess
            covar = self.covar
            hl_cov = hl @ covar
            eye = torch.eye(hl_cov.size(-1), dtype=DTYPE, device=DEVICE).expand(hl_cov.shape)
            output_covar = covar - covar @ torch.linalg.solve(hl_cov + eye, hl_cov)
            output_mean = self.utility
        else:
            X = self.datapoints
            X_new = datapoints
            if self.pred_cov_fac_need_update:
                self._update_utility_derived_values()
            covar_chol = self.covar_chol.detach()
            hl = self.likelihood_hess.detach()
            hlcov_eye = self.hlcov_eye.detach()

            covar_xnew_x = self._calc_covar(X_new, X)
            covar_x_xnew = covar_xnew_x.transpose(-1, -2)
            covar_xnew = self._calc_covar(X_new, X_new)
            p = self.utility.detach() - self._prior_mean(X)

            covar_inv_p = torch.cholesky_solve(p.unsqueeze(-1), covar_chol)
            pred_mean = (covar_xnew_x @ covar_inv_p).squeeze(-1)
            pred_mean = pred_mean + self._prior_mean(X_new)
            fac = torch.linalg.solve(hlcov_eye, hl @ covar_x_xnew)
            pred_covar = covar_xnew - (covar_xnew_x @ fac)
            output_mean, output_covar = pred_mean, pred_covar
        return output_mean, output_covar

    def posterior(self, X):
        mean, covar = self(X)
        return Posterior(mean.unsqueeze(-1), covar)


class Posterior:
    def __init__(self, mean, covariance_matrix):
        self.mean = mean
        self.covariance_matrix = covariance_matrix


class PairwiseLaplaceMarginalLogLikelihood(nn.Module):
    def __init__(self, likelihood, model):
        super().__init__()
        self.likelihood = likelihood
        self.model = model

    def forward(self, post, comp):
        model = self.model
        f_map = post[0]
        log_likelihood = self.likelihood.log_p(utility=f_map, D=model.D)
        neg_log_likelihood_sum = -(torch.sum(log_likelihood, dim=-1))
        inv_prod = torch.cholesky_solve(f_map.unsqueeze(-1), model.covar_chol)
        log_prior = 0.5 * (f_map.unsqueeze(-2) @ inv_prod).squeeze(-1).squeeze(-1)
        log_posterior = -(neg_log_likelihood_sum + log_prior).clamp(min=0)
        mll = model.covar @ model.likelihood_hess
        mll = mll + torch.diag_embed(torch.ones(mll.shape[:-1], dtype=DTYPE, device=DEVICE))
        mll = -0.5 * torch.logdet(mll)
        return (mll + log_posterior).sum()


# fit (fit_gpytorch_mll in the original: a few optimizer steps on the Laplace MLL)
datapoints = torch.rand(5, 2, dtype=DTYPE, device=DEVICE)
comparisons = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 4]], device=DEVICE)
model = PairwiseGP(datapoints=datapoints, comparisons=comparisons)
mll = PairwiseLaplaceMarginalLogLikelihood(model.likelihood, model)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
model.train()
for _ in range(3):
    optimizer.zero_grad()
    output = model(model.datapoints)
    loss = -mll(output, model.comparisons)
    loss.backward()
    optimizer.step()
model.eval()

# sensitivity analysis (Ax's GpDGSMGpMean): gradients of the posterior mean w.r.t. the inputs
input_mc_samples = torch.rand(8, 2, dtype=DTYPE, device=DEVICE)
input_mc_samples.requires_grad = True
posterior = model.posterior(input_mc_samples)
predictive_mean = posterior.mean
torch.sum(predictive_mean).backward()
mean_gradients = input_mc_samples.grad
print(mean_gradients.abs().mean(dim=0))
print("done")
