"""`python -m explainer check`: the rules on the samples (flagged at the culprit line, twins and
clean scripts silent), a false-positive corpus, suppressions and the CLI contract."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import manifest
from conftest import ROOT
from explainer.fixes.edits import apply_edits
from explainer.model import Edit, Location, edits_from_json
from explainer.static.check import check_text
from explainer.static.module import DOCS
from explainer.static.rules import RULES, doc_page

# The code expected at each buggy sample's culprit line.
EXPECTED = {
    "rnn_hidden_chunks": "BX001", "lstm_tuple_state": "BX001", "discarded_detach": "BX001",
    "module_rnn_state": "BX001", "ema_attribute": "BX001", "seed003_stored_states": "BX001",
    "seed003_yest_carried": "BX001", "seed003_yest_retain_graph": "BX001", "running_loss_total": "BX002",
    "helper_returns_state": "BX001", "state_kept_after_backward": "BX001",
    "weight_outside_loop": "BX004", "lbfgs_closure": "BX004", "init_derived_tensor": "BX004",
    "past_states_list": "BX005", "dict_cache": "BX005", "reinforce_log_probs": "BX005",
    "gan_fake_reuse": "BX006", "multitask_two_losses": "BX006", "seed000_ex1_two_losses": "BX006",
    "actor_critic_step": "BX007", "gan_step_before_g": "BX007", "seed000_ex2_retain_graph": "BX007",
    "seed002_ex1_hidden_layer": "BX007",
    "no_grad_forward": "BX009", "seed000_ex3_detach": "BX009",
    "grad_then_backward": "BX010",
}
SAMPLES = {s.name: s for s in manifest.samples()}
# Runs clean, but steps and then back-propagates through the pre-step graph again: the second
# gradient is stale (samples/README.md). The checker is right to flag it.
SILENTLY_WRONG = {"seed002_ex1_retain_then_step": ("BX007", "output = model(x)")}


def test_every_buggy_sample_has_an_expected_code():
    assert set(EXPECTED) == {s.name for s in SAMPLES.values() if s.kind != "none"}


def check_file(path):
    return check_text(path.read_text(), str(path))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_buggy_sample_is_flagged_at_its_culprit_line_and_its_fix_silences_it(name):
    sample = SAMPLES[name]
    found = [d for d in check_file(sample.path) if d.location.row == sample.culprit_row]
    assert [d.code for d in found] == [EXPECTED[name]]
    fix = found[0].fix
    assert fix is not None
    patched = apply_edits(sample.path.read_text(), fix.edits)
    compile(patched, name, "exec")
    assert not [d for d in check_text(patched, str(sample.path)) if d.code == EXPECTED[name]]


@pytest.mark.parametrize("sample", [s for s in SAMPLES.values() if s.fixed], ids=lambda s: s.name)
def test_fixed_twins_are_silent(sample):
    assert check_file(sample.fixed) == []


@pytest.mark.parametrize("sample", [s for s in SAMPLES.values() if s.kind == "none" and s.name not in SILENTLY_WRONG],
                         ids=lambda s: s.name)
def test_clean_scenarios_are_silent(sample):
    assert check_file(sample.path) == []


@pytest.mark.parametrize("name", sorted(SILENTLY_WRONG))
def test_silently_wrong_scenarios_are_flagged(name):
    code, line = SILENTLY_WRONG[name]
    path = SAMPLES[name].path
    row = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip() == line)
    assert [(d.code, d.location.row) for d in check_file(path)] == [(code, row)]


# Deep mutual learning: each model's loss also reads the others' outputs, `{peer}`.
MUTUAL_LEARNING = """
        class Trainer:
            def __init__(self):
                self.models = [nn.Linear(8, 4) for _ in range(2)]
                self.optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in self.models]

            def train(self):
                for images, labels in self.loader:
                    outputs = []
                    for model in self.models:
                        outputs.append(model(images))
                    for i in range(2):
                        kl_loss = 0
                        for j in range(2):
                            if i != j:
                                kl_loss += kl(F.log_softmax(outputs[i], dim=1), F.softmax({peer}, dim=1))
                        loss = F.cross_entropy(outputs[i], labels) + kl_loss
                        self.optimizers[i].zero_grad()
                        loss.backward()
                        self.optimizers[i].step()
