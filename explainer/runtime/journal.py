"""What has been explained in this process: plain Findings, never tensors or frames (and, to
see a kept graph grow, how many iterations each kept tensor's graph spanned, by its name).

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
_warned_at: dict[int, Finding] = {}  # backward call tick -> the warning given before it ran
_last: list[Finding] = []
# (file, function, expression) of a tensor the user keeps -> (the sequence number of its graph's
# top, how many earlier iterations the graph spanned) when last looked at: growth is seen by
# looking twice.
_spans: dict[tuple[str, str, str], tuple[int, int]] = {}


_last_error: list[Finding] = []


def record_error(error: BaseException, finding: Finding) -> None:
    with _lock:
        _by_error[id(error)] = finding
        while len(_by_error) > _MAX:
            _by_error.popitem(last=False)
        _last[:] = [finding]
        _last_error[:] = [finding]


def record_warning(finding: Finding, tick: int | None = None) -> bool:
    """Keep `finding`, a growth warning, unless one of the same cause at the same place is kept
    already (VocGAN's list of adversarial losses, seen growing from the generator's backward and
    then from the discriminator's: one leak, one warning); whether it was new."""
    with _lock:
        if any((w.code, w.filename, w.location) == (finding.code, finding.filename, finding.location)
               for w in _warnings):
            return False
        if len(_warnings) < _MAX:
            _warnings.append(finding)
            if tick is not None:
                _warned_at[tick] = finding
        _last[:] = [finding]
        return True


def warned_at(tick: int) -> Finding | None:
    """The warning given for the backward call `tick` before it ran, if any."""
    with _lock:
        return _warned_at.get(tick)


def retract_warning(finding: Finding) -> None:
    """Drop a warning that an error's finding now says in full: one bug, one finding."""
    with _lock:
        _warnings[:] = [w for w in _warnings if w is not finding]
        for tick in [t for t, w in _warned_at.items() if w is finding]:
            del _warned_at[tick]


def finding_for(error: BaseException | None) -> Finding | None:
    """The finding explained for this exception, one it was chained from, or one inside it
    (an ExceptionGroup's, depth first)."""
    seen = set()
    pending = [error]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        with _lock:
            finding = _by_error.get(id(error))
        if finding is not None:
            return finding
        pending.append(error.__cause__ or error.__context__)
        pending.extend(reversed(getattr(error, "exceptions", ())))
    return None


def last_error() -> Finding | None:
    """The finding of the error explained last (a script may catch it and exit another way)."""
    with _lock:
        return _last_error[0] if _last_error else None


def warnings() -> list[Finding]:
    with _lock:
        return list(_warnings)


def last() -> Finding | None:
    with _lock:
        return _last[0] if _last else None


def spans_before(key: tuple[str, str, str], spans: tuple[int, ...]) -> tuple[int, ...] | None:
    """What was remembered of the tensor `key` names when last looked at (None the first time):
    its top and the iterations it spans, and what else the look keeps; `spans` is remembered for
    the next look."""
    with _lock:
        before = _spans.get(key)
        _remember(key, spans)
        return before


def spans_seen(key: tuple[str, str, str]) -> tuple | None:
    """What `remember_spans` kept of the tensor `key` names when last looked at (None the first time)."""
    with _lock:
        return _spans.get(key)


def remember_spans(key: tuple[str, str, str], spans: tuple) -> None:
    with _lock:
        _remember(key, spans)


def _remember(key: tuple[str, str, str], spans: tuple) -> None:
    """Keep `spans` for `key`; a new key only while fewer than 4 * _MAX are kept. Under `_lock`."""
    if key in _spans or len(_spans) < 4 * _MAX:
        _spans[key] = spans


def clear() -> None:
    with _lock:
        _spans.clear()
        _by_error.clear()
        _warnings.clear()
        _warned_at.clear()
        _last.clear()
        _last_error.clear()
