"""Patterns the samples don't show, through `python -m explainer run --json`: the kind, the
culprit's name and line (marked `# culprit`), and `fixes[0]` applied makes the script run clean."""
from __future__ import annotations

import textwrap

import pytest

from explainer import source as src
from explainer.fixes.edits import apply_edits
from explainer.fixes.out_of_place import out_of_place
from explainer.model import edits_from_json

# name: (kind, culprit, script)
PATTERNS = {
    "augmented assignment on a saved activation": ("inplace-modified", "h", """
        import torch
        w = torch.randn(4, requires_grad=True)
        h = torch.sigmoid(w * torch.randn(4))
        loss = (h * h).sum()
        h += 1  # culprit
        loss.backward()
    """),
    "in-place method on a saved output": ("inplace-modified", "out", """
        import torch
        net = torch.nn.Linear(4, 4)
        out = torch.sigmoid(net(torch.randn(8, 4)))
        loss = out.pow(2).mean()
        out.clamp_(0.1, 0.9)  # culprit
        loss.backward()
    """),
    "masked assignment into a saved output": ("inplace-modified", "scores", """
        import torch
        net = torch.nn.Linear(4, 4)
        scores = torch.exp(net(torch.randn(8, 4)))
        loss = scores.sum()
        scores[scores > 2] = 0  # culprit
        loss.backward()
    """),
    "a manual parameter update between two backward calls": ("inplace-modified", "w", """
        import torch
        w = torch.randn(3, requires_grad=True)
        x = torch.randn(5, 3)
        for step in range(2):
            pred = torch.sigmoid(x @ w)
            loss = pred.mean() + w.pow(2).sum()  # culprit
            loss.backward(retain_graph=True)
            with torch.no_grad():
                w -= 0.1 * w.grad
            penalty = pred.pow(2).mean()
            (loss + penalty).backward()
    """),
    "every loss so far back-propagated whole": ("second-backward", "losses", """
        import torch
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(4):
            loss = model(torch.randn(4, 3)).pow(2).mean()
            losses.append(loss)  # culprit
            opt.zero_grad()
            torch.stack(losses).mean().backward()
            opt.step()
    """),
    "two autograd.grad calls over one graph": ("second-backward", "y", """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        for _ in range(2):
            x = torch.randn(5, 3, requires_grad=True)
            y = model(x).sum()
            input_grad = torch.autograd.grad(y, x)[0]  # culprit
            parameter_grads = torch.autograd.grad(y, list(model.parameters()))
    """),
    "a forward helper decorated with no_grad": ("no-grad", "loss", """
        import torch
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        @torch.no_grad()
        def predict(x):
            return model(x)

        for _ in range(2):
            loss = predict(torch.randn(4, 3)).pow(2).mean()  # culprit
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    "state on a dataclass attribute": ("second-backward", "mem.summary", """
        import torch
        from dataclasses import dataclass

        @dataclass
        class Memory:
            summary: torch.Tensor

        w = torch.randn(3, requires_grad=True)
        mem = Memory(torch.zeros(3))
        for i in range(3):
            mem.summary = mem.summary * 0.9 + w * i  # culprit
            mem.summary.sum().backward()
    """),
    "an LSTM state inside a training function": ("second-backward", "state", """
        import torch

        class Tagger(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = torch.nn.LSTM(3, 6, batch_first=True)
                self.out = torch.nn.Linear(6, 2)

            def forward(self, x, state):
                h, state = self.lstm(x, state)
                return self.out(h), state

        def train(model, chunks):
            opt = torch.optim.Adam(model.parameters())
            state = None
            for x, y in chunks:
                logits, state = model(x, state)  # culprit
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), y.reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()

        train(Tagger(), [(torch.randn(2, 5, 3), torch.randint(0, 2, (2, 5))) for _ in range(3)])
    """),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_is_explained_and_fixes_0_runs_clean(name, explain_run, tmp_path):
    kind, culprit_name, code = PATTERNS[name]
    code = textwrap.dedent(code).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    culprit_row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))

    run = explain_run(script)
    assert run.returncode == 1 and len(run.findings) == 1, run.stderr
    finding = run.findings[0]
    assert finding["kind"] == kind
    culprit = finding["culprits"][0]
    assert (culprit["name"], culprit["location"]["row"]) == (culprit_name, culprit_row), finding["message"]

    patched = tmp_path / "patched.py"
    patched.write_text(apply_edits(code, edits_from_json(finding["fixes"][0])))
    after = explain_run(patched)
    assert (after.returncode, after.findings) == (0, []), after.stderr


@pytest.mark.parametrize("line, fixed", [
    ("h += 1", "h = h + 1"),
    ("h *= a + b", "h = h * (a + b)"),
    ("h.clamp_(0, 1)", "h = h.clamp(0, 1)"),
    ("h.masked_fill_(mask, 0.0)", "h = h.masked_fill(mask, 0.0)"),
    ("h.zero_()", "h = h.clone()\nh.zero_()"),
    ("h.copy_(other)", "h = h.clone()\nh.copy_(other)"),
    ("h[mask] = 0", "h = h.clone()\nh[mask] = 0"),
])
def test_an_inplace_change_is_made_out_of_place_or_on_a_copy(line, fixed):
    source = src.parse("train.py", line + "\n")
    fix = out_of_place(source, source.tree.body[0], "h")
    assert apply_edits(line + "\n", fix.edits) == fixed + "\n"
