# source: https://github.com/ubc-vision/nf-soft-mining/issues/1 — issue "Several Issues about execution": LMC sampling with proposal_requires_grad=True fails with "RuntimeError: Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed)"
# fix-source: https://github.com/ubc-vision/nf-soft-mining/commit/cfd0c12b610643b0d07b6e2dac0f3079f33400c5 — maintainers' "fix backward error" (PR #3): t_dirs = chunk_rays.viewdirs[..., None, :].detach() in prop_sigma_fn
# expect-kind: none
# fix: the proposal networks see detached view directions (t_dirs = chunk_rays.viewdirs[..., None, :].detach()), so the estimator's own backward no longer frees the rays' graph that the radiance-field loss back-propagates into points_2d
import collections

import torch
import torch.nn.functional as F
from torch import nn
from _device import DEVICE

Rays = collections.namedtuple("Rays", ("origins", "viewdirs"))


def namedtuple_map(fn, tup):
    return type(tup)(*(None if x is None else fn(x) for x in tup))


# ---- a few nerfacc pieces, written small -------------------------------------------------------
def render_transmittance_from_density(t_starts, t_ends, sigmas):
    sigmas_dt = sigmas * (t_ends - t_starts)
    trans = torch.exp(-(torch.cumsum(sigmas_dt, dim=-1) - sigmas_dt))
    alphas = 1.0 - torch.exp(-sigmas_dt)
    return trans, alphas


def importance_sampling(t_vals, cdfs, num_samples, stratified):
    u = torch.linspace(0.0, 1.0, num_samples + 1, device=cdfs.device).expand(cdfs.shape[0], -1)
    if stratified:
        u = (u + torch.rand_like(u) / num_samples).clamp(max=1.0)
    cdfs = cdfs.contiguous()
    idx = torch.searchsorted(cdfs, u.contiguous(), right=True).clamp(1, cdfs.shape[-1] - 1)
    c0, c1 = cdfs.gather(-1, idx - 1), cdfs.gather(-1, idx)
    t0, t1 = t_vals.gather(-1, idx - 1), t_vals.gather(-1, idx)
    frac = ((u - c0) / (c1 - c0).clamp(min=1e-6)).clamp(0.0, 1.0)
    return t0 + frac * (t1 - t0)


def _pdf_loss(t_vals, cdfs, prop_t_vals, prop_cdfs):
    w = cdfs[..., 1:] - cdfs[..., :-1]
    lo = (torch.searchsorted(prop_t_vals.contiguous(), t_vals[..., :-1].contiguous(), right=True) - 1)
    hi = torch.searchsorted(prop_t_vals.contiguous(), t_vals[..., 1:].contiguous(), right=False)
    lo, hi = lo.clamp(0, prop_cdfs.shape[-1] - 1), hi.clamp(0, prop_cdfs.shape[-1] - 1)
    w_outer = prop_cdfs.gather(-1, hi) - prop_cdfs.gather(-1, lo)
    return torch.clip(w - w_outer, min=0) ** 2 / (w + 1e-7)


class PropNetEstimator(nn.Module):
    def __init__(self, optimizer=None, scheduler=None):
        super().__init__()
        self.optimizer, self.scheduler = optimizer, scheduler
        self.prop_cache = []

    @torch.no_grad()
    def sampling(self, prop_sigma_fns, prop_samples, num_samples, n_rays, near_plane, far_plane,
                 stratified=False, requires_grad=False):
        t_vals = torch.tensor([near_plane, far_plane], device=DEVICE).expand(n_rays, -1)
        cdfs = torch.tensor([0.0, 1.0], device=DEVICE).expand(n_rays, -1)
        for level_fn, level_samples in zip(prop_sigma_fns, prop_samples):
            t_vals = importance_sampling(t_vals, cdfs, level_samples, stratified)
            t_starts, t_ends = t_vals[..., :-1], t_vals[..., 1:]
            with torch.set_grad_enabled(requires_grad):
                sigmas = level_fn(t_starts, t_ends)
                trans, _ = render_transmittance_from_density(t_starts, t_ends, sigmas)
                cdfs = 1.0 - torch.cat([trans, torch.zeros_like(trans[:, :1])], dim=-1)
                if requires_grad:
                    self.prop_cache.append((t_vals, cdfs))
        t_vals = importance_sampling(t_vals, cdfs, num_samples, stratified)
        if requires_grad:
            self.prop_cache.append((t_vals, None))
        return t_vals[..., :-1], t_vals[..., 1:]

    @torch.enable_grad()
    def compute_loss(self, trans, loss_scaler=1.0):
        t_vals, _ = self.prop_cache.pop()
        cdfs = 1.0 - torch.cat([trans, torch.zeros_like(trans[:, :1])], dim=-1)
        cdfs = cdfs.detach()
        loss = 0.0
        while self.prop_cache:
            prop_t_vals, prop_cdfs = self.prop_cache.pop()
            loss += _pdf_loss(t_vals, cdfs, prop_t_vals, prop_cdfs).mean()
        return loss * loss_scaler

    @torch.enable_grad()
    def update_every_n_steps(self, trans, requires_grad=False, loss_scaler=1.0):
        if requires_grad:
            return self._update(trans=trans, loss_scaler=loss_scaler)
        return 0.0

    @torch.enable_grad()
    def _update(self, trans, loss_scaler=1.0):
        loss = self.compute_loss(trans, loss_scaler)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss


