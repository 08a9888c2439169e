"""PPO for the placement policy, in the style of cleanrl's `ppo.py` (one file, one `Args`).

Loss terms carry the names of Schulman et al. (2017): the clipped surrogate objective L^CLIP,
the value loss L^VF and the entropy bonus S; advantages by GAE (Schulman et al., 2016).
Episodes come from the training split only (`environment.TRAIN_MINUTES`), through a curriculum
over cluster sizes and node mixes. Optionally, the first updates are behaviour cloning: a
heuristic places the pods and the actor learns its choices (cross-entropy) while the critic
learns their values, so that PPO starts from a policy that packs, say, and improves on it;
`imitate_coef` keeps the teacher's log-likelihood in PPO's loss after that (the demonstration
term of DAPG, Rajeswaran et al., 2018), so PPO improves on the teacher without forgetting it.
Writes `progress.csv`, TensorBoard scalars, `learning_curve.png`, the checkpoint and the
exported ONNX model to `out`.
"""

from __future__ import annotations

import csv
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from policies import features
from simulator import plots, traces
from simulator.learning import environment, export
from simulator.learning.config import Args
from simulator.learning.network import ActorCritic
from simulator.learning.vectorized import Environments, LocalEnvironments


@dataclass
class Progress:
    """Scalars of one update, as written to CSV and TensorBoard."""

    values: dict[str, float] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True


def pick_device(wanted: str) -> str:
    if wanted == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return wanted


# nodes, mask, pod, cluster, then what only some runs observe: base, future (None when not)
Batch = tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None]


def _tensors(obs: dict[str, np.ndarray], device: torch.device) -> Batch:
    def optional(key: str) -> Tensor | None:
        return torch.as_tensor(obs[key], device=device) if key in obs else None

    return (
        torch.as_tensor(obs["nodes"], device=device),
        torch.as_tensor(obs["mask"], device=device).bool(),
        torch.as_tensor(obs["pod"], device=device),
        torch.as_tensor(obs["cluster"], device=device),
        optional("base"),
        optional("future"),
    )


def _clock(obs: dict[str, np.ndarray], device: torch.device) -> Tensor:
    """Each environment's simulated time (0 when not observed: a discount per decision)."""
    clock = obs.get("clock")
    return (
        torch.zeros(len(obs["pod"]), device=device)
        if clock is None
        else torch.as_tensor(clock[:, 0], device=device)
    )


