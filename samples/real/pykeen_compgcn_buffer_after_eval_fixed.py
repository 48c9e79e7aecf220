# source: https://github.com/pykeen/pykeen/issues/571 — CompGCN trained with stopper='early' fails with "element 0 of tensors does not require grad" once training resumes after the first evaluation
# fix-source: https://github.com/pykeen/pykeen/pull/573 (commit 7a87578) — maintainer's fix: CombinedCompGCNRepresentations.train() drops the enriched representations buffered in evaluation mode
# expect-kind: none
# fix: train() invalidates self.enriched_representations when switching from evaluation back to training mode
import torch
from torch import nn
from _device import DEVICE


class CompGCNLayer(nn.Module):
    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.w_loop = nn.Parameter(torch.randn(input_dim, output_dim) * 0.3)
        self.w_fwd = nn.Parameter(torch.randn(input_dim, output_dim) * 0.3)
        self.w_bwd = nn.Parameter(torch.randn(input_dim, output_dim) * 0.3)
        self.self_loop = nn.Parameter(torch.randn(1, input_dim))
        self.w_rel = nn.Linear(input_dim, output_dim)
        self.activation = nn.Tanh()

    def composition(self, h, r):
        return h * r

    def message(self, x_e, x_r, edge_index, edge_type, weight):
        source, target = edge_index
        m = self.composition(x_e[source], x_r[edge_type]) @ weight
        out = torch.zeros(x_e.shape[0], m.shape[1], device=m.device).index_add(0, target, m)
        degree = torch.zeros(x_e.shape[0], device=m.device).index_add(0, target, torch.ones_like(target, dtype=m.dtype))
        return out / degree.clamp_min(1.0).unsqueeze(-1)

    def forward(self, x_e, x_r, edge_index, edge_type):
        # prepare for inverse relations
        edge_type = 2 * edge_type
        # update entity representations: mean over self-loops / forward edges / backward edges
        x_e = (
            self.composition(x_e, self.self_loop) @ self.w_loop
            + self.message(x_e=x_e, x_r=x_r, edge_index=edge_index, edge_type=edge_type, weight=self.w_fwd)
            + self.message(x_e=x_e, x_r=x_r, edge_index=edge_index.flip(0), edge_type=edge_type + 1, weight=self.w_bwd)
        ) / 3
        x_e = self.activation(x_e)
        # Relation transformation
        x_r = self.w_rel(x_r)
        return x_e, x_r


class CombinedCompGCNRepresentations(nn.Module):
    """A sequence of CompGCN layers."""

    def __init__(self, *, mapped_triples, num_entities, num_relations, embedding_dim, num_layers=1):
        super().__init__()
        self.entity_representations = nn.Embedding(num_entities, embedding_dim)
        self.relation_representations = nn.Embedding(2 * num_relations, embedding_dim)
        self.layers = nn.ModuleList(CompGCNLayer(embedding_dim, embedding_dim) for _ in range(num_layers))
        self.output_dim = embedding_dim
        # register buffers for adjacency matrix; we use the same format as PyTorch Geometric
        self.register_buffer(name="edge_index", tensor=mapped_triples[:, [0, 2]].t())
        self.register_buffer(name="edge_type", tensor=mapped_triples[:, 1])
        # initialize buffer of enriched representations
        self.enriched_representations = None

    def post_parameter_update(self) -> None:
        # invalidate enriched embeddings
        self.enriched_representations = None

    def train(self, mode: bool = True):
        # when changing from evaluation to training mode, the buffered representations have been computed without
        # gradient tracking. hence, we need to invalidate them.
        if mode and not self.training:
            self.enriched_representations = None
        return super().train(mode=mode)

    def forward(self):
        """Compute enriched representations."""
        if self.enriched_representations is None:
            x_e = self.entity_representations.weight
            x_r = self.relation_representations.weight
            # enrich
            for layer in self.layers:
                x_e, x_r = layer(x_e=x_e, x_r=x_r, edge_index=self.edge_index, edge_type=self.edge_type)
            self.enriched_representations = (x_e, x_r)
        return self.enriched_representations

    def split(self):
        """Return the separated representations."""
        return (
            SingleCompGCNRepresentation(self, position=0),
            SingleCompGCNRepresentation(self, position=1),
        )


