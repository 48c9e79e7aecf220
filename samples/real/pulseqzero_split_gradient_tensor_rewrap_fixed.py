# source: https://github.com/MRsources/pulseq-zero/issues/20 — issue "Operation not differentiable": pulseq-zero's split_gradient (src/pulseqzero/adapter/grads.py at 687e53d^) rebuilds the ramp/flat/ramp pieces with torch.tensor([0, grad.amplitude]), which drops requires_grad, so an MRI sequence parameter optimized through split_gradient gets no gradient
# fix-source: https://github.com/pulseq-frame/pulseq-zero/commit/687e53d6ab8beb94460df74dcf4b45ac90f7616d — maintainer's "bugfix: make split_gradient diffable": join(*args) = torch.stack([torch.as_tensor(x) for x in args]) instead of torch.tensor([...])
# expect-kind: none
# fix: split_gradient builds each piece's amplitudes and times with join(*args) = torch.stack([torch.as_tensor(x) for x in args]), which keeps grad.amplitude's history
from dataclasses import dataclass

import torch
from _device import DEVICE


@dataclass
class Opts:
    max_grad: float = 1e6
    max_slew: float = 1e9
    grad_raster_time: float = 1e-5


Opts.default = Opts()


def calc_duration(*events):
    return max(ev.duration for ev in events)


@dataclass
class TrapGrad:
    channel: ...
    amplitude: ...
    rise_time: ...
    flat_time: ...
    fall_time: ...
    delay: ...

    @property
    def area(self):
        return self.amplitude * (self.rise_time / 2 + self.flat_time + self.fall_time / 2)

    @property
    def duration(self):
        return self.delay + self.rise_time + self.flat_time + self.fall_time


@dataclass
class FreeGrad:
    channel: ...
    waveform: ...
    delay: ...
    tt: ...
    shape_dur: ...

    @property
    def duration(self):
        return self.delay + self.shape_dur

    @property
    def area(self):
        return 0.5 * (
            (self.tt[1:] - self.tt[:-1]) *
            (self.waveform[1:] + self.waveform[:-1])
        ).sum()


def make_trapezoid(channel, amplitude=None, flat_time=None, rise_time=None, fall_time=None, delay=0, system=None):
    if system is None:
        system = Opts.default
    if fall_time is None:
        fall_time = rise_time
    return TrapGrad(channel, amplitude, rise_time, flat_time, fall_time, delay)


def make_extended_trapezoid(channel, amplitudes=torch.zeros(1), system=None, times=torch.zeros(1)):
    return FreeGrad(
        channel,
        amplitudes,
        times[0],
        times - times[0],
        times[-1]
    )


def split_gradient(grad, system=None):
    assert isinstance(grad, TrapGrad)
    if system is None:
        system = Opts.default
    total_duration = calc_duration(grad)

    def join(*args):
        return torch.stack([torch.as_tensor(x, device=DEVICE) for x in args])

    ramp_up = make_extended_trapezoid(
        channel=grad.channel,
        amplitudes=join(0, grad.amplitude),
        times=join(0, grad.rise_time)
    )
    flat_top = make_extended_trapezoid(
        channel=grad.channel,
        amplitudes=join(grad.amplitude, grad.amplitude),
        times=join(grad.rise_time, grad.rise_time + grad.flat_time)
    )
    ramp_down = make_extended_trapezoid(
        channel=grad.channel,
        amplitudes=join(grad.amplitude, 0),
        times=join(grad.rise_time + grad.flat_time, total_duration)
    )

    return ramp_up, flat_top, ramp_down


def my_seq(gx_amp):
    """The readout gradient is split so its ramps can be merged with neighbouring blocks."""
    gx = make_trapezoid(channel="x", amplitude=gx_amp, flat_time=2e-3, rise_time=1e-4)
    gx_up, gx_flat, gx_down = split_gradient(gx)
    return [gx_up, gx_flat, gx_down]


def kspace_end(blocks):
    # the simulator integrates the gradient waveform of every block into the k-space trajectory
    return sum(block.area for block in blocks)


target_k = torch.tensor(32.0, device=DEVICE)
gx_amp = torch.tensor(1e4, device=DEVICE, requires_grad=True)
optimizer = torch.optim.Adam([gx_amp], lr=10.0)
for it in range(3):
    optimizer.zero_grad()
    seq = my_seq(gx_amp)
    loss = (kspace_end(seq) - target_k) ** 2
    loss.backward()
    optimizer.step()
    print(it, loss.item(), gx_amp.item())
print("done")
