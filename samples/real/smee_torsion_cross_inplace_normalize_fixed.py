# source: https://github.com/openforcefield/smee/pull/9 — PR "Remove the use of inplace operations" (smirnoffee, 7457118): the valence potentials normalise their vectors in place (`vector_cb_cross_cd /= torch.norm(vector_cb_cross_cd, dim=1).unsqueeze(1)` in the torsion, `vector_ab /= ...` in the angle), so back-propagating the energy to the conformer (conformer minimization) raises the in-place error
# fix-source: https://github.com/openforcefield/smee/commit/177b9dbb1311f848a36644bf6d40dab813782d0d — maintainer's commit (PR #9): `vector_ab = vector_ab / torch.norm(...)` etc., every in-place update in valence.py written out of place
# expect-kind: none
# fix: every in-place update in valence.py written out of place, as 177b9db does: `vector_ab = vector_ab / torch.norm(...)`, `vector_ac = vector_ac / ...` (angle), `vector_ab_cross_cb = vector_ab_cross_cb / ...`, `vector_cb_cross_cd = vector_cb_cross_cd / ...` and `phi = phi * torch.where(...)` (torsion)
from typing import Dict, List, Tuple

import torch
from torch import optim
from _device import DEVICE

_POTENTIAL_ENERGY_FUNCTIONS = {}


def potential_energy_function(handler_type, energy_expression):
    """A decorator used to flag a function as being able to compute the potential for a
    specific handler and its associated energy expression.."""

    def _potential_function_inner(func):
        if (handler_type, energy_expression) in _POTENTIAL_ENERGY_FUNCTIONS:
            raise KeyError(
                f"A potential energy function is already defined for "
                f"handler={handler_type} fn={energy_expression}."
            )
        _POTENTIAL_ENERGY_FUNCTIONS[(handler_type, energy_expression)] = func
        return func

    return _potential_function_inner


# smirnoffee/potentials/valence.py


@potential_energy_function("Bonds", "k/2*(r-length)**2")
def evaluate_harmonic_bond_energy(
    conformer: torch.Tensor,
    atom_indices: torch.Tensor,
    parameters: torch.Tensor,
) -> torch.Tensor:
    if len(atom_indices) == 0:
        return torch.zeros(1, device=DEVICE)

    distances = torch.norm(
        conformer[atom_indices[:, 1]] - conformer[atom_indices[:, 0]], dim=1
    )

    return (0.5 * parameters[:, 0] * (distances - parameters[:, 1]) ** 2).sum()


@potential_energy_function("Angles", "k/2*(theta-angle)**2")
def evaluate_harmonic_angle_energy(
    conformer: torch.Tensor,
    atom_indices: torch.Tensor,
    parameters: torch.Tensor,
) -> torch.Tensor:
    if len(atom_indices) == 0:
        return torch.zeros(1, device=DEVICE)

    vector_ab = conformer[atom_indices[:, 1]] - conformer[atom_indices[:, 0]]
    vector_ab = vector_ab / torch.norm(vector_ab, dim=1).unsqueeze(1)

    vector_ac = conformer[atom_indices[:, 1]] - conformer[atom_indices[:, 2]]
    vector_ac = vector_ac / torch.norm(vector_ac, dim=1).unsqueeze(1)

    # TODO: handle the ACOS singularity.
    angles = torch.rad2deg(torch.acos((vector_ab * vector_ac).sum(dim=1)))

    return (0.5 * parameters[:, 0] * (angles - parameters[:, 1]) ** 2).sum()


def _evaluate_cosine_torsion_energy(
    conformer: torch.Tensor,
    atom_indices: torch.Tensor,
    parameters: torch.Tensor,
) -> torch.Tensor:
    if len(atom_indices) == 0:
        return torch.zeros(1, device=DEVICE)

    # Based on the OpenMM formalism.
    vector_ab = conformer[atom_indices[:, 0]] - conformer[atom_indices[:, 1]]
    vector_cb = conformer[atom_indices[:, 2]] - conformer[atom_indices[:, 1]]
    vector_cd = conformer[atom_indices[:, 2]] - conformer[atom_indices[:, 3]]

    vector_ab_cross_cb = torch.cross(vector_ab, vector_cb, dim=1)
    vector_cb_cross_cd = torch.cross(vector_cb, vector_cd, dim=1)

    vector_ab_cross_cb = vector_ab_cross_cb / torch.norm(
        vector_ab_cross_cb, dim=1
    ).unsqueeze(1)
    vector_cb_cross_cd = vector_cb_cross_cd / torch.norm(
        vector_cb_cross_cd, dim=1
    ).unsqueeze(1)

    cos_phi = (vector_ab_cross_cb * vector_cb_cross_cd).sum(dim=1)

    # TODO: handle the ACOS singularity.
    phi = torch.acos(cos_phi)
    phi = phi * torch.where((vector_ab * vector_cb_cross_cd).sum(dim=1) < 0, -1.0, 1.0)

    return (
        parameters[:, 0]
        / parameters[:, 3]
        * (1.0 + torch.cos(parameters[:, 1] * phi - torch.deg2rad(parameters[:, 2])))
    ).sum()


