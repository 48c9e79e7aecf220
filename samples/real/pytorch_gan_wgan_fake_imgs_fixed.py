# source: https://github.com/eriklindernoren/PyTorch-GAN/issues/6 — issue "wgan retrain_graph": implementations/wgan/wgan.py fails at gen_validity.backward(valid) with "Trying to backward through the graph a second time"
# fix-source: https://github.com/eriklindernoren/PyTorch-GAN/commit/48e84ef5f15013954ee70980095c5597128558b1 — maintainer's fix "WGAN: Fixed typo. Resolves #6": the generator step scores gen_imgs, not the critic step's fake_imgs
# expect-kind: none
# fix: the generator step scores its own gen_imgs: gen_validity = discriminator(gen_imgs) (the maintainer's typo fix in 48e84ef)
import argparse
import numpy as np

from torch.utils.data import DataLoader, TensorDataset
from torch.autograd import Variable

import torch.nn as nn
import torch
from _device import DEVICE

parser = argparse.ArgumentParser()
parser.add_argument('--n_epochs', type=int, default=2, help='number of epochs of training')
parser.add_argument('--batch_size', type=int, default=4, help='size of the batches')
parser.add_argument('--lr', type=float, default=0.00005, help='learning rate')
parser.add_argument('--latent_dim', type=int, default=8, help='dimensionality of the latent space')
parser.add_argument('--img_size', type=int, default=4, help='size of each image dimension')
parser.add_argument('--channels', type=int, default=1, help='number of image channels')
parser.add_argument('--n_critic', type=int, default=2, help='number of training steps for discriminator per iter')
parser.add_argument('--clip_value', type=float, default=0.01, help='lower and upper clip value for disc. weights')
opt = parser.parse_args([])


def weights_init_normal(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        m.weight.data.normal_(0.0, 0.02)
    elif classname.find('BatchNorm') != -1:
        m.weight.data.normal_(1.0, 0.02)
        m.bias.data.fill_(0)


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()
        self.model = nn.Sequential(
            nn.Linear(opt.latent_dim, 16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(16, 32),
            nn.BatchNorm1d(32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(32, opt.img_size ** 2),
            nn.Tanh()
        )

    def forward(self, noise):
        img = self.model(noise)
        img = img.view(img.shape[0], opt.channels, opt.img_size, opt.img_size)
        return img


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()
        self.model = nn.Sequential(
            nn.Linear(opt.img_size ** 2, 16),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(16, 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(8, 1)
        )

    def forward(self, img):
        img_flat = img.view(img.shape[0], -1)
        validity = self.model(img_flat)
        return validity


# Initialize generator and discriminator
generator = Generator().to(DEVICE)
discriminator = Discriminator().to(DEVICE)

# Initialize weights
generator.apply(weights_init_normal)
discriminator.apply(weights_init_normal)

# A small stand-in for MNIST
images = torch.rand(16, opt.channels, opt.img_size, opt.img_size) * 2 - 1
dataloader = DataLoader(TensorDataset(images, torch.zeros(16)), batch_size=opt.batch_size, shuffle=False)

# Optimizers
optimizer_G = torch.optim.RMSprop(generator.parameters(), lr=opt.lr)
optimizer_D = torch.optim.RMSprop(discriminator.parameters(), lr=opt.lr)


def Tensor(*shape):
    return torch.empty(*shape, device=DEVICE)


# ----------
#  Training
# ----------

batches_done = 0
for epoch in range(opt.n_epochs):

    # Batch iterator
    data_iter = iter(dataloader)

    for i in range(len(data_iter) // opt.n_critic):
        # Train discriminator for n_critic times
        for _ in range(opt.n_critic):
            (imgs, _) = next(data_iter)

            # Adversarial ground truths
            valid = Variable(Tensor(imgs.shape[0], 1).fill_(-1.0), requires_grad=False)
            fake = Variable(Tensor(imgs.shape[0], 1).fill_(1.0), requires_grad=False)

            # Configure input
            real_imgs = Variable(imgs.to(DEVICE))

            # ---------------------
            #  Train Discriminator
            # ---------------------

            optimizer_D.zero_grad()

            # Sample noise as generator input
            z = Variable(torch.tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim)), dtype=torch.float32, device=DEVICE))

            # Generate a batch of images
            fake_imgs = generator(z)

            # Train on real images
            real_validity = discriminator(real_imgs)
            real_validity.backward(valid)
            # Train on fake images
            fake_validity = discriminator(fake_imgs)
            fake_validity.backward(fake)

            d_loss = real_validity - fake_validity

            optimizer_D.step()

            # Clip weights of discriminator
            for p in discriminator.parameters():
                p.data.clamp_(-opt.clip_value, opt.clip_value)

        # -----------------
        #  Train Generator
        # -----------------

        optimizer_G.zero_grad()

        # Sample noise as generator input
        z = Variable(torch.tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim)), dtype=torch.float32, device=DEVICE))

        # Generate a batch of images
        gen_imgs = generator(z)

        # Loss measures generator's ability to fool the discriminator
        # Train on fake images
        gen_validity = discriminator(gen_imgs)
        gen_validity.backward(valid)

        optimizer_G.step()

        batches_done += 1
print("done")
