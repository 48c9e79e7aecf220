# source: https://github.com/lululxvi/deepxde/pull/1388 — PyTorch backend, PI-DeepONet examples: PDEOperatorCartesianProd._losses rebuilds each loss with bkd.as_tensor(list of per-function losses), a new tensor with no history, so total_loss.backward() fails
# fix-source: https://github.com/lululxvi/deepxde/commit/23bba4f983d57eb971759da47a9658d4f6238312 — merged PR #1379 ("Use stack instead of as_tensor to keep the gradients"): bkd.stack(loss, 0) instead of bkd.as_tensor(l); the PyTorch Model also turns the auxiliary vars into a tensor
# expect-kind: none
# fix: _losses reduces each loss with bkd.stack(loss, 0) instead of bkd.as_tensor(l), keeping the graph; outputs_losses also stores the auxiliary vars as a tensor (both from 23bba4f)
import numpy as np
import torch
from _device import DEVICE


class bkd:
    """The few deepxde.backend (pytorch) functions the code below uses."""

    @staticmethod
    def as_tensor(data, dtype=None):
        if isinstance(data, torch.Tensor):
            if dtype is None or data.dtype == dtype:
                return data
            return data.type(dtype=dtype)
        return torch.as_tensor(data, dtype=dtype, device=DEVICE)

    @staticmethod
    def stack(values, axis):
        return torch.stack(values, axis)

    @staticmethod
    def reduce_mean(input_tensor):
        return torch.mean(input_tensor)

    @staticmethod
    def zeros_like(input_tensor):
        return torch.zeros_like(input_tensor)


class grad:
    @staticmethod
    def jacobian(ys, xs, i=0, j=None):
        dy = torch.autograd.grad(
            ys[:, i : i + 1], xs, grad_outputs=torch.ones_like(ys[:, i : i + 1]), create_graph=True
        )[0]
        return dy if j is None else dy[:, j : j + 1]

    @staticmethod
    def clear():
        pass


def return_tensor(func):
    def wrapper(*args, **kwargs):
        return bkd.as_tensor(func(*args, **kwargs))

    return wrapper


class IC:
    """Initial conditions: y([x, t0]) = func([x, t0])."""

    def __init__(self, func, on_initial, component=0):
        self.func = return_tensor(func)
        self.on_initial = on_initial
        self.component = component

    def filter(self, X):
        return X[self.on_initial(X)]

    def error(self, X, inputs, outputs, beg, end, aux_var=None):
        values = self.func(X[beg:end], aux_var[beg:end])
        return outputs[beg:end, self.component : self.component + 1] - values


class TimePDE:
    def __init__(self, pde, ic, num_domain, num_initial):
        self.pde = pde
        self.bcs = [ic]
        rng = np.random.default_rng(0)
        x_ic = np.hstack([rng.random((num_initial, 1)), np.zeros((num_initial, 1))])
        x_dom = rng.random((num_domain, 2))
        self.train_x_bc = ic.filter(x_ic).astype(np.float32)
        self.num_bcs = [len(self.train_x_bc)]
        self.train_x = np.vstack([self.train_x_bc, x_dom]).astype(np.float32)


class GRF:
    """Random smooth input functions v(x) (a few Fourier modes)."""

    def random(self, size):
        return np.random.default_rng(1).standard_normal((size, 3)).astype(np.float32)

    def eval_batch(self, features, xs):
        k = np.arange(1, 4)[None, :]
        return (np.sin(np.pi * xs * k) @ features.T).T.astype(np.float32)


class PDEOperatorCartesianProd:
    def __init__(self, pde, function_space, evaluation_points, num_function,
                 function_variables=None, batch_size=None):
        self.pde = pde
        self.func_space = function_space
        self.eval_pts = evaluation_points
        self.num_func = num_function
        self.func_vars = function_variables
        self.batch_size = batch_size
        self.train_x = None
        self.train_y = None
        self.train_aux_vars = None
        self.train_next_batch()

    def _losses(self, outputs, loss_fn, inputs, model, num_func):
        bcs_start = np.cumsum([0] + self.pde.num_bcs)

        losses = []
        for i in range(num_func):
            out = outputs[i][:, None]

            f = []
            if self.pde.pde is not None:
                f = self.pde.pde(inputs[1], out, model.net.auxiliary_vars[i][:, None])
                if not isinstance(f, (list, tuple)):
                    f = [f]
            error_f = [fi[bcs_start[-1] :] for fi in f]
            losses_i = [loss_fn(bkd.zeros_like(error), error) for error in error_f]

            for j, bc in enumerate(self.pde.bcs):
                beg, end = bcs_start[j], bcs_start[j + 1]
                # The same BC points are used for training and testing.
                error = bc.error(
                    self.train_x[1],
                    inputs[1],
                    out,
                    beg,
                    end,
                    aux_var=model.net.auxiliary_vars[i][:, None],
                )
                losses_i.append(loss_fn(bkd.zeros_like(error), error))

            losses.append(losses_i)

        losses = zip(*losses)
        # Use stack instead of as_tensor to keep the gradients.
        losses = [bkd.reduce_mean(bkd.stack(loss, 0)) for loss in losses]
        return losses

    def losses_train(self, targets, outputs, loss_fn, inputs, model, aux=None):
        num_func = self.num_func if self.batch_size is None else self.batch_size
        return self._losses(outputs, loss_fn, inputs, model, num_func)

    def train_next_batch(self, batch_size=None):
        if self.train_x is None:
            func_feats = self.func_space.random(self.num_func)
            func_vals = self.func_space.eval_batch(func_feats, self.eval_pts)
            vx = self.func_space.eval_batch(func_feats, self.pde.train_x[:, self.func_vars])
            self.train_x = (func_vals, self.pde.train_x)
            self.train_aux_vars = vx

        if self.batch_size is None:
            return self.train_x, self.train_y, self.train_aux_vars

        indices = np.random.default_rng(len(self.func_vars)).choice(
            self.num_func, self.batch_size, replace=False
        )
        traix_x = (self.train_x[0][indices], self.train_x[1])
        return traix_x, self.train_y, self.train_aux_vars[indices]