def get_proposal_requires_grad_fn(target=5.0, num_steps=1000):
    schedule = lambda s: min(s / num_steps, 1.0) * target
    steps_since_last_grad = 0

    def proposal_requires_grad_fn(step):
        nonlocal steps_since_last_grad
        requires_grad = steps_since_last_grad > schedule(step)
        if requires_grad:
            steps_since_last_grad = 0
        steps_since_last_grad += 1
        return requires_grad

    return proposal_requires_grad_fn


def rendering(t_starts, t_ends, rgb_sigma_fn, render_bkgd=None):
    rgbs, sigmas = rgb_sigma_fn(t_starts, t_ends, None)
    trans, alphas = render_transmittance_from_density(t_starts, t_ends, sigmas)
    weights = trans * alphas
    colors = (weights[..., None] * rgbs).sum(-2)
    opacities = weights.sum(-1, keepdim=True)
    depths = (weights * (t_starts + t_ends) / 2.0).sum(-1, keepdim=True)
    if render_bkgd is not None:
        colors = colors + render_bkgd * (1.0 - opacities)
    return colors, opacities, depths, {"weights": weights, "alphas": alphas, "trans": trans}


# ---- fields -------------------------------------------------------------------------------------
class NGPDensityField(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, positions):
        return F.softplus(self.mlp(positions))


