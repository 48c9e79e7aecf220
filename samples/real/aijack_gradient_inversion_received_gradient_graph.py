# source: https://github.com/Koukyosyumei/AIJack/issues/159 — issue: the "Reconstruct Single Data" gradient inversion tutorial (FedAVG server wrapped by GradientInversionAttackServerManager) fails after local training with "Trying to backward through the graph a second time", from distance.backward in the attack's closure
# fix-source: https://github.com/Koukyosyumei/AIJack/commit/517f4e4d3e010c66e75ea447712b9937262f09bf — maintainer's fix (merged as #160, 344f171): the server wrapper's attack() detaches the received client gradients, `[cg.detach() for cg in received_gradient]`, before handing them to the attacker
# expect-kind: second-backward
# expect-culprit: received_gradient
import copy

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from _device import DEVICE


# ---- aijack.attack.inversion.utils -------------------------------------------------------------
def l2(fake_gradients, received_gradients, gradient_ignore_pos):
    distance = 0
    for i, (f_g, c_g) in enumerate(zip(fake_gradients, received_gradients)):
        if i not in gradient_ignore_pos:
            distance += ((f_g - c_g) ** 2).sum()
    return distance


def _initialize_x(x_shape, batch_size, device):
    return torch.randn((batch_size,) + (x_shape), requires_grad=True, device=device)


def _initialize_label(y_shape, batch_size, device):
    fake_label = torch.randn((batch_size, y_shape), requires_grad=True, device=device)
    return fake_label.to(device)


def _setup_attack(x_shape, y_shape, optimizer_class, optimize_label, device, received_gradients,
                  batch_size, **kwargs):
    fake_x = _initialize_x(x_shape, batch_size, device)
    fake_label = _initialize_label(y_shape, batch_size, device)
    optimizer = optimizer_class([fake_x, fake_label], **kwargs)
    return fake_x, fake_label, optimizer


def _generate_fake_gradients(target_model, lossfunc, optimize_label, fake_x, fake_label):
    fake_pred = target_model(fake_x)
    loss = lossfunc(fake_pred, fake_label.softmax(dim=-1))
    fake_gradients = torch.autograd.grad(loss, target_model.parameters(), create_graph=True, allow_unused=True)
    return fake_pred, fake_gradients


# ---- aijack.attack.inversion.gradientinversion -------------------------------------------------
class GradientInversion_Attack:
    def __init__(self, target_model, x_shape, y_shape=None, optimize_label=True, gradient_ignore_pos=[],
                 num_iteration=100, optimizer_class=torch.optim.LBFGS, lossfunc=nn.CrossEntropyLoss(),
                 distancefunc=l2, distancename=None, device="cpu", log_interval=10, seed=0,
                 early_stopping=50, **kwargs):
        self.target_model = target_model
        self.x_shape = x_shape
        self.y_shape = list(target_model.parameters())[-1].shape[0] if y_shape is None else y_shape
        self.optimize_label = optimize_label
        self.gradient_ignore_pos = gradient_ignore_pos
        self.num_iteration = num_iteration
        self.lossfunc = lossfunc
        self.distancefunc = l2 if distancename == "l2" else distancefunc
        self.optimizer_class = optimizer_class
        self.device = device
        self.log_interval = log_interval
        self.seed = seed
        self.early_stopping = early_stopping
        self.kwargs = kwargs
        torch.manual_seed(seed)

    def _setup_closure(self, optimizer, fake_x, fake_label, received_gradients):
        def closure():
            optimizer.zero_grad()
            fake_pred, fake_gradients = _generate_fake_gradients(
                self.target_model, self.lossfunc, self.optimize_label, fake_x, fake_label)
            distance = self.distancefunc(fake_gradients, received_gradients, self.gradient_ignore_pos)
            distance_val = distance.item()
            distance.backward(retain_graph=False)
            return distance_val

        return closure

    def reset_seed(self, seed):
        self.seed = seed
        torch.manual_seed(seed)

    def attack(self, received_gradients, batch_size=1):
        fake_x, fake_label, optimizer = _setup_attack(
            self.x_shape, self.y_shape, self.optimizer_class, self.optimize_label, self.device,
            received_gradients, batch_size, **self.kwargs)
        num_of_not_improve_round = 0
        best_distance = float("inf")
        for i in range(1, self.num_iteration + 1):
            closure = self._setup_closure(optimizer, fake_x, fake_label, received_gradients)
            distance = optimizer.step(closure)
            if best_distance > distance:
                best_fake_x = fake_x.detach().clone()
                best_fake_label = fake_label.detach().clone()
                best_distance = distance
                num_of_not_improve_round = 0
            else:
                num_of_not_improve_round += 1
            if num_of_not_improve_round > self.early_stopping:
                break
        return best_fake_x, best_fake_label


