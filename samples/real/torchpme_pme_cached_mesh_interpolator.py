# source: https://github.com/lab-cosmo/torch-pme/issues/62 — issue "Caching destroys computational graph": since the cell-keyed caching of #43, calling the same PMEPotential again with an unchanged cell and backpropagating fails with "Trying to backward through the graph a second time"
# fix-source: https://github.com/lab-cosmo/torch-pme/commit/e22297d3f4af8615750885605e9a46326bee5dd8 — maintainer's commit "disable caching": _compute_lr builds the MeshInterpolator and updates the k-space filter mesh from the current cell on every call
# expect-kind: second-backward
# expect-culprit: self._MI
import itertools
import math

import torch
from _device import DEVICE


def get_ns_mesh(cell, mesh_spacing):
    """number of mesh points along each axis (integers, no autograd history)"""
    basis_norms = torch.linalg.norm(cell, dim=1)
    ns_approx = basis_norms / mesh_spacing
    ns_actual_approx = 2 * ns_approx + 1  # actual number of mesh points
    return torch.tensor(2, device=cell.device).pow(torch.ceil(torch.log2(ns_actual_approx)).long())


def generate_kvectors_for_mesh(ns, cell):
    """k vectors of the reciprocal mesh used by rfftn"""
    inverse_cell = torch.linalg.inv(cell)
    reciprocal_cell = 2 * torch.pi * inverse_cell.T
    bx = reciprocal_cell[0]
    by = reciprocal_cell[1]
    bz = reciprocal_cell[2]
    nx, ny, nz = (int(n) for n in ns)
    kxs = (bx * nx) * torch.fft.fftfreq(nx, device=cell.device).unsqueeze(-1)
    kys = (by * ny) * torch.fft.fftfreq(ny, device=cell.device).unsqueeze(-1)
    kzs = (bz * nz) * torch.fft.rfftfreq(nz, device=cell.device).unsqueeze(-1)
    return kxs[:, None, None] + kys[None, :, None] + kzs[None, None, :]


class CoulombPotential:
    """reciprocal-space kernel of the smeared 1/r potential, trimmed"""

    def __init__(self, smearing=None):
        self.smearing = smearing

    def from_k_sq(self, k_sq):
        return torch.where(
            k_sq == 0,
            0.0,
            4 * torch.pi * torch.exp(-0.5 * self.smearing**2 * k_sq) / k_sq,
        )


class KSpaceFilter:
    def __init__(self, cell, ns_mesh, kernel, fft_norm="backward", ifft_norm="forward"):
        self._fft_norm = fft_norm
        self._ifft_norm = ifft_norm
        self._kernel = kernel
        self.update_mesh(cell, ns_mesh)

    def update_filter(self):
        self._kfilter = self._kernel.from_k_sq(self._knorm_sq)

    def update_mesh(self, cell, ns_mesh):
        self._cell = cell
        self._ns_mesh = ns_mesh
        self._kvectors = generate_kvectors_for_mesh(ns=ns_mesh, cell=cell)
        self._knorm_sq = torch.sum(self._kvectors**2, dim=3)
        self.update_filter()

    def compute(self, mesh_values):
        dims = (1, 2, 3)
        mesh_hat = torch.fft.rfftn(mesh_values, norm=self._fft_norm, dim=dims)
        filter_hat = mesh_hat * self._kfilter
        return torch.fft.irfftn(
            filter_hat, norm=self._ifft_norm, dim=dims, s=mesh_values.shape[-3:]
        )


class MeshInterpolator:
    """particle <-> mesh interpolation, trimmed to interpolation_order=2"""

    def __init__(self, cell, ns_mesh, interpolation_order):
        self.cell = cell
        self.inverse_cell = torch.linalg.inv(cell)
        self.ns_mesh = ns_mesh
        self.interpolation_order = interpolation_order

    def _compute_1d_weights(self, x):
        return torch.stack([0.5 * (1 - 2 * x), 0.5 * (1 + 2 * x)])

    def compute_interpolation_weights(self, positions):
        positions_rel = self.ns_mesh * torch.matmul(positions, self.inverse_cell)
        indices = torch.floor(positions_rel).long()
        offsets = positions_rel - (indices + 0.5)
        self.interpolation_weights = self._compute_1d_weights(offsets)  # (2, n, 3)
        self.x_indices = indices

    def _iter_stencil(self):
        for sx, sy, sz in itertools.product(range(2), repeat=3):
            ix = (self.x_indices[:, 0] + sx) % self.ns_mesh[0]
            iy = (self.x_indices[:, 1] + sy) % self.ns_mesh[1]
            iz = (self.x_indices[:, 2] + sz) % self.ns_mesh[2]
            w = (self.interpolation_weights[sx, :, 0]
                 * self.interpolation_weights[sy, :, 1]
                 * self.interpolation_weights[sz, :, 2])
            yield ix, iy, iz, w

    def points_to_mesh(self, particle_weights):
        n_channels = particle_weights.shape[1]
        nx, ny, nz = (int(n) for n in self.ns_mesh)
        rho_mesh = torch.zeros((n_channels, nx, ny, nz), device=particle_weights.device,
                               dtype=particle_weights.dtype)
        for ix, iy, iz, w in self._iter_stencil():
            for a in range(n_channels):
                rho_mesh[a] = rho_mesh[a].index_put((ix, iy, iz), w * particle_weights[:, a],
                                                    accumulate=True)
        return rho_mesh

    def mesh_to_points(self, mesh_vals):
        return sum(w[:, None] * mesh_vals[:, ix, iy, iz].T
                   for ix, iy, iz, w in self._iter_stencil())