"""

CORRECT_CODE = {
    "PPO: old log-probabilities kept detached, actions sampled once": """
        policy = nn.Linear(4, 3)
        dist = torch.distributions.Categorical(logits=policy(states))
        actions = dist.sample()
        old_log_probs = dist.log_prob(actions).detach()
        for epoch in range(4):
            new_log_probs = torch.distributions.Categorical(logits=policy(states)).log_prob(actions)
            ratio = torch.exp(new_log_probs - old_log_probs)
            (-(ratio * advantages).mean()).backward()
            optimizer.step()
    """,
    "per-layer states detached at the start of each step": """
        cells = nn.ModuleList([nn.GRUCell(4, 4) for _ in range(2)])
        states = [torch.zeros(3, 4) for _ in cells]
        for x in batches:
            states = [h.detach() for h in states]
            for i, cell in enumerate(cells):
                states[i] = cell(x, states[i])
                x = states[i]
            x.pow(2).mean().backward()
    """,
    "previous loss kept as a number": """
        model = nn.Linear(4, 1)
        prev_loss = None
        for x in batches:
            loss = model(x).pow(2).mean()
            if prev_loss is not None and loss.item() > prev_loss:
                print("worse")
            loss.backward()
            prev_loss = loss.item()
    """,
    "previous output kept detached for a consistency loss": """
        model = nn.Linear(4, 4)
        prev_out = None
        for x in batches:
            out = model(x)
            loss = out.pow(2).mean()
            if prev_out is not None:
                loss = loss + (out - prev_out).pow(2).mean()
            loss.backward()
            prev_out = out.detach()
    """,
    "previous output kept for logging only": """
        model = nn.Linear(4, 4)
        last_out = None
        for x in batches:
            out = model(x)
            if last_out is not None:
                print((out - last_out).abs().mean().item())
            out.pow(2).mean().backward()
            last_out = out
    """,
    "truncated BPTT with repackage_hidden": """
        def repackage_hidden(h):
            return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)
        hidden = model.init_hidden(4)
        for x, y in batches:
            hidden = repackage_hidden(hidden)
            out, hidden = model(x, hidden)
            loss_fn(out, y).backward()
    """,
    "fresh hidden state every batch": """
        for x, y in batches:
            hidden = model.init_hidden(4)
            out, hidden = model(x, hidden)
            loss_fn(out, y).backward()
    """,
    "tuple state detached": """
        for x, y in batches:
            hidden = tuple(h.detach() for h in hidden)
            out, hidden = lstm(x, hidden)
            loss_fn(out, y).backward()
    """,
    "running loss with item": """
        running_loss = 0.0
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            running_loss += loss.item()
            running_loss = running_loss + loss.item()
    """,
    "summed losses": """
        for x, y in batches:
            features = trunk(x)
            (head1(features).mean() + head2(features).mean()).backward()
    """,
    "EMA under no_grad": """
        class Model(nn.Module):
            def forward(self, x):
                h = self.proj(x)
                with torch.no_grad():
                    self.ema = 0.9 * self.ema + 0.1 * h.mean(0)
                return h
    """,
    "state detached in place, element by element (pytorch/examples rpc rnn)": """
        for data, target in batches:
            hidden[0].detach_()
            hidden[1].detach_()
            output, hidden = model(data, hidden)
            criterion(output, target).backward()
    """,
    "loss summed within one iteration of nested training loops (fast_neural_style)": """
        for epoch in range(epochs):
            for x in loader:
                style_loss = 0.
                for ft_y, gm_s in zip(features, grams):
                    style_loss += mse_loss(gram(ft_y), gm_s)
                style_loss.backward()
    """,
    "leaf parameter made before the loop": """
        w = torch.randn(5, requires_grad=True)
        scale = nn.Parameter(torch.ones(1))
        for x, y in batches:
            loss = ((x @ w * scale - y) ** 2).mean()
            loss.backward()
    """,
    "data prepared before the loop by an unknown function": """
        inputs = preprocess(raw)
        train_data = batchify(corpus.train, 20)
        for step in range(10):
            loss = loss_fn(model(inputs), targets)
            loss.backward()
    """,
    "module-level train() reading global data (word_language_model)": """
        train_data = batchify(corpus.train, 20)
        model = nn.LSTM(4, 4)
        def train():
            output = model(train_data)
            criterion(output, targets).backward()
        for epoch in range(3):
            train()
    """,
    "LBFGS with the forward inside the closure": """
        model = nn.Linear(3, 1)
        for epoch in range(3):
            def closure():
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
    """,
    "parameters created in __init__": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(3, 3))
                self.proj = nn.Linear(3, 3)
            def forward(self, x):
                return self.proj(x) @ self.weight
    """,
    "losses kept in a list for logging": """
        encoder = nn.Linear(4, 4)
        losses = []
        for x, y in batches:
            loss = loss_fn(encoder(x), y)
            loss.backward()
            losses.append(loss)
        print(sum(losses))
    """,
    "states stored detached": """
        encoder = nn.Linear(4, 4)
        memory, cache = [], {}
        for x, y in batches:
            h = encoder(x)
            if memory:
                h = h + torch.stack(memory).mean(0) + cache.get("prev", 0)
            memory.append(h.detach())
            cache["prev"] = h.detach()
            loss_fn(h, y).backward()
    """,
    "buffer emptied every iteration": """
        encoder = nn.Linear(4, 4)
        steps = []
        for x, y in batches:
            steps.clear()
            for t in range(3):
                steps.append(encoder(x[t]))
            loss_fn(torch.stack(steps), y).backward()
    """,
    "GAN: the discriminator sees fake.detach() (dcgan)": """
        generator, discriminator = Generator(), Discriminator()
        for real in loader:
            fake = generator(torch.randn(8, 4))
            d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = bce(discriminator(fake), ones)
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    """,
    "DDPG: critic on stored actions, actor loss from a fresh forward after the critic step": """
        actor, critic = Actor(), Critic()
        for state, action, target_q in replay:
            critic_loss = mse_loss(critic(state, action), target_q)
            critic_opt.zero_grad()
            critic_loss.backward()
            critic_opt.step()
            actor_loss = -critic(state, actor(state)).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
    """,
    "DDPG: the critic sees action.detach()": """
        actor, critic = Actor(), Critic()
        for state, target_q in replay:
            action = actor(state)
            critic_loss = mse_loss(critic(state, action.detach()), target_q)
            critic_loss.backward()
            critic_opt.step()
    """,
    "WGAN-GP: gradient penalty with create_graph=True": """
        critic = Critic()
        for real, fake in loader:
            mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            score = critic(mixed)
            grads = torch.autograd.grad(score.sum(), mixed, create_graph=True)[0]
            penalty = ((grads.norm(2, dim=1) - 1) ** 2).mean()
            loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
            loss.backward()
            opt.step()
    """,
    "two losses on one trunk, retain_graph=True and no step in between": """
        trunk, head1, head2 = nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1)
        for x in loader:
            features = trunk(x)
            loss1, loss2 = head1(features).mean(), head2(features).mean()
            optimizer.zero_grad()
            loss1.backward(retain_graph=True)
            loss2.backward()
            optimizer.step()
    """,
    "DQN: the target computed under no_grad": """
        policy, target_net = DQN(), DQN()
        for state, action, reward, next_state in replay:
            q = policy(state).gather(1, action)
            with torch.no_grad():
                target = reward + 0.99 * target_net(next_state).max(1)[0]
            loss = F.smooth_l1_loss(q, target.unsqueeze(1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """,
    "a loss from a helper function whose inside the file can't show": """
        for batch in loader:
            with torch.no_grad():
                teacher_out = teacher(batch)
            loss = distillation_loss(student, batch, teacher_out)
            loss.backward()
    """,
    "gradient accumulation with a conditional step": """
        model = nn.Linear(4, 1)
        for i, (x, y) in enumerate(loader):
            loss = mse_loss(model(x), y) / 4
            loss.backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
    """,
    "MAML: inner gradients with create_graph, then the outer backward": """
        model = nn.Linear(4, 1)
        for task in tasks:
            inner_loss = mse_loss(model(task.x), task.y)
            grads = torch.autograd.grad(inner_loss, model.parameters(), create_graph=True)
            adapted = [p - 0.1 * g for p, g in zip(model.parameters(), grads)]
            outer_loss = mse_loss(functional_forward(task.x2, adapted), task.y2)
            outer_loss.backward()
            meta_opt.step()
    """,
    "validation under no_grad, no backward": """
        model = nn.Linear(4, 1)
        with torch.no_grad():
            for x, y in val_loader:
                val_loss = mse_loss(model(x), y)
                total += val_loss.item()
    """,
    "two losses over the same leaf tensors, one backward each": """
        w = torch.randn(3, requires_grad=True)
        x = torch.rand(3, requires_grad=True).cuda()
        for batch in loader:
            loss1 = (batch @ w).sum() + x.sum()
            loss1.backward()
            loss2 = (batch @ w).pow(2).sum() + x.sum()
            loss2.backward()
    """,
    "helpers that return a detached state, a number and a no_grad prediction": """
        rnn = nn.RNNCell(3, 4)
        def train_step(model, x, hidden):
            hidden = model(x, hidden)
            hidden.pow(2).sum().backward()
            return hidden.detach()
        def count(step):
            return step + 1
        def predict(model, x):
            with torch.no_grad():
                return model(x)
        for x in batches:
            hidden = train_step(rnn, x, hidden)
            global_step = count(global_step)
            smoothed = 0.9 * smoothed + 0.1 * predict(rnn, x)
    """,
    "a state stepped through time and reset for every batch": """
        cell = nn.RNNCell(3, 4)
        for batch in loader:
            h = torch.zeros(1, 4)
            for t in range(5):
                new_h = cell(batch[t], h)
                h = new_h
            h.sum().backward()
    """,
    "the new state kept detached after the backward": """
        cell = nn.RNNCell(3, 4)
        for batch in loader:
            new_h = cell(batch, h)
            new_h.sum().backward()
            h = new_h.detach()
            last_output = new_h
    """,
    "counter and step": """
        step = 0
        for x, y in batches:
            step = step + 1
            loss = loss_fn(model(x), y)
            loss.backward()
    """,
    # The cases below are from tutorials the checker once flagged wrongly.
    "hidden state detached through .data": """
        rnn = nn.RNN(1, 32, batch_first=True)
        h_state = None
        for x, y in batches:
            prediction, h_state = rnn(x, h_state)
            h_state = h_state.data
            loss = loss_fn(prediction, y)
            loss.backward()
    """,
    "validation forward after the training loop": """
        model = nn.Linear(4, 2)
        for epoch in range(3):
            for data, target in train_loader:
                optimizer.zero_grad()
                output = model(data)
                loss = criterion(output, target)
                loss.backward()
                optimizer.step()
            for data, target in valid_loader:
                output = model(data)
                valid_loss = criterion(output, target).item()
    """,
    "last batch's samples reshaped for saving": """
        G = nn.Linear(8, 784)
        for epoch in range(3):
            for z in loader:
                fake_images = G(z)
                g_loss = criterion(D(fake_images), real_labels)
                g_loss.backward()
                g_optimizer.step()
            fake_images = fake_images.reshape(fake_images.size(0), 1, 28, 28)
            save_image(fake_images, "fake.png")
    """,
    "a copy for display, re-assigned from itself": """
        target = content.clone().requires_grad_(True)
        optimizer = torch.optim.Adam([target], lr=0.003)
        for step in range(100):
            loss = content_loss(vgg(target), content_features)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                img = target.clone().squeeze()
                img = denorm(img).clamp_(0, 1)
                save_image(img, "out.png")
    """,
    "evaluation outputs re-assigned from themselves": """
        model = SkipGram(100, 30)
        for inputs, targets in batches:
            loss = criterion(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if steps % 500 == 0:
                valid_examples, valid_similarities = cosine_similarity(model.embed)
                _, closest_idxs = valid_similarities.topk(6)
                valid_examples, closest_idxs = valid_examples.to("cpu"), closest_idxs.to("cpu")
    """,
    "a helper's loss returned as a number, summed for printing": """
        rnn = RNN(57, 128, 18)

        def train(category_tensor, line_tensor):
            output = rnn(line_tensor)
            loss = criterion(output, category_tensor)
            loss.backward()
            optimizer.step()
            return output, loss.item()

        current_loss = 0
        for epoch in range(1, 1000):
            output, loss = train(*random_training_pair())
            current_loss += loss
    """,
    "rewards summed from an environment fed a detached action": """
        class Policy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(3, 1)

            def forward(self, x):
                return torch.tanh(self.fc(x))

            def get_action(self, state):
                return self.forward(torch.FloatTensor(state)).detach().numpy()

        class Noise:
            def __call__(self):
                return np.random.normal(size=1)

        policy, noise = Policy(), Noise()
        for episode in range(100):
            state, score = env.reset(), 0.0
            for t in range(200):
                action = policy.get_action(state) + noise()
                state, reward, done, _ = env.step(action)
                score += reward
            loss = -policy(torch.FloatTensor(state)).mean()
            loss.backward()
    """,
    "an actor's method output weighted by Q-values under no_grad": """
        class Actor(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                return self.fc(x)

            def get_action(self, x):
                probs = torch.softmax(self(x), -1)
                return probs.argmax(-1), torch.log(probs), probs

        actor = Actor().to(device)
        for obs in batches:
            _, log_pi, action_probs = actor.get_action(obs)
            with torch.no_grad():
                q_values = qf(obs)
            actor_loss = (action_probs * (alpha * log_pi - q_values)).mean()
            actor_loss.backward()
            actor_optimizer.step()
    """,
    "input buffers made in __init__ from a tensor type kept on the model": """
        class ConditionalGAN(BaseModel):
            def __init__(self, opt):
                self.Tensor = torch.cuda.FloatTensor if opt.gpu_ids else torch.Tensor
                self.input_A = self.Tensor(opt.batchSize, 3, 256, 256)
                self.netG = define_G(opt)

            def forward(self):
                self.fake_B = self.netG(self.input_A)
    """,
    "TD3: a detached target against a network the agent made elsewhere": """
        class TD3Agent:
            def __init__(self, config):
                self.network = config.network_fn()
                self.target_network = config.network_fn()

            def step(self):
                transitions = self.replay.sample()
                states, actions = tensor(transitions.state), tensor(transitions.action)
                next_states = tensor(transitions.next_state)
                a_next = self.target_network(next_states)
                q_1, q_2 = self.target_network.q(next_states, a_next)
                target = rewards + gamma * torch.min(q_1, q_2)
                target = target.detach()
                q_1, q_2 = self.network.q(states, actions)
                critic_loss = F.mse_loss(q_1, target) + F.mse_loss(q_2, target)
                critic_loss.backward()
                self.network.critic_opt.step()
    """,
    "peers' outputs filled before the loop, the others' detached":
        MUTUAL_LEARNING.format(peer="outputs[j].detach()"),
    "the optimized image, made once as a leaf and moved": """
        target = content.clone().requires_grad_(True).to(device)
        optimizer = torch.optim.Adam([target], lr=0.003)
        for step in range(100):
            features = get_features(target, vgg)
            loss = torch.mean((features - content_features) ** 2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """,
}


