"""Explain an error after the fact (`%explain` after the error, `explainer.explain(err)`): no
backward was recorded then, so read what the traceback's frames and the graph still show."""
from __future__ import annotations

import ast
from dataclasses import replace

import torch

from ..model import Finding
from ..reading import source as src
from . import analysis, journal, records
from .errors import kind_of
from .records import BackwardCall


def explain(error: BaseException) -> Finding | None:
    known = journal.finding_for(error)
    if known is not None or kind_of(error) is None:
        return known
    frames = records.frames_of_traceback(error.__traceback__)
    try:
        if not frames:
            return None
        innermost = frames[0]
        filename, row = innermost.f_code.co_filename, innermost.f_lineno
        roots = _roots_from_torch(error.__traceback__) or _roots_from_source(innermost, filename, row)
        call = BackwardCall(0, 0, (), filename, row, False, False, "backward")
        finding = analysis.explain(error, call, roots, frames, (), ())
        if finding is not None:
            if finding.confidence == "certain":  # nothing recorded the calls: read, not seen
                finding = replace(finding, confidence="likely")
            journal.record_error(error, finding)
        return finding
    finally:
        frames.clear()


def _roots_from_torch(tb) -> list:
    """The tensors the failing call back-propagated from, as torch's own `backward` or `grad`
    frame in the traceback holds them (`self`, `tensors`, `outputs`): exact, and there however
    the user's code reached it (`accelerator.backward(loss)`, Lightning's loops)."""
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.startswith(records.TORCH_DIR) and frame.f_code.co_name in ("backward", "grad"):
            for name in ("self", "tensors", "outputs"):
                value = frame.f_locals.get(name)
                values = [value] if isinstance(value, torch.Tensor) else \
                    list(value) if isinstance(value, (list, tuple)) else []
                if values and all(isinstance(v, torch.Tensor) for v in values):
                    return values
        tb = tb.tb_next
    return []


def _roots_from_source(frame, filename: str, row: int) -> list:
    """The tensor the failing statement called backward on, looked up (never evaluated)."""
    source = src.load(filename)
    if source is None:
        return []
    stmt = src.innermost_statement(source.tree, row)
    if stmt is None:
        return []
    for call in src.calls_named(stmt, "backward", "manual_backward"):
        # `loss.backward()`; or a library's wrapper, whose frames are not the user's:
        # `accelerator.backward(loss)`, Lightning's `self.manual_backward(loss)`.
        candidates = [call.func.value] if isinstance(call.func, ast.Attribute) else []
        candidates += call.args[:1]
        for candidate in candidates:
            value = _lookup(candidate, frame)
            if isinstance(value, torch.Tensor):
                return [value]
    return []


def _lookup(node: ast.expr, frame):
    if isinstance(node, ast.Name):
        if node.id in frame.f_locals:
            return frame.f_locals[node.id]
        return frame.f_globals.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _lookup(node.value, frame)
        return getattr(owner, "__dict__", {}).get(node.attr) if owner is not None else None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        owner = _lookup(node.value, frame)
        try:
            return owner[node.slice.value] if isinstance(owner, (list, tuple, dict)) else None
        except (KeyError, IndexError, TypeError):
            return None
    return None
