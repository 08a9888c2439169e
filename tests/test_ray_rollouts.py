"""`kdrl train --ray-address ADDR --workers N`: environments in Ray actors, the learner here."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import ray
import torch

from plugin import cli
from plugin.ray_rollouts import RayEnvironments
from simulator import traces
from simulator.learning import ppo
from simulator.learning.config import Args
from tests.test_learning import tiny_run

VARYING = {"wall_s", "steps_per_s"}  # the clock's columns


def run(out: Path) -> Args:
    # Four environments of short episodes (they end and restart within the run), one update of
    # cloning `tuned` then PPO that keeps the teacher's term: every path of the learner's loop.
    return tiny_run(
        out,
        num_envs=4,
        num_steps=32,
        total_timesteps=3 * 4 * 32,
        update_epochs=1,
        episode_minutes=5,
        largest_cluster=12,
        imitate="tuned",
        imitate_timesteps=4 * 32,
        imitate_coef=0.1,
        export_onnx=False,
    )


def progress(out: Path) -> list[dict[str, str]]:
    with (out / "progress.csv").open() as handle:
        return [{k: v for k, v in row.items() if k not in VARYING} for row in csv.DictReader(handle)]


def test_the_same_seed_trains_the_same_model_here_and_on_one_or_two_workers(
    tmp_path: Path, ray_address: str
) -> None:
    models, curves = {}, {}
    for workers in (0, 1, 2):
        args = run(tmp_path / str(workers))
        environments = (
            RayEnvironments(args, traces.load(args.trace), address=ray_address, workers=workers)
            if workers
            else None
        )
        models[workers] = ppo.train(args, environments=environments).state_dict()
        curves[workers] = progress(args.out)
    assert float(curves[0][-1]["episodes"]) > 0  # episodes ended and restarted within the run
    for workers in (1, 2):
        assert curves[workers] == curves[0]
        assert models[workers].keys() == models[0].keys()
        for name, tensor in models[0].items():
            assert torch.equal(tensor, models[workers][name]), name


def test_training_on_an_unreachable_ray_cluster_stops_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever other tests started
    assert cli.main(["train", "--out", str(tmp_path), "--ray-address", "127.0.0.1:1"]) == 2
    assert "Ray cluster at 127.0.0.1:1 is unreachable" in capsys.readouterr().err
    assert not (tmp_path / "progress.csv").exists()


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--workers", "2"], "--workers needs --ray-address"),
        (["--ray-address", "127.0.0.1:1", "--workers", "0"], "--workers must be 1 to --num-envs"),
    ],
)
def test_worker_counts_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], problem: str
) -> None:
    assert cli.main(["train", "--out", str(tmp_path), *flags]) == 2
    assert problem in capsys.readouterr().err
