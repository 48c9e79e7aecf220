#!/usr/bin/env python
"""What any hook design must pay, beside what the shipped hooks pay, in one run.

    .venv/bin/python benchmarks/design_floor.py              # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/design_floor.py --rounds 20  # quicker, wider intervals

The hooks' target is <= 1.01x a training step. On the small-op loop (a 400 us step) that is 4 us
for everything the hooks do. This script times, in the same interleaved rounds as run.py's
overhead part, the shipped hooks and the pieces every design built on the issue's mechanism
pays at least:

* `step hook (does nothing)`: a global optimizer step post-hook that returns at once, i.e. what
  torch's own dispatch of one Python hook costs per step;
* `wrappers (pass through)`: `Tensor.backward`, `autograd.backward` and `autograd.grad` replaced
  by functions with the originals' signatures that only call them;
* `wrappers + peek()`, `+ root seq`, `+ frame`: the same, the `Tensor.backward` one first
  appending one thing to a deque: the autograd sequence number (`_get_sequence_nr()`, the
  watermark the hooks record), the root's own node number (`grad_fn._sequence_nr()`, an
  alternative watermark), or the caller's frame position (`sys._getframe(1).f_lasti`, what
  names the call site);
* `wrappers + nesting guard`: the wrappers with the hooks' guard that records only the
  outermost call (a per-thread flag, read in each of the two wrappers a `loss.backward()`
  passes, set and reset around the call). A plain `threading.local()` instead of the hooks'
  subclass measured the same (+1.37 us against +1.27 us, small-op loop, 100 rounds);
* `least recording`: the watermark, the frame and the guard at once, the least a design on
  the issue's mechanism records: per outermost backward call the watermark and the caller's
  code and position, per optimizer step (through a global post-hook) the watermark, a weak
  reference to the optimizer and the caller's code and position; with and without the step
  hook;
* `shipped, no step hook`: `explainer.install()` with its step hook removed again.

Ratios are medians of per-round ratios against the mean of two no-hook blocks of the same
round (as in run.py); `A/A` is the second no-hook block against the first.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import random
import sys
import threading
import weakref
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (its loops, statistics and table printer)
import torch  # noqa: E402

import explainer  # noqa: E402
from explainer.runtime import hooks  # noqa: E402

_marks: deque = deque(maxlen=16)
_peek = torch._C._autograd._get_sequence_nr
_TARGETS = ((torch.Tensor, "backward"), (torch.autograd, "backward"), (torch.autograd, "grad"))


class _PerThread(threading.local):  # as in hooks.py
    def __init__(self) -> None:
        self.state = [0]


_PASS = "    return original({forward})\n"
# The hooks' nesting guard: `loss.backward()` passes the Tensor.backward wrapper, then the
# autograd.backward one, which must see that it is nested.
_GUARDED = """    state = per_thread.state
    if state[0]:
        return original({forward})
    state[0] = 1
    try:
        return original({forward})
    finally:
        state[0] = 0
"""
# The least a hook can record for the analysis: the watermark and the call site, outermost calls
# only; per optimizer step, the watermark, the optimizer and the call site.
_LEAST = """    state = per_thread.state
    if state[0]:
        return original({forward})
    caller = getframe(1)
    marks.append((peek(), caller.f_code, caller.f_lasti))
    state[0] = 1
    try:
        return original({forward})
    finally:
        state[0] = 0
