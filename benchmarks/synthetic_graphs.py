"""Training-style functions that fail with "backward through the graph a second time" on graphs of
a chosen size, for benchmarks/run.py.

They live in their own small file because the explainer reads the source of the failing code to
name the carrier, as it would read a user's script: keeping it separate keeps that cost the same
whatever run.py grows to, and editing run.py during a run cannot change what gets explained.
`links` counts `x = x * 1.0001 + 0.0` statements, two autograd nodes each; every tensor has one
element. `marks` gets the autograd sequence number around each long chain (their differences
count the nodes built); `timing` gets the seconds of each backward call.
"""
from time import perf_counter

import torch

_seq = torch._C._autograd._get_sequence_nr


def carried_state(current_links, stale_links, w, x, marks, timing):
    """A state carried across two iterations and never detached: the second backward goes
    through the first iteration's freed graph. The long chain is in the first iteration (stale)
    or in the second (current)."""
    state = torch.zeros(1)
    for iteration in range(2):
        state = torch.tanh(state * w + x)
        marks.append(_seq())
        for _ in range(stale_links if iteration == 0 else current_links):
            state = state * 1.0001 + 0.0
        marks.append(_seq())
        loss = (state - 1.0).pow(2).sum()
        started = perf_counter()
        try:
            loss.backward()
        finally:
            timing.append(perf_counter() - started)


def shared_trunk(links, w, x, marks, timing):
    """Two losses built on one long trunk; the first backward frees it, the second needs it."""
    trunk = torch.tanh(x * w)
    marks.append(_seq())
    for _ in range(links):
        trunk = trunk * 1.0001 + 0.0
    marks.append(_seq())
    loss1 = trunk.sum()
    loss2 = (trunk * 2.0).sum()
    started = perf_counter()
    try:
        loss1.backward()
    finally:
        timing.append(perf_counter() - started)
    started = perf_counter()
    try:
        loss2.backward()
    finally:
        timing.append(perf_counter() - started)


def unrolled_cell(steps, w, x, marks, timing):
    """A one-unit RNN cell unrolled over `steps` time steps per iteration (three nodes a step),
    every state kept in `states` for the loss, and the last state carried into the next
    iteration without a detach: the second backward walks the whole current unroll, through a
    `stack` node with `steps` inputs, before it meets the first iteration's freed graph."""
    hidden = torch.zeros(1)
    for _ in range(2):
        states = []
        marks.append(_seq())
        for _ in range(steps):
            hidden = torch.tanh(hidden * w + x)
            states.append(hidden)
        marks.append(_seq())
        loss = (torch.stack(states) - 1.0).pow(2).mean()
        started = perf_counter()
        try:
            loss.backward()
        finally:
            timing.append(perf_counter() - started)


TABLE: dict = {}  # run.py fills it: a big module-level dict (a vocabulary, a cache) the explainer meets while it names tensors


def carried_beside_big_table(entries, w, x, marks, timing):
    """The small carried-state case, run while this module's globals hold a dict of `entries`
    entries."""
    TABLE.update(dict.fromkeys(range(entries), 0.0))
    try:
        carried_state(10, 10, w, x, marks, timing)
    finally:
        TABLE.clear()
