# source: https://github.com/pytorch/ignite/issues/1674 — issue "Loss automatically detaching inputs breaks some workflows": since ignite 0.4.3 Loss.update detaches both inputs before loss_fn, so DUQ's gradient-penalty metric (output_transform (x, y_pred), then torch.autograd.grad of y_pred w.r.t. x) fails with "element 0 of tensors does not require grad"
# fix-source: https://github.com/pytorch/ignite/pull/1675 — merged PR (commit 1ff17ae): call loss_fn on y_pred, y as they are and detach the result: self._loss_fn(y_pred, y, **kwargs).detach()
# expect-kind: no-grad
# expect-culprit: y
from enum import Enum

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
from _device import DEVICE


# --- a small stand-in for ignite 0.4.3: Engine, Events, Metric, Accuracy, Loss ---

class Events(Enum):
    STARTED = "started"
    EPOCH_STARTED = "epoch_started"
    ITERATION_COMPLETED = "iteration_completed"
    EPOCH_COMPLETED = "epoch_completed"
    COMPLETED = "completed"


class State:
    def __init__(self):
        self.epoch, self.iteration, self.output, self.metrics, self.max_epochs = 0, 0, None, {}, 1


class Engine:
    def __init__(self, process_function):
        self._process_function = process_function
        self._event_handlers = {e: [] for e in Events}
        self.state = State()

    def add_event_handler(self, event_name, handler, *args):
        self._event_handlers[event_name].append((handler, args))

    def on(self, event_name, *args):
        def decorator(f):
            self.add_event_handler(event_name, f, *args)
            return f
        return decorator

    def _fire_event(self, event_name):
        for handler, args in self._event_handlers[event_name]:
            handler(self, *args)

    def run(self, data, max_epochs=1):
        self.state = State()
        self.state.max_epochs = max_epochs
        self._fire_event(Events.STARTED)
        while self.state.epoch < max_epochs:
            self.state.epoch += 1
            self._fire_event(Events.EPOCH_STARTED)
            for batch in data:
                self.state.iteration += 1
                self.state.output = self._process_function(self, batch)
                self._fire_event(Events.ITERATION_COMPLETED)
            self._fire_event(Events.EPOCH_COMPLETED)
        self._fire_event(Events.COMPLETED)
        return self.state


class Metric:
    def __init__(self, output_transform=lambda x: x, device=torch.device("cpu")):
        self._output_transform = output_transform
        self._device = device
        self.reset()

    def started(self, engine):
        self.reset()

    @torch.no_grad()
    def iteration_completed(self, engine):
        output = self._output_transform(engine.state.output)
        self.update(output)

    def completed(self, engine, name):
        result = self.compute()
        if isinstance(result, torch.Tensor) and result.numel() == 1:
            result = result.item()
        engine.state.metrics[name] = result

    def attach(self, engine, name):
        engine.add_event_handler(Events.EPOCH_STARTED, self.started)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.iteration_completed)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.completed, name)


class Accuracy(Metric):
    def reset(self):
        self._num_correct, self._num_examples = 0, 0

    def update(self, output):
        y_pred, y = output[0].detach(), output[1].detach()
        self._num_correct += (y_pred.argmax(1) == y).sum().item()
        self._num_examples += y.shape[0]

    def compute(self):
        return self._num_correct / self._num_examples


class Loss(Metric):
    required_output_keys = None

    def __init__(self, loss_fn, output_transform=lambda x: x, batch_size=lambda x: len(x), device=torch.device("cpu")):
        super(Loss, self).__init__(output_transform, device=device)
        self._loss_fn = loss_fn
        self._batch_size = batch_size

    def reset(self):
        self._sum = torch.tensor(0.0, device=self._device)
        self._num_examples = 0

    def update(self, output):
        if len(output) == 2:
            y_pred, y = output
            kwargs = {}
        else:
            y_pred, y, kwargs = output
        average_loss = self._loss_fn(y_pred.detach(), y.detach(), **kwargs)  # culprit
        if len(average_loss.shape) != 0:
            raise ValueError("loss_fn did not return the average loss.")
        n = self._batch_size(y)
        self._sum += average_loss.to(self._device) * n
        self._num_examples += n

    def compute(self):
        return self._sum.item() / self._num_examples


# --- DUQ (y0ast/deterministic-uncertainty-quantification, train_duq_cifar.py), small ---

