# source: https://github.com/NLESC-JCER/QMCTorch/issues/30 — issue: solver.run(loss='energy', grad='auto') stops in loss.backward() with "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation" (the Jastrow's second derivative scales a saved product in place)
# fix-source: https://github.com/NLESC-JCER/QMCTorch/pull/33 — maintainer's PR "fix inplace ops" (commit 0a62bf5): the in-place updates of fast_jastrow.py written out of place
# expect-kind: none
# fix: write the Jastrow's in-place updates out of place (x = x * self.weight_partial_der, hess_jast = 0.5 * hess_jast, hess_jast = hess_jast + ...), as the maintainer did in 0a62bf5
import torch
from torch import nn
from _device import DEVICE


class ElectronDistance(nn.Module):
    """e-e distances r_ij and their derivatives with respect to the coordinates of electron i."""

    def __init__(self, nelec, ndim=3):
        super().__init__()
        self.nelec, self.ndim = nelec, ndim

    def forward(self, input, derivative=0):
        nbatch = input.shape[0]
        pos = input.view(nbatch, self.nelec, self.ndim)
        diff = pos.unsqueeze(2) - pos.unsqueeze(1)
        eye = torch.eye(self.nelec, device=input.device)
        dist = torch.sqrt((diff ** 2).sum(-1) + eye)  # the diagonal is masked out later
        if derivative == 0:
            return dist
        dr = diff.permute(0, 3, 1, 2) / dist.unsqueeze(1)
        if derivative == 1:
            return dr
        return (1.0 - dr ** 2) / dist.unsqueeze(1)