# Variants the samples don't show: (code, snippet). The fix must silence the code.
BUGGY_CODE = {
    "peers' outputs filled before the loop, each model learning from the others'": (
        "BX004", MUTUAL_LEARNING.format(peer="outputs[j]")),
    "FactorVAE: a trainer class steps the VAE before the discriminator's backward": ("BX007", """
        from model import Discriminator, FactorVAE

        class Solver:
            def __init__(self):
                self.VAE = FactorVAE(10).to(device)
                self.D = Discriminator(10).to(device)
                self.optim_VAE = optim.Adam(self.VAE.parameters())
                self.optim_D = optim.Adam(self.D.parameters())

            def train(self):
                for x_true1, x_true2 in self.data_loader:
                    x_recon, mu, logvar, z = self.VAE(x_true1)
                    D_z = self.D(z)
                    vae_loss = recon_loss(x_true1, x_recon) + (D_z[:, :1] - D_z[:, 1:]).mean()
                    self.optim_VAE.zero_grad()
                    vae_loss.backward(retain_graph=True)
                    self.optim_VAE.step()
                    z_pperm = permute_dims(self.VAE(x_true2, no_dec=True)).detach()
                    D_tc_loss = 0.5 * (F.cross_entropy(D_z, zeros) + F.cross_entropy(self.D(z_pperm), ones))
                    self.optim_D.zero_grad()
                    D_tc_loss.backward()
                    self.optim_D.step()
    """),
    "a GAN written before PyTorch 0.4, with retain_variables": ("BX007", """
        G, D = nn.Linear(5, 15), nn.Sequential(nn.Linear(15, 1), nn.Sigmoid())
        for step in range(100):
            fake = G(torch.randn(64, 5))
            prob_fake = D(fake)
            D_loss = -torch.mean(torch.log(D(real)) + torch.log(1. - prob_fake))
            G_loss = torch.mean(torch.log(1. - prob_fake))
            opt_D.zero_grad()
            D_loss.backward(retain_variables=True)
            opt_D.step()
            opt_G.zero_grad()
            G_loss.backward()
            opt_G.step()
    """),
    "PPO's old log-probabilities computed once, with history": ("BX004", """
        policy = nn.Linear(4, 3)
        dist = torch.distributions.Categorical(logits=policy(states))
        actions = dist.sample()
        old_log_probs = dist.log_prob(actions)
        for epoch in range(4):
            new_log_probs = torch.distributions.Categorical(logits=policy(states)).log_prob(actions)
            ratio = torch.exp(new_log_probs - old_log_probs)
            (-(ratio * advantages).mean()).backward()
            optimizer.step()
    """),
    "the same loss back-propagated again under a condition": ("BX006", """
        model = nn.Linear(4, 1)
        for x in batches:
            loss = model(x).pow(2).mean()
            loss.backward()
            if log_gradients:
                loss.backward()
            optimizer.step()
    """),
    "the previous iteration's loss kept for the next one": ("BX001", """
        model = nn.Linear(4, 1)
        prev_loss = None
        for x in batches:
            loss = model(x).pow(2).mean()
            objective = loss if prev_loss is None else loss + 0.1 * (loss - prev_loss).abs()
            objective.backward()
            prev_loss = loss
    """),
    "the previous output kept on a module for a consistency loss": ("BX001", """
        net = nn.Linear(5, 5)
        net.last_output = None
        for x in batches:
            out = net(x)
            loss = out.pow(2).mean()
            if net.last_output is not None:
                loss = loss + (out - net.last_output).pow(2).mean()
            loss.backward()
            net.last_output = out
    """),
    "predictions appended to a rollout after the backward": ("BX001", """
        model = nn.Linear(3, 3)
        history = torch.zeros(1, 3)
        for target in batches:
            pred = model(history[-1:])
            (pred - target).pow(2).mean().backward()
            history = torch.cat([history, pred], 0)
    """),
    "retain_graph=True over a tensor made before the loop": ("BX008", """
        w = torch.randn(3, requires_grad=True)
        w_hat = w / w.norm()
        for x, y in batches:
            loss = ((x @ w_hat - y) ** 2).mean()
            loss.backward(retain_graph=True)
            optimizer.step()
    """),
    "autograd.grad for logging, then backward through the same loss": ("BX010", """
        model = nn.Linear(3, 1)
        for x, y in batches:
            loss = mse_loss(model(x), y)
            input_grad = torch.autograd.grad(loss, x)
            log(input_grad)
            loss.backward()
    """),
    "the same loss back-propagated twice": ("BX006", """
        model = nn.Linear(3, 1)
        for x, y in batches:
            loss = mse_loss(model(x), y)
            loss.backward()
            loss.backward()
    """),
    "step through an optimizer the file can't see into, then backward through the old forward": ("BX007", """
        model = nn.Linear(3, 1)
        optimizer = make_optimizer(model)
        for x, y in batches:
            out = model(x)
            loss = mse_loss(out, y)
            loss.backward(retain_graph=True)
            optimizer.step()
            (out ** 2).mean().backward()
    """),
    "state carried through a helper that runs the backward": ("BX001", """
        rnn = nn.RNNCell(3, 4)
        def train_step(model, x, hidden):
            hidden = model(x, hidden)
            hidden.pow(2).sum().backward()
            return hidden
        def count(step):
            return step + 1
        for x in batches:
            hidden = train_step(rnn, x, hidden)
            global_step = count(global_step)
    """),
    "every loss so far kept in a list and back-propagated whole": ("BX005", """
        model = nn.Linear(3, 1)
        losses = []
        for x, y in batches:
            loss = mse_loss(model(x), y)
            losses.append(loss)
            torch.stack(losses).mean().backward()
            optimizer.step()
    """),
    "an LSTM state that starts as None": ("BX001", """
        lstm = nn.LSTM(3, 6)
        state = None
        for x in batches:
            out, state = lstm(x, state)
            out.sum().backward()
    """),
    "an advantage shared by the critic and the actor updates": ("BX006", """
        actor, critic = nn.Linear(4, 2), nn.Linear(4, 1)
        actor_opt = torch.optim.Adam(actor.parameters())
        critic_opt = torch.optim.Adam(critic.parameters())
        for s, returns in batches:
            dist = torch.distributions.Categorical(logits=actor(s))
            a = dist.sample()
            value = critic(s).squeeze(-1)
            advantage = returns - value
            critic_opt.zero_grad()
            advantage.pow(2).mean().backward()
            critic_opt.step()
            actor_loss = -(dist.log_prob(a) * advantage).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
    """),
    "an LSTM state kept on the module, starting as None": ("BX001", """
        class Decoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(4, 8)
                self.hidden = None

            def forward(self, x):
                y, self.hidden = self.lstm(x, self.hidden)
                return y
    """),
    "a forward helper decorated with no_grad": ("BX009", """
        from torch.nn.functional import mse_loss
        model = nn.Linear(3, 1)

        @torch.no_grad()
        def predict(x):
            return model(x)

        for x, y in batches:
            loss = mse_loss(predict(x), y)
            loss.backward()
    """),
    "a prediction detached where it is made": ("BX009", """
        from torch.nn.functional import mse_loss
        model = nn.Linear(3, 1)
        for x, y in batches:
            pred = model(x).detach()
            loss = mse_loss(pred, y)
            loss.backward()
    """),
}