class SingleCompGCNRepresentation(nn.Module):
    """A wrapper around the combined representation module."""

    def __init__(self, combined, position=0):
        super().__init__()
        self.combined = combined
        self.position = position

    def forward(self, indices=None):
        x = self.combined()[self.position]
        if indices is not None:
            x = x[indices]
        return x


class CompGCN(nn.Module):
    def __init__(self, mapped_triples, num_entities, num_relations, embedding_dim=8):
        super().__init__()
        combined = CombinedCompGCNRepresentations(
            mapped_triples=mapped_triples, num_entities=num_entities,
            num_relations=num_relations, embedding_dim=embedding_dim,
        )
        self.entity_representations, self.relation_representations = combined.split()
        self.num_entities = num_entities

    def post_parameter_update(self):
        self.entity_representations.combined.post_parameter_update()

    def score_hrt(self, hrt_batch):
        h = self.entity_representations(hrt_batch[:, 0])
        r = self.relation_representations(2 * hrt_batch[:, 1])
        t = self.entity_representations(hrt_batch[:, 2])
        return (h * r * t).sum(dim=-1, keepdim=True)  # DistMult interaction

    def score_t(self, hr_batch):
        h = self.entity_representations(hr_batch[:, 0]).unsqueeze(1)
        r = self.relation_representations(2 * hr_batch[:, 1]).unsqueeze(1)
        t = self.entity_representations().unsqueeze(0)
        return (h * r * t).sum(dim=-1)


class RankBasedEvaluator:
    def evaluate(self, model, mapped_triples):
        model.eval()
        with torch.no_grad():
            scores = model.score_t(mapped_triples[:, :2])
            true = scores.gather(1, mapped_triples[:, 2:3])
            ranks = (scores > true).sum(dim=1) + 1
        return (1.0 / ranks.float()).mean().item()


class EarlyStopper:
    def __init__(self, model, evaluator, evaluation_triples, frequency=1, patience=2):
        self.model, self.evaluator, self.evaluation_triples = model, evaluator, evaluation_triples
        self.frequency, self.patience = frequency, patience
        self.best, self.remaining = 0.0, patience

    def should_evaluate(self, epoch):
        return epoch % self.frequency == 0

    def should_stop(self, epoch):
        mrr = self.evaluator.evaluate(model=self.model, mapped_triples=self.evaluation_triples)
        if mrr > self.best:
            self.best, self.remaining = mrr, self.patience
        else:
            self.remaining -= 1
        return self.remaining <= 0


num_entities, num_relations = 10, 3
mapped_triples = torch.stack([
    torch.randint(num_entities, (24,)), torch.randint(num_relations, (24,)), torch.randint(num_entities, (24,)),
], dim=1).to(DEVICE)
training, validation = mapped_triples[:20], mapped_triples[20:]

model = CompGCN(training, num_entities, num_relations).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
stopper = EarlyStopper(model, RankBasedEvaluator(), validation, frequency=1)

for epoch in range(1, 4):
    model.train()
    for batch in training.split(10):
        optimizer.zero_grad()
        negative = batch.clone()
        negative[:, 2] = torch.randint(num_entities, (batch.shape[0],), device=DEVICE)
        positive_scores = model.score_hrt(batch)
        negative_scores = model.score_hrt(negative)
        loss = nn.functional.softplus(negative_scores - positive_scores).mean()
        loss.backward()
        optimizer.step()
        model.post_parameter_update()
    if stopper.should_evaluate(epoch) and stopper.should_stop(epoch):
        break
print("done")