"""


def _least_step_record(optimizer, args, kwargs) -> None:
    caller = sys._getframe(2)  # this hook <- torch's step wrapper <- the user's `step()` call
    _marks.append((_peek(), weakref.ref(optimizer), caller.f_code, caller.f_lasti))


def _do_nothing(optimizer, args, kwargs) -> None:
    pass


def _wrapper(original, body: str, per_thread=None):
    namespace = {"original": original, "marks": _marks, "peek": _peek, "getframe": sys._getframe,
                 "per_thread": per_thread}
    parameters, forward = hooks._parameter_lists(inspect.signature(original), namespace)
    exec(f"def hooked({parameters}):\n" + body.format(forward=forward), namespace)  # noqa: S102
    return namespace["hooked"]


class Patched:
    """Wrappers on the three backward entry points (the Tensor.backward one runs `first`, then
    `body`; the others run `body`), and/or one global step post-hook."""

    def __init__(self, first: str = "", body: str = _PASS, per_thread=None, wrappers: bool = True,
                 step_hook=None) -> None:
        self.first, self.body, self.per_thread = first, body, per_thread
        self.wrappers, self.step_hook = wrappers, step_hook
        self.saved: list = []
        self.handle = None

    def __enter__(self):
        if self.wrappers:
            for owner, name in _TARGETS:
                original = getattr(owner, name)
                body = (self.first if owner is torch.Tensor else "") + self.body
                self.saved.append((owner, name, original))
                setattr(owner, name, _wrapper(original, body, self.per_thread))
        if self.step_hook is not None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self.handle = register_optimizer_step_post_hook(self.step_hook)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in self.saved:
            setattr(owner, name, original)
        self.saved.clear()
        if self.handle is not None:
            self.handle.remove()
        _marks.clear()


class Shipped:
    def __init__(self, step_hook: bool = True) -> None:
        self.step_hook = step_hook

    def __enter__(self):
        explainer.install()
        if not self.step_hook:
            hooks._step_hook_handle.remove()
            hooks._step_hook_handle = None
        return self

    def __exit__(self, *exc) -> None:
        explainer.uninstall()


VARIANTS = {
    "none": None,
    "none2": None,
    "step hook (does nothing)": lambda: Patched(wrappers=False, step_hook=_do_nothing),
    "wrappers (pass through)": lambda: Patched(),
    "wrappers + peek()": lambda: Patched(first="    marks.append(peek())\n"),
    "wrappers + root seq": lambda: Patched(first="    marks.append(self.grad_fn._sequence_nr())\n"),
    "wrappers + frame": lambda: Patched(first="    marks.append(getframe(1).f_lasti)\n"),
    "wrappers + nesting guard": lambda: Patched(body=_GUARDED, per_thread=_PerThread()),
    "least recording, no step hook": lambda: Patched(body=_LEAST, per_thread=_PerThread()),
    "least recording": lambda: Patched(body=_LEAST, per_thread=_PerThread(), step_hook=_least_step_record),
    "shipped, no step hook": lambda: Shipped(step_hook=False),
    "shipped": lambda: Shipped(),
}


def block(step, steps: int, variant: str) -> float:
    factory = VARIANTS[variant]
    return run.timed_block(step, steps, factory() if factory else contextlib.nullcontext())


def measure(factory, rounds: int, block_s: float, seed: int = 0) -> dict:
    step = factory()
    for variant in VARIANTS:  # warm every path
        block(step, 5, variant)
    steps = max(5, round(block_s / run.median(block(step, 10, "none") for _ in range(3))))
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(VARIANTS)
        rng.shuffle(order)
        for variant in order:
            samples[variant].append(block(step, steps, variant))
    base = [(a + b) / 2 for a, b in zip(samples["none"], samples["none2"])]
    results = {"none_us": run.median(base) * 1e6, "steps_per_block": steps, "variants": {}}
    for variant in VARIANTS:
        if variant == "none":
            continue
        reference = samples["none"] if variant == "none2" else base
        ratios = [v / b for v, b in zip(samples[variant], reference)]
        results["variants"][variant] = {
            "ratio": run.median(ratios), "ratio_ci95": run.bootstrap_ci(ratios),
            "delta_us": run.median([(v - b) * 1e6 for v, b in zip(samples[variant], reference)]),
        }
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--block-s", type=float, default=0.05)
    parser.add_argument("--loop", action="append", choices=["small-op", "mlp", "gru"],
                        help="loops to measure (repeatable; default small-op and mlp)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    loops = {"small-op": run.small_op_loop, "mlp": run.mlp_loop, "gru": run.gru_loop}
    gc.collect()
    gc.freeze()
    for name in args.loop or ["small-op", "mlp"]:
        run.log(f"[floor] {name}: {args.rounds} rounds")
        result = measure(loops[name], args.rounds, args.block_s)
        budget = (run.TARGET_HOOK_RATIO - 1) * result["none_us"]
        rows = [[variant, run.fmt(r["delta_us"], 2), run.fmt(r["ratio"], 4, "x"),
                 f"{r['ratio_ci95'][0]:.4f}-{r['ratio_ci95'][1]:.4f}"]
                for variant, r in result["variants"].items()]
        print(run.table(["variant", "+us/step", "ratio", "95% CI"], rows,
                        f"{name}: {result['none_us']:.1f} us a step without hooks; "
                        f"the 1.01x target leaves {budget:.1f} us"))
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
