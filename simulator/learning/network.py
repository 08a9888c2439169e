"""The permutation-invariant actor-critic (torch; training and export only).

Every node row goes through one shared MLP together with the pod's and the cluster's features;
a masked mean of the node embeddings is the pooled context. The actor scores each node from
its embedding and the context (one logit per node, softmax over the feasible ones); the critic
reads the context alone. Nothing depends on the number of nodes or their order, so one model
serves 1 to 10,000 nodes. Feature normalisation (running mean and variance gathered during
training) is part of the module, and so of the exported graph.

A residual policy (`policies/residual.py`) adds a heuristic's logits, given as `base`, to the
actor's; its last layer starts at zero, so before training it is that heuristic.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from policies import features

NODE_INPUTS = len(features.NODE_FEATURES)
POD_INPUTS = len(features.POD_FEATURES)
CLUSTER_INPUTS = len(features.CLUSTER_FEATURES)
CLIP = 10.0
MASKED = -1e9  # a masked node's logit: finite, so gradients through softmax stay finite


class RunningNorm(nn.Module):
    """(x − mean) / std with statistics updated from training batches (Chan et al.'s merge)."""

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("var", torch.ones(size))
        self.register_buffer("count", torch.tensor(1e-4))

    @torch.no_grad()
    def update(self, batch: Tensor) -> None:
        batch = batch.reshape(-1, batch.shape[-1]).double()
        n = batch.shape[0]
        if n == 0:
            return
        mean, var = batch.mean(0), batch.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.mean += (delta * n / total).float()
        m2 = self.var * self.count + var * n + delta**2 * self.count * n / total
        self.var.copy_((m2 / total).float())
        self.count.fill_(float(total))

    def forward(self, x: Tensor) -> Tensor:
        return torch.clamp((x - self.mean) / torch.sqrt(self.var + 1e-8), -CLIP, CLIP)


def _linear(inputs: int, outputs: int, gain: float = 2**0.5, *, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(inputs, outputs, bias=bias)
    nn.init.orthogonal_(layer.weight, gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Layers that see the pod or the pooled context are split from those that see a node, so
    the shared part is computed once per pod, not once per node: the per-node cost (what
    grows with the cluster) is three H x H products and a few small ones."""

    def __init__(self, hidden: int = 32, *, residual: bool = False, future: int = 0) -> None:
        """`future`: inputs only the critic reads (what is known of the episode's arrivals)."""
        super().__init__()
        self.hidden, self.future = hidden, future
        self.node_norm = RunningNorm(NODE_INPUTS)
        self.pod_norm = RunningNorm(POD_INPUTS)
        self.cluster_norm = RunningNorm(CLUSTER_INPUTS)
        context = POD_INPUTS + CLUSTER_INPUTS
        self.node_in = _linear(NODE_INPUTS, hidden)
        self.context_in = _linear(context, hidden, bias=False)
        self.encoder = nn.Sequential(nn.Tanh(), _linear(hidden, hidden), nn.Tanh())
        self.actor_node = _linear(hidden, hidden)
        self.actor_pooled = _linear(hidden, hidden, bias=False)
        # Residual: exactly zero at the start (the policy is its base); else small, as cleanrl.
        self.actor_out = nn.Sequential(nn.Tanh(), _linear(hidden, 1, gain=0.0 if residual else 0.01))
        self.critic = nn.Sequential(
            _linear(hidden + context + future, hidden),
            nn.Tanh(),
            _linear(hidden, hidden),
            nn.Tanh(),
            _linear(hidden, 1, 1.0),
        )

    def forward(
        self,
        nodes: Tensor,
        mask: Tensor | None,
        pod: Tensor,
        cluster: Tensor,
        base: Tensor | None = None,
        future: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """nodes [B, N, F], mask [B, N] (bool; None: every row is a candidate), pod [B, P],
        cluster [B, C], base [B, N] (a residual policy's heuristic logits), future [B, `future`]
        (the critic's alone; zeros when not given) -> (logits [B, N], MASKED where masked;
        value [B])."""
        context = torch.cat([self.pod_norm(pod), self.cluster_norm(cluster)], dim=-1)
        embedded = self.encoder(self.node_in(self.node_norm(nodes)) + self.context_in(context).unsqueeze(1))
        if mask is None:
            pooled = embedded.mean(1)
        else:
            weights = mask.to(embedded.dtype).unsqueeze(-1)
            pooled = (embedded * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # [B, H]
        scores = self.actor_node(embedded) + self.actor_pooled(pooled).unsqueeze(1)
        logits = self.actor_out(scores).squeeze(-1)
        if base is not None:
            logits = logits + base
        if mask is not None:
            logits = logits.masked_fill(~mask, MASKED)
        seen = [pooled, context]
        if self.future:
            seen.append(future if future is not None else context.new_zeros(context.shape[0], self.future))
        value = self.critic(torch.cat(seen, dim=-1)).squeeze(-1)
        return logits, value

    def update_norms(self, nodes: Tensor, mask: Tensor, pod: Tensor, cluster: Tensor) -> None:
        self.node_norm.update(nodes[mask])
        self.pod_norm.update(pod)
        self.cluster_norm.update(cluster)


class Scorer(nn.Module):
    """What is exported: one pod, its candidate nodes (all feasible) -> one logit per node
    (a residual policy's residual: its base is added where the model is served).

    The same function as `ActorCritic.forward` with no mask, written on 2-D tensors so that
    ONNX gets fused `Gemm`s, with everything that depends only on the pod or the pooled
    context folded into the bias of the per-node products (computed once, not per node).
    """

    def __init__(self, model: ActorCritic) -> None:
        super().__init__()
        self.model = model

    def forward(self, nodes: Tensor, pod: Tensor, cluster: Tensor) -> Tensor:
        m = self.model
        context = torch.cat([m.pod_norm(pod), m.cluster_norm(cluster)], dim=-1)
        second, out = m.encoder[1], m.actor_out[1]
        assert isinstance(second, nn.Linear) and isinstance(out, nn.Linear)
        first_bias = (m.node_in.bias + m.context_in(context)).unsqueeze(0)
        embedded = torch.tanh(torch.addmm(first_bias, m.node_norm(nodes), m.node_in.weight.t()))
        embedded = torch.tanh(torch.addmm(second.bias.unsqueeze(0), embedded, second.weight.t()))
        pooled = embedded.mean(0)
        actor_bias = (m.actor_node.bias + m.actor_pooled(pooled)).unsqueeze(0)
        scores = torch.tanh(torch.addmm(actor_bias, embedded, m.actor_node.weight.t()))
        logits: Tensor = torch.addmm(out.bias.unsqueeze(0), scores, out.weight.t()).squeeze(1)
        return logits
