# source: https://github.com/facebookresearch/pytorch_GAN_zoo/issues/83 — with --GDPP, BaseGAN.optimizeParameters back-propagates lossGFake, then the GDPP loss through the same D(G(z)) graph
# fix-source: https://github.com/facebookresearch/pytorch_GAN_zoo/pull/85 — merged: lossGFake.backward(retain_graph=True)
# expect-kind: none
# fix: lossGFake.backward(retain_graph=True), so the GDPP loss can still back-propagate through D(G(z)) (and G) from the same forward
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


def GDPPLoss(phiFake, phiReal, backward=True):
    def compute_diversity(phi):
        phi = F.normalize(phi, p=2, dim=1)
        SB = torch.mm(phi, phi.t())
        eigVals, eigVecs = torch.linalg.eigh(SB)
        return eigVals, eigVecs

    def normalize_min_max(eigVals):
        minV, maxV = torch.min(eigVals), torch.max(eigVals)
        return (eigVals - minV) / (maxV - minV)

    fakeEigVals, fakeEigVecs = compute_diversity(phiFake)
    realEigVals, realEigVecs = compute_diversity(phiReal)
    magnitudeLoss = 0.0001 * F.mse_loss(target=realEigVals, input=fakeEigVals)
    structureLoss = -torch.sum(torch.mul(fakeEigVecs, realEigVecs), 0)
    normalizedRealEigVals = normalize_min_max(realEigVals)
    weightedStructureLoss = torch.sum(torch.mul(normalizedRealEigVals, structureLoss))
    gdppLoss = magnitudeLoss + weightedStructureLoss
    if backward:
        gdppLoss.backward(retain_graph=True)
    return gdppLoss.item()


class DCGANCriterion:
    def getCriterion(self, input, status):
        target = torch.full_like(input, 1.0 if status else 0.0)
        return F.binary_cross_entropy_with_logits(input, target)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(2, 8), nn.LeakyReLU(0.2), nn.Linear(8, 8), nn.LeakyReLU(0.2))
        self.decisionLayer = nn.Linear(8, 1)

    def forward(self, x, getFeature=False):
        feature = self.features(x)
        out = self.decisionLayer(feature)
        if getFeature:
            return out, feature
        return out


class BaseGAN:
    def __init__(self, noiseVectorDim=4, GDPP=True):
        self.noiseVectorDim = noiseVectorDim
        self.GDPP = GDPP
        self.netG = nn.Sequential(nn.Linear(noiseVectorDim, 16), nn.ReLU(), nn.Linear(16, 2)).to(DEVICE)
        self.netD = Discriminator().to(DEVICE)
        self.avgG = copy.deepcopy(self.netG)
        for param in self.avgG.parameters():
            param.requires_grad = False
        self.optimizerG = torch.optim.Adam(self.netG.parameters(), lr=1e-3, betas=(0.0, 0.99))
        self.optimizerD = torch.optim.Adam(self.netD.parameters(), lr=1e-3, betas=(0.0, 0.99))
        self.lossCriterion = DCGANCriterion()

    def buildNoiseData(self, n_samples):
        return torch.randn(n_samples, self.noiseVectorDim, device=DEVICE), None

    def optimizeParameters(self, input_batch):
        allLosses = {}
        self.real_input = input_batch.to(DEVICE)
        n_samples = self.real_input.size()[0]

        # Update the discriminator
        self.optimizerD.zero_grad()
        predRealD = self.netD(self.real_input, False)
        lossD = self.lossCriterion.getCriterion(predRealD, True)
        allLosses["lossD_real"] = lossD.item()
        inputLatent, targetRandCat = self.buildNoiseData(n_samples)
        predFakeG = self.netG(inputLatent).detach()
        predFakeD = self.netD(predFakeG, False)
        lossDFake = self.lossCriterion.getCriterion(predFakeD, False)
        allLosses["lossD_fake"] = lossDFake.item()
        lossD += lossDFake
        lossD.backward(retain_graph=True)
        self.optimizerD.step()

        # Update the generator
        self.optimizerG.zero_grad()
        self.optimizerD.zero_grad()
        inputNoise, targetCatNoise = self.buildNoiseData(n_samples)
        predFakeG = self.netG(inputNoise)
        predFakeD, phiGFake = self.netD(predFakeG, True)
        lossGFake = self.lossCriterion.getCriterion(predFakeD, True)
        allLosses["lossG_fake"] = lossGFake.item()
        lossGFake.backward(retain_graph=True)

        if self.GDPP:
            _, phiDReal = self.netD.forward(self.real_input, True)
            allLosses["lossG_GDPP"] = GDPPLoss(phiDReal, phiGFake, backward=True)

        self.optimizerG.step()

        # Update the moving average
        for p, avg_p in zip(self.netG.parameters(), self.avgG.parameters()):
            avg_p.mul_(0.999).add_(p.data, alpha=0.001)
        return allLosses


model = BaseGAN()
for step in range(4):
    real = torch.randn(4, 2, device=DEVICE) * 0.5 + 1.0
    model.optimizeParameters(real)
print("done")
