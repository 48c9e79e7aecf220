# source: https://github.com/zaiweizhang/H3DNet/issues/29 — issue "One inplace error": in ProposalModuleRefine.forward (models/proposal_module_refine.py at 81bd6af^) `net += original_feature` adds the proposal features in place onto `net`, the output of F.relu(self.bn_refine1(self.conv_refine1(...))) that ReluBackward0 saved, so training fails with "one of the variables needed for gradient computation has been modified by an inplace operation"
# fix-source: https://github.com/zaiweizhang/H3DNet/commit/81bd6af37cb131fd9e81774f52f29a0f3b0a0f43 — maintainer's "Update proposal_module_refine.py / change in-place errors": `net += original_feature` becomes `net = net + original_feature`
# expect-kind: none
# fix: the residual is added out of place, `net = net + original_feature`, so the ReLU output that ReluBackward0 saved is left unmodified
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from _device import DEVICE

SURFACE_THRESH = 0.5
LINE_THRESH = 0.5


# --- pointnet2/pointnet2_modules.py stand-ins (the CUDA ball-query/FPS ops are replaced by
#     taking the first npoint points and a shared 1x1-conv MLP over their features) ---
class PointnetSAModuleVotes(nn.Module):
    def __init__(self, npoint, mlp):
        super().__init__()
        self.npoint = npoint
        layers = []
        for i in range(len(mlp) - 1):
            layers += [nn.Conv1d(mlp[i] + (3 if i == 0 else 0), mlp[i + 1], 1), nn.BatchNorm1d(mlp[i + 1]), nn.ReLU()]
        self.mlp_module = nn.Sequential(*layers)

    def forward(self, xyz, features, inds=None):
        inds = torch.arange(self.npoint, device=xyz.device).unsqueeze(0).repeat(xyz.shape[0], 1)
        new_xyz = xyz[:, :self.npoint]
        new_features = self.mlp_module(torch.cat((new_xyz.transpose(2, 1), features[:, :, :self.npoint]), dim=1))
        return new_xyz, new_features, inds


class PointnetSAModuleMatch(PointnetSAModuleVotes):
    pass


# --- utils/box_util.py, trimmed (heading fixed to zero, so no rotation) ---
def get_surface_line_points_batch_pytorch(obj_size, heading_angle, center):
    offset_x = torch.zeros_like(obj_size)
    offset_y = torch.zeros_like(obj_size)
    offset_z = torch.zeros_like(obj_size)
    offset_x[:, :, 0] = 0.5
    offset_y[:, :, 1] = 0.5
    offset_z[:, :, 2] = 0.5
    surface_3d = torch.cat((offset_z * obj_size, -offset_z * obj_size, offset_y * obj_size,
                            -offset_y * obj_size, offset_x * obj_size, -offset_x * obj_size), dim=1)
    line_3d = torch.cat([sz * offset_z * obj_size + sx * offset_x * obj_size + sy * offset_y * obj_size
                         for sz, sx, sy in [(1, 1, 0), (1, -1, 0), (1, 0, 1), (1, 0, -1), (-1, 1, 0), (-1, -1, 0),
                                            (-1, 0, 1), (-1, 0, -1), (0, 1, 1), (0, 1, -1), (0, -1, 1), (0, -1, -1)]], dim=1)
    surface_center = center.repeat(1, 6, 1) + surface_3d
    line_center = center.repeat(1, 12, 1) + line_3d
    return surface_center, line_center