def test_the_pre_0_4_retain_variables_is_dropped_with_the_stale_graph():
    code, text = BUGGY_CODE["a GAN written before PyTorch 0.4, with retain_variables"]
    (found,) = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    patched = apply_edits(textwrap.dedent(text), found.fix.edits)
    assert "retain_variables" not in patched and "D_loss.backward()" in patched
    assert patched.count("prob_fake = D(fake)") == 2


@pytest.mark.parametrize("name", sorted(BUGGY_CODE))
def test_buggy_variant_is_flagged_and_its_fix_silences_it(name):
    code, text = BUGGY_CODE[name]
    text = textwrap.dedent(text)
    found = [d for d in check_text(text, "variant.py") if d.code == code]
    assert len(found) == 1 and found[0].fix is not None
    patched = apply_edits(text, found[0].fix.edits)
    compile(patched, name, "exec")
    assert not [d for d in check_text(patched, "variant.py") if d.code == code]


def test_a_state_that_starts_as_none_is_detached_only_once_it_exists():
    code, text = BUGGY_CODE["an LSTM state that starts as None"]
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == [
        "    if state is not None:\n        state = tuple(h.detach() for h in state)\n"]


def test_a_module_state_that_starts_as_none_is_detached_only_once_it_exists():
    code, text = BUGGY_CODE["an LSTM state kept on the module, starting as None"]
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == [
        "        if self.hidden is not None:\n"
        "            self.hidden = tuple(h.detach() for h in self.hidden)\n"]


