# source: https://github.com/Mayukhdeb/torch-dreams/issues/38 — dreamer.caricature(static=True) randomly crashes at loss.backward() with "RuntimeError: Trying to backward through the graph a second time ..." (only the resize branch of CaricatureLoss detached the hooked target y)
# fix-source: https://github.com/Mayukhdeb/torch-dreams/commit/2bc3abc104ec3a65770fb95033091d23ee4a9185 — maintainer's "Fix #38 detach y manually": cosine_dissimilarity detaches the target y on every call, not only when it had to be resized
# expect-kind: none
# fix: detach the hooked target y in CaricatureLoss.cosine_dissimilarity on every call, not only in the resize branch
import torch
import torch.nn as nn
import torch.nn.functional as F

from _device import DEVICE


def resize_4d_tensor_by_factor(x, height_factor, width_factor):
    return F.interpolate(x, scale_factor=(height_factor, width_factor), mode="bilinear")


def resize_4d_tensor_by_size(x, height, width):
    return F.interpolate(x, size=(height, width), mode="bilinear")


def uniform(a, b):
    return a + (b - a) * torch.rand(1).item()


class random_resize(nn.Module):
    def __init__(self, max_size_factor, min_size_factor):
        super().__init__()
        self.max_size_factor = max_size_factor
        self.min_size_factor = min_size_factor

    def forward(self, x):
        height_factor = uniform(self.min_size_factor, self.max_size_factor)
        width_factor = uniform(self.min_size_factor, self.max_size_factor)
        return resize_4d_tensor_by_factor(x, height_factor=height_factor, width_factor=width_factor)


class pair_random_resize(nn.Module):
    def __init__(self, max_size_factor, min_size_factor):
        super().__init__()
        self.max_size_factor = max_size_factor
        self.min_size_factor = min_size_factor

    def forward(self, x1, x2):
        height_factor = uniform(self.min_size_factor, self.max_size_factor)
        width_factor = uniform(self.min_size_factor, self.max_size_factor)
        x1 = resize_4d_tensor_by_factor(x1, height_factor=height_factor, width_factor=width_factor)
        x2 = resize_4d_tensor_by_factor(x2, height_factor=height_factor, width_factor=width_factor)
        return x1, x2


class Hook:
    def __init__(self, module):
        self.hook = module.register_forward_hook(self.hook_fn)

    def hook_fn(self, module, input, output):
        self.input = input
        self.output = output

    def close(self):
        self.hook.remove()


class CaricatureLoss(nn.Module):
    def __init__(self, power=1.0):
        super().__init__()
        self.power = power

    def cosine_dissimilarity(self, x, y, eps=1e-6):
        if x.shape != y.shape:
            # shapes differ (random resize of a static caricature): resize the target to match
            y = resize_4d_tensor_by_size(y.unsqueeze(0), height=x.shape[-2], width=x.shape[-1]).squeeze(0)
        y = y.detach()
        numerator = (x * y.detach()).sum()
        denominator = torch.sqrt((y ** 2).sum()) + eps
        cossim = numerator / denominator
        cossim = torch.maximum(torch.tensor(0.1).to(cossim.device), cossim)
        loss = -(cossim * numerator ** self.power)
        return loss

    def loss(self, x, y):
        return self.cosine_dissimilarity(x, y)

    def forward(self, layer_outputs, ideal_layer_outputs):
        assert len(layer_outputs) == len(ideal_layer_outputs)
        loss = 0.0
        for i in range(len(layer_outputs)):
            l = self.loss(layer_outputs[i], ideal_layer_outputs[i])
            loss += l
        return loss


class auto_image_param(nn.Module):
    def __init__(self, height, width, device, standard_deviation=0.01):
        super().__init__()
        self.param = nn.Parameter((torch.randn(1, 3, height, width) * standard_deviation).to(device))
        self.optimizer = None

    def forward(self, device):
        return torch.sigmoid(self.param.to(device))

    def get_optimizer(self, lr, weight_decay):
        self.optimizer = torch.optim.AdamW([self.param], lr=lr, weight_decay=weight_decay)

    def clip_grads(self, grad_clip=1.0):
        torch.nn.utils.clip_grad_norm_(self.param, grad_clip)


class dreamer:
    def __init__(self, model, device):
        self.model = model
        self.model.eval()
        self.device = device
        self.model.to(self.device)
        self.transforms = None

    def get_default_transforms(self, scale_max, scale_min):
        self.transforms = random_resize(max_size_factor=scale_max, min_size_factor=scale_min)

    def caricature(self, input_tensor, layers, power=1.0, iters=6, lr=9e-3, scale_max=1.2, scale_min=0.9,
                   weight_decay=1e-3, grad_clip=1.0, static=False):
        height, width = input_tensor.shape[-2], input_tensor.shape[-1]
        image_parameter = auto_image_param(height=height, width=width, device=self.device)
        image_parameter.get_optimizer(lr=lr, weight_decay=weight_decay)

        hooks = []
        for layer in layers:
            hooks.append(Hook(layer))

        caricature_loss = CaricatureLoss(power=power)

        if static == False:
            self.random_resize_pair = pair_random_resize(max_size_factor=scale_max, min_size_factor=scale_min)
        else:
            # static: collect the target layer outputs once and reuse them at every iteration
            self.get_default_transforms(scale_max=scale_max, scale_min=scale_min)
            model_out = self.model(input_tensor.to(self.device))

            ideal_layer_outputs = []
            for hook in hooks:
                out = hook.output[0]
                ideal_layer_outputs.append(out)

        for i in range(iters):
            image_parameter.optimizer.zero_grad()

            img = image_parameter.forward(device=self.device)

            if static == False:
                img_transformed, input_tensor_transformed = self.random_resize_pair(x1=img, x2=input_tensor)
            else:
                img_transformed = self.transforms(img)

            model_out = self.model(img_transformed)

            layer_outputs = []
            for hook in hooks:
                out = hook.output[0]
                layer_outputs.append(out)

            if static == False:
                model_out = self.model(input_tensor_transformed.to(self.device))
                ideal_layer_outputs = []
                for hook in hooks:
                    out = hook.output[0]
                    ideal_layer_outputs.append(out)

            loss = caricature_loss.forward(layer_outputs=layer_outputs, ideal_layer_outputs=ideal_layer_outputs)

            loss.backward()
            image_parameter.clip_grads(grad_clip=grad_clip)
            image_parameter.optimizer.step()

        for hook in hooks:
            hook.close()

        return image_parameter


model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
)
dreamy_boi = dreamer(model, device=DEVICE)

image_tensor = torch.rand(1, 3, 16, 16).to(DEVICE)
param = dreamy_boi.caricature(
    input_tensor=image_tensor,
    layers=[model[5]],
    power=1.2,
    static=True,
)
print("done")
