# source: https://github.com/davidmascharka/tbd-nets/issues/8 — issue: train-model.ipynb fails at loss.backward() with "element 0 of tensors does not require grad and does not have a grad_fn" (check_accuracy calls torch.set_grad_enabled(False) and never turns it back on, so the next epoch trains without a graph)
# fix-source: https://github.com/davidmascharka/tbd-nets/commit/9de0235a0ec42fd675a185f88057a1f98d176c4a — maintainer's fix "Fix training bug": torch.set_grad_enabled(True) at the start of train_epoch
# expect-kind: no-grad
# expect-culprit: outs
import io

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

device = DEVICE


class Flatten(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1)


class AndModule(nn.Module):
    def forward(self, attn1, attn2):
        return torch.min(attn1, attn2)


class AttentionModule(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(dim, 1, kernel_size=1, padding=0)
        torch.nn.init.kaiming_normal_(self.conv1.weight)
        torch.nn.init.kaiming_normal_(self.conv2.weight)
        self.dim = dim

    def forward(self, feats, attn):
        attended_feats = torch.mul(feats, attn.repeat(1, self.dim, 1, 1))
        out = F.relu(self.conv1(attended_feats))
        return torch.sigmoid(self.conv2(out))


class QueryModule(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, kernel_size=3, padding=1)
        torch.nn.init.kaiming_normal_(self.conv1.weight)
        self.dim = dim

    def forward(self, feats, attn):
        attended_feats = torch.mul(feats, attn.repeat(1, self.dim, 1, 1))
        return F.relu(self.conv1(attended_feats))


class TbDNet(nn.Module):
    def __init__(self, vocab, feature_dim=(6, 4, 4), module_dim=8, cls_proj_dim=8, fc_dim=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(feature_dim[0], module_dim, kernel_size=3, padding=1), nn.ReLU())
        module_rows, module_cols = feature_dim[1], feature_dim[2]
        self.classifier = nn.Sequential(nn.Conv2d(module_dim, cls_proj_dim, kernel_size=1),
                                        nn.ReLU(inplace=True),
                                        nn.MaxPool2d(kernel_size=2, stride=2),
                                        Flatten(),
                                        nn.Linear(cls_proj_dim * module_rows * module_cols // 4, fc_dim),
                                        nn.ReLU(inplace=True),
                                        nn.Linear(fc_dim, 28))  # note no softmax here
        self.function_modules = {}
        self.vocab = vocab
        for module_name in vocab['program_token_to_idx']:
            if module_name in ['<NULL>', '<START>', '<END>', '<UNK>', 'unique']:
                continue
            if module_name == 'scene':
                module = None
            elif module_name == 'intersect':
                module = AndModule()
            elif 'query' in module_name or module_name in {'exist', 'count'}:
                module = QueryModule(module_dim)
            else:
                module = AttentionModule(module_dim)
            self.function_modules[module_name] = module
            self.add_module(module_name, module)
        self.ones_var = torch.ones(1, 1, module_rows, module_cols).to(device)
        self._attention_sum = 0

    @property
    def attention_sum(self):
        return self._attention_sum

    def forward(self, feats, programs):
        batch_size = feats.size(0)
        assert batch_size == len(programs)
        feat_input_volume = self.stem(feats)
        final_module_outputs = []
        self._attention_sum = 0
        for n in range(batch_size):
            feat_input = feat_input_volume[n:n + 1]
            output = feat_input
            saved_output = None
            for i in reversed(programs.data[n].cpu().numpy()):
                module_type = self.vocab['program_idx_to_token'][i]
                if module_type in {'<NULL>', '<START>', '<END>', '<UNK>', 'unique'}:
                    continue
                module = self.function_modules[module_type]
                if module_type == 'scene':
                    saved_output = output
                    output = self.ones_var
                    continue
                if module_type == 'intersect':
                    output = module(output, saved_output)
                else:
                    output = module(feat_input, output)
                if 'filter' in module_type:
                    self._attention_sum += output.sum()
            final_module_outputs.append(output)
        final_module_outputs = torch.cat(final_module_outputs, 0)
        return self.classifier(final_module_outputs)


tokens = ['<NULL>', '<START>', '<END>', 'scene', 'filter_color[red]', 'filter_shape[cube]', 'intersect',
          'query_color', 'exist']
vocab = {'program_token_to_idx': {t: i for i, t in enumerate(tokens)},
         'program_idx_to_token': {i: t for i, t in enumerate(tokens)}}
tbd_net = TbDNet(vocab).to(device)

# query_color(filter_color[red](scene)); exist(intersect(filter_shape[cube](scene), filter_color[red](scene)))
program_a = [1, 7, 4, 3, 2, 0, 0, 0]
program_b = [1, 8, 6, 5, 3, 4, 3, 2]


def make_loader(n, batch_size):
    feats = torch.randn(n, 6, 4, 4)
    programs = torch.tensor([program_a if k % 2 == 0 else program_b for k in range(n)])
    answers = torch.tensor([15 + k % 17 for k in range(n)])  # answer tokens in Johnson et al.'s order
    questions, image_idxs = torch.zeros(n, 4, dtype=torch.long), torch.arange(n)
    dataset = torch.utils.data.TensorDataset(questions, image_idxs, feats, answers, programs)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)


train_loader = make_loader(8, 4)
val_loader = make_loader(4, 4)


def map_ans(answers):
    ''' Map the answers from the format Justin Johnson et al. use to our own format. '''
    ans_tensor = torch.LongTensor(answers.size())
    for ours, theirs in enumerate([15, 16, 18, 20, 21, 25, 26, 30, 17, 19, 29, 22, 28, 23, 27, 24, 31]):
        ans_tensor[answers == theirs] = ours
    for ours, theirs in enumerate(range(4, 15), start=17):
        ans_tensor[answers == theirs] = ours
    return ans_tensor


checkpoints = {}


def save_checkpoint(epoch, filename):
    ''' Save the training state. '''
    state = {'epoch': epoch, 'state_dict': tbd_net.state_dict(), 'optimizer': optimizer.state_dict()}
    checkpoints[filename] = io.BytesIO()
    torch.save(state, checkpoints[filename])


def check_accuracy(loader):
    '''
    Convenience function for checking the accuracy of the model
    over all the data in a given `DataLoader`
    '''
    torch.set_grad_enabled(False)
    num_correct, num_samples = 0, 0
    for batch in loader:
        _, _, feats, answers, programs = batch
        feats = feats.to(device)
        programs = programs.to(device)
        outs = tbd_net(feats, programs)
        _, preds = outs.max(1)
        mapped_ans = map_ans(answers)
        num_correct += (preds.to('cpu') == mapped_ans).sum()
        num_samples += preds.size(0)
    return (num_correct, num_samples)


def write_acc(f, string, correct, total):
    percent = correct / total * 100 if total != 0 else 100
    f.write(string.format(correct, total, percent))


optimizer = torch.optim.Adam(tbd_net.parameters(), 1e-04)
xent_loss = torch.nn.CrossEntropyLoss().to(device)


def train_epoch():
    ''' Convenience function to train the model for one epoch. '''
    num_correct, num_samples = 0, 0
    for batch in train_loader:
        _, _, feats, answers, programs = batch
        feats = feats.to(device)
        programs = programs.to(device)

        optimizer.zero_grad()
        outs = tbd_net(feats, programs)  # culprit
        _, preds = outs.max(1)
        mapped_ans = map_ans(answers)
        num_correct += (preds.to('cpu') == mapped_ans).sum()
        num_samples += preds.size(0)
        loss = xent_loss(outs, mapped_ans.to(device))
        # L1 penalty on the intermediate attention masks
        loss += tbd_net.attention_sum * 2.5e-07

        loss_file.write('Loss: {}\n'.format(loss.item()))
        loss.backward()
        optimizer.step()

    val_correct, val_samples = check_accuracy(val_loader)

    write_acc(acc_file, 'Train Accuracy: {} / {} ({:.2f}%)\n', num_correct, num_samples)
    write_acc(acc_file, 'Val Accuracy: {} / {} ({:.2f}%)\n', val_correct, val_samples)
    acc_file.flush()


loss_file = io.StringIO()  # results/example-loss.txt in the notebook
acc_file = io.StringIO()  # results/example-acc.txt
epoch = 0
while epoch < 3:
    save_checkpoint(epoch, 'example-{:02d}.pt'.format(epoch))
    epoch += 1
    train_epoch()

save_checkpoint(epoch, 'example-{:02d}.pt'.format(epoch))
print("done")