def train(
    args: Args,
    on_update: Callable[[int, Progress], None] = lambda *_: None,
    environments: Environments | None = None,
) -> ActorCritic:
    """PPO over `environments` (default: `args.num_envs` in this process), closed at the end."""
    seed_everything(args.seed)
    torch.set_num_threads(args.torch_threads)
    device = torch.device(pick_device(args.device))
    envs = environments or LocalEnvironments(args, traces.load(args.trace))
    curriculum = environment.Curriculum.up_to(
        args.largest_cluster, args.episode_minutes, args.fewest_functions_per_node
    )
    future = len(environment.FUTURE_FEATURES) if args.critic_sees_future else 0
    model = ActorCritic(args.hidden, residual=bool(args.residual), future=future).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate, eps=1e-5)
    rows = envs.rows
    shape = (args.num_steps, args.num_envs)
    nodes_buf = torch.zeros((*shape, rows, len(features.NODE_FEATURES)), device=device)
    mask_buf = torch.zeros((*shape, rows), dtype=torch.bool, device=device)
    pod_buf = torch.zeros((*shape, len(features.POD_FEATURES)), device=device)
    cluster_buf = torch.zeros((*shape, len(features.CLUSTER_FEATURES)), device=device)
    base_buf = torch.zeros((*shape, rows), device=device) if args.residual else None
    future_buf = torch.zeros((*shape, future), device=device) if future else None
    clock_buf = torch.zeros(shape, device=device)
    actions, logprobs, rewards, dones, values, taught = (torch.zeros(shape, device=device) for _ in range(6))

    args.out.mkdir(parents=True, exist_ok=True)
    writer = _writer(args.out)
    log = _CsvLog(args.out / "progress.csv")
    global_step, started = 0, time.time()
    obs = envs.reset(args.seed)
    next_obs, next_clock = _tensors(obs, device), _clock(obs, device)
    next_done = torch.zeros(args.num_envs, device=device)
    updates = max(args.total_timesteps // args.batch_size, 1)
    episode_returns: list[float] = []
    running_return = np.zeros(args.num_envs)
    reward_scale = RewardScale(args.num_envs, args.gamma)
    imitation_updates = args.imitate_timesteps // args.batch_size if args.imitate else 0
    keep_teacher = bool(args.imitate) and args.imitate_coef > 0

    for update in range(1, updates + 1):
        imitating = update <= imitation_updates
        fraction = (update - 1) / updates
        envs.set_progress(fraction)
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - fraction) * args.learning_rate
        for step in range(args.num_steps):
            global_step += args.num_envs
            nodes, mask, pod, cluster, base, ahead = next_obs
            nodes_buf[step], mask_buf[step], pod_buf[step], cluster_buf[step] = nodes, mask, pod, cluster
            if base_buf is not None and base is not None:
                base_buf[step] = base
            if future_buf is not None and ahead is not None:
                future_buf[step] = ahead
            clock_buf[step] = next_clock
            dones[step] = next_done
            model.update_norms(nodes, mask, pod, cluster)
            with torch.no_grad():
                logits, value = model(*next_obs)
                distribution = torch.distributions.Categorical(logits=logits)
                if imitating or keep_teacher:  # -1: a placement the teacher did not label
                    labels = envs.teach() if imitating else envs.teach(args.teach_share)
                    taught[step] = torch.as_tensor(labels, device=device)
                action = taught[step].long().clamp(min=0) if imitating else distribution.sample()
            values[step], actions[step], logprobs[step] = value, action, distribution.log_prob(action)
            obs, reward, finished = envs.step(action.cpu().numpy())
            running_return += reward
            for env_index in np.flatnonzero(finished):
                episode_returns.append(float(running_return[env_index]))
                running_return[env_index] = 0.0
            scaled = reward_scale(reward, finished)
            rewards[step] = torch.as_tensor(scaled, device=device, dtype=torch.float32)
            next_obs, next_clock = _tensors(obs, device), _clock(obs, device)
            next_done = torch.as_tensor(finished, device=device, dtype=torch.float32)

        with torch.no_grad():
            _, next_value = model(*next_obs)
            advantages = torch.zeros_like(rewards)
            last_gae = torch.zeros(args.num_envs, device=device)
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    next_nonterminal, following, then = 1.0 - next_done, next_value, next_clock
                else:
                    next_nonterminal, following, then = 1.0 - dones[t + 1], values[t + 1], clock_buf[t + 1]
                discount = _discount(args, then - clock_buf[t])
                delta = rewards[t] + discount * following * next_nonterminal - values[t]
                last_gae = delta + discount * args.gae_lambda * next_nonterminal * last_gae
                advantages[t] = last_gae
            returns = advantages + values

        b_nodes, b_mask = nodes_buf.flatten(0, 1), mask_buf.flatten(0, 1)
        b_pod, b_cluster = pod_buf.flatten(0, 1), cluster_buf.flatten(0, 1)
        b_base = base_buf.flatten(0, 1) if base_buf is not None else None
        b_future = future_buf.flatten(0, 1) if future_buf is not None else None
        b_actions, b_logprobs = actions.flatten().long(), logprobs.flatten()
        b_taught = taught.flatten().long()  # the teacher's choices (imitation, or its term in the loss)
        b_advantages, b_returns, b_values = advantages.flatten(), returns.flatten(), values.flatten()
        stats: dict[str, float] = {}
        clipfracs: list[float] = []
        for _epoch in range(args.update_epochs):
            order = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb = order[start : start + args.minibatch_size]
                mb_base = b_base[mb] if b_base is not None else None
                mb_future = b_future[mb] if b_future is not None else None
                logits, new_value = model(
                    b_nodes[mb], b_mask[mb], b_pod[mb], b_cluster[mb], mb_base, mb_future
                )
                distribution = torch.distributions.Categorical(logits=logits)
                new_logprob = distribution.log_prob(b_actions[mb])
                entropy = _masked_entropy(logits, b_mask[mb])
                log_ratio = new_logprob - b_logprobs[mb]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clipfracs.append(float(((ratio - 1.0).abs() > args.clip_coef).float().mean()))
                adv = b_advantages[mb]
                if args.norm_adv:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                if imitating:  # behaviour cloning: the negative log-likelihood of the teacher's choice
                    policy_loss = -new_logprob.mean()
                else:  # L^CLIP, as a loss to minimise
                    policy_loss = torch.max(
                        -adv * ratio, -adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    ).mean()
                # L^VF, optionally clipped around the rollout's values
                if args.clip_vloss:
                    clipped = b_values[mb] + torch.clamp(
                        new_value - b_values[mb], -args.clip_coef, args.clip_coef
                    )
                    value_loss = (
                        0.5
                        * torch.max((new_value - b_returns[mb]) ** 2, (clipped - b_returns[mb]) ** 2).mean()
                    )
                else:
                    value_loss = 0.5 * ((new_value - b_returns[mb]) ** 2).mean()
                entropy_bonus = entropy.mean()  # S
                loss = policy_loss - args.ent_coef * entropy_bonus + args.vf_coef * value_loss
                labelled = b_taught[mb] >= 0
                if keep_teacher and not imitating and bool(labelled.any()):  # stay near the teacher (DAPG)
                    taught_logprob = distribution.log_prob(b_taught[mb].clamp(min=0))[labelled]
                    loss = loss - args.imitate_coef * taught_logprob.mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
            if not imitating and args.target_kl is not None and float(approx_kl) > args.target_kl:
                break

        recent = episode_returns[-20:]
        stats = {
            "global_step": float(global_step),
            "wall_s": time.time() - started,
            "steps_per_s": global_step / max(time.time() - started, 1e-9),
            "learning_rate": float(optimizer.param_groups[0]["lr"]),
            "episodic_return": float(np.mean(recent)) if recent else float("nan"),
            "episodes": float(len(episode_returns)),
            "loss_clip": float(policy_loss.detach()),
            "loss_value": float(value_loss.detach()),
            "entropy": float(entropy_bonus.detach()),
            "approx_kl": float(approx_kl),
            "clipfrac": float(np.mean(clipfracs)),
            "curriculum_stage": float(curriculum.stage(fraction)[1]),
            "imitating": float(imitating),
        }
        log.write(stats)
        for key, value in stats.items():
            writer.add_scalar(f"train/{key}", value, global_step)
        on_update(update, Progress(stats))
        if args.time_budget_s and time.time() - started > args.time_budget_s:
            break

    writer.close()
    envs.close()
    model.cpu()
    heuristic = args.residual_base()
    checkpoint = {
        "model": model.state_dict(),
        "args": _config(args),
        "base": heuristic.to_json() if heuristic else "",
    }
    torch.save(checkpoint, args.out / "model.pt")
    plots.learning_curve(args.out / "progress.csv", args.out / "learning_curve.png")
    if args.export_onnx:
        export.export(model, args.out / "placement.onnx", _config(args), heuristic)
    return model