# --- models/proposal_module_refine.py, trimmed ---
def decode_scores(net, end_points, num_class, num_heading_bin, num_size_cluster, mean_size_arr, mode=''):
    net_transposed = net.transpose(2, 1)  # (batch_size, 1024, ..)
    batch_size = net_transposed.shape[0]
    num_proposal = net_transposed.shape[1]

    start = 2
    objectness_scores = net_transposed[:, :, 0:2]
    end_points['objectness_scores' + mode] = objectness_scores

    base_xyz = end_points['aggregated_vote_xyz' + mode]  # (batch_size, num_proposal, 3)
    center = base_xyz + net_transposed[:, :, start:start + 3]  # (batch_size, num_proposal, 3)
    end_points['center' + mode] = center

    heading_scores = net_transposed[:, :, start + 3:start + 3 + num_heading_bin]
    heading_residuals_normalized = net_transposed[:, :, start + 3 + num_heading_bin:start + 3 + num_heading_bin * 2]
    end_points['heading_scores' + mode] = heading_scores
    end_points['heading_residuals' + mode] = heading_residuals_normalized * (np.pi / num_heading_bin)

    size_scores = net_transposed[:, :, start + 3 + num_heading_bin * 2:start + 3 + num_heading_bin * 2 + num_size_cluster]
    size_residuals_normalized = net_transposed[:, :, start + 3 + num_heading_bin * 2 + num_size_cluster:start + 3 + num_heading_bin * 2 + num_size_cluster * 4].view([batch_size, num_proposal, num_size_cluster, 3])
    end_points['size_scores' + mode] = size_scores
    end_points['size_residuals' + mode] = size_residuals_normalized * torch.from_numpy(mean_size_arr.astype(np.float32)).to(DEVICE).unsqueeze(0).unsqueeze(0)

    sem_cls_scores = net_transposed[:, :, start + 3 + num_heading_bin * 2 + num_size_cluster * 4:]
    end_points['sem_cls_scores' + mode] = sem_cls_scores
    if mode == 'center':
        return end_points['center' + mode], end_points['size_residuals' + mode], end_points['size_scores' + mode], end_points
    else:
        return end_points