# ---- aijack.collaborative ----------------------------------------------------------------------
class BaseClient(torch.nn.Module):
    def __init__(self, model, user_id=0):
        super(BaseClient, self).__init__()
        self.model = model
        self.user_id = user_id

    def forward(self, x):
        return self.model(x)


class BaseServer(torch.nn.Module):
    def __init__(self, clients, server_model, server_id=0):
        super(BaseServer, self).__init__()
        self.clients = clients
        self.server_id = server_id
        self.server_model = server_model
        self.num_clients = len(clients)


class SGDFLOptimizer:
    def __init__(self, parameters, lr=0.01, weight_decay=0.0):
        self.parameters = list(parameters)
        self.lr = lr
        self.weight_decay = weight_decay
        self.t = 1

    def step(self, grads):
        for param, grad in zip(self.parameters, grads):
            param.data -= self.lr * grad
        self.t += 1


class FedAVGClient(BaseClient):
    def __init__(self, model, user_id=0, lr=0.1, send_gradient=True, server_side_update=True, device="cpu"):
        super(FedAVGClient, self).__init__(model, user_id=user_id)
        self.lr = lr
        self.send_gradient = send_gradient
        self.server_side_update = server_side_update
        self.device = device
        self.prev_parameters = []
        for param in self.model.parameters():
            self.prev_parameters.append(copy.deepcopy(param))
        self.initialized = False

    def upload_gradients(self):
        gradients = []
        for param, prev_param in zip(self.model.parameters(), self.prev_parameters):
            gradients.append((prev_param - param) / self.lr)
        return gradients

    def download(self, new_global_model):
        self.model.load_state_dict(new_global_model)
        if not self.initialized:
            self.initialized = True
        self.prev_parameters = []
        for param in self.model.parameters():
            self.prev_parameters.append(copy.deepcopy(param))

    def local_train(self, local_epoch, criterion, trainloader, optimizer, communication_id=0):
        for i in range(local_epoch):
            for _, data in enumerate(trainloader, 0):
                inputs, labels = data
                inputs = inputs.to(self.device)
                labels = labels.to(self.device)
                optimizer.zero_grad()
                self.zero_grad()
                outputs = self(inputs)
                loss = criterion(outputs, labels)
                loss.backward()
                optimizer.step()


class FedAVGServer(BaseServer):
    def __init__(self, clients, global_model, server_id=0, lr=0.1, server_side_update=True, device="cpu"):
        super(FedAVGServer, self).__init__(clients, global_model, server_id=server_id)
        self.lr = lr
        self.optimizer = SGDFLOptimizer(self.server_model.parameters(), lr=self.lr)
        self.server_side_update = server_side_update
        self.device = device
        self.uploaded_gradients = []
        self.force_send_model_state_dict = True
        self.weight = [1.0 / self.num_clients] * self.num_clients

    def receive(self, use_gradients=True):
        self.receive_local_gradients()

    def receive_local_gradients(self):
        self.uploaded_gradients = [c.upload_gradients() for c in self.clients]

    def update_from_gradients(self):
        self.aggregated_gradients = [torch.zeros_like(params) for params in self.server_model.parameters()]
        len_gradients = len(self.aggregated_gradients)
        for i, gradients in enumerate(self.uploaded_gradients):
            for gradient_id in range(len_gradients):
                self.aggregated_gradients[gradient_id] = (
                    gradients[gradient_id] * self.weight[i] + self.aggregated_gradients[gradient_id])
        if self.server_side_update:
            self.optimizer.step(self.aggregated_gradients)

    def distribute(self):
        for client in self.clients:
            client.download(self.server_model.state_dict())


