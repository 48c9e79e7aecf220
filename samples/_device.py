"""The device every sample runs on: CUDA when a GPU is there, the CPU otherwise.

`samples/validate.py --device cpu|cuda` pins it through EXPLAINER_SAMPLE_DEVICE.
"""
import os

import torch

DEVICE = torch.device(
    os.environ.get("EXPLAINER_SAMPLE_DEVICE")
    or ("cuda" if torch.cuda.is_available() else "cpu")
)
torch.manual_seed(0)