@potential_energy_function("ProperTorsions", "k*(1+cos(periodicity*theta-phase))")
def evaluate_cosine_proper_torsion_energy(
    conformer: torch.Tensor,
    atom_indices: torch.Tensor,
    parameters: torch.Tensor,
) -> torch.Tensor:
    return _evaluate_cosine_torsion_energy(conformer, atom_indices, parameters)


# smirnoffee/potentials/potentials.py

VectorizedHandler = Tuple[torch.Tensor, torch.Tensor, List[Tuple[str, Tuple[str, ...]]]]


def evaluate_vectorized_handler_energy(
    handler: VectorizedHandler,
    handler_type: str,
    handler_expression: str,
    conformer: torch.Tensor,
) -> torch.Tensor:
    indices, parameters, parameter_ids = handler

    if len(parameter_ids) == 0:
        return torch.zeros(1, device=DEVICE)

    energy_expression = _POTENTIAL_ENERGY_FUNCTIONS[(handler_type, handler_expression)]
    handler_energy = energy_expression(conformer, indices, parameters)

    return handler_energy


def evaluate_vectorized_system_energy(
    system: Dict[Tuple[str, str], VectorizedHandler],
    conformer: torch.Tensor,
) -> torch.Tensor:
    total_energy = torch.zeros(1, device=DEVICE)

    for (handler_type, handler_expression), handler in system.items():
        handler_energy = evaluate_vectorized_handler_energy(
            handler, handler_type, handler_expression, conformer
        )
        total_energy += handler_energy

    return total_energy


def vectorize_system():
    """A five-atom chain standing in for `vectorize_system(System.from_smirnoff(...))`
    (no openff-toolkit here): the assigned parameters of each valence handler."""
    bonds = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 4]], device=DEVICE)
    angles = torch.tensor([[0, 1, 2], [1, 2, 3], [2, 3, 4]], device=DEVICE)
    propers = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]], device=DEVICE)
    return {
        ("Bonds", "k/2*(r-length)**2"): (
            bonds,
            torch.tensor([[2000.0, 1.53]] * 4, device=DEVICE),
            [("[#6:1]-[#6:2]", ("k", "length"))] * 4,
        ),
        ("Angles", "k/2*(theta-angle)**2"): (
            angles,
            torch.tensor([[0.15, 109.5]] * 3, device=DEVICE),
            [("[#6:1]-[#6:2]-[#6:3]", ("k", "angle"))] * 3,
        ),
        ("ProperTorsions", "k*(1+cos(periodicity*theta-phase))"): (
            propers,
            torch.tensor([[1.5, 3.0, 0.0, 1.0]] * 2, device=DEVICE),
            [("[#6:1]-[#6:2]-[#6:3]-[#6:4]", ("k", "periodicity", "phase", "idivf"))] * 2,
        ),
    }


# examples/conformer-minimization.py


def main():
    # A zig-zag carbon chain, perturbed so that it needs minimization.
    conformer = (
        torch.tensor(
            [
                [0.00, 0.00, 0.00],
                [1.25, 0.85, 0.10],
                [2.55, 0.05, -0.12],
                [3.80, 0.90, 0.35],
                [5.05, 0.10, 0.95],
            ],
            device=DEVICE,
        )
        * 1.10
    )
    conformer = conformer + 0.05 * torch.randn(conformer.shape, device=DEVICE)
    conformer.requires_grad = True

    openff_system = vectorize_system()

    # Minimize the conformer
    optimizer = optim.Adam([conformer], lr=0.02)

    for epoch in range(3):
        energy = evaluate_vectorized_system_energy(openff_system, conformer)
        energy.backward()

        optimizer.step()
        optimizer.zero_grad()

        print(f"Epoch {epoch}: E={energy.item()} kJ / mol")


if __name__ == "__main__":
    main()
    print("done")