class FedAVGAPI:
    def __init__(self, server, clients, criterion, local_optimizers, local_dataloaders,
                 num_communication=1, local_epoch=1, use_gradients=True, device="cpu"):
        self.server = server
        self.clients = clients
        self.criterion = criterion
        self.local_optimizers = local_optimizers
        self.local_dataloaders = local_dataloaders
        self.num_communication = num_communication
        self.local_epoch = local_epoch
        self.use_gradients = use_gradients
        self.device = device
        self.client_num = len(self.clients)

    def local_train(self, i):
        for client_idx in range(self.client_num):
            self.clients[client_idx].local_train(self.local_epoch, self.criterion,
                                                 self.local_dataloaders[client_idx],
                                                 self.local_optimizers[client_idx], communication_id=i)

    def run(self):
        self.server.force_send_model_state_dict = True
        self.server.distribute()
        self.server.force_send_model_state_dict = False
        for i in range(self.num_communication):
            self.local_train(i)
            self.server.receive(use_gradients=self.use_gradients)
            self.server.update_from_gradients()
            self.server.distribute()


# ---- aijack.attack.inversion.gradientinversion_server ------------------------------------------
def _default_gradinent_inversion_attack_on_receive(self):
    tmp_result = []
    for s in range(self.num_trial_per_communication):
        self.reset_seed(s)
        try:
            tmp_result.append(self.attack())
        except OverflowError:
            continue
    self.attack_results.append(tmp_result)


def attach_gradient_inversion_attack_to_server(cls, x_shape,
                                               attack_function_on_receive=_default_gradinent_inversion_attack_on_receive,
                                               num_trial_per_communication=1, target_client_id=0,
                                               **gradinvattack_kwargs):
    class GradientInversionServerWrapper(cls):
        def __init__(self, *args, **kwargs):
            super(GradientInversionServerWrapper, self).__init__(*args, **kwargs)
            self.target_client_id = target_client_id
            self.num_trial_per_communication = num_trial_per_communication
            self.attacker = GradientInversion_Attack(self.server_model, x_shape, **gradinvattack_kwargs)
            self.attack_results = []

        def receive(self, *args, **kwargs):
            super(GradientInversionServerWrapper, self).receive(*args, **kwargs)
            attack_function_on_receive(self)

        def attack(self, **kwargs):
            received_gradient = self.uploaded_gradients[self.target_client_id]  # culprit
            return self.attacker.attack(received_gradient, **kwargs)

        def reset_seed(self, seed):
            self.attacker.reset_seed(seed)

    return GradientInversionServerWrapper


class GradientInversionAttackServerManager:
    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs

    def attach(self, cls):
        return attach_gradient_inversion_attack_to_server(cls, *self.args, **self.kwargs)


# ---- the tutorial ------------------------------------------------------------------------------
class LeNet(nn.Module):
    def __init__(self, channel=3, hideen=768, num_classes=10):
        super(LeNet, self).__init__()
        act = nn.Sigmoid
        self.body = nn.Sequential(
            nn.Conv2d(channel, 12, kernel_size=5, padding=5 // 2, stride=2),
            nn.BatchNorm2d(12),
            act(),
            nn.Conv2d(12, 12, kernel_size=5, padding=5 // 2, stride=2),
            nn.BatchNorm2d(12),
            act(),
            nn.Conv2d(12, 12, kernel_size=5, padding=5 // 2, stride=1),
            nn.BatchNorm2d(12),
            act(),
        )
        self.fc = nn.Sequential(nn.Linear(hideen, num_classes))

    def forward(self, x):
        out = self.body(x)
        out = out.view(out.size(0), -1)
        out = self.fc(out)
        return out


shape_img = (8, 8)
num_classes = 10
channel = 1
hidden = 48

x = torch.rand(1, channel, *shape_img, device=DEVICE)
y = torch.tensor([3], device=DEVICE)
criterion = nn.CrossEntropyLoss()

manager = GradientInversionAttackServerManager(
    (1, 8, 8),
    num_trial_per_communication=2,
    log_interval=0,
    num_iteration=2,
    distancename="l2",
    device=DEVICE,
    lr=1.0,
    max_iter=3,
)
DLGFedAVGServer = manager.attach(FedAVGServer)

client = FedAVGClient(LeNet(channel=channel, hideen=hidden, num_classes=num_classes).to(DEVICE), lr=1.0, device=DEVICE)
server = DLGFedAVGServer([client], LeNet(channel=channel, hideen=hidden, num_classes=num_classes).to(DEVICE),
                         lr=1.0, device=DEVICE)

local_dataloaders = [DataLoader(TensorDataset(x, y))]
local_optimizers = [optim.SGD(client.parameters(), lr=1.0)]

api = FedAVGAPI(server, [client], criterion, local_optimizers, local_dataloaders,
                num_communication=1, local_epoch=1, use_gradients=True, device=DEVICE)
api.run()

print("done")
