"""The device of ../_device.py, for the scripts of this folder (`python samples/libraries/NAME.py`)."""
import runpy
from pathlib import Path

DEVICE = runpy.run_path(str(Path(__file__).resolve().parent.parent / "_device.py"))["DEVICE"]
