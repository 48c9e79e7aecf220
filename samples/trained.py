"""What a script trained: run it as `python SCRIPT` would, seeded, and keep every parameter of
every module and optimizer it made (and every leaf tensor requiring grad left in its globals),
every gradient when the first backward returned, and the gradients each optimizer applied in its
first step.

    python samples/trained.py SCRIPT OUT.pt            # run SCRIPT, save what it trained
    python samples/trained.py --compare A.pt B.pt      # exit 0 when both trained the same

A fix is right only if it trains what the expert's fix trains: samples/validate.py and the tests
run a buggy script with `fixes[0]` applied and its twin through this, and compare.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

RTOL, ATOL = 1e-4, 1e-6
HERE = Path(__file__).resolve().parent


def run(script: Path) -> dict:
    """Run `script` as __main__ with the seeds fixed; return {"error": str|None, "tensors": [(label,
    tensor)], "first_backward": [(label, grad)] | None, "first_step": {label: grad}}: the trained
    tensors in the order the script made their modules and optimizers, their gradients when the
    first backward returned, and the gradients each optimizer held when its first step began."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    made_modules: list = []
    made_optimizers: list = []
    module_init, optimizer_init = torch.nn.Module.__init__, torch.optim.Optimizer.__init__
    backward = torch.autograd.backward
    namespace = {"__name__": "__main__", "__file__": str(script.resolve()), "__builtins__": __builtins__}
    first_backward: list = []
    first_step: dict = {}
    stepped: set[int] = set()

    def gradients() -> list:
        return [(label, None if t.grad is None else t.grad.detach().to("cpu", copy=True))
                for label, t in tracked(made_modules, made_optimizers, namespace)]
    def remember_module(self, *args, **kwargs):
        module_init(self, *args, **kwargs)
        made_modules.append(self)

    def remember_optimizer(self, *args, **kwargs):
        optimizer_init(self, *args, **kwargs)
        made_optimizers.append(self)

    def remember_first_backward(*args, **kwargs):
        result = backward(*args, **kwargs)
        if not first_backward:
            first_backward.extend(gradients())
        return result

    def remember_first_step(optimizer, args, kwargs):
        made = [i for i, o in enumerate(made_optimizers) if o is optimizer]
        if not made or made[0] in stepped:
            return
        stepped.add(made[0])
        for g, group in enumerate(optimizer.param_groups):
            for k, p in enumerate(group["params"]):
                first_step[f"{type(optimizer).__name__}#{made[0]}.group{g}[{k}]"] = \
                    None if p.grad is None else p.grad.detach().to("cpu", copy=True)

    random.seed(0)
    torch.manual_seed(0)
    try:
        import numpy

        numpy.random.seed(0)
    except ImportError:
        pass
    script = script.resolve()
    sys.argv[:] = [str(script)]
    sys.path.insert(0, str(script.parent))
    torch.nn.Module.__init__, torch.optim.Optimizer.__init__ = remember_module, remember_optimizer
    torch.autograd.backward = remember_first_backward  # what Tensor.backward calls
    step_hook = register_optimizer_step_pre_hook(remember_first_step)
    error = None
    try:
        exec(compile(script.read_text(encoding="utf-8"), str(script), "exec"), namespace)
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            error = f"SystemExit({exit_.code!r})"
    except BaseException as caught:  # noqa: BLE001 - what the script did is the result
        error = f"{type(caught).__name__}: {str(caught).splitlines()[0] if str(caught) else ''}"
    finally:
        torch.nn.Module.__init__, torch.optim.Optimizer.__init__ = module_init, optimizer_init
        torch.autograd.backward = backward
        step_hook.remove()
    tensors = [(label, t.detach().to("cpu", copy=True)) for label, t in tracked(made_modules, made_optimizers, namespace)]
    return {"error": error, "tensors": tensors, "first_backward": first_backward or None,
            "first_step": first_step}


def tracked(modules: list, optimizers: list, namespace: dict) -> list:
    """(label, tensor) for every parameter of `modules` and `optimizers`, then every leaf tensor
    requiring grad in `namespace`, each once."""
    import torch

    seen: set[int] = set()
    found: list = []

    def keep(label: str, tensor) -> None:
        if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
            seen.add(id(tensor))
            found.append((label, tensor))

    for i, module in enumerate(modules):
        for name, parameter in module.named_parameters(recurse=False):
            keep(f"{type(module).__name__}#{i}.{name}", parameter)
    for i, optimizer in enumerate(optimizers):
        for g, group in enumerate(optimizer.param_groups):
            for k, parameter in enumerate(group["params"]):
                keep(f"{type(optimizer).__name__}#{i}.group{g}[{k}]", parameter)
    for name, value in sorted(namespace.items()):
        if isinstance(value, torch.Tensor) and value.is_leaf and value.requires_grad:
            keep(f"global {name}", value)
    return found


