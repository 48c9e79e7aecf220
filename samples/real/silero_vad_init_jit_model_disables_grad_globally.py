# source: https://github.com/snakers4/silero-vad/issues/460 — issue "DO NOT disable PyTorch gradient globally when using PyTorch JIT model": Silero VAD used inside a training pipeline (to drop speech from clips on the fly) switches autograd off for the whole process (utils_vad.py at 82342b8: init_jit_model calls torch.set_grad_enabled(False)), so the classifier's loss.backward() fails
# fix-source: https://github.com/snakers4/silero-vad/pull/467 — merged PR (commit 8b0566682b1f4a7c058dace11d801a2151a157b8): init_jit_model no longer calls torch.set_grad_enabled(False); get_speech_timestamps and VADIterator.__call__ are decorated with @torch.no_grad()
# expect-kind: no-grad
# expect-culprit: logits
import warnings
from typing import Callable, List

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# --- a stand-in for files/silero_vad.jit: a speech-probability model with the same call surface
# (model(chunk, sr) -> probability, model.reset_states()); an energy detector instead of the trained net ---
class SileroVAD(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(1, 1)
        with torch.no_grad():
            self.proj.weight.fill_(4.0)
            self.proj.bias.fill_(8.0)
        self.reset_states()

    def reset_states(self, batch_size=1):
        self._state = torch.zeros(batch_size, 1, device=self.proj.weight.device)

    def forward(self, x, sr: int):
        energy = torch.log(x.pow(2).mean() + 1e-8).view(1, 1)
        self._state = 0.5 * self._state + 0.5 * energy
        return torch.sigmoid(self.proj(self._state))


# --- utils_vad.py (82342b8), trimmed ---
def init_jit_model(model_path: str,
                   device=torch.device('cpu')):
    torch.set_grad_enabled(False)
    model = SileroVAD().to(device)  # torch.jit.load(model_path, map_location=device) in the original
    model.eval()
    return model


def get_speech_timestamps(audio: torch.Tensor,
                          model,
                          threshold: float = 0.5,
                          sampling_rate: int = 16000,
                          min_speech_duration_ms: int = 250,
                          min_silence_duration_ms: int = 100,
                          window_size_samples: int = 512,
                          speech_pad_ms: int = 30,
                          progress_tracking_callback: Callable[[float], None] = None):
    if not torch.is_tensor(audio):
        try:
            audio = torch.Tensor(audio)
        except:
            raise TypeError("Audio cannot be casted to tensor. Cast it manually")
    if len(audio.shape) > 1:
        for i in range(len(audio.shape)):  # trying to squeeze empty dimensions
            audio = audio.squeeze(0)
        if len(audio.shape) > 1:
            raise ValueError("More than one dimension in audio. Are you trying to process audio with 2 channels?")
    if window_size_samples not in [256, 512, 768, 1024, 1536]:
        warnings.warn('Unusual window_size_samples!')

    model.reset_states()
    min_speech_samples = sampling_rate * min_speech_duration_ms / 1000
    speech_pad_samples = sampling_rate * speech_pad_ms / 1000
    min_silence_samples = sampling_rate * min_silence_duration_ms / 1000

    audio_length_samples = len(audio)

    speech_probs = []
    for current_start_sample in range(0, audio_length_samples, window_size_samples):
        chunk = audio[current_start_sample: current_start_sample + window_size_samples]
        if len(chunk) < window_size_samples:
            chunk = torch.nn.functional.pad(chunk, (0, int(window_size_samples - len(chunk))))
        speech_prob = model(chunk, sampling_rate).item()
        speech_probs.append(speech_prob)
        progress = min(current_start_sample + window_size_samples, audio_length_samples)
        if progress_tracking_callback:
            progress_tracking_callback((progress / audio_length_samples) * 100)

    triggered = False
    speeches = []
    current_speech = {}
    neg_threshold = threshold - 0.15
    temp_end = 0

    for i, speech_prob in enumerate(speech_probs):
        if (speech_prob >= threshold) and temp_end:
            temp_end = 0

        if (speech_prob >= threshold) and not triggered:
            triggered = True
            current_speech['start'] = window_size_samples * i
            continue

        if (speech_prob < neg_threshold) and triggered:
            if not temp_end:
                temp_end = window_size_samples * i
            if (window_size_samples * i) - temp_end < min_silence_samples:
                continue
            else:
                current_speech['end'] = temp_end
                if (current_speech['end'] - current_speech['start']) > min_speech_samples:
                    speeches.append(current_speech)
                current_speech = {}
                temp_end = 0
                triggered = False
                continue

    if current_speech and (audio_length_samples - current_speech['start']) > min_speech_samples:
        current_speech['end'] = audio_length_samples
        speeches.append(current_speech)

    for i, speech in enumerate(speeches):
        if i == 0:
            speech['start'] = int(max(0, speech['start'] - speech_pad_samples))
        if i != len(speeches) - 1:
            silence_duration = speeches[i+1]['start'] - speech['end']
            if silence_duration < 2 * speech_pad_samples:
                speech['end'] += int(silence_duration // 2)
                speeches[i+1]['start'] = int(max(0, speeches[i+1]['start'] - silence_duration // 2))
            else:
                speech['end'] = int(min(audio_length_samples, speech['end'] + speech_pad_samples))
                speeches[i+1]['start'] = int(max(0, speeches[i+1]['start'] - speech_pad_samples))
        else:
            speech['end'] = int(min(audio_length_samples, speech['end'] + speech_pad_samples))

    return speeches


def drop_chunks(tss: List[dict],
                wav: torch.Tensor):
    chunks = []
    cur_start = 0
    for i in tss:
        chunks.append((wav[cur_start: i['start']]))
        cur_start = i['end']
    return torch.cat(chunks)


# --- the training pipeline: VAD removes speech on the fly in the data pre-processing,
# and an audio classifier is trained on the silence that is left ---
SAMPLING_RATE = 16000
CLIP_SAMPLES = 512 * 32
FEATURE_SAMPLES = 1024


def make_clip(label):
    t = torch.arange(CLIP_SAMPLES, device=DEVICE) / SAMPLING_RATE
    background = (0.01 * (label + 1)) * torch.sin(2 * torch.pi * (50.0 + 40.0 * label) * t)
    wav = background + 0.002 * torch.randn(CLIP_SAMPLES, device=DEVICE)
    wav[512 * 4: 512 * 17] += 0.5 * torch.randn(512 * 13, device=DEVICE)  # someone talking
    return wav


class SilenceDataset:
    def __init__(self, vad_model, n_items=4):
        self.vad_model = vad_model
        self.items = [(make_clip(i % 3), i % 3) for i in range(n_items)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        wav, label = self.items[idx]
        speech_timestamps = get_speech_timestamps(wav, self.vad_model, sampling_rate=SAMPLING_RATE)
        silence = drop_chunks(speech_timestamps, wav)
        silence = F.pad(silence, (0, max(0, FEATURE_SAMPLES - len(silence))))[:FEATURE_SAMPLES]
        return silence, label


def batches(dataset, batch_size):
    for start in range(0, len(dataset), batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        yield torch.stack([w for w, _ in items]), torch.tensor([l for _, l in items], device=DEVICE)


class AudioClassifier(nn.Module):
    def __init__(self, n_classes=3):
        super().__init__()
        self.frontend = nn.Conv1d(1, 8, kernel_size=64, stride=32)
        self.head = nn.Linear(8, n_classes)

    def forward(self, wav):
        x = F.relu(self.frontend(wav.unsqueeze(1)))
        return self.head(x.mean(-1))


vad_model = init_jit_model('files/silero_vad.jit', device=DEVICE)
train_set = SilenceDataset(vad_model)

classifier = AudioClassifier().to(DEVICE)
optimizer = torch.optim.Adam(classifier.parameters(), lr=1e-3)

for epoch in range(2):
    for wavs, labels in batches(train_set, batch_size=2):
        logits = classifier(wavs)  # culprit
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print("done")
