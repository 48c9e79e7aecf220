# source: https://github.com/1adrianb/face-alignment/issues/140 — issue "Re-enable autograd after reading model": using face_alignment to extract landmarks for a training task switches autograd off for the whole program (face_alignment/api.py at ecb963e^: FaceAlignment.get_landmarks_from_image calls torch.set_grad_enabled(False) and never turns it back on)
# fix-source: https://github.com/1adrianb/face-alignment/commit/ecb963efa71a092f31c5bf03521b9553fe81ecd5 — maintainer's "Disable grad temporary only": get_landmarks_from_image is decorated with @torch.no_grad() and the global torch.set_grad_enabled(False) is removed
# expect-kind: none
# fix: get_landmarks_from_image runs under @torch.no_grad() instead of calling torch.set_grad_enabled(False), so grad mode is back on when it returns and the regressor's forward records its graph
from enum import Enum

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE


# --- face_alignment/utils.py, trimmed ---
def transform(point, center, scale, resolution, invert=False):
    _pt = torch.ones(3)
    _pt[0] = point[0]
    _pt[1] = point[1]

    h = 200.0 * scale
    t = torch.eye(3)
    t[0, 0] = resolution / h
    t[1, 1] = resolution / h
    t[0, 2] = resolution * (-center[0] / h + 0.5)
    t[1, 2] = resolution * (-center[1] / h + 0.5)

    if invert:
        t = torch.inverse(t)

    new_point = (torch.matmul(t, _pt))[0:2]

    return new_point.int()


def crop(image, center, scale, resolution=256.0):
    """ Crops the image around the center. Input is expected to be an np.ndarray """
    ul = transform([1, 1], center, scale, resolution, True)
    br = transform([resolution, resolution], center, scale, resolution, True)
    newDim = np.array([br[1] - ul[1], br[0] - ul[0], image.shape[2]], dtype=np.int32)
    newImg = np.zeros(newDim, dtype=np.uint8)
    ht = image.shape[0]
    wd = image.shape[1]
    newX = np.array([max(1, -ul[0] + 1), min(br[0], wd) - ul[0]], dtype=np.int32)
    newY = np.array([max(1, -ul[1] + 1), min(br[1], ht) - ul[1]], dtype=np.int32)
    oldX = np.array([max(1, ul[0] + 1), min(br[0], wd)], dtype=np.int32)
    oldY = np.array([max(1, ul[1] + 1), min(br[1], ht)], dtype=np.int32)
    newImg[newY[0] - 1:newY[1], newX[0] - 1:newX[1]] = image[oldY[0] - 1:oldY[1], oldX[0] - 1:oldX[1], :]
    # cv2.resize(newImg, (resolution, resolution)) in the original; nearest neighbour here
    rows = (np.arange(int(resolution)) * newImg.shape[0] / resolution).astype(np.int64)
    cols = (np.arange(int(resolution)) * newImg.shape[1] / resolution).astype(np.int64)
    return newImg[rows][:, cols]


def get_preds_fromhm(hm, center=None, scale=None):
    max, idx = torch.max(hm.view(hm.size(0), hm.size(1), hm.size(2) * hm.size(3)), 2)
    idx += 1
    preds = idx.view(idx.size(0), idx.size(1), 1).repeat(1, 1, 2).float()
    preds[..., 0].apply_(lambda x: (x - 1) % hm.size(3) + 1)
    preds[..., 1].add_(-1).div_(hm.size(2)).floor_().add_(1)

    preds.add_(-.5)

    preds_orig = torch.zeros(preds.size())
    if center is not None and scale is not None:
        for i in range(hm.size(0)):
            for j in range(hm.size(1)):
                preds_orig[i, j] = transform(preds[i, j], center, scale, hm.size(2), True)

    return preds, preds_orig


# --- face_alignment/models.py, trimmed: the FAN keeps its list of per-stack heatmaps ---
class FAN(nn.Module):
    def __init__(self, num_modules=1):
        super(FAN, self).__init__()
        self.num_modules = num_modules
        self.conv1 = nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.add_module('l0', nn.Conv2d(8, 68, kernel_size=1, stride=1, padding=0))

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)), True)
        x = F.avg_pool2d(x, 2, stride=2)
        outputs = []
        for i in range(self.num_modules):
            tmp_out = self._modules['l' + str(i)](x)
            outputs.append(tmp_out)
        return outputs


class FaceDetector:
    """face_alignment.detection.sfd's detector, reduced to the scale the landmark crop uses
    (the caller hands get_landmarks the boxes, so no detection runs)."""

    def __init__(self, device, verbose=False):
        self.device = device

    @property
    def reference_scale(self):
        return 195


# --- face_alignment/api.py ---
class LandmarksType(Enum):
    _2D = 1
    _2halfD = 2
    _3D = 3


class FaceAlignment:
    def __init__(self, landmarks_type, device='cuda', flip_input=False, face_detector='sfd', verbose=False):
        self.device = device
        self.flip_input = flip_input
        self.landmarks_type = landmarks_type
        self.verbose = verbose

        self.face_detector = FaceDetector(device=device, verbose=verbose)

        # Initialise the face alignemnt networks (the pretrained weights are not loaded here)
        self.face_alignment_net = FAN(1)
        self.face_alignment_net.to(device)
        self.face_alignment_net.eval()

    def get_landmarks(self, image_or_path, detected_faces=None):
        """Deprecated, please use get_landmarks_from_image"""
        return self.get_landmarks_from_image(image_or_path, detected_faces)

    @torch.no_grad()
    def get_landmarks_from_image(self, image_or_path, detected_faces=None):
        if isinstance(image_or_path, torch.Tensor):
            image = image_or_path.detach().cpu().numpy()
        else:
            image = image_or_path

        if len(detected_faces) == 0:
            print("Warning: No faces were detected.")
            return None

        landmarks = []
        for i, d in enumerate(detected_faces):
            center = torch.FloatTensor([d[2] - (d[2] - d[0]) / 2.0, d[3] - (d[3] - d[1]) / 2.0])
            center[1] = center[1] - (d[3] - d[1]) * 0.12
            scale = (d[2] - d[0] + d[3] - d[1]) / self.face_detector.reference_scale

            inp = crop(image, center, scale, resolution=16.0)
            inp = torch.from_numpy(inp.transpose((2, 0, 1))).float()

            inp = inp.to(self.device)
            inp.div_(255.0).unsqueeze_(0)

            out = self.face_alignment_net(inp)[-1].detach()
            out = out.cpu()

            pts, pts_img = get_preds_fromhm(out, center, scale)
            pts, pts_img = pts.view(68, 2) * 4, pts_img.view(68, 2)

            landmarks.append(pts_img.numpy())

        return landmarks


# --- the training task of the issue: a landmark regressor trained on the landmarks face_alignment extracts ---
class LandmarkRegressor(nn.Module):
    def __init__(self):
        super(LandmarkRegressor, self).__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(8, 68 * 2)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


fa = FaceAlignment(LandmarksType._2D, device=str(DEVICE), flip_input=False)
model = LandmarkRegressor().to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(3):
    image = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8).numpy()
    bbox = np.array([4.0, 4.0, 28.0, 28.0, 0.99])
    landmarks = fa.get_landmarks(image, detected_faces=[bbox])[0]
    target = torch.from_numpy(landmarks).float().to(DEVICE) / 32.0

    img = torch.from_numpy(image.transpose((2, 0, 1))).float().div(255.0).unsqueeze(0).to(DEVICE)
    pred = model(img).view(68, 2)
    loss = F.mse_loss(pred, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