def test_a_tensor_the_next_optimizer_does_not_train_is_detached_for_its_update():
    code, text = BUGGY_CODE["an advantage shared by the critic and the actor updates"]
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == ["advantage.detach()"]
    assert "`actor_opt.step()`" in found[0].fix.message


def test_a_value_extended_after_the_backward_is_kept_detached_whole():
    code, text = BUGGY_CODE["predictions appended to a rollout after the backward"]
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == ["torch.cat([history, pred], 0).detach()"]


def test_a_second_backward_of_the_same_loss_is_removed_not_summed():
    code, text = BUGGY_CODE["the same loss back-propagated again under a condition"]
    text = textwrap.dedent(text)
    found = [d for d in check_text(text, "variant.py") if d.code == code]
    assert found[0].location.row == 7 and "back-propagated twice" in found[0].message
    assert apply_edits(text, found[0].fix.edits) == text.replace(
        "if log_gradients:\n        loss.backward()", "if log_gradients:\n        pass")


def test_a_snapshot_of_a_model_the_loop_calls_again_is_kept_detached():
    code, text = BUGGY_CODE["PPO's old log-probabilities computed once, with history"]
    found = [d for d in check_text(textwrap.dedent(text), "variant.py") if d.code == code]
    assert [e.content for e in found[0].fix.edits] == ["dist.log_prob(actions).detach()"]


