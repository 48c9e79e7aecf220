# source: https://github.com/facebookresearch/inversecooking/issues/3 — issue: DecoderTransformer.sample() returns torch.stack(logits, 1).data, so the ingredient losses have no grad_fn
# fix-source: https://github.com/facebookresearch/inversecooking/commit/3ab629c08f0b5d84bbc3d56ac70ce12e60500322 — maintainers' fix: logits = torch.stack(logits, 1)
# expect-kind: no-grad
# expect-culprit: logits
import torch
import torch.nn as nn
from _device import DEVICE


def label2onehot(labels, pad_value):
    inp_ = torch.unsqueeze(labels, 2)
    one_hot = torch.zeros(labels.size(0), labels.size(1), pad_value + 1, device=labels.device)
    one_hot.scatter_(2, inp_, 1)
    one_hot, _ = one_hot.max(dim=1)
    return one_hot[:, :-1]


def mask_from_eos(ids, eos_value, mult_before=True):
    mask = torch.ones(ids.size(), dtype=torch.bool, device=ids.device)
    mask_aux = torch.ones(ids.size(0), dtype=torch.bool, device=ids.device)
    for idx in range(1, ids.size(1)):
        if mult_before:
            mask[:, idx] = mask[:, idx] & mask_aux
            mask_aux = mask_aux & (ids[:, idx] != eos_value)
        else:
            mask_aux = mask_aux & (ids[:, idx - 1] != eos_value)
            mask[:, idx] = mask[:, idx] & mask_aux
    return mask


class DecoderTransformer(nn.Module):
    def __init__(self, embed_size, vocab_size, seq_length):
        super().__init__()
        self.seq_length = seq_length
        self.embed_tokens = nn.Embedding(vocab_size, embed_size)
        self.layer = nn.Linear(2 * embed_size, embed_size)
        self.linear = nn.Linear(embed_size, vocab_size)

    def forward(self, img_features, captions):
        x = self.embed_tokens(captions[:, -1])
        x = torch.relu(self.layer(torch.cat([x, img_features], dim=-1)))
        x = self.linear(x)
        _, predicted = x.max(dim=-1)
        return x, predicted

    def sample(self, img_features, greedy=True, first_token_value=0, replacement=True):
        fs = img_features.size(0)
        first_word = torch.ones(fs, device=img_features.device) * first_token_value
        sampled_ids = [first_word.long()]
        logits = []
        for i in range(self.seq_length):
            outputs, _ = self.forward(img_features, torch.stack(sampled_ids, 1))
            if not replacement:
                if i == 0:
                    predicted_mask = torch.zeros(outputs.shape, device=outputs.device)
                else:
                    batch_ind = [j for j in range(fs) if sampled_ids[i][j] != 0]
                    sampled_ids_new = sampled_ids[i][batch_ind]
                    predicted_mask[batch_ind, sampled_ids_new] = float('-inf')
                outputs += predicted_mask
            logits.append(outputs)
            outputs_prob = torch.nn.functional.softmax(outputs, dim=-1)
            _, predicted = outputs_prob.max(1)
            sampled_ids.append(predicted.detach())
        sampled_ids = torch.stack(sampled_ids[1:], 1)
        logits = torch.stack(logits, 1).data  # culprit
        return sampled_ids, logits


class InverseRecipeModel(nn.Module):
    def __init__(self, vocab_size=5, embed_size=8, seq_length=4):
        super().__init__()
        self.image_encoder = nn.Linear(12, embed_size)
        self.ingredient_decoder = DecoderTransformer(embed_size, vocab_size, seq_length)
        self.crit_ingr = nn.BCELoss(reduction='none')
        self.crit_eos = nn.BCELoss(reduction='none')
        self.pad_value = vocab_size
        self.ingrs_only = True

    def forward(self, img_inputs, target_ingrs):
        losses = {}
        img_features = self.image_encoder(img_inputs)
        target_one_hot_smooth = label2onehot(target_ingrs, self.pad_value) * 0.9 + 0.05
        ingr_ids, ingr_logits = self.ingredient_decoder.sample(img_features, greedy=True, first_token_value=0, replacement=False)
        ingr_logits = torch.nn.functional.softmax(ingr_logits, dim=-1)

        eos = ingr_logits[:, :, 0]
        target_eos = ((target_ingrs == 0) ^ (target_ingrs == self.pad_value))
        mask_perminv = mask_from_eos(target_ingrs, eos_value=0, mult_before=False)
        ingr_probs = ingr_logits * mask_perminv.float().unsqueeze(-1)
        ingr_probs, _ = torch.max(ingr_probs, dim=1)
        ingr_ids[mask_perminv == 0] = self.pad_value

        ingr_loss = self.crit_ingr(ingr_probs, target_one_hot_smooth)
        losses['ingr_loss'] = torch.mean(ingr_loss, dim=-1)
        losses['eos_loss'] = torch.mean(self.crit_eos(eos, target_eos.float()), dim=-1)
        if self.ingrs_only:
            return losses


model = InverseRecipeModel().to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
target_ingrs = torch.tensor([[1, 3, 0, 5], [2, 4, 1, 0]], device=DEVICE)

for it in range(4):
    img_inputs = torch.randn(2, 12, device=DEVICE)
    losses = model(img_inputs, target_ingrs)
    loss = 1000.0 * losses['ingr_loss'].mean() + 1.0 * losses['eos_loss'].mean()
    model.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
