"""What has been explained in this process: plain Findings, never tensors or frames.

Front-ends read it: `explainer run --json` writes the warnings and the finding of the error that
ended the script; `%explain` shows the last one again.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from ..model import Finding

_MAX = 32
_lock = threading.Lock()
_by_error: OrderedDict[int, Finding] = OrderedDict()
_warnings: list[Finding] = []
_last: list[Finding] = []


def record_error(error: BaseException, finding: Finding) -> None:
    with _lock:
        _by_error[id(error)] = finding
        while len(_by_error) > _MAX:
            _by_error.popitem(last=False)
        _last[:] = [finding]


def record_warning(finding: Finding) -> None:
    with _lock:
        if len(_warnings) < _MAX:
            _warnings.append(finding)
        _last[:] = [finding]


def finding_for(error: BaseException | None) -> Finding | None:
    """The finding explained for this exception (or one it was chained from)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        with _lock:
            finding = _by_error.get(id(error))
        if finding is not None:
            return finding
        error = error.__cause__ or error.__context__
    return None


def warnings() -> list[Finding]:
    with _lock:
        return list(_warnings)


def last() -> Finding | None:
    with _lock:
        return _last[0] if _last else None


def clear() -> None:
    with _lock:
        _by_error.clear()
        _warnings.clear()
        _last.clear()
