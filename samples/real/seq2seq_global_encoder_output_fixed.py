# source: https://github.com/spro/practical-pytorch/issues/27 — batched attention seq2seq (vijendra-rana/Random translation_with_batch.py): "backward through the graph second time", "I don't see anywhere that I am doing it twice" (issue comment)
# fix-source: own reading of the posted code — train() copies the module-level output_from_encoder instead of its own encoder_outputs; use the local one
# expect-kind: none
# fix: copy train()'s own encoder_outputs into encoder_outputs_for_decoder, not the module-level output_from_encoder
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from _device import DEVICE

random.seed(0)
MAX_LENGTH = 10


class EncoderRNN(nn.Module):
    def __init__(self, input_size, batch_size, hidden_size, n_layers=1):
        super().__init__()
        self.n_layers = n_layers
        self.batch_size = batch_size
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)

    def forward(self, input, hidden):
        embedded = self.embedding(input).transpose(0, 1)  # (time_steps, batch, hidden)
        output = embedded
        for i in range(self.n_layers):
            output, hidden = self.gru(output, hidden)
        return output, hidden

    def initHidden(self):
        return torch.zeros(self.n_layers, self.batch_size, self.hidden_size, device=DEVICE)


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size, batch_size, n_layers=1, dropout_p=0.1, max_length=MAX_LENGTH):
        super().__init__()
        self.hidden_size = hidden_size
        self.output_size = output_size
        self.n_layers = n_layers
        self.max_length = max_length
        self.batch_size = batch_size
        self.embedding = nn.Embedding(self.output_size, self.hidden_size)
        self.attn = nn.Linear(self.hidden_size * 2, self.max_length)
        self.attn_combine = nn.Linear(self.hidden_size * 2, self.hidden_size)
        self.dropout = nn.Dropout(dropout_p)
        self.gru = nn.GRU(self.hidden_size, self.hidden_size)
        self.out = nn.Linear(self.hidden_size, self.output_size)

    def forward(self, input, hidden, encoder_outputs):
        embedded = self.embedding(input).view(1, batch_size, -1)
        embedded = self.dropout(embedded)
        attn_weights = F.softmax(self.attn(torch.cat((embedded[0], hidden[0]), 1)), dim=1)
        encoder_outputs = encoder_outputs.transpose(1, 0)
        attn_weights = attn_weights.unsqueeze(1)
        attn_applied = torch.bmm(attn_weights, encoder_outputs).transpose(0, 1)
        output = torch.cat((embedded[0], attn_applied[0]), 1)
        output = self.attn_combine(output).unsqueeze(0)
        for i in range(self.n_layers):
            output = F.relu(output)
            output, hidden = self.gru(output, hidden)
        output = F.log_softmax(self.out(output[0]), dim=1)
        return output, hidden, attn_weights


def fake_batch(batch_size, enc_len=6, dec_len=5, max_vocab=10):
    en_sen = torch.randint(3, max_vocab, (batch_size, enc_len), device=DEVICE)
    dec_sen = torch.randint(3, max_vocab, (batch_size, dec_len), device=DEVICE)
    dec_mask = torch.ones(batch_size, dec_len, dtype=torch.long, device=DEVICE)
    return en_sen, dec_sen, dec_mask


def train(encoder_sentences, decoder_sentences, decoder_mask, encoder, decoder, encoder_optimizer, decoder_optimizer, max_len=MAX_LENGTH):
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    encoder_outputs, encoder_hidden = encoder(encoder_sentences, encoder.initHidden())

    encoder_outputs_for_decoder = torch.zeros(max_len, batch_size, hidden_size, device=DEVICE)
    for i in range(encoder_outputs.size(0)):
        encoder_outputs_for_decoder[i] = encoder_outputs[i]

    decoder_input = torch.full((batch_size, 1), 2, dtype=torch.long, device=DEVICE)
    decoder_hidden = encoder_hidden
    decoding_len = decoder_sentences.size()[1]

    loss = 0
    for i in range(decoding_len):
        output_from_decoder, decoder_hidden, decoder_attention = decoder(decoder_input, decoder_hidden, encoder_outputs_for_decoder)
        tmp = decoder_sentences[:, i].contiguous().view(-1, 1)
        word_loss = output_from_decoder.gather(1, tmp) * decoder_mask[:, i].float().contiguous().view(-1, 1)
        loss += -1 * word_loss.sum()
        decoder_input = decoder_sentences[:, i].contiguous().view(-1, 1)

    loss.backward()
    encoder_optimizer.step()
    decoder_optimizer.step()
    return loss.item() / decoding_len


def train_iters(encoder, decoder, batch_size, num_iters, learning_rate=0.01):
    encoder_optimizer = optim.SGD(encoder.parameters(), lr=learning_rate)
    decoder_optimizer = optim.SGD(decoder.parameters(), lr=learning_rate)
    for iter in range(1, num_iters + 1):
        en_sen, dec_sen, dec_mask = fake_batch(batch_size)
        loss = train(en_sen, dec_sen, dec_mask, encoder, decoder, encoder_optimizer, decoder_optimizer)


batch_size = 4
hidden_size = 8
input_size = 10
encoder = EncoderRNN(input_size, hidden_size=hidden_size, batch_size=batch_size).to(DEVICE)

output_size = 10
attn_decoder1 = AttnDecoderRNN(hidden_size, output_size, batch_size, dropout_p=0.1).to(DEVICE)

# checking the shapes on one batch before training
en_sen, dec_sen, dec_mask = fake_batch(batch_size)
output_from_encoder, hidden_from_encoder = encoder(en_sen, encoder.initHidden())

train_iters(encoder, attn_decoder1, batch_size, 4)
print("done")
