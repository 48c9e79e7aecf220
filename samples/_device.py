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
if DEVICE.type == "cuda":
    # Some cuDNN and cuBLAS kernels add in an order that changes from run to run: on a lent H100,
    # microbial_hrnet's fixes[0] and its twin trained convolutions 1.7e-3 apart, where the CPU
    # agrees. A script and its twin are compared weight by weight, so the samples ask for the
    # deterministic kernels (a warning where an operation has none).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