class FNN(torch.nn.Module):
    def __init__(self, layer_sizes, activation):
        super().__init__()
        self.activation = activation
        self.linears = torch.nn.ModuleList(
            [torch.nn.Linear(layer_sizes[i - 1], layer_sizes[i]) for i in range(1, len(layer_sizes))]
        )

    def forward(self, x):
        for linear in self.linears[:-1]:
            x = self.activation(linear(x))
        return self.linears[-1](x)


class DeepONetCartesianProd(torch.nn.Module):
    def __init__(self, layer_sizes_branch, layer_sizes_trunk, activation):
        super().__init__()
        self.auxiliary_vars = None
        self._input_transform = None
        self.regularizer = None
        self.activation_trunk = activation
        self.branch = FNN(layer_sizes_branch, activation)
        self.trunk = FNN(layer_sizes_trunk, self.activation_trunk)
        self.b = torch.nn.parameter.Parameter(torch.tensor(0.0))

    def apply_feature_transform(self, transform):
        self._input_transform = transform

    def forward(self, inputs):
        x_func = inputs[0]
        x_loc = inputs[1]
        # Branch net to encode the input function
        x_func = self.branch(x_func)
        # Trunk net to encode the domain of the output function
        if self._input_transform is not None:
            x_loc = self._input_transform(x_loc)
        x_loc = self.activation_trunk(self.trunk(x_loc))
        # Dot product
        x = torch.einsum("bi,ni->bn", x_func, x_loc)
        # Add bias
        x += self.b
        return x


class Model:
    def __init__(self, data, net):
        self.data = data
        self.net = net

    def compile(self, lr):
        loss_fn = torch.nn.functional.mse_loss

        def outputs_losses(training, inputs, targets, auxiliary_vars, losses_fn):
            self.net.auxiliary_vars = None
            if auxiliary_vars is not None:
                self.net.auxiliary_vars = torch.as_tensor(auxiliary_vars, device=DEVICE)
            self.net.train(mode=training)
            if isinstance(inputs, tuple):
                inputs = tuple(
                    map(lambda x: bkd.as_tensor(x).requires_grad_(), inputs)
                )
            outputs_ = self.net(inputs)
            losses = losses_fn(targets, outputs_, loss_fn, inputs, self)
            if not isinstance(losses, list):
                losses = [losses]
            losses = torch.stack(losses)
            # Clear cached Jacobians and Hessians.
            grad.clear()
            return outputs_, losses

        def outputs_losses_train(inputs, targets, auxiliary_vars):
            return outputs_losses(True, inputs, targets, auxiliary_vars, self.data.losses_train)

        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)

        def train_step(inputs, targets, auxiliary_vars):
            def closure():
                losses = outputs_losses_train(inputs, targets, auxiliary_vars)[1]
                total_loss = torch.sum(losses)
                self.opt.zero_grad()
                total_loss.backward()
                return total_loss

            self.opt.step(closure)

        self.train_step = train_step

    def train(self, iterations):
        for i in range(iterations):
            X_train, y_train, train_aux_vars = self.data.train_next_batch(self.data.batch_size)
            self.train_step(X_train, y_train, train_aux_vars)


# PDE
def pde(x, y, v):
    dy_x = grad.jacobian(y, x, j=0)
    dy_t = grad.jacobian(y, x, j=1)
    return dy_t + dy_x


def func_ic(x, v):
    return v


ic = IC(func_ic, lambda x: np.isclose(x[:, 1], 0))
pde = TimePDE(pde, ic, num_domain=12, num_initial=4)

# Function space
func_space = GRF()

# Data
eval_pts = np.linspace(0, 1, num=6)[:, None]
data = PDEOperatorCartesianProd(
    pde, func_space, eval_pts, 6, function_variables=[0], batch_size=3
)

# Net
net = DeepONetCartesianProd([6, 8, 8], [5, 8, 8], torch.tanh).to(DEVICE)


def periodic(x):
    x, t = x[:, :1], x[:, 1:]
    x = x * 2 * np.pi
    return torch.cat(
        [torch.cos(x), torch.sin(x), torch.cos(2 * x), torch.sin(2 * x), t], 1
    )


net.apply_feature_transform(periodic)

model = Model(data, net)
model.compile(lr=0.0005)
model.train(iterations=3)
print("done")
