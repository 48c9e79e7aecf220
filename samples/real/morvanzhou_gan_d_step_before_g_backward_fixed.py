# source: https://github.com/MorvanZhou/PyTorch-Tutorial/issues/89 — issue: 406_GAN.py raises the in-place error at G_loss.backward() with torch 1.5 (opt_D.step() changed D's weights)
# fix-source: maintainer's commit f52e199 "update for new version of torch" (after PR #91 / albanD in pytorch/pytorch#39141): update G first, then train D on G_paintings.detach()
# expect-kind: none
# fix: G_loss backward and opt_G.step() first (through D before its step), then D scores real and G_paintings.detach() afresh for D_loss and opt_D.step()
import torch
import torch.nn as nn
import numpy as np
from _device import DEVICE

# Hyper Parameters
BATCH_SIZE = 8
LR_G = 0.0001           # learning rate for generator
LR_D = 0.0001           # learning rate for discriminator
N_IDEAS = 5             # think of this as number of ideas for generating an art work (Generator)
ART_COMPONENTS = 15     # it could be total point G can draw in the canvas
PAINT_POINTS = np.vstack([np.linspace(-1, 1, ART_COMPONENTS) for _ in range(BATCH_SIZE)])


def artist_works():     # painting from the famous artist (real target)
    a = np.random.uniform(1, 2, size=BATCH_SIZE)[:, np.newaxis]
    paintings = a * np.power(PAINT_POINTS, 2) + (a-1)
    paintings = torch.from_numpy(paintings).float().to(DEVICE)
    return paintings

G = nn.Sequential(                      # Generator
    nn.Linear(N_IDEAS, 16),             # random ideas (could from normal distribution)
    nn.ReLU(),
    nn.Linear(16, ART_COMPONENTS),      # making a painting from these random ideas
).to(DEVICE)

D = nn.Sequential(                      # Discriminator
    nn.Linear(ART_COMPONENTS, 16),      # receive art work either from the famous artist or a newbie like G
    nn.ReLU(),
    nn.Linear(16, 1),
    nn.Sigmoid(),                       # tell the probability that the art work is made by artist
).to(DEVICE)

opt_D = torch.optim.Adam(D.parameters(), lr=LR_D)
opt_G = torch.optim.Adam(G.parameters(), lr=LR_G)

for step in range(4):
    artist_paintings = artist_works()           # real painting from artist
    G_ideas = torch.randn(BATCH_SIZE, N_IDEAS, device=DEVICE)  # random ideas
    G_paintings = G(G_ideas)                    # fake painting from G (random ideas)
    prob_artist1 = D(G_paintings)               # D try to reduce this prob
    G_loss = torch.mean(torch.log(1. - prob_artist1))
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()

    prob_artist0 = D(artist_paintings)          # D try to increase this prob
    prob_artist1 = D(G_paintings.detach())      # D try to reduce this prob
    D_loss = - torch.mean(torch.log(prob_artist0) + torch.log(1. - prob_artist1))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)      # reusing computational graph
    opt_D.step()

print("done")