class PMEPotential(torch.nn.Module):
    def __init__(self, exponent=1.0, atomic_smearing=None, mesh_spacing=None,
                 interpolation_order=3):
        super().__init__()
        self.exponent = exponent
        self.potential = CoulombPotential(smearing=atomic_smearing)
        self.mesh_spacing = mesh_spacing
        self.atomic_smearing = atomic_smearing
        self.interpolation_order = interpolation_order

        # TorchScript requires to initialize all attributes in __init__
        self._cell_cache = -1 * torch.ones([3, 3])
        self._MI = MeshInterpolator(
            cell=torch.eye(3),
            ns_mesh=torch.ones(3, dtype=int),
            interpolation_order=self.interpolation_order,
        )
        self._KF = KSpaceFilter(
            cell=torch.eye(3),
            ns_mesh=torch.ones(3, dtype=int),
            kernel=self.potential,
            fft_norm="backward",
            ifft_norm="forward",
        )

    def forward(self, positions, charges, cell, neighbor_indices, neighbor_distances):
        return self._compute_single_system(
            positions, charges, cell, neighbor_indices, neighbor_distances)

    def _compute_single_system(self, positions, charges, cell, neighbor_indices,
                               neighbor_distances):
        smearing = self.atomic_smearing
        if self.mesh_spacing is None:
            mesh_spacing = smearing / 8.0
        else:
            mesh_spacing = self.mesh_spacing
        # (the real-space part over the neighbor list is left out: the list is empty here)
        potential_lr = self._compute_lr(
            positions=positions,
            charges=charges,
            cell=cell,
            smearing=smearing,
            lr_wavelength=mesh_spacing,
        )
        return potential_lr

    def _compute_lr(self, positions, charges, cell, smearing, lr_wavelength):
        dtype = positions.dtype
        device = positions.device
        self._cell_cache = self._cell_cache.to(dtype=dtype, device=device)

        # Inverse of cell volume for later use
        ivolume = torch.abs(cell.det()).pow(-1)

        # Kernel function `G` and initialization of `MeshInterpolator` only depend on
        # `cell`. Caching can save up to 15%.
        if not torch.allclose(cell, self._cell_cache):
            self._cell_cache = cell.detach().clone()

            ns = get_ns_mesh(cell, lr_wavelength)

            self._MI = MeshInterpolator(cell, ns, interpolation_order=self.interpolation_order)  # culprit

            self.potential.smearing = smearing
            self._KF.update_mesh(cell, ns)

        # Step 1. Compute density interpolation
        self._MI.compute_interpolation_weights(positions)
        rho_mesh = self._MI.points_to_mesh(particle_weights=charges)

        # Step 2: Perform actual convolution using FFT
        potential_mesh = self._KF.compute(rho_mesh)

        # Step 3: Back interpolation, and apply cell volume scaling
        interpolated_potential = self._MI.mesh_to_points(potential_mesh) * ivolume

        # Step 4: Remove the self-contribution
        phalf = self.exponent / 2
        fill_value = 1 / math.gamma(phalf + 1) / (2 * smearing**2) ** phalf
        self_contrib = torch.full([], fill_value, device=device)
        interpolated_potential -= charges * self_contrib

        # Step 5: compensate a net charge with a homogeneous background
        charge_tot = torch.sum(charges, dim=0)
        prefac = torch.pi**1.5 * (2 * smearing**2) ** ((3 - self.exponent) / 2)
        prefac /= (3 - self.exponent) * math.gamma(self.exponent / 2)
        interpolated_potential -= 2 * prefac * charge_tot * ivolume

        # Compensate for double counting of pairs (i,j) and (j,i)
        return interpolated_potential / 2


sr_cutoff = 5.5
calculator = PMEPotential(
    exponent=1.0,
    atomic_smearing=sr_cutoff / 5.0,
    mesh_spacing=1.5,
    interpolation_order=2,
).to(DEVICE)

for step in range(3):
    positions = (5 * torch.rand((8, 3), device=DEVICE)).requires_grad_()
    cell = (5 * torch.eye(3, device=DEVICE)).requires_grad_()
    charges = torch.rand((8, 1), device=DEVICE)
    neighbor_indices = torch.zeros((0, 2), dtype=torch.int64, device=DEVICE)
    neighbor_distances = torch.zeros((0,), device=DEVICE)

    output = calculator(positions, charges, cell, neighbor_indices, neighbor_distances)
    output = output.sum()
    output.backward()
print("done")
