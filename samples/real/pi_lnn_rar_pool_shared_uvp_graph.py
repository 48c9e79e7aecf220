# source: https://github.com/latteine1217/pi-lnn/blob/4c76b6b6e5325e8fff2de374acef6640f6e73951/tests/test_rar_pool_autograd.py — EXP-272 (first run with physics_collocation_strategy="rar") crashed at the first RAR pool update in _rar_update_pool -> _g1 with "RuntimeError: Trying to backward through the graph a second time"; u/v/p are slices of one uvp forward
# fix-source: https://github.com/latteine1217/pi-lnn/commit/4c76b6b6e5325e8fff2de374acef6640f6e73951 — author's fix: _g1 takes a retain flag; the u and v first-order grads use retain_graph=True and only the last (p) grad frees the shared graph
# expect-kind: second-backward
# expect-culprit: uvp
import torch
import torch.nn as nn

from _device import DEVICE


class KolmogorovDataset:
    """Tiny stand-in: K sensors of (u, v) over T snapshots, plus a collocation sampler."""

    re_norm = 0.5

    def __init__(self, n_sensors=6, n_time=4):
        self.sensor_pos = torch.rand(n_sensors, 2)
        self.sensor_time = torch.linspace(0.0, 1.0, n_time)
        self.sensor_vals = 0.1 * torch.randn(n_time, n_sensors, 2)

    def sample_physics_points(self, n, t_max=None, strategy="random"):
        xy = torch.rand(n, 2)
        t = torch.rand(n) * float(t_max if t_max is not None else 1.0)
        return xy, t


