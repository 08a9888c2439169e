"""Forecast chunks as Ray tasks (`KDRL_FORECAST_ENGINE=ray`, `KDRL_RAY_ADDRESS`).

The chunk functions (`forecasting.backtest`, `forecasting.forecast_chunk`) are pure, so a Ray
worker computes exactly what this process would; history, planning and serving stay here.
At most `in_flight` chunks are submitted ahead of the one being collected, which bounds what
the driver holds, as the local engine's one-at-a-time does. Ray is imported only when this
engine is chosen: the local engine, the default, never needs it.
"""

from __future__ import annotations

import collections
import logging
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from forecaster.forecasting import Result, Task

logger = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 3.0


def connect(address: str) -> None:
    """Join the Ray cluster at `address` once per process (HOST:PORT of its GCS, or
    ray://HOST:PORT of its client server). A cluster that does not answer fails in seconds, not
    in the minutes `ray.init` would wait; one of another Ray or Python version fails naming both."""
    import ray

    if ray.is_initialized():
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except (OSError, ValueError) as error:
        raise ConnectionError(f"Ray cluster at {address} is unreachable: {error}") from error
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except RuntimeError as error:
        if "Version mismatch" not in str(error):
            raise
        # Ray's text names both versions over several lines; one line, and what to do.
        versions = " ".join(str(error).split())
        raise ConnectionError(
            f"Ray cluster at {address}: {versions} Install the cluster's Ray and Python versions here "
            "(or run the cluster on this image)."
        ) from error
    logger.info("joined the Ray cluster at %s (Ray %s)", address, ray.__version__)


class RayEngine:
    def __init__(self, address: str, *, in_flight: int = 8) -> None:
        self.address = address
        self.in_flight = in_flight
        self._remote: dict[Callable[..., Any], Any] = {}

    def map(self, work: Callable[[Task], Result], tasks: Iterable[Task]) -> Iterator[Result]:
        import ray

        connect(self.address)
        # One retry where a worker is lost; then the caller runs the cycle locally.
        if work not in self._remote:
            self._remote[work] = ray.remote(max_retries=1)(work)
        remote = self._remote[work]
        pending: collections.deque[Any] = collections.deque()
        try:
            for task in tasks:
                pending.append(remote.remote(task))
                if len(pending) > self.in_flight:
                    yield ray.get(pending.popleft())
            while pending:
                yield ray.get(pending.popleft())
        finally:
            for ref in pending:  # a failed or stopped cycle leaves nothing running
                ray.cancel(ref)
