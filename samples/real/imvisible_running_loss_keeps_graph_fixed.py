# source: https://github.com/samuelyu2002/ImVisible/issues/2 — issue: Model/training.py sums `running_loss += loss` (and MSE, cross_entropy) every batch, keeping each batch's graph until RAM runs out
# fix-source: maintainer's comment in the issue and commit e536e5e "Update training.py": accumulate `loss.item()`, `MSE.item()`, `cross_entropy.item()`
# expect-kind: none
# fix: accumulate plain numbers (`running_loss += loss.item()`, likewise MSE, cross_entropy and the validation sum), as the maintainer's commit does
import math
import torch
import torch.nn as nn
from _device import DEVICE

BATCH_SIZE = 4
MAX_EPOCHS = 2
INIT_LR = 0.001
LR_DROP_MILESTONES = [400, 600]


def conv_bn(inp, oup, stride):
    return nn.Sequential(
        nn.Conv2d(inp, oup, 3, stride, 1, bias=False),
        nn.BatchNorm2d(oup),
        nn.ReLU6(inplace=True),
        nn.MaxPool2d(2, 2),
    )


def conv_1x1_bn(inp, oup):
    return nn.Sequential(
        nn.Conv2d(inp, oup, 1, 1, 0, bias=False),
        nn.BatchNorm2d(oup),
        nn.ReLU6(inplace=True)
    )


class LYTNet(nn.Module):
    def __init__(self, n_class=5):
        super(LYTNet, self).__init__()
        input_channel = 4
        self.last_channel = 8
        self.features = nn.Sequential(conv_bn(3, input_channel, 2),
                                      conv_1x1_bn(input_channel, self.last_channel),
                                      nn.Dropout(0.1))

        #classfier section of the network
        self.classifier_light = nn.Sequential(
            nn.Linear(self.last_channel, 6),
            nn.BatchNorm1d(6),
            nn.ReLU6(inplace=True),
            nn.Linear(6, n_class),
            nn.Softmax(dim=1)
        )

        # regression for direction
        self.regression_direction = nn.Sequential(
            nn.Linear(self.last_channel, 6),
            nn.BatchNorm1d(6),
            nn.ReLU6(inplace=True),
            nn.Linear(6, 4)
        )

    def forward(self, x):
        x = self.features(x)
        x = x.mean(3).mean(2)
        x1 = self.classifier_light(x)
        x2 = self.regression_direction(x)
        return x1, x2


def my_loss(classifier, regression, points, mode):
    alpha = 0.5
    MSE = nn.MSELoss()
    MSEl = MSE(regression, points)
    cross_entropy = nn.CrossEntropyLoss()
    ce = cross_entropy(classifier, mode)

    loss = ce*alpha + MSEl*(1-alpha)
    return loss, MSEl, ce


def direction_performance(pred, label):
    pred = pred.cpu().detach().numpy().tolist()
    label = label.cpu().detach().numpy().tolist()
    pred_angle = math.atan2(pred[0][3] - pred[0][1], pred[0][0] - pred[0][2])
    act_angle = math.atan2(label[0][3] - label[0][1], label[0][0] - label[0][2])
    angle = math.fabs((pred_angle - act_angle)*180/math.pi)
    start = math.fabs(math.hypot(pred[0][2] - label[0][2], pred[0][3] - label[0][3]))
    end = math.fabs(math.hypot(pred[0][0] - label[0][0], pred[0][1] - label[0][1]))
    return angle, start, end


def batches(n, batch_size):
    return [{'image': torch.randn(batch_size, 3, 16, 16),
             'mode': torch.randint(0, 5, (batch_size,)),
             'points': torch.rand(batch_size, 4)} for _ in range(n)]


train_dataloader = batches(3, BATCH_SIZE)
valid_dataloader = batches(2, 1)

net = LYTNet().to(DEVICE)

loss_fn = my_loss

optimizer = torch.optim.Adam(net.parameters(), lr=INIT_LR, weight_decay=0.000005)
lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, LR_DROP_MILESTONES)

train_losses = [] #stores the overall training loss at each epoch
train_MSE = [] #stores the MSE loss during training at each epoch
train_CE = [] #stores the cross entropy loss during training at each epoch
valid_losses = [] #stores the overall validation loss at each epoch

for epoch in range(MAX_EPOCHS):
    net.train()

    running_loss = 0.0 #stores the total loss for the epoch
    running_loss_MSE = 0.0 #stores the total MSE loss for the epoch
    running_loss_cross_entropy = 0.0 #store the total cross entropy loss for the epoch
    angle_error = 0.0 #stores average angle error for the epoch
    train_correct = 0
    train_total = 0

    for j, data in enumerate(train_dataloader, 0):

        optimizer.zero_grad()
        train_total += 1

        images = data['image'].type(torch.FloatTensor).to(DEVICE)
        mode = data['mode'].to(DEVICE) #index of traffic light mode
        points = data['points'].to(DEVICE) #array of midline coordinates

        pred_classes, pred_direc = net(images)
        _, predicted = torch.max(pred_classes, 1) #finds index of largest probability
        train_correct += (predicted == mode).sum().item()
        loss, MSE, cross_entropy = loss_fn(pred_classes, pred_direc, points, mode)
        angle, start, end = direction_performance(pred_direc, points)
        angle_error += angle

        loss.backward()
        optimizer.step()

        running_loss += loss.item()
        running_loss_MSE += MSE.item()
        running_loss_cross_entropy += cross_entropy.item()

    train_MSE.append(running_loss_MSE/train_total)
    train_CE.append(running_loss_cross_entropy/train_total)
    train_losses.append(running_loss/train_total)

    lr_scheduler.step() #decrease learning rate if at desired epoch

    net.eval()
    val_running_loss = 0
    val_total = 0
    with torch.no_grad():
        for k, data in enumerate(valid_dataloader, 0):
            images = data['image'].type(torch.FloatTensor).to(DEVICE)
            mode = data['mode'].to(DEVICE)
            points = data['points'].to(DEVICE)

            pred_classes, pred_direc = net(images)
            val_total += 1
            loss, MSE, cross_entropy = loss_fn(pred_classes, pred_direc, points, mode)
            val_running_loss += loss.item()
        valid_losses.append(val_running_loss/val_total)

print("done")
