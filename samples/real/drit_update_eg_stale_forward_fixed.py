# source: https://github.com/HsinYingLee/DRIT/issues/48 — update_EG steps enc_c/enc_a/gen, then backward_G_alone back-propagates through update_D's forward
# fix-source: commenter's fix in the same issue (wilsonjwcsu): run self.forward() once more before backward_G_alone()
# expect-kind: none
# fix: re-run self.forward() after the first E/G step, so backward_G_alone back-propagates through the updated enc_a/gen
import torch
import torch.nn as nn
from _device import DEVICE


class Dis(nn.Module):
  def __init__(self, input_dim):
    super(Dis, self).__init__()
    self.model = nn.Sequential(nn.Conv2d(input_dim, 8, 3, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(8, 1, 1))

  def forward(self, x_A):
    out_A = self.model(x_A)
    out_A = out_A.view(-1)
    outs_A = []
    outs_A.append(out_A)
    return outs_A


class Dis_content(nn.Module):
  def __init__(self):
    super(Dis_content, self).__init__()
    self.model = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1), nn.LeakyReLU(0.2), nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 1, 1))

  def forward(self, x):
    out = self.model(x)
    out = out.view(-1)
    outs = []
    outs.append(out)
    return outs


class E_content(nn.Module):
  def __init__(self, input_dim_a, input_dim_b):
    super(E_content, self).__init__()
    self.convA = nn.Sequential(nn.Conv2d(input_dim_a, 8, 3, 2, 1), nn.LeakyReLU(0.2))
    self.convB = nn.Sequential(nn.Conv2d(input_dim_b, 8, 3, 2, 1), nn.LeakyReLU(0.2))
    self.conv_share = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1), nn.ReLU())

  def forward(self, xa, xb):
    outputA = self.convA(xa)
    outputB = self.convB(xb)
    outputA = self.conv_share(outputA)
    outputB = self.conv_share(outputB)
    return outputA, outputB


class E_attr(nn.Module):
  def __init__(self, input_dim_a, input_dim_b, output_nc=8):
    super(E_attr, self).__init__()
    self.model_a = nn.Sequential(nn.Conv2d(input_dim_a, 8, 3, 2, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, output_nc, 1, 1, 0))
    self.model_b = nn.Sequential(nn.Conv2d(input_dim_b, 8, 3, 2, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, output_nc, 1, 1, 0))

  def forward(self, xa, xb):
    xa = self.model_a(xa)
    xb = self.model_b(xb)
    output_A = xa.view(xa.size(0), -1)
    output_B = xb.view(xb.size(0), -1)
    return output_A, output_B


class G(nn.Module):
  def __init__(self, output_dim_a, output_dim_b, nz):
    super(G, self).__init__()
    self.nz = nz
    self.mlpA = nn.Sequential(nn.Linear(nz, 16), nn.ReLU(inplace=True), nn.Linear(16, 8))
    self.mlpB = nn.Sequential(nn.Linear(nz, 16), nn.ReLU(inplace=True), nn.Linear(16, 8))
    self.decA5 = nn.Sequential(nn.ConvTranspose2d(8, output_dim_a, 4, 2, 1), nn.Tanh())
    self.decB5 = nn.Sequential(nn.ConvTranspose2d(8, output_dim_b, 4, 2, 1), nn.Tanh())

  def forward_a(self, x, z):
    z = self.mlpA(z)
    out = self.decA5(x + z[:, :, None, None])
    return out

  def forward_b(self, x, z):
    z = self.mlpB(z)
    out = self.decB5(x + z[:, :, None, None])
    return out


