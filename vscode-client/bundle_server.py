"""Bundle the language server into the extension (`bundled/libs`), for
`backwardExplainer.importStrategy: useBundled`: any Python 3.10+ then runs it with nothing
installed. Everything the server imports is pure Python (it never imports torch), so one set of
wheels serves every interpreter and platform.

Run by `npm run package` with the project's interpreter (`../.venv/bin/python`, else `python3`):
the server's dependencies are pinned to the versions that interpreter has, which are the ones
the project's tests ran against.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent
TARGET = HERE / "bundled" / "libs"
WHEELS = HERE / "bundled" / "wheels"
# The server's imports: pygls (with lsprotocol, cattrs, attrs), and jedi (with parso).
REQUIREMENTS = ["pygls", "jedi"]
OLDEST_PYTHON = "3.10"  # the project's requires-python: wheels chosen (and markers read) for it


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args], check=True)


def main() -> None:
    shutil.rmtree(TARGET, ignore_errors=True)
    TARGET.mkdir(parents=True)
    # pip reads environment markers for the running Python, not --python-version: cattrs's
    # `exceptiongroup; python_version < "3.11"` is named here for 3.10.
    pinned = [f"{name}=={metadata.version(name)}" for name in REQUIREMENTS] + ["exceptiongroup>=1.1.1"]
    pip("install", "--target", str(TARGET), "--only-binary=:all:", "--python-version", OLDEST_PYTHON,
        "--implementation", "py", "--no-compile", *pinned)
    with tempfile.TemporaryDirectory() as scratch:
        # Our own package as a wheel (it needs no torch to install), built from a copy of the
        # sources: setuptools would leave a build/ folder in the project, and reuse it next time.
        source, wheels = Path(scratch) / "source", Path(scratch) / "wheels"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(PROJECT / name, source / name)
        for package in ("explainer", "lsp_server"):
            shutil.copytree(PROJECT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
        pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(source))
        (wheel,) = wheels.glob("*.whl")
        pip("install", "--target", str(TARGET), "--no-deps", "--no-compile", str(wheel))
        # The wheel itself, for the extension's "Install into this environment" (no index has it).
        shutil.rmtree(WHEELS, ignore_errors=True)
        WHEELS.mkdir(parents=True)
        shutil.copy(wheel, WHEELS / wheel.name)
    for leftover in [*TARGET.glob("bin"), *TARGET.rglob("__pycache__")]:
        shutil.rmtree(leftover, ignore_errors=True)
    names = sorted(p.name for p in TARGET.iterdir() if not p.name.endswith(".dist-info"))
    print(f"bundled into {TARGET.relative_to(HERE)}: {', '.join(names)}")


if __name__ == "__main__":
    main()
