"""Fine-tuning the placement policy from the decisions the service recorded (`kdrl train
--from-decisions DB [--from-model M]`): off-policy, from a log it did not choose.

Each recorded placement is a one-step decision judged by what the pod then saw: the reward is
minus its priority-weighted start delay, with `SLA_VIOLATION_S` more for a missed SLA (the QoS
term of `policies.objectives`; the nodes' cost and energy are not in the record). Advantages
are taken against the mean reward of the same function (an input-dependent baseline, as in
Mao et al., ICLR 2019: what a function's start costs depends on the function first), scaled to
unit variance.

The update is conservative, as a log of another policy's choices allows:
- where the log has the serving policy's probabilities (the learned policy served), PPO's
  clipped surrogate with the logged policy as the old one (Schulman et al., 2017): importance
  ratios pi/mu clipped to [1 - eps, 1 + eps], so no recorded choice moves the policy far;
- where it has none (a heuristic served), advantage-weighted regression (Peng et al., 2019):
  the recorded choices' log-likelihood weighted by exp(A / beta), clipped;
- and a KL penalty to the starting policy over every recorded state, so the fine-tuned model
  stays near the one that served (behaviour-regularised, as Wu et al., 2019).

Rows whose bound node is not among the candidates, whose features are not finite, or whose pod
was never seen Ready are skipped and counted, never trained on.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from policies.decision_records import Record
from policies.objectives import PRIORITY_WEIGHT, SLA_VIOLATION_S
from simulator.learning.network import ActorCritic


@dataclass(frozen=True)
class OfflineArgs:
    epochs: int = 30
    learning_rate: float = 3e-4
    clip_coef: float = 0.2  # PPO's epsilon, on the logged policy's probabilities
    awr_beta: float = 1.0  # temperature of the advantage weights where no probabilities were logged
    awr_max_weight: float = 20.0
    kl_coef: float = 0.5  # the pull towards the starting policy
    batch: int = 256
    seed: int = 1


@dataclass
class Usable:
    """The records trained on, and how many were skipped, by reason."""

    records: list[Record] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def usable(
    records: Sequence[Record], skipped: Counter[str] | None = None, *, residual: bool = False
) -> Usable:
    """`residual`: for a residual model, which needs the served probabilities (`_batch`)."""
    out = Usable(skipped=Counter(skipped or {}))
    for record in records:
        o = record.observation
        if not 0 <= record.chosen < len(record.names) or not record.mask[record.chosen]:
            out.skipped["unknown node"] += 1
        elif not all(np.isfinite(a).all() for a in (o.nodes, o.pod, o.cluster)):
            out.skipped["features not finite"] += 1
        elif residual and record.probabilities is None:
            out.skipped["no served probabilities (a residual model needs them)"] += 1
        elif record.start_s is None or not np.isfinite(record.start_s):
            out.skipped["no outcome yet"] += 1
        else:
            out.records.append(record)
    return out


def rewards(records: Sequence[Record]) -> np.ndarray:
    """Minus the priority-weighted start delay, plus SLA_VIOLATION_S for a missed SLA."""
    return np.array(
        [
            -PRIORITY_WEIGHT[r.priority] * ((r.start_s or 0.0) + (0.0 if r.sla_met else SLA_VIOLATION_S))
            for r in records
        ]
    )


def advantages(records: Sequence[Record]) -> np.ndarray:
    """Reward minus its function's mean reward, scaled to unit variance."""
    reward = rewards(records)
    by_function: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_function.setdefault(r.function, []).append(i)
    advantage = reward - reward.mean()
    for rows in by_function.values():
        if len(rows) > 1:
            advantage[rows] = reward[rows] - reward[rows].mean()
    scale = float(advantage.std())
    scaled: np.ndarray = advantage / scale if scale > 1e-8 else advantage
    return scaled


Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