class QueryDecoder(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(3 + d_model, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.out_uvp = nn.Linear(32, 3)

    def forward_uvp(self, xy, t_q, h_states, s_time, sensor_pos):
        ctx = h_states.mean(dim=0, keepdim=True).expand(xy.shape[0], -1)
        z = self.trunk(torch.cat([xy, t_q[:, None], ctx], dim=1))
        return self.out_uvp(z)  # [N, 3] = (u, v, p)


class LiquidOperator(nn.Module):
    def __init__(self, d_model=16):
        super().__init__()
        self.sensor_enc = nn.Linear(2 + 2 + 1 + 1, d_model)
        self.query_decoder = QueryDecoder(d_model)

    def encode(self, sensor_vals, sensor_pos, re_norm, sensor_time):
        T, K, _ = sensor_vals.shape
        pos = sensor_pos[None].expand(T, K, 2)
        tt = sensor_time[:, None, None].expand(T, K, 1)
        re = torch.full((T, K, 1), float(re_norm), device=sensor_vals.device)
        h = torch.tanh(self.sensor_enc(torch.cat([sensor_vals, pos, tt, re], dim=-1)))
        return h.mean(dim=1), sensor_time  # h_states [T, d], s_time [T]


def make_lnn_model_fn_uvp(net, sensor_vals, sensor_pos, re_norm, sensor_time, device):
    h_states, s_time = net.encode(sensor_vals, sensor_pos, re_norm, sensor_time)

    def model_fn_uvp(xyt):
        xyt_d = xyt.to(device)
        return net.query_decoder.forward_uvp(xyt_d[:, :2], xyt_d[:, 2], h_states, s_time, sensor_pos)

    return model_fn_uvp


def _grad(y, x):
    grad = torch.autograd.grad(y, x, torch.ones_like(y), create_graph=True, allow_unused=True)[0]
    return grad if grad is not None else torch.zeros_like(x)


def unsteady_ns_residuals(uvp_fn, xyt, re, k_f=4.0, A=0.1, domain_length=1.0):
    uvp = uvp_fn(xyt)
    u, v, p = uvp[:, 0:1], uvp[:, 1:2], uvp[:, 2:3]
    u_xyt, v_xyt, p_xyt = _grad(u, xyt), _grad(v, xyt), _grad(p, xyt)
    du_dx, du_dy, du_dt = u_xyt[:, 0:1], u_xyt[:, 1:2], u_xyt[:, 2:3]
    dv_dx, dv_dy, dv_dt = v_xyt[:, 0:1], v_xyt[:, 1:2], v_xyt[:, 2:3]
    dp_dx, dp_dy = p_xyt[:, 0:1], p_xyt[:, 1:2]
    du_dx2 = _grad(du_dx, xyt)[:, 0:1]
    du_dy2 = _grad(du_dy, xyt)[:, 1:2]
    dv_dx2 = _grad(dv_dx, xyt)[:, 0:1]
    dv_dy2 = _grad(dv_dy, xyt)[:, 1:2]
    nu = 1.0 / float(re)
    forcing_x = A * torch.sin((2.0 * torch.pi * k_f / domain_length) * xyt[:, 1:2])
    mom_u = du_dt + u * du_dx + v * du_dy + dp_dx - nu * (du_dx2 + du_dy2) - forcing_x
    mom_v = dv_dt + u * dv_dx + v * dv_dy + dp_dy - nu * (dv_dx2 + dv_dy2)
    cont = du_dx + dv_dy
    return mom_u, mom_v, cont


def _rar_update_pool(net, datasets, sensor_vals_list, sensor_pos_list, sensor_time_list,
                     n_select, pool_size, t_max, k_f, A, domain_length, device, exploration_ratio=0.2):
    """Residual Adaptive Refinement: keep the top-residual points of a large candidate pool."""
    n_top = max(1, round(n_select * (1.0 - exploration_ratio)))
    n_rand = n_select - n_top
    kw = 2.0 * torch.pi * float(k_f) / float(domain_length)
    result = []
    net.eval()
    for i, ds in enumerate(datasets):
        xy, t = ds.sample_physics_points(n=pool_size, t_max=t_max, strategy="random")
        xyt_pool = torch.cat([xy, t[:, None]], dim=1).to(device).requires_grad_(True)
        uvp_fn = make_lnn_model_fn_uvp(
            net, sensor_vals_list[i], sensor_pos_list[i],
            re_norm=ds.re_norm, sensor_time=sensor_time_list[i], device=device,
        )
        uvp = uvp_fn(xyt_pool)  # culprit
        u = uvp[:, 0:1]
        v = uvp[:, 1:2]
        p = uvp[:, 2:3]

        def _g1(y):
            g = torch.autograd.grad(
                y, xyt_pool, torch.ones_like(y),
                create_graph=False, allow_unused=True,
            )[0]
            return g if g is not None else torch.zeros_like(xyt_pool)

        u_xyt = _g1(u)
        v_xyt = _g1(v)
        p_xyt = _g1(p)

        du_dx = u_xyt[:, 0:1]; du_dy = u_xyt[:, 1:2]; du_dt = u_xyt[:, 2:3]
        dv_dx = v_xyt[:, 0:1]; dv_dy = v_xyt[:, 1:2]; dv_dt = v_xyt[:, 2:3]
        dp_dx = p_xyt[:, 0:1]; dp_dy = p_xyt[:, 1:2]

        forcing = float(A) * torch.sin(kw * xyt_pool[:, 1:2]).detach()
        mom_u = du_dt + u.detach() * du_dx + v.detach() * du_dy + dp_dx - forcing
        mom_v = dv_dt + u.detach() * dv_dx + v.detach() * dv_dy + dp_dy
        cont = du_dx + dv_dy

        res_mag = (mom_u.detach() ** 2 + mom_v.detach() ** 2 + cont.detach() ** 2).squeeze(-1)
        _, top_idx = torch.topk(res_mag, n_top)
        selected = xyt_pool[top_idx].detach()
        if n_rand > 0:
            rxy, rt = ds.sample_physics_points(n=n_rand, t_max=t_max, strategy="random")
            selected = torch.cat([selected, torch.cat([rxy, rt[:, None]], dim=1).to(device)], dim=0)
        result.append(selected)
    net.train()
    return result


def train_lnn_kolmogorov(args):
    device = DEVICE
    datasets = [KolmogorovDataset(), KolmogorovDataset()]
    sensor_vals_list = [ds.sensor_vals.to(device) for ds in datasets]
    sensor_pos_list = [ds.sensor_pos.to(device) for ds in datasets]
    sensor_time_list = [ds.sensor_time.to(device) for ds in datasets]

    net = LiquidOperator().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    _is_rar = args["physics_collocation_strategy"] == "rar"
    _rar_pool = None
    _rar_update_freq = args["rar_update_freq"]
    n_phys = args["num_physics_points"]

    for step in range(1, args["iterations"] + 1):
        if _is_rar and (_rar_pool is None or step % _rar_update_freq == 0):
            _rar_pool = _rar_update_pool(
                net, datasets, sensor_vals_list, sensor_pos_list, sensor_time_list,
                n_select=n_phys, pool_size=n_phys * args["rar_pool_multiplier"], t_max=1.0,
                k_f=args["k_f"], A=args["A"], domain_length=1.0, device=device,
                exploration_ratio=args["rar_exploration_ratio"],
            )

        optimizer.zero_grad()
        l_data = 0.0
        l_physics = 0.0
        for i, ds in enumerate(datasets):
            uvp_fn = make_lnn_model_fn_uvp(
                net, sensor_vals_list[i], sensor_pos_list[i],
                re_norm=ds.re_norm, sensor_time=sensor_time_list[i], device=device,
            )
            T, K, _ = sensor_vals_list[i].shape
            xyt_s = torch.cat([
                sensor_pos_list[i][None].expand(T, K, 2),
                sensor_time_list[i][:, None, None].expand(T, K, 1),
            ], dim=-1).reshape(-1, 3)
            pred = uvp_fn(xyt_s)[:, :2]
            l_data = l_data + ((pred - sensor_vals_list[i].reshape(-1, 2)) ** 2).mean()

            xyt = _rar_pool[i].clone().requires_grad_(True)
            mom_u, mom_v, cont = unsteady_ns_residuals(uvp_fn, xyt, re=args["re"], k_f=args["k_f"], A=args["A"])
            l_physics = l_physics + (mom_u ** 2).mean() + (mom_v ** 2).mean() + (cont ** 2).mean()

        l_total = l_data + args["physics_loss_weight"] * l_physics
        l_total.backward()
        optimizer.step()
    return net


args = {
    "iterations": 4,
    "physics_collocation_strategy": "rar",
    "rar_update_freq": 2,
    "rar_pool_multiplier": 10,
    "rar_exploration_ratio": 0.2,
    "num_physics_points": 16,
    "re": 1000.0,
    "k_f": 2.0,
    "A": 0.1,
    "physics_loss_weight": 0.1,
}
train_lnn_kolmogorov(args)
print("done")