def test_every_rule_flags_some_sample_or_variant():
    flagged = {d.code for s in SAMPLES.values() for d in check_file(s.path)}
    flagged |= {code for code, _ in BUGGY_CODE.values()}
    assert flagged == {rule.CODE for rule in RULES}


@pytest.mark.parametrize("name", sorted(CORRECT_CODE))
def test_correct_training_code_is_silent(name):
    assert check_text(textwrap.dedent(CORRECT_CODE[name]), "corpus.py") == []


def test_noqa_select_and_ignore():
    code = textwrap.dedent("""
        for x in batches:
            hidden.detach()
            out, hidden = model(x, hidden)
            out.sum().backward()
    """)
    assert [d.code for d in check_text(code, "a.py")] == ["BX003", "BX001"]
    assert [d.code for d in check_text(code, "a.py", select=["BX003"])] == ["BX003"]
    assert [d.code for d in check_text(code, "a.py", ignore=["BX003"])] == ["BX001"]
    silenced = code.replace("hidden.detach()", "hidden.detach()  # noqa: BX003")
    assert [d.code for d in check_text(silenced, "a.py")] == ["BX001"]
    assert check_text(silenced.replace("model(x, hidden)", "model(x, hidden)  # noqa"), "a.py") == []


def test_every_rule_has_a_docs_page_in_sync_and_its_url():
    for rule in RULES:
        page = DOCS / f"{rule.CODE}.md"
        assert page.read_text() == doc_page(rule)
        for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
            assert heading in page.read_text()


def run_check(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "explainer", "check", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""})


def test_cli_json_shape_and_exit_codes(tmp_path):
    flagged = run_check("--format", "json", "samples/rnn_hidden_chunks.py")
    assert flagged.returncode == 1
    (diagnostic,) = json.loads(flagged.stdout)
    assert set(diagnostic) == {"code", "message", "filename", "location", "end_location", "fix", "url"}
    assert diagnostic["url"].startswith("file://") and diagnostic["url"].endswith("/BX001.md")
    assert (diagnostic["location"], diagnostic["end_location"]) == ({"row": 19, "column": 10}, {"row": 19, "column": 16})
    clean = run_check("samples/rnn_hidden_chunks_fixed.py")
    assert (clean.returncode, clean.stdout.strip()) == (0, "All checks passed.")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    failed = run_check(str(broken), "samples/rnn_hidden_chunks_fixed.py")
    assert failed.returncode == 2 and "cannot parse" in failed.stderr
    # Not "All checks passed": one of the two was never checked.
    assert failed.stdout.strip() == "No diagnostics. 1 input could not be checked (stderr says why)."
    assert run_check("--select", "NOPE1", "samples/").returncode == 0
    assert run_check("no/such/path.py").returncode == 2


def test_files_are_decoded_as_python_does(tmp_path):
    latin = tmp_path / "latin.py"
    latin.write_bytes("# -*- coding: latin-1 -*-\n# café\nfor x in data:\n    h = m(x, h)\n    h.sum().backward()\n".encode("latin-1"))
    undecodable = tmp_path / "bad.py"
    undecodable.write_bytes(b"x = '\xff'\n")
    result = run_check("--format", "json", str(latin), str(undecodable))
    assert [d["code"] for d in json.loads(result.stdout)] == ["BX001"]
    assert result.returncode == 2 and "bad.py: cannot read" in result.stderr


def test_text_format_is_ruff_like():
    out = run_check("samples/running_loss_total.py").stdout
    assert out.splitlines()[0].startswith("samples/running_loss_total.py:15:5: BX002 ")
    assert "15 |     total = total + loss  # culprit" in out and "= fix:" in out


