# source: https://github.com/guopengf/FL-MRCM/issues/10 — FL-MRCM (federated MRI reconstruction with adversarial feature alignment): in LocalUpdate_ad_da.train the reconstruction net's adversarial loss is turned into a float (`loss_adv_g = loss_adv_g.detach().item()`) before `loss = L1_loss + loss_adv_g`, so "loss_adv_g will not take effect to the back propagation"; no error is raised, the alignment term silently trains nothing
# fix-source: https://github.com/guopengf/FL-MRCM/commit/7769f407cfa96819b29b8dd099400aeda47d267f — maintainer's fix (with 0a36f17): keep loss_adv_g a tensor and log `loss_adv_g.detach().item()` in batch_loss_adv_g.append(...) instead
# expect-kind: no-grad
# expect-culprit: loss_adv_g
import types

import numpy as np
import torch
from torch import nn
from torch.autograd import Variable
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from _device import DEVICE


class UnetModel_ad_da(nn.Module):
    # stand-in for the repo's U-Net: one down block, bottleneck, one up block; returns (output, z)
    def __init__(self, chans=4):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(1, chans, 3, padding=1), nn.LeakyReLU(0.2))
        self.conv = nn.Sequential(nn.Conv2d(chans, chans, 3, padding=1), nn.LeakyReLU(0.2))
        self.up = nn.ConvTranspose2d(chans, chans, 2, stride=2)
        self.out = nn.Conv2d(2 * chans, 1, 1)

    def forward(self, input):
        output = input.unsqueeze(1)
        skip = self.down(output)
        output = F.avg_pool2d(skip, kernel_size=2, stride=2, padding=0)
        output = self.conv(output)
        z = F.adaptive_avg_pool2d(output, 2).view(output.shape[0], -1)
        output = self.up(output)
        output = self.out(torch.cat([output, skip], dim=1))
        return output.squeeze(1), z


