# source: https://github.com/thunlp/FewRel/issues/73 — MetaNet's forward calls loss.backward() to learn fast weights, but the framework's eval() runs it under torch.no_grad()
# fix-source: https://github.com/thunlp/FewRel/issues/73 — maintainer's comment (THUCSTHanxu13): for MetaNet remove the `with torch.no_grad()`, the method needs gradients to make its parameters
# expect-kind: none
# fix: eval() runs MetaNet without `with torch.no_grad()`, so the fast-weight losses in forward keep their graph
import numpy as np
import torch
from torch import optim, nn
from torch.autograd import Variable
from torch.nn import functional as F
from _device import DEVICE


class Embedding(nn.Module):

    def __init__(self, word_vec_mat, max_length, word_embedding_dim=50, pos_embedding_dim=5):
        nn.Module.__init__(self)
        self.max_length = max_length
        self.word_embedding_dim = word_embedding_dim
        self.pos_embedding_dim = pos_embedding_dim
        word_vec_mat = torch.from_numpy(word_vec_mat)
        self.word_embedding = nn.Embedding(word_vec_mat.shape[0], self.word_embedding_dim, padding_idx=word_vec_mat.shape[0] - 1)
        self.word_embedding.weight.data.copy_(word_vec_mat)
        self.pos1_embedding = nn.Embedding(2 * max_length, pos_embedding_dim, padding_idx=0)
        self.pos2_embedding = nn.Embedding(2 * max_length, pos_embedding_dim, padding_idx=0)

    def forward(self, inputs):
        word = inputs['word']
        pos1 = inputs['pos1']
        pos2 = inputs['pos2']
        x = torch.cat([self.word_embedding(word),
                       self.pos1_embedding(pos1),
                       self.pos2_embedding(pos2)], 2)
        return x


class Encoder(nn.Module):
    def __init__(self, max_length, word_embedding_dim=50, pos_embedding_dim=5, hidden_size=230):
        nn.Module.__init__(self)
        self.max_length = max_length
        self.hidden_size = hidden_size
        self.embedding_dim = word_embedding_dim + pos_embedding_dim * 2
        self.conv = nn.Conv1d(self.embedding_dim, self.hidden_size, 3, padding=1)
        self.pool = nn.MaxPool1d(max_length)

    def forward(self, inputs):
        return self.cnn(inputs)

    def cnn(self, inputs):
        x = self.conv(inputs.transpose(1, 2))
        x = F.relu(x)
        x = self.pool(x)
        return x.squeeze(2)  # n x hidden_size


class FewShotREModel(nn.Module):
    def __init__(self, my_sentence_encoder):
        nn.Module.__init__(self)
        self.sentence_encoder = my_sentence_encoder
        self.cost = nn.CrossEntropyLoss()

    def loss(self, logits, label):
        N = logits.size(-1)
        return self.cost(logits.view(-1, N), label.view(-1))

    def accuracy(self, pred, label):
        return torch.mean((pred.view(-1) == label.view(-1)).type(torch.FloatTensor))


def log_and_sign(inputs, k=7):
    eps = 1e-7
    log = torch.log(torch.abs(inputs) + eps) / k
    log[log < -1.0] = -1.0
    sign = log * np.exp(k)
    sign[sign < -1.0] = -1.0
    sign[sign > 1.0] = 1.0
    return torch.cat([log, sign], 1)


class LearnerForAttention(nn.Module):

    def __init__(self):
        nn.Module.__init__(self)
        self.conv_lstm = nn.LSTM(2, 20, batch_first=True)
        self.conv_fc = nn.Linear(20, 1)
        self.fc_lstm = nn.LSTM(2, 20, batch_first=True)
        self.fc_fc = nn.Linear(20, 1)

    def forward(self, inputs, is_conv):
        size = inputs.size()
        x = inputs.view((-1, 1))
        x = log_and_sign(x)  # (-1, 2)

        #### NO BACKPROP
        x = Variable(x, requires_grad=False).unsqueeze(0)  # (1, param_size, 2)
        ####

        if is_conv:
            x, _ = self.conv_lstm(x)  # (1, param_size, 1)
            x = x.squeeze()
            x = self.conv_fc(x)
        else:
            x, _ = self.fc_lstm(x)  # (1, param_size, 1)
            x = x.squeeze()
            x = self.fc_fc(x)
        return x.view(size)


