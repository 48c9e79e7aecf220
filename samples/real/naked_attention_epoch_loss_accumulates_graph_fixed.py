# source: https://github.com/jostmey/NakedAttention/issues/1 — issue: RAM runs out because `e_train += e_batch` builds a graph that grows all epoch
# fix-source: https://github.com/jostmey/NakedAttention/commit/2aa6b4ca9dedc87ad2dc0fa5bee0fdc32b9b6fc1 — maintainer's commit ("Fixed. Thanks!!") applying the reporter's .detach()
# expect-kind: none
# fix: accumulate the detached batch loss (and accuracy), e_batch.detach(), as commit 2aa6b4c does
import torch
from _device import DEVICE


class SelfAttentionModel(torch.nn.Module):
  def __init__(self, num_steps, num_channels, num_outputs, **kwargs):
    super().__init__(**kwargs)
    self.K = torch.nn.Parameter((2.0*torch.rand(num_channels, num_channels)-1.0)/num_channels**0.5)
    self.Q = torch.nn.Parameter((2.0*torch.rand(num_channels, num_channels)-1.0)/num_channels**0.5)
    self.V = torch.nn.Parameter((2.0*torch.rand(num_channels, num_channels)-1.0)/num_channels**0.5)
    self.softmax = torch.nn.Softmax(dim=1)
    self.out = torch.nn.Linear(num_steps*num_channels, num_outputs)

  def forward(self, x):
    batch_size, num_steps, num_channels = x.shape
    y = []
    for i in range(batch_size): # Process one sample at a time
      x_i = x[i,:,:]
      x_k_i = torch.matmul(x_i, self.K)
      x_q_i = torch.matmul(x_i, self.Q)
      x_v_i = torch.matmul(x_i, self.V)
      w_i = self.softmax(torch.matmul(x_q_i, x_k_i.T)/num_channels**0.5)
      y_i = torch.matmul(w_i, x_v_i)
      y.append(y_i)
    y = torch.stack(y, axis=0)
    y_flat = y.reshape([ batch_size, num_steps*num_channels ])
    l = self.out(y_flat)
    return l


def accuracy(ps, ys): # stands in for torchmetrics' MulticlassAccuracy
  return (ps.argmax(dim=1) == ys).float().mean()


def load_mnist(seed): # stands in for dataplumbing.load_mnist: random 4x4 "images", 10 classes
  g = torch.Generator().manual_seed(seed)
  xs = torch.rand(36, 16, 1, generator=g)
  ys = torch.randint(0, 10, (36,), generator=g)
  return xs[:12], ys[:12], xs[12:24], ys[12:24], xs[24:], ys[24:]


model = SelfAttentionModel(num_steps=4**2, num_channels=1, num_outputs=10).to(DEVICE)
probability = torch.nn.Softmax(dim=1)

loss = torch.nn.CrossEntropyLoss()

optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

xs_train, ys_train, xs_val, ys_val, xs_test, ys_test = load_mnist(seed=46525)
xs_train, ys_train, xs_val, ys_val = xs_train.to(DEVICE), ys_train.to(DEVICE), xs_val.to(DEVICE), ys_val.to(DEVICE)

dataset_train = torch.utils.data.TensorDataset(xs_train, ys_train)
loader_train = torch.utils.data.DataLoader(dataset=dataset_train, batch_size=4, shuffle=False, drop_last=True)

i_better = -1
e_better = 1.0e8
state_better = {}

for i in range(2):

  # Train the model
  #
  model.train()
  e_train = 0.0
  a_train = 0.0
  for xs_batch, ys_batch in iter(loader_train):
    ls_batch = model(xs_batch)
    ps_batch = probability(ls_batch)
    e_batch = loss(ls_batch, ys_batch)
    a_batch = accuracy(ps_batch, ys_batch)
    optimizer.zero_grad()
    e_batch.backward()
    optimizer.step()
    e_train += e_batch.detach()/len(loader_train) # Accumulate average loss for this epoch
    a_train += a_batch.detach()/len(loader_train) # Accumulate average accuracy for this epoch

  # Assess performance on validation data
  #
  model.eval()
  with torch.no_grad():
    ls_val = model(xs_val)
    ps_val = probability(ls_val)
    e_val = loss(ls_val, ys_val)
    a_val = accuracy(ps_val, ys_val)
    if e_val < e_better: # Early stopping check
      i_better = i
      e_better = e_val
      state_better = model.state_dict()

  report = [float(e_train)/0.693, 100.0*float(a_train), float(e_val)/0.693, 100.0*float(a_val)]

print("done")