class Feature_discriminator(nn.Module):
    def __init__(self, input_dim=16):
        super(Feature_discriminator, self).__init__()
        self.fc1 = nn.Linear(input_dim, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        x = F.leaky_relu(self.fc1(x), 0.2)
        x = F.leaky_relu(self.fc2(x), 0.2)
        return x


class SliceData(Dataset):
    # stand-in for the fastMRI slice dataset: (input, target, mean, std, norm, fname, slice)
    def __init__(self, n, shift):
        self.items = [(torch.randn(8, 8) + shift, torch.randn(8, 8), torch.tensor(0.0), torch.tensor(1.0),
                       torch.tensor(1.0), 'vol%d' % i, i) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class LocalUpdate_ad_da(object):
    # v1
    def __init__(self, args, device, dataset, dataset_target, optimizer, optimizer_fd, flag):
        self.args = args
        self.device = device
        self.loss_func = nn.L1Loss().to(device)
        self.adv_loss = nn.BCEWithLogitsLoss().to(device)
        self.selected_clients = []
        self.ldr_train = DataLoader(dataset, batch_size=self.args.local_bs, shuffle=True)
        self.target_domain = DataLoader(dataset_target, batch_size=self.args.local_bs, shuffle=True)
        self.optimizer = optimizer
        self.optimizer_fd = optimizer_fd
        self.flag = flag

    def set_requires_grad(self, nets, requires_grad=False):
        if not isinstance(nets, list):
            nets = [nets]
        for net in nets:
            if net is not None:
                for param in net.parameters():
                    param.requires_grad = requires_grad

    def train(self, net, net_fd, epoch, idx, writer):
        net.train()
        net_fd.train()
        optimizer = self.optimizer
        optimizer_fd = self.optimizer_fd

        epoch_loss = []
        epoch_loss_adv_g = []
        for iter in range(self.args.local_ep):
            batch_loss = []
            batch_loss_L1 = []
            batch_loss_adv_g = []
            batch_loss_adv_d = []
            for batch_idx, (batch, batch_t) in enumerate(zip(self.ldr_train, self.target_domain)):
                input, target, mean, std, norm, fname, slice = batch
                input_t, target_t, _, _, _, _, _ = batch_t
                net.zero_grad()
                net_fd.zero_grad()
                output, z = net(input.to(self.device))
                output_t, z_t = net(input_t.to(self.device))
                mean = mean.unsqueeze(1).unsqueeze(2).to(self.device)
                std = std.unsqueeze(1).unsqueeze(2).to(self.device)
                norm = norm.unsqueeze(1).unsqueeze(2).to(self.device)

                # prepare labels for fd
                src_domain_code = np.repeat(np.array([[*([1]), *([0])]]), input.shape[0], axis=0)
                tgt_domain_code = np.repeat(np.array([[*([0]), *([1])]]), input_t.shape[0], axis=0)
                src_domain_code = Variable(torch.FloatTensor(src_domain_code).to(self.device), requires_grad=False)
                tgt_domain_code = Variable(torch.FloatTensor(tgt_domain_code).to(self.device), requires_grad=False)

                # update DF for source site
                df_loss = 0
                if not self.flag:
                    self.set_requires_grad(net_fd, True)
                    src_domain_pred = net_fd(z.detach())
                    tgt_domain_pred = net_fd(z_t.detach())
                    # adv loss for DF
                    df_loss_src = self.adv_loss(src_domain_pred, 1 - src_domain_code)
                    df_loss_tgt = self.adv_loss(tgt_domain_pred, 1 - tgt_domain_code)
                    df_loss = ((df_loss_src + df_loss_tgt) / 2)

                    df_loss.backward()
                    optimizer_fd.step()
                    df_loss = df_loss.detach().item()
                batch_loss_adv_d.append(df_loss)

                # update Recon
                self.set_requires_grad(net_fd, False)
                loss_adv_g = 0
                if not self.flag:
                    # adv for recon net
                    src_domain_pred = net_fd(z)
                    tgt_domain_pred = net_fd(z_t)
                    df_loss_src = self.adv_loss(src_domain_pred, src_domain_code)
                    df_loss_tgt = self.adv_loss(tgt_domain_pred, tgt_domain_code)
                    loss_adv_g = ((df_loss_src + df_loss_tgt) / 2)
                    loss_adv_g = loss_adv_g.detach().item()  # culprit
                batch_loss_adv_g.append(loss_adv_g)

                L1_loss = self.loss_func(output, target.to(self.device))
                batch_loss_L1.append(L1_loss.detach().item())
                if not self.flag:
                    loss = L1_loss + loss_adv_g
                else:
                    loss = L1_loss
                batch_loss.append(loss.detach().item())
                loss.backward()
                optimizer.step()

            epoch_loss.append(sum(batch_loss) / len(batch_loss))
            epoch_loss_adv_g.append(sum(batch_loss_adv_g) / len(batch_loss_adv_g))
        writer.add_scalar('TrainLoss/adv_g/' + self.args.train_datasets[idx],
                          sum(epoch_loss_adv_g) / len(epoch_loss_adv_g), epoch)

        return net.state_dict(), sum(epoch_loss) / len(epoch_loss)


class NullWriter(object):
    # stand-in for the tensorboard SummaryWriter
    def add_scalar(self, *args, **kwargs):
        pass


if __name__ == "__main__":
    torch.manual_seed(0)
    args = types.SimpleNamespace(local_bs=2, local_ep=1, lr=1e-3, train_datasets=['fastMRI'])
    G = UnetModel_ad_da().to(DEVICE)
    FD = Feature_discriminator().to(DEVICE)
    opt_g = torch.optim.RMSprop(G.parameters(), lr=args.lr)
    opt_fd = torch.optim.RMSprop(FD.parameters(), lr=args.lr * 10)
    dataset_train, dataset_target = SliceData(6, 0.0), SliceData(6, 1.0)
    writer = NullWriter()
    for epoch in range(2):
        flag = False  # the source site is not the target (test) site: the adversarial loss is on
        local = LocalUpdate_ad_da(args=args, device=DEVICE, dataset=dataset_train, dataset_target=dataset_target,
                                  optimizer=opt_g, optimizer_fd=opt_fd, flag=flag)
        w, loss = local.train(net=G, net_fd=FD, epoch=epoch, idx=0, writer=writer)
    print("done")