class ProposalModuleRefine(nn.Module):
    def __init__(self, num_class, num_heading_bin, num_size_cluster, mean_size_arr, num_proposal, sampling, seed_feat_dim=256, with_angle=False):
        super().__init__()

        self.num_class = num_class
        self.num_heading_bin = num_heading_bin
        self.num_size_cluster = num_size_cluster
        self.mean_size_arr = mean_size_arr
        self.num_proposal = num_proposal
        self.sampling = sampling
        self.seed_feat_dim = seed_feat_dim
        self.with_angle = with_angle

        # Vote clustering
        self.vote_aggregation = PointnetSAModuleVotes(npoint=self.num_proposal, mlp=[self.seed_feat_dim, 128, 128, 128])
        ### surface center matching
        self.match_surface_center = PointnetSAModuleMatch(npoint=self.num_proposal * 6, mlp=[128 + 6, 128, 64, 32])
        ### line center matching
        self.match_line_center = PointnetSAModuleMatch(npoint=self.num_proposal * 12, mlp=[128 + 12, 128, 64, 32])

        # Initial object proposal/detection
        self.conv1 = torch.nn.Conv1d(128, 128, 1)
        self.conv2 = torch.nn.Conv1d(128, 128, 1)
        self.conv3 = torch.nn.Conv1d(128, 2 + 3 + num_heading_bin * 2 + num_size_cluster * 4 + self.num_class, 1)
        self.bn1 = torch.nn.BatchNorm1d(128)
        self.bn2 = torch.nn.BatchNorm1d(128)

        # Surface feature aggregation
        self.conv_surface1 = torch.nn.Conv1d(32, 32, 1)
        self.conv_surface2 = torch.nn.Conv1d(32, 32, 1)
        self.bn_surface1 = torch.nn.BatchNorm1d(32)
        self.bn_surface2 = torch.nn.BatchNorm1d(32)

        # Line feature aggregation
        self.conv_line1 = torch.nn.Conv1d(32, 32, 1)
        self.conv_line2 = torch.nn.Conv1d(32, 32, 1)
        self.bn_line1 = torch.nn.BatchNorm1d(32)
        self.bn_line2 = torch.nn.BatchNorm1d(32)

        ### Final object proposal/detection
        self.conv_refine1 = torch.nn.Conv1d(192 * 3, 128, 1)
        self.conv_refine2 = torch.nn.Conv1d(128, 128, 1)
        self.conv_refine3 = torch.nn.Conv1d(128, 128, 1)
        self.conv_refine4 = torch.nn.Conv1d(128, 2 + 3 + num_heading_bin * 2 + num_size_cluster * 4 + self.num_class, 1)

        self.bn_refine1 = torch.nn.BatchNorm1d(128)
        self.bn_refine2 = torch.nn.BatchNorm1d(128)
        self.bn_refine3 = torch.nn.BatchNorm1d(128)

        self.softmax_normal = torch.nn.Softmax(dim=1)

    def forward(self, xyz, features, center_z, z_feature, center_xy, xy_feature, center_line, line_feature, end_points):
        if self.sampling == 'vote_fps':
            xyz, features, fps_inds = self.vote_aggregation(xyz, features)
            sample_inds = fps_inds
        end_points['aggregated_vote_xyzcenter'] = xyz  # (batch_size, num_proposal, 3)
        end_points['aggregated_vote_inds'] = sample_inds
        batch_size = xyz.shape[0]
        object_proposal = xyz.shape[1]
        # --------- PROPOSAL GENERATION ---------
        net = F.relu(self.bn1(self.conv1(features)))
        net = F.relu(self.bn2(self.conv2(net)))
        original_feature = features.contiguous()
        net = self.conv3(net)  # (batch_size, 2+3+num_heading_bin*2+num_size_cluster*4, num_proposal)

        center_vote, size_vote, sizescore_vote, end_points = decode_scores(net, end_points, self.num_class, self.num_heading_bin, self.num_size_cluster, self.mean_size_arr, mode='center')

        ### Extract surface points and features here
        ind_normal_z = self.softmax_normal(end_points["pred_flag_z"])
        z_sel = (ind_normal_z[:, 1, :] <= SURFACE_THRESH).detach().float()
        offset = torch.ones_like(center_z) * 100.0
        z_center = center_z + offset * z_sel.unsqueeze(-1)

        ind_normal_xy = self.softmax_normal(end_points["pred_flag_xy"])
        xy_sel = (ind_normal_xy[:, 1, :] <= SURFACE_THRESH).detach().float()
        offset = torch.ones_like(center_xy) * 100.0
        xy_center = center_xy + offset * xy_sel.unsqueeze(-1)

        surface_center_pred = torch.cat((z_center, xy_center), dim=1)
        surface_center_feature_pred = torch.cat((z_feature, xy_feature), dim=2)
        surface_center_feature_pred = torch.cat((torch.zeros((batch_size, 6, surface_center_feature_pred.shape[2])).to(DEVICE), surface_center_feature_pred), dim=1)

        ### Extract line points and features here
        ind_normal_line = self.softmax_normal(end_points["pred_flag_line"])
        line_sel = (ind_normal_line[:, 1, :] <= SURFACE_THRESH).detach().float()
        offset = torch.ones_like(center_line) * 100.0
        line_center = center_line + offset * line_sel.unsqueeze(-1)

        end_points['aggregated_vote_xyzopt'] = xyz

        ### Extract the object center here
        obj_center = center_vote.contiguous()
        size_residual = size_vote.contiguous()
        pred_size_class = torch.argmax(sizescore_vote.contiguous(), -1)
        pred_size_residual = torch.gather(size_vote.contiguous(), 2, pred_size_class.unsqueeze(-1).unsqueeze(-1).repeat(1, 1, 1, 3))
        mean_size_class_batched = torch.ones_like(size_residual) * torch.from_numpy(self.mean_size_arr.astype(np.float32)).to(DEVICE).unsqueeze(0).unsqueeze(0)
        pred_size_avg = torch.gather(mean_size_class_batched, 2, pred_size_class.unsqueeze(-1).unsqueeze(-1).repeat(1, 1, 1, 3))
        obj_size = (pred_size_avg.squeeze(2) + pred_size_residual.squeeze(2)).detach()

        pred_heading_class = torch.argmax(end_points['heading_scores' + 'center'].detach(), -1)  # B,num_proposal
        pred_heading = torch.zeros_like(pred_heading_class)

        obj_surface_center, obj_line_center = get_surface_line_points_batch_pytorch(obj_size, pred_heading, obj_center)
        obj_surface_feature = original_feature.repeat(1, 1, 6)
        # Add an indicator for different surfaces
        obj_surface_indicator = torch.eye(6, device=DEVICE).repeat_interleave(object_proposal, dim=1).unsqueeze(0).repeat(batch_size, 1, 1)
        obj_surface_feature = torch.cat((obj_surface_indicator, obj_surface_feature), dim=1)

        obj_line_feature = original_feature.repeat(1, 1, 12)
        # Add an indicator for different lines
        obj_line_indicator = torch.eye(12, device=DEVICE).repeat_interleave(object_proposal, dim=1).unsqueeze(0).repeat(batch_size, 1, 1)
        obj_line_feature = torch.cat((obj_line_indicator, obj_line_feature), dim=1)

        surface_xyz, surface_features, _ = self.match_surface_center(torch.cat((obj_surface_center, surface_center_pred), dim=1), torch.cat((obj_surface_feature, surface_center_feature_pred), dim=2))
        line_feature = torch.cat((torch.zeros((batch_size, 12, line_feature.shape[2])).to(DEVICE), line_feature), dim=1)
        line_xyz, line_features, _ = self.match_line_center(torch.cat((obj_line_center, line_center), dim=1), torch.cat((obj_line_feature, line_feature), dim=2))

        surface_features = F.relu(self.bn_surface1(self.conv_surface1(surface_features)))
        surface_features = F.relu(self.bn_surface2(self.conv_surface2(surface_features)))

        line_features = F.relu(self.bn_line1(self.conv_line1(line_features)))
        line_features = F.relu(self.bn_line2(self.conv_line2(line_features)))

        surface_features = surface_features.view(batch_size, -1, 6, object_proposal).contiguous()
        line_features = line_features.view(batch_size, -1, 12, object_proposal).contiguous()

        # Combine all surface and line features
        surface_pool_feature = surface_features.view(batch_size, -1, object_proposal).contiguous()
        line_pool_feature = line_features.view(batch_size, -1, object_proposal).contiguous()

        combine_feature = torch.cat((surface_pool_feature, line_pool_feature), dim=1)

        net = F.relu(self.bn_refine1(self.conv_refine1(combine_feature)))
        net = net + original_feature
        net = F.relu(self.bn_refine2(self.conv_refine2(net)))
        net = F.relu(self.bn_refine3(self.conv_refine3(net)))
        net = self.conv_refine4(net)  # (batch_size, 2+3+num_heading_bin*2+num_size_cluster*4, num_proposal)

        end_points = decode_scores(net, end_points, self.num_class, self.num_heading_bin, self.num_size_cluster, self.mean_size_arr, mode='opt')
        return end_points