class NGPRadianceField(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.base = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, hidden + 1))
        self.head = nn.Sequential(nn.Linear(hidden + 3, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def forward(self, positions, directions):
        h = self.base(positions)
        density, feat = F.softplus(h[..., :1]), h[..., 1:]
        rgb = torch.sigmoid(self.head(torch.cat([feat, directions], dim=-1)))
        return rgb, density


def render_image_with_propnet(radiance_field, proposal_networks, estimator, rays, num_samples,
                              num_samples_per_prop, near_plane, far_plane, render_bkgd=None,
                              proposal_requires_grad=False):
    num_rays, _ = rays.origins.shape

    def prop_sigma_fn(t_starts, t_ends, proposal_network):
        t_origins = chunk_rays.origins[..., None, :]
        t_dirs = chunk_rays.viewdirs[..., None, :].detach()
        positions = t_origins + t_dirs * (t_starts + t_ends)[..., None] / 2.0
        sigmas = proposal_network(positions)
        return sigmas.squeeze(-1)

    def rgb_sigma_fn(t_starts, t_ends, ray_indices):
        t_origins = chunk_rays.origins[..., None, :]
        t_dirs = chunk_rays.viewdirs[..., None, :].repeat_interleave(t_starts.shape[-1], dim=-2)
        positions = t_origins + t_dirs * (t_starts + t_ends)[..., None] / 2.0
        rgb, sigmas = radiance_field(positions, t_dirs)
        return rgb, sigmas.squeeze(-1)

    chunk = num_rays
    results = []
    for i in range(0, num_rays, chunk):
        chunk_rays = namedtuple_map(lambda r: r[i: i + chunk], rays)
        t_starts, t_ends = estimator.sampling(
            prop_sigma_fns=[lambda *args: prop_sigma_fn(*args, p) for p in proposal_networks],
            prop_samples=num_samples_per_prop, num_samples=num_samples, n_rays=chunk_rays.origins.shape[0],
            near_plane=near_plane, far_plane=far_plane, stratified=radiance_field.training,
            requires_grad=proposal_requires_grad)
        rgb, opacity, depth, extras = rendering(t_starts, t_ends, rgb_sigma_fn=rgb_sigma_fn, render_bkgd=render_bkgd)
        results.append([rgb, opacity, depth, extras])
    colors, opacities, depths = (torch.cat([r[k] for r in results], 0) for k in range(3))
    extras = {"trans": torch.cat([r[3]["trans"] for r in results], 0)}
    return colors, opacities, depths, extras


# ---- Langevin Monte Carlo pixel sampler and the dataset -------------------------------------------
class LMC(nn.Module):
    def __init__(self, images, num_rays, const_img_id, minpct=0.25, lossminpc=0.25, a=2e1, b=2e-2):
        super().__init__()
        self.num_rays, self.a, self.b = num_rays, a, b
        self.HEIGHT, self.WIDTH = images.shape[1], images.shape[2]
        self.const_img_id = const_img_id
        self.rand_ten = torch.empty((num_rays, 2), device=DEVICE)
        self.noise = torch.empty((num_rays, 2), device=DEVICE)
        self.u_num = int(minpct * num_rays)
        self.reinit = int(lossminpc * num_rays)
        self.prev_samples = torch.rand(num_rays, 2, device=DEVICE)
        self.HW = torch.tensor([self.HEIGHT - 1, self.WIDTH - 1], device=DEVICE, dtype=torch.float32)

    def forward(self, net_grad, loss_per_pix):
        if net_grad is not None:
            with torch.no_grad():
                self.noise.normal_(mean=0.0, std=1.0)
                self.rand_ten.uniform_()
                net_grad.mul_(self.a).add_(self.noise, alpha=self.b)
                self.prev_samples.add_(net_grad)
                threshold, _ = torch.topk(loss_per_pix, self.reinit + 1, largest=False)
                mask = torch.cat([self.prev_samples < 0, self.prev_samples > 1,
                                  loss_per_pix.unsqueeze(1) <= threshold[-1]], 1).sum(1)
                bound_idxs = torch.where(mask)[0]
                self.prev_samples[-self.u_num:].copy_(self.rand_ten[-self.u_num:])
                if bound_idxs.shape[0] > 0:
                    self.prev_samples[bound_idxs] = torch.rand(bound_idxs.shape[0], 2, device=DEVICE)
                self.prev_samples.clamp_(min=0.0, max=1.0)
        point2d = self.prev_samples * self.HW
        return point2d.round_()


class SubjectLoader:
    def __init__(self, num_rays, height=8, width=8):
        self.num_rays, self.HEIGHT, self.WIDTH = num_rays, height, width
        self.images = torch.rand(1, height, width, 4, device=DEVICE)
        self.camtoworlds = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 3.0]]],
                                        device=DEVICE)
        self.K = torch.tensor([[8.0, 0.0, 4.0], [0.0, 8.0, 4.0], [0.0, 0.0, 1.0]], device=DEVICE)
        self.const_img_id = torch.zeros(num_rays, dtype=torch.long, device=DEVICE)
        self.training = True
        self.lmc = LMC(images=self.images, num_rays=num_rays, const_img_id=self.const_img_id)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index, net_grad=None, loss_per_pix=None):
        data = self.fetch_data_lmc(net_grad=net_grad, loss_per_pix=loss_per_pix)
        return self.preprocess(data)

    def preprocess(self, data):
        rgba, rays = data["rgba"], data["rays"]
        pixels, alpha = torch.split(rgba, [3, 1], dim=-1)
        color_bkgd = torch.rand(3, device=DEVICE)
        pixels = pixels * alpha + color_bkgd * (1.0 - alpha)
        return {"pixels": pixels, "rays": rays, "color_bkgd": color_bkgd,
                **{k: v for k, v in data.items() if k not in ["rgba", "rays"]}}

    def simages(self, image_id, y, x):
        return self.images[image_id, y.long(), x.long()]

    def get_origin_viewdirs(self, image_id, y, x):
        c2w = self.camtoworlds[image_id]
        camera_dirs = F.pad(torch.stack([(x - self.K[0, 2] + 0.5) / self.K[0, 0],
                                         (y - self.K[1, 2] + 0.5) / self.K[1, 1] * -1.0], dim=-1),
                            (0, 1), value=-1.0)
        directions = (camera_dirs[:, None, :] * c2w[:, :3, :3]).sum(dim=-1)
        origins = torch.broadcast_to(c2w[:, :3, -1], directions.shape)
        viewdirs = directions / torch.linalg.norm(directions, dim=-1, keepdims=True)
        return origins, viewdirs

    def fetch_data_lmc(self, net_grad=None, loss_per_pix=None):
        points_2d = self.lmc(net_grad, loss_per_pix)
        points_2d.round_()
        rgba = self.simages(self.const_img_id, points_2d[:, 0], points_2d[:, 1])
        points_2d.requires_grad = True
        x, y = points_2d[:, 1], points_2d[:, 0]
        origins, viewdirs = self.get_origin_viewdirs(self.const_img_id, y, x)
        rays = Rays(origins=origins.reshape(self.num_rays, 3), viewdirs=viewdirs.reshape(self.num_rays, 3))
        return {"rgba": rgba.reshape(self.num_rays, 4), "rays": rays, "x": x, "y": y,
                "image_id": self.const_img_id, "points_2d": points_2d}