class DRIT(nn.Module):
  def __init__(self, opts):
    super(DRIT, self).__init__()
    lr = 0.0001
    lr_dcontent = lr / 2.5
    self.nz = 8
    self.no_ms = opts['no_ms']
    self.disA = Dis(3)
    self.disB = Dis(3)
    self.disA2 = Dis(3)
    self.disB2 = Dis(3)
    self.disContent = Dis_content()
    self.enc_c = E_content(3, 3)
    self.enc_a = E_attr(3, 3, self.nz)
    self.gen = G(3, 3, nz=self.nz)
    self.disA_opt = torch.optim.Adam(self.disA.parameters(), lr=lr, betas=(0.5, 0.999), weight_decay=0.0001)
    self.disB_opt = torch.optim.Adam(self.disB.parameters(), lr=lr, betas=(0.5, 0.999), weight_decay=0.0001)
    self.disA2_opt = torch.optim.Adam(self.disA2.parameters(), lr=lr, betas=(0.5, 0.999), weight_decay=0.0001)
    self.disB2_opt = torch.optim.Adam(self.disB2.parameters(), lr=lr, betas=(0.5, 0.999), weight_decay=0.0001)
    self.disContent_opt = torch.optim.Adam(self.disContent.parameters(), lr=lr_dcontent, betas=(0.5, 0.999), weight_decay=0.0001)
    self.enc_c_opt = torch.optim.Adam(self.enc_c.parameters(), lr=lr, betas=(0.5, 0.999), weight_decay=0.0001)
    self.enc_a_opt = torch.optim.Adam(self.enc_a.parameters(), lr=lr, betas=(0.5, 0.999), weight_decay=0.0001)
    self.gen_opt = torch.optim.Adam(self.gen.parameters(), lr=lr, betas=(0.5, 0.999), weight_decay=0.0001)
    self.criterionL1 = torch.nn.L1Loss()

  def get_z_random(self, batchSize, nz, random_type='gauss'):
    z = torch.randn(batchSize, nz).to(DEVICE)
    return z

  def forward(self):
    half_size = 1
    real_A = self.input_A
    real_B = self.input_B
    self.real_A_encoded = real_A[0:half_size]
    self.real_A_random = real_A[half_size:]
    self.real_B_encoded = real_B[0:half_size]
    self.real_B_random = real_B[half_size:]

    self.z_content_a, self.z_content_b = self.enc_c.forward(self.real_A_encoded, self.real_B_encoded)
    self.z_attr_a, self.z_attr_b = self.enc_a.forward(self.real_A_encoded, self.real_B_encoded)

    self.z_random = self.get_z_random(self.real_A_encoded.size(0), self.nz, 'gauss')
    if not self.no_ms:
      self.z_random2 = self.get_z_random(self.real_A_encoded.size(0), self.nz, 'gauss')

    input_content_forA = torch.cat((self.z_content_b, self.z_content_a, self.z_content_b, self.z_content_b), 0)
    input_content_forB = torch.cat((self.z_content_a, self.z_content_b, self.z_content_a, self.z_content_a), 0)
    input_attr_forA = torch.cat((self.z_attr_a, self.z_attr_a, self.z_random, self.z_random2), 0)
    input_attr_forB = torch.cat((self.z_attr_b, self.z_attr_b, self.z_random, self.z_random2), 0)
    output_fakeA = self.gen.forward_a(input_content_forA, input_attr_forA)
    output_fakeB = self.gen.forward_b(input_content_forB, input_attr_forB)
    self.fake_A_encoded, self.fake_AA_encoded, self.fake_A_random, self.fake_A_random2 = torch.split(output_fakeA, self.z_content_a.size(0), dim=0)
    self.fake_B_encoded, self.fake_BB_encoded, self.fake_B_random, self.fake_B_random2 = torch.split(output_fakeB, self.z_content_a.size(0), dim=0)

    self.z_content_recon_b, self.z_content_recon_a = self.enc_c.forward(self.fake_A_encoded, self.fake_B_encoded)
    self.z_attr_recon_a, self.z_attr_recon_b = self.enc_a.forward(self.fake_A_encoded, self.fake_B_encoded)

    self.fake_A_recon = self.gen.forward_a(self.z_content_recon_a, self.z_attr_recon_a)
    self.fake_B_recon = self.gen.forward_b(self.z_content_recon_b, self.z_attr_recon_b)

    self.z_attr_random_a, self.z_attr_random_b = self.enc_a.forward(self.fake_A_random, self.fake_B_random)

  def forward_content(self):
    half_size = 1
    self.real_A_encoded = self.input_A[0:half_size]
    self.real_B_encoded = self.input_B[0:half_size]
    self.z_content_a, self.z_content_b = self.enc_c.forward(self.real_A_encoded, self.real_B_encoded)

  def update_D_content(self, image_a, image_b):
    self.input_A = image_a
    self.input_B = image_b
    self.forward_content()
    self.disContent_opt.zero_grad()
    loss_D_Content = self.backward_contentD(self.z_content_a, self.z_content_b)
    self.disContent_loss = loss_D_Content.item()
    nn.utils.clip_grad_norm_(self.disContent.parameters(), 5)
    self.disContent_opt.step()

  def update_D(self, image_a, image_b):
    self.input_A = image_a
    self.input_B = image_b
    self.forward()

    self.disA_opt.zero_grad()
    loss_D1_A = self.backward_D(self.disA, self.real_A_encoded, self.fake_A_encoded)
    self.disA_loss = loss_D1_A.item()
    self.disA_opt.step()

    self.disA2_opt.zero_grad()
    loss_D2_A = self.backward_D(self.disA2, self.real_A_random, self.fake_A_random)
    self.disA2_loss = loss_D2_A.item()
    if not self.no_ms:
      loss_D2_A2 = self.backward_D(self.disA2, self.real_A_random, self.fake_A_random2)
      self.disA2_loss += loss_D2_A2.item()
    self.disA2_opt.step()

    self.disB_opt.zero_grad()
    loss_D1_B = self.backward_D(self.disB, self.real_B_encoded, self.fake_B_encoded)
    self.disB_loss = loss_D1_B.item()
    self.disB_opt.step()

    self.disB2_opt.zero_grad()
    loss_D2_B = self.backward_D(self.disB2, self.real_B_random, self.fake_B_random)
    self.disB2_loss = loss_D2_B.item()
    if not self.no_ms:
      loss_D2_B2 = self.backward_D(self.disB2, self.real_B_random, self.fake_B_random2)
      self.disB2_loss += loss_D2_B2.item()
    self.disB2_opt.step()

    self.disContent_opt.zero_grad()
    loss_D_Content = self.backward_contentD(self.z_content_a, self.z_content_b)
    self.disContent_loss = loss_D_Content.item()
    nn.utils.clip_grad_norm_(self.disContent.parameters(), 5)
    self.disContent_opt.step()

  def backward_D(self, netD, real, fake):
    pred_fake = netD.forward(fake.detach())
    pred_real = netD.forward(real)
    loss_D = 0
    for it, (out_a, out_b) in enumerate(zip(pred_fake, pred_real)):
      out_fake = torch.sigmoid(out_a)
      out_real = torch.sigmoid(out_b)
      all0 = torch.zeros_like(out_fake).to(DEVICE)
      all1 = torch.ones_like(out_real).to(DEVICE)
      ad_fake_loss = nn.functional.binary_cross_entropy(out_fake, all0)
      ad_true_loss = nn.functional.binary_cross_entropy(out_real, all1)
      loss_D += ad_true_loss + ad_fake_loss
    loss_D.backward()
    return loss_D

  def backward_contentD(self, imageA, imageB):
    pred_fake = self.disContent.forward(imageA.detach())
    pred_real = self.disContent.forward(imageB.detach())
    for it, (out_a, out_b) in enumerate(zip(pred_fake, pred_real)):
      out_fake = torch.sigmoid(out_a)
      out_real = torch.sigmoid(out_b)
      all1 = torch.ones((out_real.size(0))).to(DEVICE)
      all0 = torch.zeros((out_fake.size(0))).to(DEVICE)
      ad_true_loss = nn.functional.binary_cross_entropy(out_real, all1)
      ad_fake_loss = nn.functional.binary_cross_entropy(out_fake, all0)
    loss_D = ad_true_loss + ad_fake_loss
    loss_D.backward()
    return loss_D

  def update_EG(self):
    # update G, Ec, Ea
    self.enc_c_opt.zero_grad()
    self.enc_a_opt.zero_grad()
    self.gen_opt.zero_grad()
    self.backward_EG()
    self.enc_c_opt.step()
    self.enc_a_opt.step()
    self.gen_opt.step()

    # update G, Ec
    self.enc_c_opt.zero_grad()
    self.gen_opt.zero_grad()
    self.forward()
    self.backward_G_alone()
    self.enc_c_opt.step()
    self.gen_opt.step()

  def backward_EG(self):
    loss_G_GAN_Acontent = self.backward_G_GAN_content(self.z_content_a)
    loss_G_GAN_Bcontent = self.backward_G_GAN_content(self.z_content_b)
    loss_G_GAN_A = self.backward_G_GAN(self.fake_A_encoded, self.disA)
    loss_G_GAN_B = self.backward_G_GAN(self.fake_B_encoded, self.disB)
    loss_kl_za_a = self._l2_regularize(self.z_attr_a) * 0.01
    loss_kl_za_b = self._l2_regularize(self.z_attr_b) * 0.01
    loss_kl_zc_a = self._l2_regularize(self.z_content_a) * 0.01
    loss_kl_zc_b = self._l2_regularize(self.z_content_b) * 0.01
    loss_G_L1_A = self.criterionL1(self.fake_A_recon, self.real_A_encoded) * 10
    loss_G_L1_B = self.criterionL1(self.fake_B_recon, self.real_B_encoded) * 10
    loss_G_L1_AA = self.criterionL1(self.fake_AA_encoded, self.real_A_encoded) * 10
    loss_G_L1_BB = self.criterionL1(self.fake_BB_encoded, self.real_B_encoded) * 10
    loss_G = loss_G_GAN_A + loss_G_GAN_B + \
             loss_G_GAN_Acontent + loss_G_GAN_Bcontent + \
             loss_G_L1_AA + loss_G_L1_BB + \
             loss_G_L1_A + loss_G_L1_B + \
             loss_kl_zc_a + loss_kl_zc_b + \
             loss_kl_za_a + loss_kl_za_b
    loss_G.backward(retain_graph=True)
    self.G_loss = loss_G.item()

  def backward_G_GAN_content(self, data):
    outs = self.disContent.forward(data)
    for out in outs:
      outputs_fake = torch.sigmoid(out)
      all_half = 0.5 * torch.ones((outputs_fake.size(0))).to(DEVICE)
      ad_loss = nn.functional.binary_cross_entropy(outputs_fake, all_half)
    return ad_loss

  def backward_G_GAN(self, fake, netD=None):
    outs_fake = netD.forward(fake)
    loss_G = 0
    for out_a in outs_fake:
      outputs_fake = torch.sigmoid(out_a)
      all_ones = torch.ones_like(outputs_fake).to(DEVICE)
      loss_G += nn.functional.binary_cross_entropy(outputs_fake, all_ones)
    return loss_G

  def backward_G_alone(self):
    loss_G_GAN2_A = self.backward_G_GAN(self.fake_A_random, self.disA2)
    loss_G_GAN2_B = self.backward_G_GAN(self.fake_B_random, self.disB2)
    if not self.no_ms:
      loss_G_GAN2_A2 = self.backward_G_GAN(self.fake_A_random2, self.disA2)
      loss_G_GAN2_B2 = self.backward_G_GAN(self.fake_B_random2, self.disB2)
    if not self.no_ms:
      lz_AB = torch.mean(torch.abs(self.fake_B_random2 - self.fake_B_random)) / torch.mean(torch.abs(self.z_random2 - self.z_random))
      lz_BA = torch.mean(torch.abs(self.fake_A_random2 - self.fake_A_random)) / torch.mean(torch.abs(self.z_random2 - self.z_random))
      eps = 1 * 1e-5
      loss_lz_AB = 1 / (lz_AB + eps)
      loss_lz_BA = 1 / (lz_BA + eps)
    loss_z_L1_a = torch.mean(torch.abs(self.z_attr_random_a - self.z_random)) * 10
    loss_z_L1_b = torch.mean(torch.abs(self.z_attr_random_b - self.z_random)) * 10
    loss_z_L1 = loss_z_L1_a + loss_z_L1_b + loss_G_GAN2_A + loss_G_GAN2_B
    if not self.no_ms:
      loss_z_L1 += (loss_G_GAN2_A2 + loss_G_GAN2_B2)
      loss_z_L1 += (loss_lz_AB + loss_lz_BA)
    loss_z_L1.backward()
    self.l1_recon_z_loss_a = loss_z_L1_a.item()

  def _l2_regularize(self, mu):
    mu_2 = torch.pow(mu, 2)
    encoding_loss = torch.mean(mu_2)
    return encoding_loss


model = DRIT({'no_ms': False}).to(DEVICE)
train_loader = [(torch.rand(2, 3, 8, 8) * 2 - 1, torch.rand(2, 3, 8, 8) * 2 - 1) for _ in range(6)]
d_iter = 3
for it, (images_a, images_b) in enumerate(train_loader):
  images_a = images_a.to(DEVICE).detach()
  images_b = images_b.to(DEVICE).detach()
  if (it + 1) % d_iter != 0 and it < len(train_loader) - 2:
    model.update_D_content(images_a, images_b)
    continue
  else:
    model.update_D(images_a, images_b)
    model.update_EG()
print("done")
