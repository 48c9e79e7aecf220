# source: https://github.com/jlamprou/Infini-Attention/issues/3 — segment-by-segment Infini-attention training only runs with backward(retain_graph=True) (issue)
# fix-source: https://github.com/Beomi/InfiniTransformer/commit/122a4dffee48cae99dac639503c9cdb0c1a27e6a — reporter's fix after the maintainer's comment (detach memory and norm_term, drop retain_graph)
# expect-kind: none
# fix: the attention returns self.memory.detach(), self.norm_term.detach(); plain loss.backward() (no retain_graph)
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from _device import DEVICE


class GemmaInfiniAttention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.gate = nn.Parameter(torch.zeros(1, num_heads, 1, 1))

    def forward(self, hidden_states, memory=None, norm_term=None):
        self.memory = memory
        self.norm_term = norm_term
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)

        # Memory retrieval and attention calculation per segment
        memory_output = self._retrieve_from_memory(query_states)
        # Update memory with current segment's key and value states
        self._update_memory(key_states, value_states)

        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states, is_causal=True)
        combined_output = F.sigmoid(self.gate) * memory_output + (1 - F.sigmoid(self.gate)) * attn_output
        combined_output = combined_output.transpose(1, 2).contiguous().view(bsz, q_len, self.hidden_size)
        final_output = self.o_proj(combined_output)
        return final_output, self.memory.detach(), self.norm_term.detach()

    def _retrieve_from_memory(self, query_states):
        if self.memory is None or self.norm_term is None:
            return torch.zeros_like(query_states)
        query_states = F.elu(query_states) + 1
        memory_output = torch.matmul(query_states, self.memory)
        norm_term_broadcastable = torch.matmul(query_states, self.norm_term.transpose(-2, -1))
        return memory_output / norm_term_broadcastable

    def _update_memory(self, key_states, value_states):
        key_states = F.elu(key_states) + 1
        if self.memory is not None:
            self.memory = self.memory + torch.matmul(key_states.transpose(-2, -1), value_states)
        else:
            self.memory = torch.matmul(key_states.transpose(-2, -1), value_states)
        if self.norm_term is not None:
            self.norm_term = self.norm_term + key_states.sum(dim=2, keepdim=True)
        else:
            self.norm_term = key_states.sum(dim=2, keepdim=True)


class InfiniGemmaForCausalLM(nn.Module):
    def __init__(self, vocab_size, hidden_size, num_heads):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.self_attn = GemmaInfiniAttention(hidden_size, num_heads)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, input_ids, labels, memory=None, norm_term=None):
        hidden_states = self.embed_tokens(input_ids)
        attn_out, memory, norm_term = self.self_attn(hidden_states, memory=memory, norm_term=norm_term)
        logits = self.lm_head(hidden_states + attn_out)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        return SimpleNamespace(loss=loss, logits=logits, memory=memory, norm_term=norm_term)


vocab_size, segment_length = 16, 4
model = InfiniGemmaForCausalLM(vocab_size, hidden_size=8, num_heads=2).to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
train_batches = [{"input_ids": torch.randint(0, vocab_size, (2, 12), device=DEVICE)} for _ in range(2)]

total_loss = 0
for step, batch in enumerate(train_batches):
    batch["labels"] = batch["input_ids"].clone()
    # Segment the batch items into smaller chunks of segment_length tokens
    input_ids = torch.tensor_split(
        batch["input_ids"], list(range(segment_length, batch["input_ids"].shape[1], segment_length)), dim=1
    )
    labels = torch.tensor_split(
        batch["labels"], list(range(segment_length, batch["labels"].shape[1], segment_length)), dim=1
    )
    memory, norm_term = None, None
    for i in range(len(input_ids)):
        outputs = model(input_ids=input_ids[i], labels=labels[i], memory=memory, norm_term=norm_term)
        memory = outputs.memory
        norm_term = outputs.norm_term
        loss = outputs.loss
        loss.backward()
        total_loss += loss.detach().float()
    optimizer.step()
    optimizer.zero_grad()
print("done")