class NeRFLoss(nn.Module):
    def __init__(self, lambda_opacity=0.0, lambda_distortion=0.0):
        super().__init__()
        self.lambda_opacity, self.lambda_distortion = lambda_opacity, lambda_distortion

    def forward(self, results, target, opacity=None, distkwargs=None):
        return {"rgb": (results - target) ** 2}


# ---- training (train_ngp_nerf_prop.py, sampling_type == "lmc") -----------------------------------
max_steps = 4
near_plane, far_plane = 2.0, 4.0
num_samples, num_samples_per_prop = 8, [8]
alpha = 0.6

train_dataset = SubjectLoader(num_rays=16)
proposal_networks = [NGPDensityField().to(DEVICE)]
prop_optimizer = torch.optim.Adam([p for net in proposal_networks for p in net.parameters()], lr=1e-2, eps=1e-15)
estimator = PropNetEstimator(prop_optimizer, None).to(DEVICE)
radiance_field = NGPRadianceField().to(DEVICE)
optimizer = torch.optim.Adam(radiance_field.parameters(), lr=1e-2, eps=1e-15)
proposal_requires_grad_fn = get_proposal_requires_grad_fn()
loss_fn = NeRFLoss()

gradval = None
lossperpix_prev = None
for step in range(max_steps + 1):
    radiance_field.train()
    for p in proposal_networks:
        p.train()
    estimator.train()

    i = torch.randint(0, len(train_dataset), (1,)).item()
    data = train_dataset.__getitem__(i, net_grad=gradval, loss_per_pix=lossperpix_prev)
    render_bkgd, rays, pixels = data["color_bkgd"], data["rays"], data["pixels"]

    proposal_requires_grad = proposal_requires_grad_fn(step)
    rgb, acc, depth, extras = render_image_with_propnet(
        radiance_field, proposal_networks, estimator, rays, num_samples=num_samples,
        num_samples_per_prop=num_samples_per_prop, near_plane=near_plane, far_plane=far_plane,
        render_bkgd=render_bkgd, proposal_requires_grad=proposal_requires_grad)
    estimator.update_every_n_steps(extras["trans"], proposal_requires_grad, loss_scaler=1024)

    loss_d = loss_fn(rgb, pixels, acc)
    loss_per_pix = loss_d["rgb"].mean(-1)
    imp_loss = torch.abs(rgb - pixels).mean(-1).detach()
    correction = 1.0 / torch.clip(imp_loss, min=torch.finfo(torch.float16).eps).detach()
    r = min((step / 1000), alpha)
    correction.pow_(r)
    correction.clamp_(min=0.2, max=(correction.mean() + correction.std()).item())
    loss_per_pix.mul_(correction)
    loss = loss_per_pix.mean()

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    with torch.no_grad():
        net_grad = data["points_2d"].grad.detach()
        loss_per_pix = loss_per_pix.detach()
        net_grad = net_grad / ((correction * loss_per_pix).unsqueeze(1) + torch.finfo(net_grad.dtype).eps)
        gradval = net_grad
        lossperpix_prev = loss_per_pix
print("done")