class TwoBodyJastrowFactor(nn.Module):
    def __init__(self, nup, ndown, w=1.0):
        super().__init__()
        self.nup, self.ndown = nup, ndown
        self.nelec = nup + ndown
        self.ndim = 3
        self.weight = nn.Parameter(torch.tensor([w]))
        self.mask_tri_up, self.index_col, self.index_row = self.get_mask_tri_up()
        self.edist = ElectronDistance(self.nelec, self.ndim)
        self.static_weight = self.get_static_weight()
        self._get_index_partial_derivative()

    def get_mask_tri_up(self):
        mask = torch.zeros(self.nelec, self.nelec, dtype=torch.bool)
        index_col, index_row = [], []
        for i in range(self.nelec - 1):
            for j in range(i + 1, self.nelec):
                index_row.append(i)
                index_col.append(j)
                mask[i, j] = True
        return mask.to(DEVICE), torch.LongTensor(index_col).to(DEVICE), torch.LongTensor(index_row).to(DEVICE)

    def extract_tri_up(self, input):
        nbatch = input.shape[0]
        return input.masked_select(self.mask_tri_up).view(nbatch, -1)

    def get_static_weight(self):
        bup = torch.cat((0.25 * torch.ones(self.nup, self.nup), 0.5 * torch.ones(self.nup, self.ndown)), dim=1)
        bdown = torch.cat((0.5 * torch.ones(self.ndown, self.nup), 0.25 * torch.ones(self.ndown, self.ndown)), dim=1)
        static_weight = torch.cat((bup, bdown), dim=0).to(DEVICE)
        return static_weight.masked_select(self.mask_tri_up)

    def forward(self, pos, derivative=0, jacobian=True):
        nbatch = pos.shape[0]
        r = self.extract_tri_up(self.edist(pos))
        jast = self._get_jastrow_elements(r)
        if derivative == 0:
            return jast.prod(1).view(nbatch, 1)
        dr = self.extract_tri_up(self.edist(pos, derivative=1)).view(nbatch, 3, -1)
        if derivative == 1:
            return self._jastrow_derivative(r, dr, jast, jacobian)
        d2r = self.extract_tri_up(self.edist(pos, derivative=2)).view(nbatch, 3, -1)
        return self._jastrow_second_derivative(r, dr, d2r, jast)

    def _jastrow_derivative(self, r, dr, jast, jacobian):
        nbatch = r.shape[0]
        prod_val = jast.prod(1).unsqueeze(-1).unsqueeze(-1)
        djast = self._get_der_jastrow_elements(r, dr)
        djast = djast * prod_val
        out = torch.zeros(nbatch, 3, self.nelec, device=DEVICE)
        out.index_add_(2, self.index_row, djast)
        out.index_add_(2, self.index_col, -djast)
        return out

    def _jastrow_second_derivative(self, r, dr, d2r, jast):
        nbatch = r.shape[0]
        prod_val = jast.prod(1).unsqueeze(-1)
        d2jast = self._get_second_der_jastrow_elements(r, dr, d2r).sum(1)
        hess_jast = torch.zeros(nbatch, self.nelec, device=DEVICE)
        hess_jast.index_add_(1, self.index_row, d2jast)
        hess_jast.index_add_(1, self.index_col, d2jast)
        hess_jast = 0.5 * hess_jast

        # mixed terms
        djast = self._get_der_jastrow_elements(r, dr)
        hess_jast = hess_jast + self._partial_derivative(djast, out_mat=hess_jast)
        return hess_jast * prod_val

    def _get_jastrow_elements(self, r):
        return torch.exp(self._compute_kernel(r))

    def _compute_kernel(self, r):
        return self.static_weight * r / (1.0 + self.weight * r)

    def _get_der_jastrow_elements(self, r, dr):
        r_ = r.unsqueeze(1)
        denom = 1.0 / (1.0 + self.weight * r_)
        a = self.static_weight * dr * denom
        b = -self.static_weight * self.weight * r_ * dr * denom ** 2
        return a + b

    def _get_second_der_jastrow_elements(self, r, dr, d2r):
        r_ = r.unsqueeze(1)
        denom = 1.0 / (1.0 + self.weight * r_)
        denom2 = denom ** 2
        dr_square = dr ** 2
        a = self.static_weight * d2r * denom
        b = -2 * self.static_weight * self.weight * dr_square * denom2
        c = -self.static_weight * self.weight * r_ * d2r * denom2
        d = 2 * self.static_weight * self.weight ** 2 * r_ * dr_square * denom ** 3
        e = self._get_der_jastrow_elements(r, dr)
        return a + b + c + d + e ** 2

    def _get_index_partial_derivative(self):
        self.index_partial_der, self.weight_partial_der, self.index_partial_der_to_elec = [], [], []
        for idx in range(self.nelec):
            index_pairs = [(idx, j, 1.0) for j in range(idx + 1, self.nelec)] + \
                          [(j, idx, -1.0) for j in range(0, idx)]
            for p1 in range(len(index_pairs) - 1):
                i1, j1, w1 = index_pairs[p1]
                for p2 in range(p1 + 1, len(index_pairs)):
                    i2, j2, w2 = index_pairs[p2]
                    self.index_partial_der.append([self._single_index(i1, j1), self._single_index(i2, j2)])
                    self.weight_partial_der.append(w1 * w2)
                    self.index_partial_der_to_elec.append(idx)
        self.weight_partial_der = torch.tensor(self.weight_partial_der).to(DEVICE)
        self.index_partial_der_to_elec = torch.LongTensor(self.index_partial_der_to_elec).to(DEVICE)

    def _single_index(self, i, j):
        n = self.nelec
        return int((n * (n - 1) / 2) - (n - i) * ((n - i) - 1) / 2 + j - i - 1)

    def _partial_derivative(self, djast, out_mat=None):
        nbatch = djast.shape[0]
        if out_mat is None:
            out_mat = torch.zeros(nbatch, self.nelec, device=DEVICE)
        if len(self.index_partial_der) > 0:
            x = djast[..., self.index_partial_der]
            x = x.prod(-1)
            x = x * self.weight_partial_der
            x = x.sum(1)
            out_mat.index_add_(1, self.index_partial_der_to_elec, x)
        return out_mat