# --- a trimmed training step: votes, surface/line primitives from the earlier heads, one objectness/center loss ---
num_class, num_heading_bin, num_size_cluster, num_proposal = 3, 2, 3, 4
mean_size_arr = np.array([[1.0, 1.0, 1.0], [0.5, 0.5, 1.0], [2.0, 1.0, 0.5]])
model = ProposalModuleRefine(num_class, num_heading_bin, num_size_cluster, mean_size_arr, num_proposal, 'vote_fps', seed_feat_dim=16).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for it in range(3):
    B, n_votes, n_surf, n_line = 2, 8, 5, 6
    xyz = torch.rand(B, n_votes, 3, device=DEVICE)
    features = torch.rand(B, 16, n_votes, device=DEVICE)
    center_z, center_xy = torch.rand(B, n_surf, 3, device=DEVICE), torch.rand(B, n_surf, 3, device=DEVICE)
    z_feature, xy_feature = torch.rand(B, 128, n_surf, device=DEVICE), torch.rand(B, 128, n_surf, device=DEVICE)
    center_line, line_feature = torch.rand(B, n_line, 3, device=DEVICE), torch.rand(B, 128, n_line, device=DEVICE)
    end_points = {"pred_flag_z": torch.randn(B, 2, n_surf, device=DEVICE),
                  "pred_flag_xy": torch.randn(B, 2, n_surf, device=DEVICE),
                  "pred_flag_line": torch.randn(B, 2, n_line, device=DEVICE)}
    objectness_label = torch.randint(0, 2, (B, num_proposal), device=DEVICE)
    gt_center = torch.rand(B, num_proposal, 3, device=DEVICE)

    end_points = model(xyz, features, center_z, z_feature, center_xy, xy_feature, center_line, line_feature, end_points)
    loss = F.cross_entropy(end_points['objectness_scoresopt'].transpose(2, 1), objectness_label) \
        + F.smooth_l1_loss(end_points['centeropt'], gt_center)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