def differences(a: dict, b: dict, names: tuple[str, str] = ("the first", "the second")) -> list[str]:
    """Why `a` and `b` did not train the same; empty when they did."""
    import torch

    if a["error"] or b["error"]:
        return [f"{which} ended with {r['error']}" for which, r in zip(names, (a, b)) if r["error"]]
    if not a["tensors"]:
        return ["the script trained nothing this harness can see"]
    if len(a["tensors"]) != len(b["tensors"]):
        return [f"{len(a['tensors'])} trained tensors against {len(b['tensors'])}"]
    found = []
    for (label, x), (_, y) in zip(a["tensors"], b["tensors"]):
        if x.shape != y.shape:
            found.append(f"{label}: shape {tuple(x.shape)} against {tuple(y.shape)}")
        elif not torch.allclose(x.double(), y.double(), rtol=RTOL, atol=ATOL, equal_nan=True):
            gap = (x.double() - y.double()).abs().max().item()
            found.append(f"{label}: differs by up to {gap:.3g}")
    return found


def trained_by(script: Path, out: Path, device: str | None = None, env: dict[str, str] | None = None,
               runner=subprocess.run) -> dict:
    """`run(script)` in a process of its own, from the repository root as the samples expect,
    with `env` added to this process's environment; `runner` starts it, as `subprocess.run` does
    (the tests' is tests/forkserver.py's)."""
    import torch

    env = {**os.environ, **(env or {}), "PYTHONPATH": str(HERE.parent)}
    if device:
        env["EXPLAINER_SAMPLE_DEVICE"] = device
    proc = runner([sys.executable, str(Path(__file__).resolve()), str(script), str(out)],
                  capture_output=True, text=True, cwd=HERE.parent, env=env, timeout=600)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the harness failed: {tail}", "tensors": []}
    return torch.load(out, weights_only=False)


def same_first_step(a: dict, b: dict) -> list[str]:
    """Why `a` and `b` did not take their first step with exactly the same gradients: those every
    gradient held when the first backward returned, and those each optimizer that both stepped
    applied in its first step (a step after several backward calls applies all of them)."""
    import torch

    if a.get("first_backward") is None or b.get("first_backward") is None:
        return ["one of them never finished a backward"]
    if len(a["first_backward"]) != len(b["first_backward"]):
        return ["their first backward calls reach different tensors"]
    steps_a, steps_b = a.get("first_step") or {}, b.get("first_step") or {}
    pairs = [(f"{label} after the first backward", x, y)
             for (label, x), (_, y) in zip(a["first_backward"], b["first_backward"])]
    pairs += [(f"{label} in its optimizer's first step", steps_a[label], steps_b[label])
              for label in steps_a if label in steps_b]
    return [f"{label}: the gradient differs" for label, x, y in pairs
            if (x is None) != (y is None) or (x is not None and not torch.equal(x, y))]


def changes_first_step(buggy: dict, fixed: dict) -> bool:
    """Whether `fixed` took its first step with other gradients than `buggy`, both having finished
    a backward (a script that fails in its first backward shows nothing to compare)."""
    return buggy.get("first_backward") is not None and fixed.get("first_backward") is not None \
        and bool(same_first_step(buggy, fixed))


def trains_like(candidate: Path, twins: Sequence[Path], workdir: Path, device: str | None = None) -> list[str]:
    """Empty when `candidate` trains what one of `twins` trains; otherwise why it does not, told
    against the first twin."""
    mine = trained_by(candidate, workdir / f"{candidate.stem}.{os.getpid()}.{id(candidate)}.candidate.pt", device)
    return like_a_twin(mine, twins, workdir, device)


def like_a_twin(result: dict, twins: Sequence[Path], workdir: Path, device: str | None = None) -> list[str]:
    """Empty when `result` (of `trained_by`) is what one of `twins` trains; otherwise why not,
    told against the first twin."""
    return like_one_of(result, ((twin.name, trained_by(twin, workdir / f"{twin.stem}.{os.getpid()}.{i}.twin.pt", device))
                                for i, twin in enumerate(twins)))


def like_one_of(result: dict, twins: Iterable[tuple[str, dict]]) -> list[str]:
    """Empty when `result` is what one of `twins` (name, `trained_by` result) trains, read only as
    far as the first that matches; otherwise why not, told against the first."""
    first: list[str] | None = None
    for name, twin in twins:
        found = differences(result, twin, ("the fixed script", name))
        if not found:
            return []
        first = found if first is None else first
    return first or ["no twin to compare with"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs=2, type=Path)
    parser.add_argument("--compare", action="store_true")
    options = parser.parse_args()
    import torch

    if options.compare:
        found = differences(*(torch.load(p, weights_only=False) for p in options.paths))
        for line in found:
            print(line)
        return 1 if found else 0
    script, out = options.paths
    result = run(script)
    torch.save(result, os.fspath(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