def test_check_never_imports_the_code_it_reads(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nimport train\n")
    (tmp_path / "train.py").write_text("import evil\nfor x in data:\n    h = m(x, h)\n    h.sum().backward()\n")
    result = run_check(str(tmp_path))
    assert result.returncode == 1 and not marker.exists()


def test_rule_command_prints_the_docs():
    shown = subprocess.run([sys.executable, "-m", "explainer", "rule", "bx002"], capture_output=True,
                           text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert shown.returncode == 0 and "## Use instead" in shown.stdout


def write_notebook(path, cells, language="python"):
    """A notebook as Jupyter saves it (nbformat 4, indent 1), from (cell_type, source) pairs."""
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "language": language, "display_name": "Python 3"}
    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell}
    notebook.cells = [make[kind](textwrap.dedent(source).strip("\n")) for kind, source in cells]
    nbformat.write(notebook, str(path))
    return path


RNN_NOTEBOOK = [
    ("markdown", "# Truncated BPTT"),
    ("code", """
        %matplotlib inline
        import torch
        rnn = torch.nn.RNNCell(3, 4)
        opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
        hidden = torch.zeros(1, 4)
    """),
    ("code", """
        !nvidia-smi
        for step in range(3):
            x = torch.randn(1, 3)
            hidden = rnn(x, hidden)
            files = !ls
            loss = hidden.pow(2).sum()
            loss.backward()
            rnn?
            opt.step()
    """),
    ("code", """
        %%bash
        if then fi
    """),
]


def test_notebook_cells_are_one_module_with_ipython_lines_skipped(tmp_path):
    notebook = write_notebook(tmp_path / "rnn.ipynb", RNN_NOTEBOOK)
    result = run_check("--format", "json", str(notebook))
    assert result.returncode == 1, result.stderr
    (diagnostic,) = json.loads(result.stdout)
    # Cells count as the notebook shows them, the markdown cell included; rows within the cell.
    assert (diagnostic["code"], diagnostic["cell"], diagnostic["location"]) == ("BX001", 3, {"row": 4, "column": 5})
    assert diagnostic["fix"]["edits"][0]["cell"] == 3
    text = run_check(str(notebook)).stdout
    assert f"{notebook.name}:cell 3:4:5: BX001" in text.replace(str(tmp_path) + "/", "")
    assert "4 |     hidden = rnn(x, hidden)" in text


def test_notebook_cell_that_does_not_parse_is_skipped_and_reported(tmp_path):
    notebook = write_notebook(tmp_path / "broken.ipynb", [*RNN_NOTEBOOK, ("code", "def broken(:\n    pass")])
    result = run_check("--format", "json", str(notebook))
    assert [d["code"] for d in json.loads(result.stdout)] == ["BX001"]
    assert result.returncode == 2 and "cell 5:1: cannot parse" in result.stderr
    (tmp_path / "bad.ipynb").write_text("{not json")
    (tmp_path / "r.ipynb").write_text(json.dumps({"cells": [], "metadata": {"kernelspec": {"language": "R"}}}))
    bad = run_check(str(tmp_path / "bad.ipynb"), str(tmp_path / "r.ipynb"))
    assert bad.returncode == 2 and "invalid JSON" in bad.stderr and "not a Python notebook" in bad.stderr


