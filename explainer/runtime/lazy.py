"""Install the hooks when torch is imported, not before: a script that never imports torch runs
exactly as under plain `python` (no torch start-up cost, no torch warnings on stderr)."""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class _InstallAfterTorch(importlib.abc.Loader):
    def __init__(self, loader, install: Callable[[], object]) -> None:
        self._loader = loader
        self._install = install

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._install()

    def __getattr__(self, name):  # get_resource_reader, get_filename, ... of the real loader
        return getattr(self._loader, name)


class _TorchWatcher(importlib.abc.MetaPathFinder):
    def __init__(self, install: Callable[[], object]) -> None:
        self._install = install

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.loader is not None:
            spec.loader = _InstallAfterTorch(spec.loader, self._install)
        return spec


def install_when_torch_is_imported(install: Callable[[], object]) -> None:
    """Call `install` (which imports torch) right after the user's code imports torch, or now
    if it already has."""
    if "torch" in sys.modules:
        install()
    elif not any(isinstance(finder, _TorchWatcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchWatcher(install))
