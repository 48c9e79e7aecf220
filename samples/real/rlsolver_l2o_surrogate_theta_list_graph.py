# source: https://github.com/AI4Finance-Foundation/RLSolver/pull/91 — learn-to-optimize (LSTM optimizer) over a surrogate MLP objective for tensor-network contraction order; the surrogate is refit inside get_objective on self.theta_list, and training dies with "RuntimeError: Trying to backward through the graph a second time ..." (and, once past that, "one of the variables needed for gradient computation has been modified by an inplace operation" in all_losses.backward())
# fix-source: https://github.com/AI4Finance-Foundation/RLSolver/commit/cb7e1105f539bdd303b330479b9805f9fa61163b — the maintainer's "auto TNCO" commit (merged as PR #91) stores the sampled thetas without their graph (built under th.no_grad into a replay buffer) and evaluates the objective with a deepcopy of the surrogate (obj_model1 = deepcopy(obj_model0)) so the surrogate's optimizer.step() no longer touches weights saved for all_losses.backward()
# expect-kind: second-backward
# expect-culprit: self.theta_list
from copy import deepcopy

import torch as th
import torch.nn as nn

from _device import DEVICE

TEN = th.Tensor

"""Learn To Optimize + a trainable surrogate objective"""


class ObjectiveTask:
    def __init__(self, *args):
        self.args = None

    def get_args_for_train(self):
        return self.args

    @staticmethod
    def get_objective(*args) -> TEN:
        return th.zeros(())


class OptimizerTask(nn.Module):
    def __init__(self, dim, device):
        super().__init__()
        self.dim = dim
        self.device = device
        self.register_buffer('theta', th.zeros(self.dim, requires_grad=True, device=device))

    def re_init(self):
        self.__init__(dim=self.dim, device=self.device)

    def get_register_params(self):
        return [('theta', self.theta)]

    def get_output(self):
        return self.theta


class OptimizerOpti(nn.Module):
    def __init__(self, hid_dim=20):
        super().__init__()
        self.hid_dim = hid_dim
        self.recurs1 = nn.LSTMCell(1, hid_dim)
        self.recurs2 = nn.LSTMCell(hid_dim, hid_dim)
        self.output = nn.Linear(hid_dim, 1)

    def forward(self, inp0, hid0, cell):
        hid1, cell1 = self.recurs1(inp0, (hid0[0], cell[0]))
        hid2, cell2 = self.recurs2(hid1, (hid0[1], cell[1]))
        return self.output(hid2), (hid1, hid2), (cell1, cell2)


def set_attr(obj, attr, val):
    attrs = attr.split('.')
    for attr in attrs[:-1]:
        obj = getattr(obj, attr)
    setattr(obj, attrs[-1], val)


def opt_train(obj_task, opt_opti, opt_task, opt_base, num_opt, unroll, device):
    opt_opti.train()
    opt_task.zero_grad()
    obj_args = obj_task.get_args_for_train()

    n_params = 0
    for name, p in opt_task.get_register_params():
        n_params += p.numel()
    hc_state1 = th.zeros(4, n_params, opt_opti.hid_dim, device=device)

    all_losses_ever = []
    all_losses = None
    for iteration in range(1, num_opt + 1):
        output = opt_task.get_output()
        loss = obj_task.get_objective(output, *obj_args)
        loss.backward(retain_graph=True)

        if all_losses is None:
            all_losses = loss
        else:
            all_losses += loss
        all_losses_ever.append(loss.item())

        i = 0
        result_params = {}
        hc_state2 = th.zeros(4, n_params, opt_opti.hid_dim, device=device)
        for name, p in opt_task.get_register_params():
            hid_dim = p.numel()
            gradients = p.grad.view(hid_dim, 1).detach().clone().requires_grad_(True)

            j = i + hid_dim
            hc_part = hc_state1[:, i:j]
            updates, new_hidden, new_cell = opt_opti(gradients, hc_part[0:2], hc_part[2:4])

            hc_state2[0, i:j] = new_hidden[0]
            hc_state2[1, i:j] = new_hidden[1]
            hc_state2[2, i:j] = new_cell[0]
            hc_state2[3, i:j] = new_cell[1]

            result = p + updates.view(*p.size())
            result_params[name] = result / result.norm()
            result_params[name].retain_grad()
            i = j

        if iteration % unroll == 0:
            opt_base.zero_grad()
            all_losses.backward()
            opt_base.step()
            all_losses = None

            opt_task.re_init()
            opt_task.load_state_dict(result_params)
            opt_task.zero_grad()
            hc_state1 = hc_state2.detach().clone().requires_grad_(True)
        else:
            for name, p in opt_task.get_register_params():
                set_attr(opt_task, name, result_params[name])
            hc_state1 = hc_state2
    return all_losses_ever