def test_fix_rewrites_python_files_and_reports_what_is_left(tmp_path):
    for name in ("rnn_hidden_chunks", "gan_fake_reuse", "running_loss_total"):
        (tmp_path / f"{name}.py").write_bytes((ROOT / "samples" / f"{name}.py").read_bytes())
    (tmp_path / "clean.py").write_bytes((ROOT / "samples" / "rnn_hidden_chunks_fixed.py").read_bytes())
    before = (tmp_path / "clean.py").stat().st_mtime_ns
    result = run_check("--fix", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("(3 fixed, 0 remaining).")
    assert run_check(str(tmp_path)).returncode == 0
    assert (tmp_path / "clean.py").stat().st_mtime_ns == before  # untouched files are not rewritten
    for name in ("rnn_hidden_chunks", "gan_fake_reuse", "running_loss_total"):
        compile((tmp_path / f"{name}.py").read_text(), name, "exec")


def test_fix_rewrites_only_the_fixed_lines_of_a_notebook(tmp_path):
    notebook = write_notebook(tmp_path / "rnn.ipynb", [*RNN_NOTEBOOK, ("code", "def broken(:\n    pass")])
    original = notebook.read_text()
    result = run_check("--fix", str(notebook))
    assert "(1 fixed, 0 remaining)" in result.stdout
    changed = [(a, b) for a, b in zip(original.splitlines(), notebook.read_text().splitlines()) if a != b]
    assert changed == [('    "    hidden = rnn(x, hidden)\\n",', '    "    hidden = rnn(x, hidden.detach())\\n",')]


def test_editor_fix_all_in_a_notebook_changes_only_the_fixed_cell():
    """What the language server's "Fix all" on a notebook applies: the cells as one module, the
    IPython lines and a cell that does not parse kept as they were, no newline added."""
    from explainer.static.editor import Settings, fix_all_cells

    cells = ["import torch\nrnn = torch.nn.RNNCell(3, 4)\nhidden = torch.zeros(1, 4)",
             "%matplotlib inline\nfor step in range(3):\n    hidden = rnn(torch.randn(1, 3), hidden)\n"
             "    files = !ls\n    hidden.sum().backward()",
             "def broken(:\n    pass"]
    fixed = fix_all_cells(cells, "train.ipynb", Settings())
    assert fixed == [cells[0], cells[1].replace("rnn(torch.randn(1, 3), hidden)", "rnn(torch.randn(1, 3), hidden.detach())"),
                     cells[2]]
    assert fix_all_cells(fixed, "train.ipynb", Settings()) is None  # nothing left to fix
    assert fix_all_cells(cells, "train.ipynb", Settings(ignore=("BX001",))) is None
    assert fix_all_cells(cells, "train.ipynb", Settings(enable=False)) is None


def test_editor_fix_all_in_a_cell_applies_only_the_fixes_inside_it():
    """VS Code fixes each cell on its own on save: a cell gets the fixes whose edits all lie in it,
    and a fix that moves a line from one cell into another is left to the notebook's fix-all."""
    from explainer.static.editor import Settings, fix_all_cells, fix_all_in_cell

    setup = "import torch\nw = torch.randn(5, requires_grad=True)\nopt = torch.optim.SGD([w], lr=0.1)\n" \
            "w_hat = w / w.norm()\nrnn = torch.nn.RNNCell(3, 4)\nhidden = torch.zeros(1, 4)\n"
    moved = "for step in range(3):\n    loss = (w_hat * torch.randn(5)).sum()\n    opt.zero_grad()\n" \
            "    loss.backward()\n    opt.step()\n"
    carried = "%matplotlib inline\nfor step in range(3):\n    hidden = rnn(torch.randn(1, 3), hidden)\n" \
              "    hidden.sum().backward()"
    cells = [setup, moved, carried, "def broken(:\n    pass"]
    whole = fix_all_cells(cells, "train.ipynb", Settings())
    assert "w_hat" not in whole[0] and "    w_hat = w / w.norm()\n" in whole[1]  # the cross-cell fix
    assert [fix_all_in_cell(cells, n, "train.ipynb", Settings()) for n in (0, 1, 3)] == [None, None, None]
    assert fix_all_in_cell(cells, 2, "train.ipynb", Settings()) == whole[2] == \
        carried.replace("rnn(torch.randn(1, 3), hidden)", "rnn(torch.randn(1, 3), hidden.detach())")
    # Once the cross-cell fix is in (cell 2 now starts a row further down): the same fix.
    grown = [whole[0], whole[1], carried, cells[3]]
    assert fix_all_in_cell(grown, 2, "train.ipynb", Settings()) == whole[2]
    assert fix_all_in_cell(cells, 2, "train.ipynb", Settings(enable=False)) is None


def test_sarif_output(tmp_path):
    result = run_check("--format", "sarif", "samples/gan_fake_reuse.py", "samples/rnn_hidden_chunks_fixed.py")
    assert result.returncode == 1
    sarif = json.loads(result.stdout)
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    (run,) = sarif["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [rule.CODE for rule in RULES]
    assert all(r["helpUri"].endswith(f"/{r['id']}.md") and "## Use instead" in r["help"]["markdown"] for r in rules)
    (found,) = run["results"]
    assert found["ruleId"] == "BX006" and rules[found["ruleIndex"]]["id"] == "BX006"
    location = found["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "samples/gan_fake_reuse.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 22, "startColumn": 5, "endLine": 22, "endColumn": 9}
    # The fix, applied from SARIF's replacements alone, gives the script the JSON fix gives.
    (change,) = found["fixes"][0]["artifactChanges"]
    edits = [Edit("x", r["insertedContent"]["text"],
                  Location(r["deletedRegion"]["startLine"], r["deletedRegion"]["startColumn"]),
                  Location(r["deletedRegion"]["endLine"], r["deletedRegion"]["endColumn"]))
             for r in change["replacements"]]
    (diagnostic,) = json.loads(run_check("--format", "json", "samples/gan_fake_reuse.py").stdout)
    text = (ROOT / "samples" / "gan_fake_reuse.py").read_text()
    assert apply_edits(text, edits) == apply_edits(text, edits_from_json(diagnostic["fix"]))


def test_jedi_follows_workspace_imports_without_importing_them(tmp_path):
    marker = tmp_path / "imported"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'ws'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "models.py").write_text(textwrap.dedent(f"""
        import torch.nn as nn
        open({str(marker)!r}, "w").write("imported")
        class Base(nn.Module):
            pass
        class Net(Base):
            def forward(self, x):
                return x
        def build_model():
            return Net()
        def load_data():
            return [1, 2, 3]
    """))
    train = textwrap.dedent("""
        import torch
        from pkg.models import build_model as make, load_data
        model = FACTORY()
        optimizer = torch.optim.LBFGS(model.parameters())
        for step in range(3):
            pred = model(torch.randn(4, 3))
            def closure():
                optimizer.zero_grad()
                loss = (pred - 1).pow(2).mean()
                loss.backward()
                return loss
            optimizer.step(closure)
    """)
    (tmp_path / "train.py").write_text(train.replace("FACTORY", "make"))
    (tmp_path / "data.py").write_text(train.replace("FACTORY", "load_data"))
    result = run_check("--format", "json", str(tmp_path / "train.py"), str(tmp_path / "data.py"))
    found = [(Path(d["filename"]).name, d["code"], d["location"]["row"]) for d in json.loads(result.stdout)]
    assert found == [("train.py", "BX004", 7)]
    assert not marker.exists()


def test_checks_in_several_threads_agree_with_one_at_a_time():
    """The language server checks in worker threads; parsed trees share their context and
    operator nodes (`Load`, `Add`), which the checker must not write to."""
    import threading

    from explainer.static import editor

    sources = [(str(s.path), s.path.read_text()) for s in manifest.samples()]

    def codes_of_all() -> list[list[tuple[str, int]]]:
        return [[(d.code, d.location.row) for d in editor.check_document(text, path, editor.Settings()) or []]
                for path, text in sources]

    expected = codes_of_all()
    results, failures = [], []

    def work() -> None:
        try:
            for _ in range(2):
                results.append(codes_of_all())
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(repr(error))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert all(result == expected for result in results) and len(results) == 12
