# source: https://github.com/open-mmlab/mmcv/issues/1379 — GradientCumulativeOptimizerHook added under custom_hooks while the base schedule still sets optimizer_config: the runner registers both optimizer hooks, OptimizerHook back-propagates runner.outputs['loss'] and GradientCumulativeOptimizerHook back-propagates it again, "Trying to backward through the graph a second time"
# fix-source: https://github.com/open-mmlab/mmcv/issues/1379 — maintainer's answer (zhouzaida): both hooks are set; configure the cumulative hook as the optimizer hook, optimizer_config = dict(type="GradientCumulativeOptimizerHook", cumulative_iters=4), instead of adding it to custom_hooks
# expect-kind: second-backward
# expect-culprit: outputs
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import clip_grad
from _device import DEVICE

PRIORITY = {'VERY_HIGH': 10, 'HIGH': 30, 'ABOVE_NORMAL': 40, 'NORMAL': 50, 'LOW': 70, 'VERY_LOW': 90}
HOOKS = {}


def register_module(cls):
    HOOKS[cls.__name__] = cls
    return cls


def build_from_cfg(cfg, registry):
    args = dict(cfg)
    obj_type = args.pop('type')
    return registry[obj_type](**args)


class Hook:
    def after_train_iter(self, runner):
        pass

    def every_n_iters(self, runner, n):
        return (runner.iter + 1) % n == 0 if n > 0 else False

    def is_last_iter(self, runner):
        return runner.iter + 1 == runner._max_iters


@register_module
class OptimizerHook(Hook):
    def __init__(self, grad_clip=None):
        self.grad_clip = grad_clip

    def clip_grads(self, params):
        params = list(filter(lambda p: p.requires_grad and p.grad is not None, params))
        if len(params) > 0:
            return clip_grad.clip_grad_norm_(params, **self.grad_clip)

    def after_train_iter(self, runner):
        runner.optimizer.zero_grad()
        runner.outputs['loss'].backward()
        if self.grad_clip is not None:
            self.clip_grads(runner.model.parameters())
        runner.optimizer.step()


@register_module
class GradientCumulativeOptimizerHook(OptimizerHook):
    def __init__(self, cumulative_iters=1, **kwargs):
        super(GradientCumulativeOptimizerHook, self).__init__(**kwargs)
        self.cumulative_iters = cumulative_iters
        self.divisible_iters = 0
        self.remainder_iters = 0
        self.initialized = False

    def _init(self, runner):
        residual_iters = runner.max_iters - runner.iter
        self.divisible_iters = residual_iters // self.cumulative_iters * self.cumulative_iters
        self.remainder_iters = residual_iters - self.divisible_iters
        self.initialized = True

    def after_train_iter(self, runner):
        if not self.initialized:
            self._init(runner)
        if runner.iter < self.divisible_iters:
            loss_factor = self.cumulative_iters
        else:
            loss_factor = self.remainder_iters
        loss = runner.outputs['loss']
        loss = loss / loss_factor
        loss.backward()
        if self.every_n_iters(runner, self.cumulative_iters) or self.is_last_iter(runner):
            if self.grad_clip is not None:
                self.clip_grads(runner.model.parameters())
            runner.optimizer.step()
            runner.optimizer.zero_grad()


class EpochBasedRunner:
    def __init__(self, model, optimizer, max_epochs):
        self.model = model
        self.optimizer = optimizer
        self._max_epochs = max_epochs
        self._hooks = []
        self._iter = 0
        self._epoch = 0
        self.outputs = None

    @property
    def iter(self):
        return self._iter

    @property
    def max_iters(self):
        return self._max_iters

    def register_hook(self, hook, priority='NORMAL'):
        priority = PRIORITY[priority]
        hook.priority = priority
        inserted = False
        for i in range(len(self._hooks) - 1, -1, -1):
            if priority >= self._hooks[i].priority:
                self._hooks.insert(i + 1, hook)
                inserted = True
                break
        if not inserted:
            self._hooks.insert(0, hook)

    def register_hook_from_cfg(self, hook_cfg):
        hook_cfg = hook_cfg.copy()
        priority = hook_cfg.pop('priority', 'NORMAL')
        self.register_hook(build_from_cfg(hook_cfg, HOOKS), priority=priority)

    def call_hook(self, fn_name):
        for hook in self._hooks:
            getattr(hook, fn_name)(self)

    def register_optimizer_hook(self, optimizer_config):
        if optimizer_config is None:
            return
        optimizer_config = dict(optimizer_config)
        optimizer_config.setdefault('type', 'OptimizerHook')
        self.register_hook(build_from_cfg(optimizer_config, HOOKS), priority='ABOVE_NORMAL')

    def register_custom_hooks(self, custom_config):
        if custom_config is None:
            return
        for item in custom_config:
            self.register_hook_from_cfg(item)

    def register_training_hooks(self, optimizer_config=None, custom_hooks_config=None):
        self.register_optimizer_hook(optimizer_config)
        self.register_custom_hooks(custom_hooks_config)

    def run_iter(self, data_batch, train_mode, **kwargs):
        outputs = self.model.train_step(data_batch, self.optimizer, **kwargs)  # culprit
        self.outputs = outputs

    def train(self, data_loader, **kwargs):
        self.model.train()
        self.data_loader = data_loader
        self._max_iters = self._max_epochs * len(self.data_loader)
        for i, data_batch in enumerate(self.data_loader):
            self._inner_iter = i
            self.run_iter(data_batch, train_mode=True, **kwargs)
            self.call_hook('after_train_iter')
            self._iter += 1
        self._epoch += 1


class TinyDetector(nn.Module):
    """Stands in for an mmdet detector: forward returns a dict of losses."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.cls_head = nn.Linear(16, 3)
        self.bbox_head = nn.Linear(16, 4)

    def forward(self, img, gt_labels, gt_bboxes):
        feats = self.backbone(img).flatten(1)
        return dict(loss_cls=F.cross_entropy(self.cls_head(feats), gt_labels),
                    loss_bbox=F.l1_loss(self.bbox_head(feats), gt_bboxes))

    def _parse_losses(self, losses):
        log_vars = {name: value.mean() for name, value in losses.items()}
        loss = sum(_value for _key, _value in log_vars.items() if 'loss' in _key)
        log_vars['loss'] = loss
        return loss, {k: v.item() for k, v in log_vars.items()}

    def train_step(self, data, optimizer):
        losses = self(**data)
        loss, log_vars = self._parse_losses(losses)
        return dict(loss=loss, log_vars=log_vars, num_samples=len(data['img']))


# configs/_base_/schedules/schedule_1x.py, then the user's config
optimizer = dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.0001)
optimizer_config = dict(grad_clip=None)
custom_hooks = [dict(type="GradientCumulativeOptimizerHook", cumulative_iters=4)]

model = TinyDetector().to(DEVICE)
optim = torch.optim.SGD(model.parameters(), lr=optimizer['lr'], momentum=optimizer['momentum'],
                        weight_decay=optimizer['weight_decay'])
data_loader = [dict(img=torch.randn(2, 3, 8, 8, device=DEVICE),
                    gt_labels=torch.randint(0, 3, (2,), device=DEVICE),
                    gt_bboxes=torch.rand(2, 4, device=DEVICE)) for _ in range(4)]

runner = EpochBasedRunner(model, optim, max_epochs=1)
runner.register_training_hooks(optimizer_config, custom_hooks_config=custom_hooks)
runner.train(data_loader)
print("done")