class LearnerForBasic(nn.Module):

    def __init__(self):
        nn.Module.__init__(self)
        self.conv_fc1 = nn.Linear(2, 20)
        self.conv_fc2 = nn.Linear(20, 20)
        self.conv_fc3 = nn.Linear(20, 1)
        self.fc_fc1 = nn.Linear(2, 20)
        self.fc_fc2 = nn.Linear(20, 20)
        self.fc_fc3 = nn.Linear(20, 1)

    def forward(self, inputs, is_conv):
        size = inputs.size()
        x = inputs.view((-1, 1))
        x = log_and_sign(x)  # (-1, 2)

        #### NO BACKPROP
        x = Variable(x, requires_grad=False)
        ####

        if is_conv:
            x = F.relu(self.conv_fc1(x))
            x = F.relu(self.conv_fc2(x))
            x = self.conv_fc3(x)
        else:
            x = F.relu(self.fc_fc1(x))
            x = F.relu(self.fc_fc2(x))
            x = self.fc_fc3(x)
        return x.view(size)


class MetaNet(FewShotREModel):

    def __init__(self, N, K, embedding, max_length, hidden_size=230):
        FewShotREModel.__init__(self, None)
        self.max_length = max_length
        self.hidden_size = hidden_size
        self.N = N
        self.K = K

        self.embedding = embedding

        self.basic_encoder = Encoder(max_length, word_embedding_dim=50, pos_embedding_dim=5, hidden_size=hidden_size)
        self.attention_encoder = Encoder(max_length, word_embedding_dim=50, pos_embedding_dim=5, hidden_size=hidden_size)

        self.basic_fast_conv_W = None
        self.attention_fast_conv_W = None

        self.basic_fc = nn.Linear(hidden_size, N, bias=False)
        self.attention_fc = nn.Linear(hidden_size, N, bias=False)

        self.basic_fast_fc_W = None
        self.attention_fast_fc_W = None

        self.learner_basic = LearnerForBasic()
        self.learner_attention = LearnerForAttention()

    def basic_emb(self, inputs, size, use_fast=False):
        x = self.embedding(inputs)
        output = self.basic_encoder(x)
        if use_fast:
            output += F.relu(F.conv1d(x.transpose(-1, -2), self.basic_fast_conv_W, padding=1)).max(-1)[0]
        return output.view(size)

    def attention_emb(self, inputs, size, use_fast=False):
        x = self.embedding(inputs)
        output = self.attention_encoder(x)
        if use_fast:
            output += F.relu(F.conv1d(x.transpose(-1, -2), self.attention_fast_conv_W, padding=1)).max(-1)[0]
        return output.view(size)

    def attention_score(self, s_att, q_att):
        s_att = s_att.view(s_att.size(0), s_att.size(1) * s_att.size(2), s_att.size(3))  # (B, N * K, D)
        s_att = s_att.unsqueeze(1)  # (B, 1, N * K, D)
        q_att = q_att.unsqueeze(2)  # (B, NQ, 1, D)
        cos = F.cosine_similarity(s_att, q_att, dim=-1)  # (B, NQ, N * K)
        score = F.softmax(cos, -1)  # (B, NQ, N * K)
        return score

    def forward(self, support, query, N, K, Q):
        # learn fast parameters for attention encoder
        s = self.attention_emb(support, (-1, N, K, self.hidden_size))
        logits = self.attention_fc(s)  # (B, N, K, N)

        B = s.size(0)
        NQ = N * Q
        assert(B == 1)

        self.zero_grad()
        tmp_label = Variable(torch.tensor([[x] * K for x in range(N)] * B, dtype=torch.long).to(DEVICE))
        loss = self.cost(logits.view(-1, N), tmp_label.view(-1))
        loss.backward(retain_graph=True)

        grad_conv = self.attention_encoder.conv.weight.grad
        grad_fc = self.attention_fc.weight.grad

        self.attention_fast_conv_W = self.learner_attention(grad_conv, is_conv=True)
        self.attention_fast_fc_W = self.learner_attention(grad_fc, is_conv=False)

        # learn fast parameters for basic encoder (each class)
        s = self.basic_emb(support, (-1, N, K, self.hidden_size))
        logits = self.basic_fc(s)  # (B, N, K, N)

        basic_fast_conv_params = []
        basic_fast_fc_params = []
        for i in range(N):
            for j in range(K):
                self.zero_grad()
                tmp_label = Variable(torch.tensor([i], dtype=torch.long).to(DEVICE))
                loss = self.cost(logits[:, i, j].view(-1, N), tmp_label.view(-1))
                loss.backward(retain_graph=True)

                grad_conv = self.basic_encoder.conv.weight.grad
                grad_fc = self.basic_fc.weight.grad

                basic_fast_conv_params.append(self.learner_basic(grad_conv, is_conv=True))
                basic_fast_fc_params.append(self.learner_basic(grad_fc, is_conv=False))
        basic_fast_conv_params = torch.stack(basic_fast_conv_params, 0)  # (N * K, conv_weight_size)
        basic_fast_fc_params = torch.stack(basic_fast_fc_params, 0)  # (N * K, fc_weight_size)

        # final
        self.zero_grad()
        s_att = self.attention_emb(support, (-1, N, K, self.hidden_size), use_fast=True)
        q_att = self.attention_emb(query, (-1, NQ, self.hidden_size), use_fast=True)
        score = self.attention_score(s_att, q_att).squeeze(0)  # assume B = 1, (NQ, N * K)
        size_conv_param = basic_fast_conv_params.size()[1:]
        size_fc_param = basic_fast_fc_params.size()[1:]
        final_fast_conv_param = torch.matmul(score, basic_fast_conv_params.view(N * K, -1))  # (NQ, conv_weight_size)
        final_fast_fc_param = torch.matmul(score, basic_fast_fc_params.view(N * K, -1))  # (NQ, fc_weight_size)
        stack_logits = []
        for i in range(NQ):
            self.basic_fast_conv_W = final_fast_conv_param[i].view(size_conv_param)
            self.basic_fast_fc_W = final_fast_fc_param[i].view(size_fc_param)
            q = self.basic_emb({'word': query['word'][i:i + 1], 'pos1': query['pos1'][i:i + 1], 'pos2': query['pos2'][i:i + 1], 'mask': query['mask'][i:i + 1]}, (self.hidden_size), use_fast=True)
            logits = self.basic_fc(q) + F.linear(q, self.basic_fast_fc_W)
            stack_logits.append(logits)
        logits = torch.stack(stack_logits, 0)

        _, pred = torch.max(logits.view(-1, N), 1)
        return logits, pred