def _discount(args: Args, elapsed: Tensor) -> Tensor | float:
    """γ per decision, or γ_s^seconds between decisions (`gamma_per_second`): what a minute of
    simulated time is worth then does not depend on how busy the cluster is."""
    if args.gamma_per_second <= 0:
        return args.gamma
    return torch.pow(torch.as_tensor(args.gamma_per_second), elapsed.clamp(min=0.0))


class RewardScale:
    """Rewards divided by the running std of the discounted return (as gymnasium's
    NormalizeReward): returns of order 1, so the value loss does not swamp the policy's
    gradient under the shared encoder and gradient clipping."""

    def __init__(self, envs: int, gamma: float) -> None:
        self.gamma, self.returns = gamma, np.zeros(envs)
        self.count, self.mean, self.m2 = 1e-4, 0.0, 0.0

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + reward
        for value in self.returns:
            self.count += 1
            delta = value - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (value - self.mean)
        self.returns[done] = 0.0
        scaled: np.ndarray = reward / np.sqrt(self.m2 / self.count + 1e-8)
        return scaled


def _masked_entropy(logits: Tensor, mask: Tensor) -> Tensor:
    """Entropy over the feasible rows only (masked rows have probability 0)."""
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()
    return -(torch.where(mask, p * log_p, torch.zeros_like(p))).sum(-1)


def _config(args: Args) -> dict[str, Any]:
    """The configuration as the model file records it: paths by name (no machine's layout)."""
    return {k: (v.name if isinstance(v, Path) else v) for k, v in asdict(args).items()}


def _writer(out: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(out / "tensorboard"))


class _CsvLog:
    def __init__(self, path: Path) -> None:
        self.path, self.header = path, False
        path.unlink(missing_ok=True)

    def write(self, row: dict[str, float]) -> None:
        with self.path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(row))
            if not self.header:
                writer.writeheader()
                self.header = True
            writer.writerow(row)