def _batch(
    records: Sequence[Record], start: ActorCritic | None = None
) -> tuple[Inputs, torch.Tensor, torch.Tensor]:
    """(nodes, mask, pod, cluster, base), the chosen rows, the logged probability of each.

    `start`: the residual model that served. Its base (the heuristic's logits) is not in the
    record, but the served logits are, up to a constant, as the logged log-probabilities; less
    the start's own residual, they are the base (a constant per row changes no softmax)."""
    rows = max(len(r.names) for r in records)
    width = records[0].observation.nodes.shape[1]
    nodes = np.zeros((len(records), rows, width), dtype=np.float32)
    mask = np.zeros((len(records), rows), dtype=bool)
    served = np.zeros((len(records), rows), dtype=np.float32)
    for i, r in enumerate(records):
        nodes[i, : len(r.names)] = r.observation.nodes
        mask[i, : len(r.names)] = r.mask
        if r.probabilities is not None:
            served[i, : len(r.names)] = np.log(np.maximum(r.probabilities, 1e-30))
    pod = np.stack([r.observation.pod for r in records]).astype(np.float32)
    cluster = np.stack([r.observation.cluster for r in records]).astype(np.float32)
    chosen = np.array([r.chosen for r in records])
    logged = np.array(
        [np.nan if r.probabilities is None else float(r.probabilities[r.chosen]) for r in records]
    )
    n, m, p, c = (torch.as_tensor(a) for a in (nodes, mask, pod, cluster))
    base = None
    if start is not None:
        with torch.no_grad():
            residual, _ = start(n, m, p, c)
        base = torch.where(m, torch.as_tensor(served) - residual, torch.zeros_like(residual))
    return (n, m, p, c, base), torch.as_tensor(chosen), torch.as_tensor(logged)


@dataclass(frozen=True)
class Report:
    used: int
    skipped: dict[str, int]
    with_probabilities: int
    kl_to_start: float  # mean KL(start || tuned) over the recorded states, after the last epoch
    losses: list[float]


def fine_tune(
    model: ActorCritic, data: Usable, args: OfflineArgs = OfflineArgs(), *, residual: bool = False
) -> Report:
    """Fine-tune `model`'s actor in place on `data` (see the module docstring). `residual`: the
    model is a residual policy's, and every record has the probabilities it served with."""
    if not data.records:
        raise ValueError("no usable decisions to learn from")
    if residual and any(r.probabilities is None for r in data.records):
        raise ValueError("a residual model learns only from records with its probabilities")
    torch.manual_seed(args.seed)
    generator = np.random.default_rng(args.seed)
    start = copy.deepcopy(model)
    start.eval()
    model.train()
    served_by = start if residual else None
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    advantage = torch.as_tensor(advantages(data.records), dtype=torch.float32)
    losses: list[float] = []
    order = np.arange(len(data.records))
    for _ in range(args.epochs):
        generator.shuffle(order)
        total = 0.0
        for first in range(0, len(order), args.batch):
            rows = order[first : first + args.batch]
            inputs, chosen, logged = _batch([data.records[i] for i in rows], served_by)
            loss = _loss(model, start, args, inputs, chosen, logged, advantage[rows])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            total += float(loss.detach()) * len(rows)
        losses.append(total / len(order))
    with torch.no_grad():
        inputs, _, _ = _batch(data.records, served_by)
        kl = float(_kl(start, _log_policy(model, inputs), inputs).mean())
    return Report(
        used=len(data.records),
        skipped=dict(data.skipped),
        with_probabilities=sum(r.probabilities is not None for r in data.records),
        kl_to_start=kl,
        losses=losses,
    )


def _log_policy(model: ActorCritic, inputs: Inputs) -> torch.Tensor:
    logits, _ = model(*inputs)
    return torch.log_softmax(logits, dim=-1)


def _kl(start: ActorCritic, after: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    """KL(start || current) per state, `after` the current policy's log-probabilities there."""
    with torch.no_grad():
        before = _log_policy(start, inputs)
    mask = inputs[1]
    terms = torch.where(mask, before.exp() * (before - after), torch.zeros_like(after))
    return terms.sum(-1)


def _loss(
    model: ActorCritic,
    start: ActorCritic,
    args: OfflineArgs,
    inputs: Inputs,
    chosen: torch.Tensor,
    logged: torch.Tensor,
    advantage: torch.Tensor,
) -> torch.Tensor:
    log_policy = _log_policy(model, inputs)
    taken = log_policy.gather(1, chosen.long().unsqueeze(1)).squeeze(1)
    has = torch.isfinite(logged)
    ratio = torch.exp(taken - torch.log(torch.where(has, logged, torch.ones_like(logged)).clamp(min=1e-8)))
    clipped = torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    ppo = -torch.min(ratio * advantage, clipped * advantage)
    weight = torch.clamp(torch.exp(advantage / args.awr_beta), max=args.awr_max_weight)
    awr = -weight * taken
    policy_loss = torch.where(has, ppo, awr).mean()
    kl = _kl(start, log_policy, inputs).mean()  # the same forward pass
    return policy_loss + args.kl_coef * kl