class Orbital(nn.Module):
    """psi = prod_i exp(-zeta |x_i|) * J : 1s orbitals around a nucleus of charge Z, times the Jastrow."""

    def __init__(self, nup=2, ndown=1, zeta=1.5, Z=3.0):
        super().__init__()
        self.nelec, self.ndim = nup + ndown, 3
        self.zeta, self.Z = zeta, Z
        self.jastrow = TwoBodyJastrowFactor(nup, ndown, w=1.0)

    def forward(self, x):
        rn = x.view(x.shape[0], self.nelec, self.ndim).norm(dim=-1)
        return torch.exp(-self.zeta * rn).prod(1, keepdim=True) * self.jastrow(x)

    def kinetic_energy_jacobi(self, x):
        xe = x.view(x.shape[0], self.nelec, self.ndim)
        rn = xe.norm(dim=-1)
        dmo = (-self.zeta * xe / rn.unsqueeze(-1)).transpose(1, 2)  # grad(phi)/phi, nbatch x 3 x nelec
        d2mo = self.zeta ** 2 - 2 * self.zeta / rn  # lap(phi)/phi, nbatch x nelec
        jast = self.jastrow(x)
        djast = self.jastrow(x, derivative=1, jacobian=False) / jast.unsqueeze(-1)
        d2jast = self.jastrow(x, derivative=2) / jast
        bkin = d2mo + 2 * (djast * dmo).sum(1) + d2jast
        return -0.5 * bkin.sum(1, keepdim=True)

    def electronic_potential(self, x):
        r = self.jastrow.extract_tri_up(self.jastrow.edist(x))
        return (1.0 / r).sum(1, keepdim=True)

    def nuclear_potential(self, x):
        rn = x.view(x.shape[0], self.nelec, self.ndim).norm(dim=-1)
        return -(self.Z / rn).sum(1, keepdim=True)

    def local_energy(self, pos):
        return self.kinetic_energy_jacobi(pos) + self.nuclear_potential(pos) + self.electronic_potential(pos)

    def energy(self, pos):
        return torch.mean(self.local_energy(pos))


class Metropolis:
    def __init__(self, nwalkers=16, nstep=20, step_size=0.3, nelec=3, ndim=3):
        self.nwalkers, self.nstep, self.step_size = nwalkers, nstep, step_size
        self.nelec, self.ndim = nelec, ndim
        self.walkers = torch.randn(nwalkers, nelec * ndim, device=DEVICE)

    @torch.no_grad()
    def __call__(self, pdf):
        pos = self.walkers
        fx = pdf(pos)
        for _ in range(self.nstep):
            new = pos + self.step_size * torch.randn_like(pos)
            fnew = pdf(new)
            accept = (fnew / fx) > torch.rand_like(fx)
            pos = torch.where(accept, new, pos)
            fx = torch.where(accept, fnew, fx)
        self.walkers = pos
        return pos.clone()


class SolverOrbital:
    def __init__(self, wf, sampler, optimizer):
        self.wf, self.sampler, self.opt = wf, sampler, optimizer

    def pdf(self, pos):
        return self.wf(pos) ** 2

    def run(self, nepoch, loss='energy', grad='auto'):
        for epoch in range(nepoch):
            pos = self.sampler(self.pdf)
            self.opt.zero_grad()
            loss_val = self.wf.energy(pos)
            loss_val.backward()
            self.opt.step()
        return self.wf.jastrow.weight.item()


wf = Orbital(nup=2, ndown=1).to(DEVICE)
sampler = Metropolis(nwalkers=16, nstep=20, step_size=0.3, nelec=wf.nelec, ndim=3)
opt = torch.optim.Adam(wf.parameters(), lr=0.05)
solver = SolverOrbital(wf=wf, sampler=sampler, optimizer=opt)
obs = solver.run(4, loss='energy', grad='auto')
print("done")
