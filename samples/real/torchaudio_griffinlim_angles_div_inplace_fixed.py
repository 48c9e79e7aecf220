# source: https://github.com/pytorch/audio/issues/729 — issue "torchaudio.transforms.GriffinLim does not allow backpropagation": training a Linear layer through GriffinLim fails in backward, "[torch.FloatTensor [1, 257, 101, 2]], which is output 0 of SubBackward0, is at version 1" (torchaudio/functional.py griffinlim: angles.div_(complex_norm(angles).add_(1e-16)...))
# fix-source: https://github.com/pytorch/audio/pull/730 — merged PR "Remove in-place operations from GriffinLim for backprop" (closes #729; as released in torchaudio 0.6.0): the phase update is written out of place, angles.div(complex_norm(angles).add(1e-16)...)
# expect-kind: none
# fix: griffinlim updates the phase out of place, angles = angles.div(complex_norm(angles).add(1e-16).unsqueeze(-1).expand_as(angles)), so the angles and norm that complex_norm saved stay unmodified
import math
from typing import Callable, Optional

import torch
from torch import Tensor
from _device import DEVICE


# torchaudio.functional at the time worked on real tensors of shape (..., 2) for complex values;
# these two helpers keep that layout on top of today's complex torch.stft / torch.istft
def istft(stft_matrix: Tensor, n_fft: int, hop_length: int, win_length: int, window: Tensor,
          length: Optional[int] = None) -> Tensor:
    return torch.istft(torch.view_as_complex(stft_matrix.contiguous()), n_fft, hop_length, win_length, window,
                       center=True, normalized=False, onesided=True, length=length)


def _stft(input: Tensor, n_fft: int, hop_length: int, win_length: int, window: Tensor) -> Tensor:
    return torch.view_as_real(torch.stft(input, n_fft, hop_length, win_length, window,
                                         True, 'reflect', False, True, return_complex=True))


def complex_norm(complex_tensor: Tensor, power: float = 1.0) -> Tensor:
    if power == 1.0:
        return torch.norm(complex_tensor, 2, -1)
    return torch.norm(complex_tensor, 2, -1).pow(power)


def griffinlim(specgram: Tensor, window: Tensor, n_fft: int, hop_length: int, win_length: int, power: float,
               normalized: bool, n_iter: int, momentum: float, length: Optional[int], rand_init: bool) -> Tensor:
    assert momentum < 1, 'momentum=%s > 1 can be unstable' % momentum
    assert momentum >= 0, 'momentum=%s < 0' % momentum

    # pack batch
    shape = specgram.size()
    specgram = specgram.reshape([-1] + list(shape[-2:]))

    specgram = specgram.pow(1 / power)

    # randomly initialize the phase
    batch, freq, frames = specgram.size()
    if rand_init:
        angles = 2 * math.pi * torch.rand(batch, freq, frames, device=specgram.device)
    else:
        angles = torch.zeros(batch, freq, frames, device=specgram.device)
    angles = torch.stack([angles.cos(), angles.sin()], dim=-1) \
        .to(dtype=specgram.dtype, device=specgram.device)
    specgram = specgram.unsqueeze(-1).expand_as(angles)

    # And initialize the previous iterate to 0
    rebuilt = torch.tensor(0., device=specgram.device)

    for _ in range(n_iter):
        # Store the previous iterate
        tprev = rebuilt

        # Invert with our current estimate of the phases
        inverse = istft(specgram * angles, n_fft=n_fft, hop_length=hop_length, win_length=win_length,
                        window=window, length=length).float()

        # Rebuild the spectrogram
        rebuilt = _stft(inverse, n_fft, hop_length, win_length, window)

        # Update our phase estimates
        angles = rebuilt
        if momentum:
            angles = angles - tprev.mul_(momentum / (1 + momentum))
        angles = angles.div(complex_norm(angles).add(1e-16).unsqueeze(-1).expand_as(angles))

    # Return the final phase estimates
    waveform = istft(specgram * angles, n_fft=n_fft, hop_length=hop_length, win_length=win_length,
                     window=window, length=length)

    # unpack batch
    waveform = waveform.reshape(shape[:-2] + waveform.shape[-1:])

    return waveform


class GriffinLim(torch.nn.Module):
    def __init__(self, n_fft: int = 400, n_iter: int = 32, win_length: Optional[int] = None,
                 hop_length: Optional[int] = None, window_fn: Callable[..., Tensor] = torch.hann_window,
                 power: float = 2., normalized: bool = False, momentum: float = 0.99,
                 length: Optional[int] = None, rand_init: bool = True) -> None:
        super(GriffinLim, self).__init__()
        self.n_fft = n_fft
        self.n_iter = n_iter
        self.win_length = win_length if win_length is not None else n_fft
        self.hop_length = hop_length if hop_length is not None else self.win_length // 2
        self.register_buffer('window', window_fn(self.win_length))
        self.normalized = normalized
        self.length = length
        self.power = power
        self.momentum = momentum / (1 + momentum)
        self.rand_init = rand_init

    def forward(self, specgram: Tensor) -> Tensor:
        return griffinlim(specgram, self.window, self.n_fft, self.hop_length, self.win_length, self.power,
                          self.normalized, self.n_iter, self.momentum, self.length, self.rand_init)


# the reproduction, with tiny sizes: a Linear layer on the power spectrogram, resynthesised by Griffin-Lim
# (power=1.: the square root of power=2 would turn the Linear layer's negative outputs into NaN)
n_fft, hop_length, win_length = 16, 4, 8
x = torch.rand(1, 64, device=DEVICE)
spec = torch.view_as_real(torch.stft(x, n_fft=n_fft, hop_length=hop_length, win_length=win_length,
                                     window=torch.hann_window(win_length, device=DEVICE), return_complex=True))
mag = spec.pow(2).sum(-1).transpose(1, -1)
model = torch.nn.Linear(n_fft // 2 + 1, n_fft // 2 + 1).to(DEVICE)
resyn = GriffinLim(n_fft=n_fft, n_iter=4, hop_length=hop_length, win_length=win_length, power=1.,
                   length=x.size(-1)).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=0.0001)
for step in range(2):
    out = model(mag).transpose(1, -1)
    wav = resyn(out)
    loss = torch.nn.functional.mse_loss(wav, x)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
