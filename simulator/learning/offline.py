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


def usable(records: Sequence[Record], skipped: Counter[str] | None = None) -> Usable:
    out = Usable(skipped=Counter(skipped or {}))
    for record in records:
        o = record.observation
        if not 0 <= record.chosen < len(record.names) or not record.mask[record.chosen]:
            out.skipped["unknown node"] += 1
        elif not all(np.isfinite(a).all() for a in (o.nodes, o.pod, o.cluster)):
            out.skipped["features not finite"] += 1
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


def _batch(records: Sequence[Record]) -> tuple[torch.Tensor, ...]:
    rows = max(len(r.names) for r in records)
    width = records[0].observation.nodes.shape[1]
    nodes = np.zeros((len(records), rows, width), dtype=np.float32)
    mask = np.zeros((len(records), rows), dtype=bool)
    for i, r in enumerate(records):
        nodes[i, : len(r.names)] = r.observation.nodes
        mask[i, : len(r.names)] = r.mask
    pod = np.stack([r.observation.pod for r in records]).astype(np.float32)
    cluster = np.stack([r.observation.cluster for r in records]).astype(np.float32)
    chosen = np.array([r.chosen for r in records])
    logged = np.array(
        [np.nan if r.probabilities is None else float(r.probabilities[r.chosen]) for r in records]
    )
    return tuple(torch.as_tensor(a) for a in (nodes, mask, pod, cluster, chosen, logged))


@dataclass(frozen=True)
class Report:
    used: int
    skipped: dict[str, int]
    with_probabilities: int
    kl_to_start: float  # mean KL(start || tuned) over the recorded states, after the last epoch
    losses: list[float]


def fine_tune(model: ActorCritic, data: Usable, args: OfflineArgs = OfflineArgs()) -> Report:
    """Fine-tune `model`'s actor in place on `data` (see the module docstring)."""
    if not data.records:
        raise ValueError("no usable decisions to learn from")
    torch.manual_seed(args.seed)
    generator = np.random.default_rng(args.seed)
    start = ActorCritic(model.hidden)
    start.load_state_dict(model.state_dict())
    start.eval()
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    advantage = torch.as_tensor(advantages(data.records), dtype=torch.float32)
    losses: list[float] = []
    order = np.arange(len(data.records))
    for _ in range(args.epochs):
        generator.shuffle(order)
        total = 0.0
        for first in range(0, len(order), args.batch):
            rows = order[first : first + args.batch]
            nodes, mask, pod, cluster, chosen, logged = _batch([data.records[i] for i in rows])
            loss = _loss(model, start, args, nodes, mask, pod, cluster, chosen, logged, advantage[rows])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            total += float(loss.detach()) * len(rows)
        losses.append(total / len(order))
    with torch.no_grad():
        nodes, mask, pod, cluster, *_ = _batch(data.records)
        inputs = (nodes, mask, pod, cluster)
        kl = float(_kl(start, _log_policy(model, *inputs), *inputs).mean())
    return Report(
        used=len(data.records),
        skipped=dict(data.skipped),
        with_probabilities=sum(r.probabilities is not None for r in data.records),
        kl_to_start=kl,
        losses=losses,
    )


def _log_policy(
    model: ActorCritic, nodes: torch.Tensor, mask: torch.Tensor, pod: torch.Tensor, cluster: torch.Tensor
) -> torch.Tensor:
    logits, _ = model(nodes, mask, pod, cluster)
    return torch.log_softmax(logits, dim=-1)


def _kl(start: ActorCritic, after: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """KL(start || current) per state, `after` the current policy's log-probabilities there."""
    with torch.no_grad():
        before = _log_policy(start, *inputs)
    mask = inputs[1]
    terms = torch.where(mask, before.exp() * (before - after), torch.zeros_like(after))
    return terms.sum(-1)


def _loss(
    model: ActorCritic,
    start: ActorCritic,
    args: OfflineArgs,
    nodes: torch.Tensor,
    mask: torch.Tensor,
    pod: torch.Tensor,
    cluster: torch.Tensor,
    chosen: torch.Tensor,
    logged: torch.Tensor,
    advantage: torch.Tensor,
) -> torch.Tensor:
    log_policy = _log_policy(model, nodes, mask, pod, cluster)
    taken = log_policy.gather(1, chosen.long().unsqueeze(1)).squeeze(1)
    has = torch.isfinite(logged)
    ratio = torch.exp(taken - torch.log(torch.where(has, logged, torch.ones_like(logged)).clamp(min=1e-8)))
    clipped = torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    ppo = -torch.min(ratio * advantage, clipped * advantage)
    weight = torch.clamp(torch.exp(advantage / args.awr_beta), max=args.awr_max_weight)
    awr = -weight * taken
    policy_loss = torch.where(has, ppo, awr).mean()
    kl = _kl(start, log_policy, nodes, mask, pod, cluster).mean()  # the same forward pass
    return policy_loss + args.kl_coef * kl