def build_mlp(dims, activation=None, if_raw_out=True):
    if activation is None:
        activation = nn.ReLU
    net_list = []
    for i in range(len(dims) - 1):
        net_list.extend([nn.Linear(dims[i], dims[i + 1]), activation()])
    if if_raw_out:
        del net_list[-1]
    return nn.Sequential(*net_list)


class MLP(nn.Module):
    def __init__(self, inp_dim, out_dim, dims=(16, 16)):
        super().__init__()
        self.net = build_mlp(dims=[inp_dim, *dims, out_dim], activation=nn.Tanh)

    def forward(self, x):
        return self.net(x)


class TensorNetworkEnv:
    """Stand-in for the contraction-cost simulator: cost of contracting edges in a given order."""

    def __init__(self, num_edges):
        self.num_edges = num_edges
        self.edge_dims = th.arange(2, 2 + num_edges, dtype=th.float32)

    def get_log10_multiple_times(self, edge_argsort):
        dims = self.edge_dims[edge_argsort.cpu()]
        return th.log10(th.cumprod(dims, dim=0).sum()).item()


class ObjectiveTNCO(ObjectiveTask):
    def __init__(self, dim, device):
        super().__init__()
        self.device = device
        self.args = ()

        self.env = TensorNetworkEnv(num_edges=dim)
        self.dim = self.env.num_edges

        self.theta_list = []
        self.score_list = []
        self.obj_model = MLP(inp_dim=self.dim, out_dim=1).to(device)
        self.optimizer = th.optim.SGD(self.obj_model.parameters(), lr=1e-2)
        self.criterion = nn.MSELoss()
        self.batch_size = 4
        self.min_train_size = 1

    def get_objective(self, theta, *args) -> TEN:
        score = self.get_objective_without_grad(theta)
        self.theta_list.append(theta)  # culprit
        self.score_list.append(score)

        theta_tensor = th.stack(self.theta_list).to(self.device)
        score_tensor = th.tensor(self.score_list, device=self.device).unsqueeze(1)
        train_size = score_tensor.shape[0]

        if train_size > self.min_train_size:
            for epoch in range(3):  # fast_fit_it
                indices = th.randperm(train_size, device=self.device)[:self.batch_size]
                inputs = theta_tensor[indices]
                labels = score_tensor[indices]

                outputs = self.obj_model(inputs)
                loss = self.criterion(outputs, labels)

                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

        objective = self.obj_model(theta)
        return objective

    def get_objective_without_grad(self, theta, *_args) -> float:
        return self.env.get_log10_multiple_times(edge_argsort=theta.argsort())


def train_optimizer():
    train_times = 3
    lr = 1e-3
    unroll = 2
    num_opt = 4
    hid_dim = 8

    obj_task = ObjectiveTNCO(dim=6, device=DEVICE)
    dim = obj_task.env.num_edges

    opt_task = OptimizerTask(dim=dim, device=DEVICE)
    opt_opti = OptimizerOpti(hid_dim=hid_dim).to(DEVICE)
    opt_base = th.optim.Adam(opt_opti.parameters(), lr=lr)

    for i in range(train_times):
        opt_train(obj_task=obj_task, opt_task=opt_task, opt_opti=opt_opti,
                  num_opt=num_opt, device=DEVICE, unroll=unroll, opt_base=opt_base)


if __name__ == '__main__':
    train_optimizer()
    print('done')
