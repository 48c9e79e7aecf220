# source: https://github.com/learningmatter-mit/Atomistic-Adversarial-Attacks/issues/1 — issue "Running through grah a second time": robust/schnet/attacker.py's Attacker.attack_epoch with a user's own potential whose forward computes the forces by torch.autograd.grad of the energy; loss.backward() of the adversarial loss raises "Trying to backward through the graph a second time"
# fix-source: https://github.com/learningmatter-mit/Atomistic-Adversarial-Attacks/issues/1 — maintainer's answer (dskoda), confirmed by the reporter: pass retain_graph=True to torch.autograd.grad when computing the forces, as NFF's compute_grad does
# expect-kind: none
# fix: torch.autograd.grad(energy, xyz, ...) in the model's forward now passes retain_graph=True, so the energy graph survives for the adversarial loss's backward
import copy

import torch as ch
from torch.autograd import grad
from _device import DEVICE

N_ATOMS = 4


class Atoms:
    def __init__(self, nxyz):
        self.nxyz = nxyz

    def __len__(self):
        return self.nxyz.shape[0]

    def get_batch(self):
        return {'nxyz': self.nxyz.clone(), 'num_atoms': ch.tensor([len(self)], device=DEVICE)}


class PairPotential(ch.nn.Module):
    """The reporter's own model: energy from pair distances, forces inside forward."""

    def __init__(self):
        super().__init__()
        self.net = ch.nn.Sequential(ch.nn.Linear(1, 8), ch.nn.Tanh(), ch.nn.Linear(8, 1))

    def forward(self, batch):
        xyz = batch['nxyz'][:, 1:]
        i, j = ch.triu_indices(xyz.shape[0], xyz.shape[0], offset=1, device=xyz.device)
        r = (xyz[i] - xyz[j]).norm(dim=-1, keepdim=True)
        energy = self.net(r).sum().reshape(1)
        energy_grad = grad(energy, xyz, grad_outputs=ch.ones_like(energy), retain_graph=True)[0]
        return {'energy': energy, 'energy_grad': energy_grad}


class Ensemble:
    def __init__(self, models):
        self.models = models


class AdvLoss:
    def __init__(self, train_e, temperature=1.0):
        self.e = train_e
        self.temperature = temperature

    def boltzmann_probability(self, e):
        return ch.exp(-e / self.temperature)

    @property
    def partition_fn(self):
        return self.boltzmann_probability(self.e).mean()

    def probability_fn(self, yp):
        return self.boltzmann_probability(yp) / self.partition_fn

    def loss_fn(self, x, e, f=None, s=None):
        if f is not None:
            return -f.var(-1).mean(-1, keepdims=True) * self.probability_fn(e.mean(-1).reshape(-1, 1))


class Attacker:
    """Performs an adversarial attack on an `initial` atom using the `ensemble` models."""

    def __init__(self, initial, ensemble, adv_loss, delta_init=0.01, epsilon=3, optim_lr=1e-2, device=DEVICE):
        self.initial = initial
        self.ensemble = ensemble
        self.loss_fn = adv_loss
        self.delta_init = delta_init
        self.epsilon = epsilon
        self.optim_lr = optim_lr
        self.device = device

    @property
    def num_atoms(self):
        return len(self.initial)

    def initialize_translation(self):
        delta = self.delta_init * ch.randn((self.num_atoms, 3), device=self.device)
        delta.requires_grad = True
        opt = ch.optim.Adam([delta], lr=self.optim_lr)
        return delta, opt

    def attack(self, epochs=3):
        delta, opt = self.initialize_translation()
        results = []
        for epoch in range(epochs):
            epoch_results = self.attack_epoch(opt, delta, epoch)
            results.append({'epoch': epoch, **epoch_results})
        return results

    def attack_epoch(self, opt, delta, epoch):
        opt.zero_grad()
        batch = self.prepare_attack(delta)

        results = [m(batch) for m in self.ensemble.models]
        forces = ch.stack([r['energy_grad'] for r in results], dim=-1)
        energy = ch.stack([r['energy'] for r in results], dim=-1)

        energy_per_atom = energy / self.num_atoms
        loss = self.loss_fn.loss_fn(x=None, e=energy_per_atom, f=forces).sum()
        loss_item = loss.item()

        opt.zero_grad()
        loss.backward()
        opt.step()
        delta.data.clamp_(-self.epsilon, self.epsilon)

        return {
            'delta': batch['delta'].clone().detach().cpu().numpy(),
            'energy': energy.detach().cpu().numpy(),
            'forces': forces.detach().cpu().numpy(),
            'loss': loss_item,
        }

    def prepare_attack(self, delta):
        batch = self.get_batch()
        nxyz_translation = self.get_translation(delta)
        batch['nxyz'].requires_grad = True
        batch['nxyz'] = batch['nxyz'] + nxyz_translation
        batch['delta'] = delta
        return batch

    def get_translation(self, delta):
        return ch.cat([ch.zeros((self.num_atoms, 1), device=delta.device), delta], dim=1)

    def get_batch(self):
        atoms = copy.deepcopy(self.initial)
        batch = atoms.get_batch()
        batch['energy'] = 0
        batch['energy_grad'] = []
        return batch


nxyz = ch.cat([ch.tensor([[8.], [1.], [1.], [1.]], device=DEVICE), ch.randn(N_ATOMS, 3, device=DEVICE)], dim=1)
ensemble = Ensemble([PairPotential().to(DEVICE) for _ in range(2)])
adv_loss = AdvLoss(train_e=ch.randn(10, device=DEVICE))
attacker = Attacker(Atoms(nxyz), ensemble, adv_loss)
results = attacker.attack(epochs=3)
print("done")
