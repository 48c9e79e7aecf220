# source: https://github.com/RUCAIBox/TextBox/pull/105 — maintainer's PR "FIX: bugs in the backward of multiple optimizers": LeakGANTrainer._optimize_step stepped the manager optimizer before the worker loss, whose graph runs through the manager, was back-propagated
# fix-source: https://github.com/RUCAIBox/TextBox/pull/105 (commit 35166fc) — maintainer's fix: back-propagate every loss first, then step every optimizer (`for o in opt: o.step()`)
# expect-kind: none
# fix: every loss is back-propagated before any optimizer steps (`for o in opt: o.step()` after the backward loop)
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from _device import DEVICE


class LeakGANDiscriminator(nn.Module):
    def __init__(self, vocab_size, embedding_size=8, filter_nums=(4, 4)):
        super().__init__()
        self.word_embedding = nn.Embedding(vocab_size, embedding_size)
        self.filters = nn.ModuleList(nn.Linear(embedding_size, n) for n in filter_nums)
        self.highway = nn.Linear(sum(filter_nums), sum(filter_nums))

    def get_feature(self, inp):
        data = self.word_embedding(inp)  # b * len * e
        combined_outputs = torch.cat([torch.relu(f(data)).max(dim=1)[0] for f in self.filters], 1)
        C_tilde = torch.sigmoid(self.highway(combined_outputs))  # b * tot_f_n
        return C_tilde


class LeakGANGenerator(nn.Module):
    def __init__(self, vocab_size=10, batch_size=4, max_seq_length=8, step_size=4):
        super().__init__()
        self.vocab_size = vocab_size
        self.batch_size = batch_size
        self.hidden_size = 8
        self.embedding_size = 8
        self.max_length = max_seq_length
        self.goal_out_size = 8
        self.goal_size = 4
        self.step_size = step_size
        self.start_idx, self.pad_idx = 1, 0

        self.word_embedding = nn.Embedding(self.vocab_size, self.embedding_size)
        self.worker = nn.LSTM(self.embedding_size, self.hidden_size)
        self.manager = nn.LSTM(self.goal_out_size, self.hidden_size)
        self.work2goal = nn.Linear(self.hidden_size, self.vocab_size * self.goal_size)
        self.mana2goal = nn.Linear(self.hidden_size, self.goal_out_size)
        self.goal2goal = nn.Linear(self.goal_out_size, self.goal_size, bias=False)
        self.goal_init = nn.Parameter(torch.rand((self.batch_size, self.goal_out_size)))

    def init_hidden(self, batch_size=1):
        h = torch.zeros(1, batch_size, self.hidden_size, device=self.goal_init.device)
        c = torch.zeros(1, batch_size, self.hidden_size, device=self.goal_init.device)
        return h, c

    def forward(self, idx, inp, work_hidden, mana_hidden, feature, real_goal):
        emb = self.word_embedding(inp).unsqueeze(0)  # 1 * batch_size * embed_dim
        # Manager
        mana_out, mana_hidden = self.manager(feature, mana_hidden)
        mana_out = self.mana2goal(mana_out.permute([1, 0, 2]))  # batch_size * 1 * goal_out_size
        cur_goal = F.normalize(mana_out, p=2, dim=-1).squeeze(dim=1)
        _real_goal = self.goal2goal(real_goal)  # batch_size * goal_size
        _real_goal = F.normalize(_real_goal, p=2, dim=-1).unsqueeze(-1)  # batch_size * goal_size * 1
        # Worker
        work_out, work_hidden = self.worker(emb, work_hidden)
        work_out = self.work2goal(work_out.squeeze(dim=0))
        work_out = work_out.contiguous().view(-1, self.vocab_size, self.goal_size)
        out = torch.matmul(work_out, _real_goal).squeeze(-1)  # batch_size * vocab_size
        return out, cur_goal, work_hidden, mana_hidden

    def leakgan_forward(self, targets, dis):
        batch_size, seq_len = targets.size()
        device = targets.device
        feature_array = torch.zeros((batch_size, self.max_length + 1, self.goal_out_size), device=device)
        goal_array = torch.zeros((batch_size, self.max_length + 1, self.goal_out_size), device=device)
        leak_out_array = torch.zeros((batch_size, self.max_length + 1, self.vocab_size), device=device)

        work_hidden = self.init_hidden(batch_size)
        mana_hidden = self.init_hidden(batch_size)
        leak_inp_t = torch.full((batch_size,), self.start_idx, dtype=torch.long, device=device)
        cur_dis_inp = torch.full((batch_size, seq_len), self.pad_idx, dtype=torch.long, device=device)

        real_goal = self.goal_init[:batch_size, :]  # init real goal
        goal_array[:, 0, :] = real_goal
        feature = dis.get_feature(cur_dis_inp).unsqueeze(0)
        feature_array[:, 0, :] = feature.squeeze(0)
        _, mana_hidden = self.manager(feature, mana_hidden)

        for i in range(1, self.max_length + 1):
            given_dis_inp = targets[:, :i]
            cur_dis_inp = torch.cat([given_dis_inp, cur_dis_inp], dim=1)[:, :seq_len].long()
            feature = dis.get_feature(cur_dis_inp).unsqueeze(0)
            feature_array[:, i, :] = feature.squeeze(0)
            out, cur_goal, work_hidden, mana_hidden = self.forward(
                i, leak_inp_t, work_hidden, mana_hidden, feature, real_goal
            )
            leak_out_array[:, i - 1, :] = out
            goal_array[:, i, :] = cur_goal
            # update real goal every step_size steps
            if i % self.step_size == 0:
                real_goal = torch.sum(goal_array[:, i - 3:i + 1, :], dim=1)
            leak_inp_t = targets[:, i - 1]
        leak_out_array = leak_out_array[:, :seq_len, :]
        return leak_out_array, feature_array, goal_array

    def pretrain_loss(self, corpus, dis):
        targets = corpus[:, 1:]  # not use sos token
        batch_size, seq_len = targets.size()
        leak_out_array, feature_array, goal_array = self.leakgan_forward(targets, dis)
        # Manager loss
        mana_cos_loss = self.manager_cos_loss(batch_size, feature_array, goal_array)
        manager_loss = -torch.sum(mana_cos_loss) / (self.batch_size * self.max_length / self.step_size)
        # Worker loss
        work_cn_loss = F.cross_entropy(leak_out_array.reshape(-1, self.vocab_size), targets.reshape(-1))
        return manager_loss, work_cn_loss

    def manager_cos_loss(self, batch_size, feature_array, goal_array):
        n = self.max_length // self.step_size
        sub_feature = torch.zeros(batch_size, n, self.goal_out_size, device=goal_array.device)
        real_goal = torch.zeros(batch_size, n, self.goal_out_size, device=goal_array.device)
        for i in range(n):
            idx = i * self.step_size
            sub_feature[:, i, :] = feature_array[:, idx + self.step_size, :] - feature_array[:, idx, :]
            if i == 0:
                real_goal[:, i, :] = goal_array[:, i, :]
            else:
                idx = (i - 1) * self.step_size + 1
                real_goal[:, i, :] = torch.sum(goal_array[:, idx:idx + 4, :], dim=1)
        sub_feature = F.normalize(sub_feature, p=2, dim=-1)
        real_goal = F.normalize(real_goal, p=2, dim=-1)
        return F.cosine_similarity(sub_feature, real_goal, dim=-1)

    def split_params(self):
        mana_params = list()
        work_params = list()
        mana_params += list(self.manager.parameters())
        mana_params += list(self.mana2goal.parameters())
        mana_params.append(self.goal_init)
        work_params += list(self.word_embedding.parameters())
        work_params += list(self.worker.parameters())
        work_params += list(self.work2goal.parameters())
        work_params += list(self.goal2goal.parameters())
        return mana_params, work_params


class LeakGAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = LeakGANGenerator()
        self.discriminator = LeakGANDiscriminator(self.generator.vocab_size)

    def calculate_g_train_loss(self, corpus, epoch_idx):
        self.discriminator.eval()
        loss = self.generator.pretrain_loss(corpus, self.discriminator)  # corpus: target_text
        self.discriminator.train()
        return loss


class LeakGANTrainer:
    def __init__(self, model, gen_lr=1e-3, grad_clip=5.0):
        self.model = model
        self.grad_clip = grad_clip
        self.g_optimizer = self._build_module_optimizer_(self.model.generator, gen_lr)  # (manager_opt, worker_opt)

    def _build_module_optimizer_(self, module, learing_rate):
        manager_params, worker_params = module.split_params()
        manager_opt = optim.Adam(manager_params, lr=learing_rate)
        worker_opt = optim.Adam(worker_params, lr=learing_rate)
        return (manager_opt, worker_opt)

    def _optimize_step(self, losses, total_loss, model, opt):
        loss_tuple = tuple(per_loss.item() for per_loss in losses)
        total_loss = loss_tuple if total_loss is None else tuple(map(sum, zip(total_loss, loss_tuple)))

        for i, (o, loss) in enumerate(zip(opt, losses)):
            o.zero_grad()
            loss.backward(retain_graph=True if i < len(opt) - 1 else False)
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)

        for o in opt:
            o.step()
        return total_loss

    def _g_train_epoch(self, real_data, epoch_idx):
        total_loss = None
        for data in real_data.split(self.model.generator.batch_size):
            losses = self.model.calculate_g_train_loss(data, epoch_idx=epoch_idx)
            total_loss = self._optimize_step(losses, total_loss, self.model.generator, self.g_optimizer)
        return total_loss


model = LeakGAN().to(DEVICE)
trainer = LeakGANTrainer(model)
real_data = torch.randint(2, 10, (8, 9), device=DEVICE)  # sos + max_seq_length tokens
real_data[:, 0] = 1
for epoch_idx in range(2):
    trainer._g_train_epoch(real_data, epoch_idx)
print("done")
