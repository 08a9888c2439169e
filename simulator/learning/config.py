"""PPO's hyperparameters: one dataclass, importable without torch (the CLI builds flags from it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from policies.residual import ResidualBase
from simulator.evaluation import DRAIN_UNDERUSED

# Which seconds pods wait for room the reward's QoS term counts: none, all, or those a
# placement can cause (`engine.Meters.weighted_scale_up_wait_s`).
CapacityQos = Literal["", "all", "scale-up"]


@dataclass
class Args:
    """Every hyperparameter, with why it has its value."""

    seed: int = 3  # seeds python, numpy, torch and every environment (3: the shipped model's)
    trace: Path = Path(__file__).resolve().parents[1] / "data" / "azure2019_slice"
    shapes: str = "medium"  # the cluster spec whose pool shapes the curriculum mixes
    out: Path = Path("runs/placement")
    total_timesteps: int = 400_000  # placements (environment steps)
    time_budget_s: float = 2400.0  # stop after this much wall time (0: none): 40 min on 2 CPU cores
    torch_threads: int = 1  # the simulator takes one core, the network the other
    num_envs: int = 8  # vectorized environments (synchronous: the simulator is pure Python)
    num_steps: int = 256  # steps per environment per rollout
    learning_rate: float = 1e-3  # a small network; 3e-4 moved the policy too slowly
    anneal_lr: bool = True  # linear decay to 0, as cleanrl
    gamma: float = 0.995  # per decision, where gamma_per_second is 0; also the reward scale's
    # > 0: discount per simulated second instead of `gamma` per decision: a 20-minute half-life,
    # past the 10-minute scale-down delay that packing pays off over, at any decision rate
    gamma_per_second: float = 0.999422
    gae_lambda: float = 0.95
    num_minibatches: int = 8
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2  # ε of L^CLIP
    clip_vloss: bool = True
    ent_coef: float = 0.0  # c2, weight of the entropy bonus S: none, the residual's base explores
    vf_coef: float = 0.5  # c1, weight of L^VF
    max_grad_norm: float = 0.5
    target_kl: float | None = 0.03  # stop an update's epochs early past this KL
    # a heuristic (e.g. tuned) whose choices the actor first learns to copy, or "lookahead":
    # the residual base's best candidates played forward in copies of the simulation
    imitate: str = ""
    imitate_timesteps: int = 100_000  # placements chosen by that heuristic, before PPO takes over
    imitate_coef: float = 0.0  # after that, weight of the teacher's log-likelihood in PPO's loss
    # the share of PPO's placements the teacher labels for that term (a lookahead label costs
    # about 0.2 s of copies, a thousand placements' worth)
    teach_share: float = 1.0
    lookahead_candidates: int = 4  # the base's best this many candidates are played forward
    lookahead_minutes: int = 15  # for this long: past the 10-minute scale-down delay
    lookahead_margin: float = 0.01  # composite another candidate must gain to be the label
    residual: str = "tuned"  # a weighted heuristic the actor's logits are a residual on ("": none)
    residual_scale: float = 2.0  # its standardised scores in logits: its best node ~e^2-e^4 likelier
    # > 0: the actor scores only the residual base's best this many candidates (0: all of them)
    residual_top_k: int = 0
    critic_sees_future: bool = True  # the critic reads the episode's coming arrivals (training only)
    request_weighted_qos: bool = False  # QoS: seconds requests waited on pulls, not seconds pods did
    qos_counts_capacity_waits: bool = False  # QoS also: seconds pods wait for a node with room
    # QoS also: of those, the seconds a placement can cause (a node being added, up to its
    # join); counted in the above too, which wins when both are set
    qos_counts_scale_up_waits: bool = True
    shape_reward: bool = True  # potential-based shaping for node release
    hidden: int = 32  # per-node width: inference cost grows with its square and the node count
    episode_minutes: int = 360  # 6 hours of the 12-hour training split
    fewest_functions_per_node: float = 0.3  # the sparsest episodes' functions per node (most: 4.5)
    largest_cluster: int = 48  # the curriculum's largest initial cluster (Curriculum.up_to)
    # > 1: episodes' invocations scaled by a factor drawn log-uniformly from [1, this]
    max_arrival_scale: float = 1.0
    # episodes where the cluster autoscaler also drains nodes under half allocated, the
    # evaluation's ground (`evaluation.DRAIN_UNDERUSED`); off: only empty nodes go
    drain_underused: bool = DRAIN_UNDERUSED
    device: str = "auto"  # auto: CUDA when present
    export_onnx: bool = True

    @property
    def capacity_qos(self) -> CapacityQos:
        """Which waits for room the reward's QoS term counts (`CapacityQos`)."""
        if self.qos_counts_capacity_waits:
            return "all"
        return "scale-up" if self.qos_counts_scale_up_waits else ""

    def residual_base(self) -> ResidualBase | None:
        """The heuristic the actor's logits are a residual on (None: not a residual policy)."""
        return (
            ResidualBase.of(self.residual, self.residual_scale, self.residual_top_k)
            if self.residual
            else None
        )

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches
