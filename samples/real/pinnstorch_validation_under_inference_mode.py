# source: https://github.com/rezaakb/pinns-torch/issues/12 — issue "Output function cannot calculate gradient": the Navier-Stokes example trains, but in validation output_fn's pinnstorch.utils.gradient(outputs["psi"], y) fails with "element 0 of tensors does not require grad" when the Trainer is built without the Hydra config (Lightning's default inference_mode=True)
# fix-source: https://github.com/rezaakb/pinns-torch/issues/12 — accepted resolution in the thread, matching the project's own pinnstorch/conf/trainer/default.yaml (inference_mode: false): build the trainer with inference_mode=False
# expect-kind: no-grad
# expect-culprit: outputs
from typing import Dict, List

import torch
from torch import nn
from _device import DEVICE


def gradient(dy: torch.Tensor, dx, create_graph: bool = True) -> List[torch.Tensor]:
    grad_outputs = [torch.ones_like(dy)]
    if isinstance(dx, torch.Tensor):
        dx = [dx]
    dy_dx = torch.autograd.grad([dy], dx, grad_outputs=grad_outputs, create_graph=create_graph,
                                retain_graph=True, allow_unused=False)
    return [grad if grad is not None else torch.zeros_like(dx[i]) for i, grad in enumerate(dy_dx)]


def set_requires_grad(x, t, enable_grad=True):
    if t is not None:
        t = t.requires_grad_(enable_grad)
    x = [x_.requires_grad_(enable_grad) for x_ in x]
    return x, t


def relative_l2_error(preds, target):
    return torch.sqrt(torch.mean(torch.square(preds - target)) / torch.mean(torch.square(target)))


def sse(loss, preds, target=None, keys=None):
    for key in keys:
        loss = loss + torch.sum(torch.square(preds[key] - (0 if target is None else target[key])))
    return loss


class FCN(nn.Module):
    def __init__(self, layers, lb, ub, output_names):
        super().__init__()
        net = nn.Sequential()
        net.add_module("input", nn.Linear(layers[0], layers[1]))
        net.add_module("activation_1", nn.Tanh())
        net.add_module("output", nn.Linear(layers[-2], layers[-1]))
        self.model = net
        self.register_buffer("lb", torch.tensor(lb, dtype=torch.float32))
        self.register_buffer("ub", torch.tensor(ub, dtype=torch.float32))
        self.output_names = output_names

    def forward(self, spatial: List[torch.Tensor], time: torch.Tensor) -> Dict[str, torch.Tensor]:
        x, y = spatial
        z = torch.cat((x, y, time), 1)
        z = 2.0 * (z - self.lb) / (self.ub - self.lb) - 1.0
        z = self.model(z)
        return {name: z[:, i: i + 1] for i, name in enumerate(self.output_names)}


def output_fn(outputs, x, y, t):
    """Define `output_fn` function that will be applied to outputs of net."""
    outputs["u"] = gradient(outputs["psi"], y)[0]
    outputs["v"] = -gradient(outputs["psi"], x)[0]
    return outputs


def pde_fn(outputs, x, y, t, extra_variables):
    u_x, u_y, u_t = gradient(outputs["u"], [x, y, t])
    v_x, v_y, v_t = gradient(outputs["v"], [x, y, t])
    p_x, p_y = gradient(outputs["p"], [x, y])
    outputs["f_u"] = u_t + extra_variables["l1"] * (outputs["u"] * u_x + outputs["v"] * u_y) + p_x
    outputs["f_v"] = v_t + extra_variables["l1"] * (outputs["u"] * v_x + outputs["v"] * v_y) + p_y
    return outputs


class PointCloud:
    """The training condition: solution data plus PDE residual (sampler_base.loss_fn)."""

    def loss_fn(self, inputs, loss, functions):
        x, t, u = inputs
        outputs = functions["forward"](x, t)
        outputs = functions["pde_fn"](outputs, *x, t, functions["extra_variables"])
        loss = functions["loss_fn"](loss, outputs, u, keys=["u", "v"])
        loss = functions["loss_fn"](loss, outputs, keys=["f_u", "f_v"])
        return loss, outputs


class PINNModule(nn.Module):
    def __init__(self, net, pde_fn, output_fn=None, extra_variables=None):
        super().__init__()
        self.net = net
        self.pde_fn = pde_fn
        self.output_fn = output_fn
        self.extra_variables = nn.ParameterDict(
            {k: nn.Parameter(torch.tensor(v, device=DEVICE)) for k, v in extra_variables.items()})
        self.loss_fn = sse
        self.functions = {"forward": self.forward, "pde_fn": self.pde_fn, "output_fn": self.output_fn,
                          "extra_variables": self.extra_variables, "loss_fn": self.loss_fn, "net": self.net}

    def forward(self, spatial, time):
        outputs = self.net(spatial, time)  # culprit
        if self.output_fn is not None:
            outputs = self.output_fn(outputs, *spatial, time)
        return outputs

    def model_step(self, batch):
        loss = 0.0
        for loss_fn, data in batch.items():
            x, t, u = data
            x, t = set_requires_grad(x, t, True)
            loss, preds = self.function_mapping[loss_fn](data, loss, self.functions)
        return loss, preds

    def training_step(self, batch, batch_idx):
        loss, pred = self.model_step(batch)
        return loss

    def eval_step(self, batch):
        loss_fn, solution = self.trainer.datamodule.loss_fn, self.trainer.datamodule.solution_names
        _, _, u = batch
        with torch.set_grad_enabled(True):
            loss, preds = self.model_step({str(loss_fn): batch})
        error_dict = {name: relative_l2_error(preds[name], u[name]) for name in solution}
        return loss, error_dict, preds

    def validation_step(self, batch, batch_idx):
        loss, error_dict, preds = self.eval_step(batch)
        return loss.item(), {k: v.item() for k, v in error_dict.items()}

    def configure_optimizers(self):
        return {"optimizer": torch.optim.Adam(self.parameters(), lr=1e-3)}


class PINNDataModule:
    def __init__(self, train_batch, val_batch):
        self.train_batch, self.val_batch = train_batch, val_batch
        self.function_mapping = {"PointCloud": PointCloud().loss_fn}
        self.loss_fn = "PointCloud"
        self.solution_names = ["u", "v"]


class Trainer:
    """What pinnstorch gets from lightning.Trainer: evaluation runs under torch.inference_mode()
    when inference_mode=True (the default), else under torch.no_grad()."""

    def __init__(self, max_epochs=2, inference_mode=True):
        self.max_epochs = max_epochs
        self.inference_mode = inference_mode

    def _evaluation_context(self):
        return torch.inference_mode() if self.inference_mode else torch.no_grad()

    def fit(self, model, datamodule):
        self.datamodule = datamodule
        model.trainer = self
        model.function_mapping = datamodule.function_mapping
        optimizer = model.configure_optimizers()["optimizer"]
        for epoch in range(self.max_epochs):
            optimizer.zero_grad()
            loss = model.training_step(datamodule.train_batch, 0)
            loss.backward()
            optimizer.step()
            with self._evaluation_context():
                model.validation_step(datamodule.val_batch, 0)


def make_batch(n):
    x, y, t = (torch.rand(n, 1, device=DEVICE) for _ in range(3))
    return ([x, y], t, {"u": torch.randn(n, 1, device=DEVICE), "v": torch.randn(n, 1, device=DEVICE)})


net = FCN([3, 8, 2], lb=[0.0, 0.0, 0.0], ub=[1.0, 1.0, 1.0], output_names=["psi", "p"]).to(DEVICE)
model = PINNModule(net, pde_fn, output_fn=output_fn, extra_variables={"l1": 0.0}).to(DEVICE)
datamodule = PINNDataModule({"PointCloud": make_batch(16)}, make_batch(8))
trainer = Trainer(max_epochs=2)
trainer.fit(model=model, datamodule=datamodule)
print("done")
