# source: https://github.com/shap/shap/pull/684 — PR "Pytorch DeepExplainer: retain graph for multiple inputs": with a model of several inputs, PyTorchDeepExplainer.gradient runs one forward and calls torch.autograd.grad(selected, x) once per input, and the second call raises "Trying to backward through the graph a second time"
# fix-source: https://github.com/shap/shap/commit/bf4e52d7e9150ca69f41590103b4ea3f3b8c3355 — merged PR #684 (3d143396 + 41873154): torch.autograd.grad(selected, x, retain_graph=True if idx + 1 < len(X) else None), so every input but the last keeps the graph
# expect-kind: none
# fix: each torch.autograd.grad call but the last one passes retain_graph=True, as in the merged PR
import warnings

import numpy as np
import torch
from torch import nn
from _device import DEVICE

warnings.filterwarnings("ignore", category=FutureWarning)


class PyTorchDeepExplainer:

    def __init__(self, model, data):
        # check if we have multiple inputs
        self.multi_input = False
        if type(data) == list:
            self.multi_input = True
        if type(data) != list:
            data = [data]
        self.data = data
        self.model = model.eval()

        self.multi_output = False
        self.num_outputs = 1
        with torch.no_grad():
            outputs = model(*data)
            self.device = outputs.device
            if outputs.shape[1] > 1:
                self.multi_output = True
                self.num_outputs = outputs.shape[1]
            self.expected_value = outputs.mean(0).cpu().numpy()

    def add_handles(self, model, forward_handle, backward_handle):
        """Add handles to all non-container layers in the model."""
        handles_list = []
        for child in model.children():
            if 'nn.modules.container' in str(type(child)):
                handles_list.extend(self.add_handles(child, forward_handle, backward_handle))
            else:
                handles_list.append(child.register_forward_hook(forward_handle))
                handles_list.append(child.register_backward_hook(backward_handle))
        return handles_list

    def remove_attributes(self, model):
        for child in model.children():
            for attr in ("x", "y"):
                if hasattr(child, attr):
                    delattr(child, attr)

    def gradient(self, idx, inputs):
        self.model.zero_grad()
        X = [x.requires_grad_() for x in inputs]
        outputs = self.model(*X)
        selected = [val for val in outputs[:, idx]]
        grads = [torch.autograd.grad(selected, x,
                                     retain_graph=True if idx + 1 < len(X) else None)[0].cpu().numpy()
                 for idx, x in enumerate(X)]
        return grads

    def shap_values(self, X):
        if not self.multi_input:
            X = [X]
        X = [x.to(self.device) for x in X]
        model_output_ranks = (torch.ones((X[0].shape[0], self.num_outputs)).int() *
                              torch.arange(0, self.num_outputs).int())

        # add the gradient handles
        handles = self.add_handles(self.model, add_interim_values, deeplift_grad)

        # compute the attributions
        output_phis = []
        for i in range(model_output_ranks.shape[1]):
            phis = [np.zeros(X[k].shape) for k in range(len(X))]
            for j in range(X[0].shape[0]):
                # tile the inputs to line up with the background data samples
                tiled_X = [X[l][j:j + 1].repeat((self.data[l].shape[0],) + tuple([1 for k in range(len(X[l].shape) - 1)]))
                           for l in range(len(X))]
                joint_x = [torch.cat((tiled_X[l], self.data[l]), dim=0) for l in range(len(X))]
                feature_ind = model_output_ranks[j, i]
                sample_phis = self.gradient(feature_ind, joint_x)
                for l in range(len(X)):
                    phis[l][j] = (torch.from_numpy(sample_phis[l][self.data[l].shape[0]:]).to(self.device)
                                  * (X[l][j: j + 1] - self.data[l])).detach().cpu().numpy().mean(0)
            output_phis.append(phis[0] if not self.multi_input else phis)

        for handle in handles:
            handle.remove()
        self.remove_attributes(self.model)
        return output_phis[0]


# Module hooks

def deeplift_grad(module, grad_input, grad_output):
    """The backward hook which computes the deeplift gradient for an nn.Module"""
    module_type = module.__class__.__name__
    if module_type in op_handler:
        if op_handler[module_type].__name__ not in ['passthrough', 'linear_1d']:
            return op_handler[module_type](module, grad_input, grad_output)
    return grad_input


def add_interim_values(module, input, output):
    """The forward hook used to save interim tensors, detached from the graph."""
    module_type = module.__class__.__name__
    if module_type in op_handler and op_handler[module_type].__name__ == 'nonlinear_1d':
        setattr(module, 'x', torch.nn.Parameter(input[0].detach()))
        setattr(module, 'y', torch.nn.Parameter(output.detach()))


def linear_1d(module, grad_input, grad_output):
    return None


def nonlinear_1d(module, grad_input, grad_output):
    delta_out = module.y[: int(module.y.shape[0] / 2)] - module.y[int(module.y.shape[0] / 2):]
    delta_in = module.x[: int(module.x.shape[0] / 2)] - module.x[int(module.x.shape[0] / 2):]
    dup0 = [2] + [1 for i in delta_in.shape[1:]]
    grads = [None for _ in grad_input]
    grads[0] = torch.where(torch.abs(delta_in.repeat(dup0)) < 1e-6, grad_input[0],
                           grad_output[0] * (delta_out / delta_in).repeat(dup0))
    return tuple(grads)


op_handler = {'Linear': linear_1d, 'ReLU': nonlinear_1d}


# a tabular model with two inputs: numeric columns and one-hot categorical columns
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(7, 8)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(8, 1)

    def forward(self, x_num, x_cat):
        return self.linear2(self.relu(self.linear1(torch.cat((x_num, x_cat), dim=-1))))


batch_size = 4
model = Net().to(DEVICE)
x_num = torch.randn(batch_size, 3, device=DEVICE)
x_cat = torch.eye(4, device=DEVICE)[torch.randint(0, 4, (batch_size,), device=DEVICE)]
background = [torch.zeros(batch_size, 3, device=DEVICE), torch.zeros(batch_size, 4, device=DEVICE)]

e = PyTorchDeepExplainer(model, background)
shap_num, shap_cat = e.shap_values([x_num, x_cat])

with torch.no_grad():
    diff = (model(x_num, x_cat) - model(*background).mean(0)).squeeze(-1).cpu().numpy()
sums = shap_num.sum(-1) + shap_cat.sum(-1)
print("attributions sum:", np.round(sums, 4), "model diff:", np.round(diff, 4))
print("done")
