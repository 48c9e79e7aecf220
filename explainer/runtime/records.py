"""What the hooks record, and whose code a frame runs.

The hooks, the analysis and the front-ends all ask "is this frame the user's?": the answer is
written here once. Importing this module does not import torch (`explainer run` asks before the
script has imported it).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import weakref
from typing import NamedTuple


def _torch_dir() -> str:
    spec = importlib.util.find_spec("torch") if "torch" not in sys.modules else sys.modules["torch"].__spec__
    origin = spec.origin if spec is not None and spec.origin else ""
    return os.path.dirname(origin) + os.sep if origin else os.sep + "<no torch>" + os.sep


PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
TORCH_DIR = _torch_dir()


def _library_dirs() -> tuple[str, ...]:
    """The standard library's folders and every installed packages' folder (site-packages,
    Debian's dist-packages, the user's site)."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    dirs = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    dirs.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else "")
    return tuple(sorted(os.path.join(d, "") for d in dirs if d))


# Frames of these files are library code, never the user's: torch's, ours, the standard
# library's and every installed package's (accelerate's `backward`, Lightning's loops). The
# hooks record the user's frame nearest the call instead, and the analysis searches and cites
# only the user's frames.
LIBRARY = (TORCH_DIR, PACKAGE_DIR, *_library_dirs())
# An installed package wherever its environment lies (one put on sys.path by PYTHONPATH).
_INSTALLED = f"{os.sep}site-packages{os.sep}"
_DEBIAN_INSTALLED = f"{os.sep}dist-packages{os.sep}"
_FRONT_END_MODULES = ("IPython.", "ipykernel.", "runpy", "explainer.")


class BackwardCall(NamedTuple):
    """One recorded backward / autograd.grad call. `mark` is the next autograd sequence number
    at the call: every node created before the call has a smaller one."""

    tick: int
    mark: int
    root_ids: tuple[int, ...]
    filename: str
    row: int
    retain_graph: bool
    create_graph: bool
    api: str
    # Where on the row the call is (0-based, UTF-8 bytes, as the AST counts): tells
    # `opt.zero_grad(); loss.backward(); opt.step()` apart. None when not known.
    column: int | None = None


class StepCall(NamedTuple):
    """One recorded optimizer step (or a hand-written update read from the source as one)."""

    tick: int
    mark: int
    optimizer: weakref.ref
    filename: str
    row: int
    column: int | None = None  # as BackwardCall's


class LoadCall(NamedTuple):
    """One recorded `Module.load_state_dict` call: it copies the loaded values into the module's
    own parameters and buffers in place, bumping their versions like an optimizer step."""

    tick: int
    mark: int
    module: weakref.ref
    filename: str
    row: int
    column: int | None = None  # as BackwardCall's


class ZeroingCall(NamedTuple):
    """One recorded `zero_grad()` call, of an optimizer or a module: it clears the gradients of
    `owner`'s parameters that the next step would have applied."""

    tick: int
    owner: weakref.ref


def is_library_file(filename: str) -> bool:
    """Library code (LIBRARY), a frozen module's, or an installed package's wherever it lies."""
    return filename.startswith(LIBRARY) or filename.startswith("<frozen") or _INSTALLED in filename \
        or _DEBIAN_INSTALLED in filename


def outside_libraries(frame):
    """The first frame of the user's code, going outwards (the hooks' caller): the user's
    `accelerator.backward(loss)`, not accelerate's `loss.backward()` inside it."""
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def is_user_frame(frame) -> bool:
    """Code the user wrote: not a library's (torch's, ours, the standard library's, an
    installed package's) or a front-end's (IPython, runpy)."""
    if is_library_file(frame.f_code.co_filename):
        return False
    return not frame.f_globals.get("__name__", "").startswith(_FRONT_END_MODULES)


MAX_FRAMES = 24


def user_frames(frame) -> list:
    """The user's frames from `frame` outwards (innermost first), at most MAX_FRAMES."""
    frames = []
    while frame is not None and len(frames) < MAX_FRAMES:
        if is_user_frame(frame):
            frames.append(frame)
        frame = frame.f_back
    return frames


def frames_of_traceback(tb) -> list:
    """The user's frames of a traceback, innermost first (for post-mortem explanations)."""
    frames = []
    while tb is not None:
        if is_user_frame(tb.tb_frame):
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    frames.reverse()
    return frames
