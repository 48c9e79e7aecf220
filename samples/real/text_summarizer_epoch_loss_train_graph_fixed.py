# source: https://github.com/JulesBelveze/text-summarizer/commit/5aee43740c150758ce6d197b23f1fef5684e7fe1 — seq2seq LSTM summarizer at its buggy commit: train_epoch adds each batch_loss_train tensor (with its graph) into epoch_loss_train, after the author's a382761 "fix: release graph loss to reduce memory usage" had only moved the .item() to train()
# fix-source: https://github.com/JulesBelveze/text-summarizer/commit/31047af0f874a5af084cd26533efd3bc4bd5d7a5 — the author's PR #7: `epoch_loss_train += batch_loss_train.item()`, and train() stores the float
# expect-kind: none
# fix: accumulate batch_loss_train.item() into epoch_loss_train (a float), and store that float in train(), as the author's 31047af (#7) does
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

embedding_dim = 8
MAX_LEN_STORY = 6
hidden_dim = 8
voc_size = 12
MAX_LEN_HIGHLIGHT = 3

NUM_EPOCHS = 2
batch_size = 2


class Encoder(nn.Module):
    def __init__(self):
        super(Encoder, self).__init__()
        self.embeddings = nn.Embedding(
            num_embeddings=voc_size,
            embedding_dim=embedding_dim
        )
        self.lstm = nn.LSTM(
            input_size=embedding_dim,
            hidden_size=hidden_dim,
            num_layers=1,
            bidirectional=False,
            batch_first=True
        )

    def forward(self, input):
        embedded = self.embeddings(input)
        output, (hidden, cell) = self.lstm(embedded)
        return output, (hidden, cell)


class AttnDecoder(nn.Module):
    def __init__(self):
        super(AttnDecoder, self).__init__()
        self.embeddings = nn.Embedding(
            num_embeddings=voc_size,
            embedding_dim=hidden_dim
        )
        self.lstm = nn.LSTM(
            input_size=hidden_dim,
            hidden_size=hidden_dim,
            num_layers=1,
            bidirectional=False,
            batch_first=False
        )
        # attention layer (tanh, as in the paper)
        self.attn = nn.Sequential(
            nn.Linear(hidden_dim * 2, MAX_LEN_STORY),
            nn.Tanh()
        )
        self.attn_combine = nn.Linear(hidden_dim * 2, hidden_dim)

        self.fc = nn.Linear(
            in_features=hidden_dim,
            out_features=voc_size
        )
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden, cell, outputs):
        embedded = self.embeddings(input).squeeze(1)  # batch * hidden_dim

        # attention over the encoder outputs at this step
        attn_weights = F.softmax(
            self.attn(torch.cat((embedded, hidden[0]), 1)), dim=1)
        attn_applied = torch.bmm(attn_weights.unsqueeze(1), outputs)
        attn_applied = attn_applied.squeeze(1)

        output = torch.cat((embedded, attn_applied), 1)
        output = self.attn_combine(output).unsqueeze(0)

        output, (hidden, cell) = self.lstm(output, (hidden, cell))
        output = self.fc(output.squeeze(0))
        output = self.softmax(output).unsqueeze(1)  # unsqueeze for concatenation
        return output, (hidden, cell)


class Seq2seqAttention(nn.Module):
    def __init__(self, encoder, decoder):
        super(Seq2seqAttention, self).__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, input, target):
        encoder_output, (encoder_hidden, encoder_cell) = self.encoder(input)

        decoder_input = torch.tensor([2] * batch_size,
                                     dtype=torch.long, device=DEVICE).view(batch_size, -1)

        decoder_hidden = encoder_hidden
        decoder_cell = encoder_cell

        batch_output = torch.Tensor().to(DEVICE)
        for i in range(MAX_LEN_HIGHLIGHT):
            decoder_output, (decoder_hidden, decoder_cell) = self.decoder(decoder_input, decoder_hidden, decoder_cell,
                                                                          encoder_output)
            batch_output = torch.cat((batch_output, decoder_output), 1)

        return batch_output


def train_epoch(train_iter, criterion, model, optimizer):
    epoch_loss_train = 0

    # training network
    model.train()
    for i, batch in enumerate(train_iter):
        batch_loss_train = 0
        optimizer.zero_grad()

        story, highlight = batch
        story = story.to(DEVICE)
        highlight = highlight.to(DEVICE)

        output = model(story, highlight)
        for sequence, target in zip(output, highlight):
            batch_loss_train += criterion(sequence, target)
        batch_loss_train.backward()
        epoch_loss_train += batch_loss_train.item()
        optimizer.step()

    return epoch_loss_train / len(train_iter)


def train(train_iter, criterion, model, optimizer, num_epochs=NUM_EPOCHS):
    train_loss = []
    model.to(DEVICE)

    # training loop
    for epoch in range(num_epochs):
        epoch_loss_train = train_epoch(train_iter, criterion, model, optimizer)
        train_loss.append(epoch_loss_train)
    return train_loss


# a few (story, highlight) batches of token ids stand in for the CNN/DailyMail loader
train_loader = [(torch.randint(0, voc_size, (batch_size, MAX_LEN_STORY)),
                 torch.randint(0, voc_size, (batch_size, MAX_LEN_HIGHLIGHT))) for _ in range(4)]

encoder = Encoder()
attention_decoder = AttnDecoder()
model = Seq2seqAttention(encoder, attention_decoder).to(DEVICE)

optimizer = torch.optim.Adam(model.parameters(), lr=3e-4, weight_decay=5e-3)
loss_function = torch.nn.NLLLoss()

train(train_loader, loss_function, model, optimizer)
print("done")