def few_shot_loader(N, K, Q, max_length, vocab):
    """Stands in for FewRel's data loader: random sentences of N classes (batch size 1)."""
    def sentences(n):
        return {'word': torch.randint(0, vocab, (n, max_length), device=DEVICE),
                'pos1': torch.randint(1, 2 * max_length, (n, max_length), device=DEVICE),
                'pos2': torch.randint(1, 2 * max_length, (n, max_length), device=DEVICE),
                'mask': torch.ones(n, max_length, dtype=torch.long, device=DEVICE)}
    while True:
        label = torch.arange(N, device=DEVICE).repeat_interleave(Q)
        yield sentences(N * K), sentences(N * Q), label


class FewShotREFramework:

    def __init__(self, train_data_loader, val_data_loader, test_data_loader):
        self.train_data_loader = train_data_loader
        self.val_data_loader = val_data_loader
        self.test_data_loader = test_data_loader

    def item(self, x):
        return x.item()

    def train(self, model, model_name, B, N_for_train, N_for_eval, K, Q,
              na_rate=0, learning_rate=1e-1, lr_step_size=20000, weight_decay=1e-5,
              train_iter=4, val_iter=1, val_step=2, pytorch_optim=optim.SGD, grad_iter=1):
        optimizer = pytorch_optim(model.parameters(),
                                  learning_rate, weight_decay=weight_decay)
        scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=lr_step_size)
        start_iter = 0

        model.train()

        # Training
        best_acc = 0
        iter_loss = 0.0
        iter_right = 0.0
        iter_sample = 0.0
        for it in range(start_iter, start_iter + train_iter):
            support, query, label = next(self.train_data_loader)
            logits, pred = model(support, query,
                                 N_for_train, K, Q)  # MetaNet takes Q per class
            loss = model.loss(logits, label) / float(grad_iter)
            right = model.accuracy(pred, label)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10)

            if it % grad_iter == 0:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

            iter_loss += self.item(loss.data)
            iter_right += self.item(right.data)
            iter_sample += 1

            if (it + 1) % val_step == 0:
                acc = self.eval(model, B, N_for_eval, K, Q, val_iter, na_rate=na_rate)
                model.train()
                if acc > best_acc:
                    best_acc = acc  # (the original saves a checkpoint here)
                iter_loss = 0.
                iter_right = 0.
                iter_sample = 0.

    def eval(self, model, B, N, K, Q, eval_iter, na_rate=0, ckpt=None):
        model.eval()
        eval_dataset = self.val_data_loader

        iter_right = 0.0
        iter_sample = 0.0
        for it in range(eval_iter):
            support, query, label = next(eval_dataset)
            logits, pred = model(support, query, N, K, Q)

            right = model.accuracy(pred, label)
            iter_right += self.item(right.data)
            iter_sample += 1
        return iter_right / iter_sample


N, K, Q, max_length, vocab = 2, 2, 1, 6, 20
word_vec_mat = np.random.randn(vocab, 50).astype(np.float32)
embedding = Embedding(word_vec_mat, max_length).to(DEVICE)
model = MetaNet(N, K, embedding, max_length, hidden_size=4).to(DEVICE)
framework = FewShotREFramework(few_shot_loader(N, K, Q, max_length, vocab),
                               few_shot_loader(N, K, Q, max_length, vocab),
                               few_shot_loader(N, K, Q, max_length, vocab))
framework.train(model, "metanet", 1, N, N, K, Q)
print("done")