class ResNet_DUQ(nn.Module):
    def __init__(self, input_size, num_classes, centroid_size, model_output_size, length_scale, gamma):
        super().__init__()
        self.gamma = gamma
        self.W = nn.Parameter(torch.zeros(centroid_size, num_classes, model_output_size))
        nn.init.kaiming_normal_(self.W, nonlinearity="relu")
        self.resnet = nn.Sequential(nn.Linear(input_size, 16), nn.ReLU(), nn.Linear(16, model_output_size))
        self.register_buffer("N", torch.zeros(num_classes) + 13)
        self.register_buffer("m", torch.normal(torch.zeros(centroid_size, num_classes), 0.05))
        self.m = self.m * self.N
        self.sigma = length_scale

    def rbf(self, z):
        z = torch.einsum("ij,mnj->imn", z, self.W)
        embeddings = self.m / self.N.unsqueeze(0)
        diff = z - embeddings.unsqueeze(0)
        diff = (diff ** 2).mean(1).div(2 * self.sigma ** 2).mul(-1).exp()
        return diff

    def update_embeddings(self, x, y):
        self.N = self.gamma * self.N + (1 - self.gamma) * y.sum(0)
        z = self.resnet(x)
        z = torch.einsum("ij,mnj->imn", z, self.W)
        embedding_sum = torch.einsum("ijk,ik->jk", z, y)
        self.m = self.gamma * self.m + (1 - self.gamma) * embedding_sum

    def forward(self, x):
        z = self.resnet(x)
        y_pred = self.rbf(z)
        return z, y_pred


input_size, num_classes = 10, 3
l_gradient_penalty = 0.5
model = ResNet_DUQ(input_size, num_classes, centroid_size=8, model_output_size=8, length_scale=0.5, gamma=0.999)
model = model.to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[25, 50, 75], gamma=0.2)


def bce_loss_fn(y_pred, y):
    return F.binary_cross_entropy(y_pred, y, reduction="sum").div(num_classes * y_pred.shape[0])


def output_transform_bce(output):
    y_pred, y, x = output
    y = F.one_hot(y, num_classes).float()
    return y_pred, y


def output_transform_acc(output):
    y_pred, y, x = output
    return y_pred, y


def output_transform_gp(output):
    y_pred, y, x = output
    return x, y_pred


def calc_gradients_input(x, y_pred):
    gradients = torch.autograd.grad(outputs=y_pred, inputs=x, grad_outputs=torch.ones_like(y_pred),
                                    create_graph=True)[0]
    return gradients.flatten(start_dim=1)


def calc_gradient_penalty(x, y_pred):
    gradients = calc_gradients_input(x, y_pred)
    grad_norm = gradients.norm(2, dim=1)
    return ((grad_norm - 1) ** 2).mean()


def step(engine, batch):
    model.train()
    optimizer.zero_grad()
    x, y = batch
    x, y = x.to(DEVICE), y.to(DEVICE)
    if l_gradient_penalty > 0:
        x.requires_grad_(True)
    z, y_pred = model(x)
    y = F.one_hot(y, num_classes).float()
    loss = bce_loss_fn(y_pred, y)
    if l_gradient_penalty > 0:
        loss += l_gradient_penalty * calc_gradient_penalty(x, y_pred)
    loss.backward()
    optimizer.step()
    x.requires_grad_(False)
    with torch.no_grad():
        model.eval()
        model.update_embeddings(x, y)
    return loss.item()


def eval_step(engine, batch):
    model.eval()
    x, y = batch
    x, y = x.to(DEVICE), y.to(DEVICE)
    x.requires_grad_(True)
    z, y_pred = model(x)
    return y_pred, y, x


trainer = Engine(step)
evaluator = Engine(eval_step)

metric = Accuracy(output_transform=output_transform_acc)
metric.attach(evaluator, "accuracy")
metric = Loss(F.binary_cross_entropy, output_transform=output_transform_bce)
metric.attach(evaluator, "bce")
metric = Loss(calc_gradient_penalty, output_transform=output_transform_gp)
metric.attach(evaluator, "gradient_penalty")

train_dataset = torch.utils.data.TensorDataset(torch.randn(24, input_size), torch.randint(0, num_classes, (24,)))
val_dataset = torch.utils.data.TensorDataset(torch.randn(12, input_size), torch.randint(0, num_classes, (12,)))
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=8, shuffle=False, drop_last=True)
val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=6, shuffle=False)


@trainer.on(Events.EPOCH_COMPLETED)
def log_results(trainer):
    evaluator.run(val_loader)
    metrics = evaluator.state.metrics
    acc = metrics["accuracy"]
    bce = metrics["bce"]
    GP = metrics["gradient_penalty"]
    loss = bce + l_gradient_penalty * GP
    scheduler.step()


trainer.run(train_loader, max_epochs=2)
print("done")
