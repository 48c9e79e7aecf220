# source: https://github.com/huggingface/transformers/pull/43203 — RecurrentGemma's RG-LRU keeps recurrent_states on the module even with use_cache=False, so the next training forward reuses graph-attached state (double-backward error, PR review comment)
# fix-source: https://github.com/huggingface/transformers/pull/43203 — maintainers' fix: clear self.conv1d_state and self.rg_lru.recurrent_states when use_cache is False
# expect-kind: none
# fix: with use_cache=False the block clears self.conv1d_state and self.rg_lru.recurrent_states before the scan
from types import SimpleNamespace

import torch
from torch import nn
from _device import DEVICE

_MAX_SQRT_GRADIENT = 1000.0


class SqrtBoundDerivative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sqrt(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        clipped_x_times_4 = torch.clip(4.0 * x, min=1 / (_MAX_SQRT_GRADIENT**2))
        return grad_output / torch.sqrt(clipped_x_times_4)


class RecurrentGemmaRglru(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.block_width = config.lru_width // self.num_attention_heads
        self.recurrent_param = nn.Parameter(torch.rand([config.lru_width]))
        self.input_gate_weight = nn.Parameter(torch.randn([self.num_attention_heads, self.block_width, self.block_width]) * 0.3)
        self.input_gate_bias = nn.Parameter(torch.zeros([self.num_attention_heads, self.block_width]))
        self.recurrent_gate_weight = nn.Parameter(torch.randn([self.num_attention_heads, self.block_width, self.block_width]) * 0.3)
        self.recurrent_gate_bias = nn.Parameter(torch.zeros([self.num_attention_heads, self.block_width]))
        self.recurrent_states = None

    def forward(self, activations, position_ids):
        batch_size, seq_len, lru_width = activations.shape
        reset = position_ids[:, :, None] == 0

        reshape_act = activations.reshape(batch_size * seq_len, self.num_attention_heads, self.block_width)
        reshape_act = reshape_act.permute(1, 0, 2)

        res = torch.baddbmm(self.input_gate_bias[:, None, :], reshape_act, self.input_gate_weight)
        input_gate = torch.sigmoid(res.transpose(0, 1).reshape(batch_size, seq_len, lru_width))

        res = torch.baddbmm(self.recurrent_gate_bias[:, None, :], reshape_act, self.recurrent_gate_weight)
        recurrent_gate = torch.sigmoid(res.transpose(0, 1).reshape(batch_size, seq_len, lru_width))

        log_recurrent_gate = -8.0 * recurrent_gate * nn.functional.softplus(self.recurrent_param)
        recurrent_gate = torch.exp(log_recurrent_gate)
        a_square = torch.exp(2 * log_recurrent_gate)

        gated_inputs = activations * input_gate
        multiplier = SqrtBoundDerivative.apply(1 - a_square)
        multiplier = reset + ~reset * multiplier
        normalized_x = gated_inputs * multiplier.type(activations.dtype)

        hidden_states, recurrent_states = self._rnn_scan(
            hidden_states=normalized_x,
            recurrent_gate=recurrent_gate,
            reset=reset,
            recurrent_states=self.recurrent_states,
        )
        self.recurrent_states = recurrent_states
        return hidden_states

    def _rnn_scan(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype=torch.float32):
        # Multiply `a` by the reset.
        recurrent_gate = recurrent_gate * ~reset
        if recurrent_states is None:
            recurrent_states = torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)
        contextualized_states = torch.zeros_like(hidden_states)
        for t in range(hidden_states.shape[1]):
            recurrent_states = recurrent_gate[:, t].type(acc_dtype) * recurrent_states.to(recurrent_gate.device)
            recurrent_states = recurrent_states + hidden_states[:, t].type(acc_dtype)
            contextualized_states[:, t] = recurrent_states.type(hidden_states.dtype)
        return contextualized_states, recurrent_states


class RecurrentGemmaRecurrentBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.lru_width = config.lru_width
        self.hidden_size = config.hidden_size
        self.linear_y = nn.Linear(config.hidden_size, config.lru_width)
        self.linear_x = nn.Linear(config.hidden_size, config.lru_width)
        self.linear_out = nn.Linear(config.lru_width, config.hidden_size)
        self.conv1d_width = config.conv1d_width
        self.conv_1d = nn.Conv1d(
            config.lru_width,
            config.lru_width,
            kernel_size=config.conv1d_width,
            groups=config.lru_width,
            padding=config.conv1d_width - 1,
        )
        self.rg_lru = RecurrentGemmaRglru(config)
        self.act_fn = nn.GELU(approximate="tanh")
        self.conv1d_state = None

    def forward(self, input_states, position_ids, use_cache=True):
        _, seq_len, _ = input_states.shape
        batch_size = input_states.shape[0]

        y_branch = self.act_fn(self.linear_y(input_states))
        x_branch = self.linear_x(input_states).transpose(1, 2)

        if use_cache:
            if self.conv1d_state is None or self.conv1d_state.shape[0] != batch_size:
                self.conv1d_state = torch.zeros((batch_size, self.hidden_size, self.conv1d_width - 1), device=input_states.device)
                self.rg_lru.recurrent_states = torch.zeros((batch_size, self.lru_width), device=input_states.device)
            self.conv1d_state = nn.functional.pad(x_branch, (self.conv1d_width - x_branch.shape[-1] - 1, 0))
            x_branch = self.conv_1d(x_branch)[..., :seq_len]
        else:
            self.conv1d_state = None
            self.rg_lru.recurrent_states = None
            x_branch = self.conv_1d(x_branch)[..., :seq_len]

        x_branch = self.rg_lru(x_branch.transpose(1, 2), position_ids)

        hidden_states = x_branch * y_branch
        hidden_states = self.linear_out(hidden_states)
        return hidden_states


class RecurrentGemmaForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.temporal_block = RecurrentGemmaRecurrentBlock(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids, labels, use_cache=None):
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand_as(input_ids)
        hidden_states = self.embed_tokens(input_ids)
        hidden_states = hidden_states + self.temporal_block(hidden_states, position_ids, use_cache=use_cache)
        logits = self.lm_head(hidden_states)
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        return SimpleNamespace(loss=loss, logits=logits)


config = SimpleNamespace(vocab_size=20, hidden_size=8, lru_width=8, num_attention_heads=2, conv1d_width=4)
model = RecurrentGemmaForCausalLM(config).to(DEVICE)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for step in range(4):
    input_ids = torch.randint(0, config.vocab_size, (2, 7), device=DEVICE)
    outputs = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    outputs.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("done")
