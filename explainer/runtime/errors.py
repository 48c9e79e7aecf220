"""Recognise the autograd errors this project explains, from PyTorch's own messages."""
from __future__ import annotations

import re
from dataclasses import dataclass

_SECOND_BACKWARD = "Trying to backward through the graph a second time"
_INPLACE = "modified by an inplace operation"
_NO_GRAD = "does not require grad and does not have a grad_fn"

_INPLACE_DETAIL = re.compile(
    r"\[(?P<type>[\w.]+) \[(?P<shape>[\d, ]*)\]\](?:, which is (?P<origin>.*?),)? is at version "
    r"(?P<version>\d+); expected version (?P<expected>\d+)"
)


def kind_of(error: BaseException) -> str | None:
    """The Finding kind for an exception, or None for errors we do not explain."""
    if not isinstance(error, RuntimeError):
        return None
    text = str(error)
    if _SECOND_BACKWARD in text:
        return "second-backward"
    if _INPLACE in text:
        return "inplace-modified"
    if _NO_GRAD in text:
        return "no-grad"
    return None


@dataclass(frozen=True)
class InplaceDetail:
    tensor_type: str
    shape: tuple[int, ...]
    origin: str
    version: int
    expected_version: int


def version_facts(detail: InplaceDetail | None) -> tuple[tuple[str, int | str], ...]:
    """The version the graph saved and the one the tensor is at ('?' where the message had none)."""
    return (("expected_version", detail.expected_version if detail else "?"),
            ("version", detail.version if detail else "?"))


def inplace_detail(error: BaseException) -> InplaceDetail | None:
    match = _INPLACE_DETAIL.search(str(error))
    if not match:
        return None
    shape = tuple(int(d) for d in match["shape"].replace(" ", "").split(",") if d)
    return InplaceDetail(
        match["type"], shape, match["origin"] or "", int(match["version"]), int(match["expected"])
    )
