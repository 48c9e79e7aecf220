"""A real ipykernel driven through jupyter_client, for tests."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from jupyter_client.manager import KernelManager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class CellResult:
    reply: dict
    outputs: list = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    def of_type(self, msg_type: str) -> list[dict]:
        return [o["content"] for o in self.outputs if o["msg_type"] == msg_type]

    def html(self) -> str:
        return "".join(d["data"].get("text/html", "") for d in self.of_type("display_data"))

    def text(self) -> str:
        streams = "".join(s["text"] for s in self.of_type("stream"))
        plain = "".join(d["data"].get("text/plain", "") for d in self.of_type("display_data"))
        errors = "".join("\n".join(e["traceback"]) for e in self.of_type("error"))
        return strip_ansi(streams + plain + errors)


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


class Kernel:
    def __init__(self, cwd: str = ROOT, env: dict | None = None) -> None:
        self.manager = KernelManager(kernel_name="python3")
        env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
        self.manager.start_kernel(env=env, extra_arguments=[], cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 120) -> CellResult:
        msg_id = self.client.execute(code)
        outputs = []
        while True:
            message = self.client.get_iopub_msg(timeout=timeout)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                break
            if message["msg_type"] in ("stream", "display_data", "execute_result", "error"):
                outputs.append(message)
        reply = self.client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.client.get_shell_msg(timeout=timeout)
        return CellResult(reply, outputs)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)



# A truncated-BPTT notebook as a user writes it: the extension, the set-up, the training loop
# (whose `hidden` carries the previous step's graph).
NOTEBOOK_CELLS = (
    "%load_ext explainer",
    "import torch\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.GRU(3, 5, batch_first=True)\n"
    "head = torch.nn.Linear(5, 1)\n"
    "opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)\n"
    "hidden = torch.zeros(1, 2, 5)",
    "for step in range(3):\n"
    "    out, hidden = model(torch.randn(2, 4, 3), hidden)\n"
    "    loss = head(out).pow(2).mean()\n"
    "    opt.zero_grad()\n"
    "    loss.backward()\n"
    "    opt.step()",
)
# The alt text of the explanation's boundary picture in that notebook.
NOTEBOOK_PICTURE_ALT = "`hidden` carries history from before the earlier backward into this one"


def explained_notebook(path):
    """NOTEBOOK_CELLS run in a real kernel (nbclient, this checkout's explainer) and saved at
    `path` as Jupyter saves it; returns the notebook."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [nbformat.v4.new_markdown_cell("# Truncated BPTT"),
                      *(nbformat.v4.new_code_cell(source) for source in NOTEBOOK_CELLS)]
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env={**os.environ, "PYTHONPATH": ROOT})
    nbformat.write(notebook, str(path))
    return notebook
