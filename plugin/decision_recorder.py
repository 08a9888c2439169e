"""What the extender served, recorded off the request path (`KDRL_DECISIONS_RECORD`).

Bind hands over references (the pod, the candidates' immutable table, the policy's scores):
an append. Every `flush_s` their feature rows are encoded as the model saw them, one placement
at a time between requests, and written to the history database (`policies.decision_records`)
by SQLite on the recorder's own thread, with the pods' outcomes as their events report them
Ready. A placement costs about a millisecond at 1,000 nodes, so at most `max_per_s` are
recorded (the rest counted as `over_rate`, never the extender slowed); the table keeps
`retention_s` and `max_rows`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from forecaster.history import ColdStart
from plugin import metrics
from plugin.decisions import Decision
from plugin.store_thread import StoreThread
from policies import decision_records, features
from policies.decision_records import DecisionStore, Record
from policies.onnx_policy import LoadedPolicy, OnnxPolicy
from policies.types import FloatArray, NodeTable, PodRequest

logger = logging.getLogger(__name__)
MAX_OUTCOMES = 10_000  # pods' outcomes waiting for a flush
TRIM_EVERY_S = 600.0


@dataclass(frozen=True, slots=True)
class Served:
    pod: PodRequest
    at: float
    candidates: NodeTable
    scores: FloatArray  # NaN where infeasible
    node: str
    policy: str
    model: str
    logits: bool  # the scores are the policy's logits (its probabilities are their softmax)

    def record(self) -> Record:
        feasible = np.isfinite(self.scores)
        names = [str(n) for n in self.candidates.names]
        probabilities = None
        if self.logits and feasible.any():
            shifted = np.where(feasible, self.scores - self.scores[feasible].max(), -np.inf)
            weights = np.exp(shifted)
            probabilities = (weights / weights.sum()).astype(np.float32)
        return Record(
            uid=self.pod.uid,
            at=self.at,
            function=self.pod.function or "",
            priority=self.pod.priority,
            policy=self.policy,
            model=self.model,
            feature_schema=features.SCHEMA_HASH,
            node=self.node,
            chosen=names.index(self.node) if self.node in names else -1,
            names=names,
            observation=features.encode(self.pod, self.candidates, feasible),
            mask=feasible,
            probabilities=probabilities,
        )


class DecisionRecorder:
    def __init__(
        self,
        path: Path,
        *,
        retention_s: float,
        max_rows: int,
        max_per_s: float,
        flush_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = DecisionStore(path)
        self.retention_s, self.max_rows, self.flush_s, self.clock = retention_s, max_rows, flush_s, clock
        self.max_per_flush = max(int(max_per_s * flush_s), 1)
        self._served: list[Served] = []
        self._outcomes: list[tuple[str, float, float, float | None, float | None]] = []
        self._trimmed = 0.0
        self._flushing = asyncio.Lock()  # held while a periodic flush has rows taken, not yet written
        # A write that outlives its cancelled flush, the final flush and close queue behind
        # each other on one thread (`StoreThread`).
        self._io = StoreThread("decisions")

    def served(self, decision: Decision, loaded: LoadedPolicy) -> None:
        """A bound pod's decision, by reference (no work here: the extender is waiting)."""
        if decision.candidates is None or decision.scores is None or decision.bound_node is None:
            return  # bound without a prioritize of ours: nothing the policy scored
        if len(self._served) >= self.max_per_flush:
            metrics.decisions_recorded.add(1, {"kdrl.outcome": "over_rate"})
            return
        self._served.append(
            Served(
                pod=decision.pod,
                at=self.clock(),
                candidates=decision.candidates,
                scores=decision.scores,
                node=decision.bound_node,
                policy=loaded.policy.name,
                model=loaded.model,
                logits=isinstance(loaded.policy, OnnxPolicy),
            )
        )

    def observed(self, cold_start: ColdStart) -> None:
        if cold_start.uid and len(self._outcomes) < MAX_OUTCOMES:
            c = cold_start
            self._outcomes.append((c.uid, self.clock(), c.seconds, c.scheduling_s, c.startup_s))

    def flush(self) -> int:
        """Write what waits, here and now; returns the decisions written."""
        served, outcomes = self._take()
        rows = [row for row in map(self._row, served) if row is not None]
        self._io.call(partial(self._write, rows, outcomes))
        return len(rows)

    def _take(
        self,
    ) -> tuple[list[Served], list[tuple[str, float, float, float | None, float | None]]]:
        served, self._served = self._served, []
        outcomes, self._outcomes = self._outcomes, []
        return served, outcomes

    def _row(self, item: Served) -> tuple[Any, ...] | None:
        try:
            return decision_records.row(item.record())
        except Exception:  # one odd pod must not cost the batch
            logger.exception("cannot record the decision for %s", item.pod.key)
            metrics.decisions_recorded.add(1, {"kdrl.outcome": "failed"})
            return None

    def _write(
        self,
        rows: list[tuple[Any, ...]],
        outcomes: list[tuple[str, float, float, float | None, float | None]],
    ) -> None:
        if rows:
            self.store.write_rows(rows)
            metrics.decisions_recorded.add(len(rows), {"kdrl.outcome": "written"})
        if outcomes:
            self.store.observe(outcomes)
        now = self.clock()
        if now - self._trimmed >= TRIM_EVERY_S:
            self._trimmed = now
            self.store.trim(now=now, retention_s=self.retention_s, max_rows=self.max_rows)

    async def flush_soon(self) -> None:
        """Write what waits: the rows made on the loop, one placement at a time with the loop
        let go in between (a second thread doing it would hold the GIL against every request:
        Python hands it back to an I/O thread only every switch interval), then written by
        SQLite on the recorder's thread (it lets the GIL go while it works)."""
        async with self._flushing:
            served, outcomes = self._take()
            rows = []
            try:
                for item in served:
                    made = self._row(item)
                    if made is not None:
                        rows.append(made)
                    await asyncio.sleep(0)
                await self._io.run(partial(self._write, rows, outcomes))
            except asyncio.CancelledError:
                # Shutdown: the final flush writes them. A write already on the thread goes on
                # and may too; a pod's row written twice is stored once.
                self._served[:0], self._outcomes[:0] = served, outcomes
                raise

    async def drain(self) -> int:
        """Everything recorded so far, written: after the periodic flush under way, if any
        (`flush` alone misses the rows it has taken and not yet written); returns the decisions
        this call wrote."""
        async with self._flushing:
            return self.flush()

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.flush_s)
                try:
                    await self.flush_soon()
                except Exception:  # a full disk or a locked file: the next flush tries again
                    logger.exception("recording decisions failed")
        finally:
            with contextlib.suppress(Exception):
                self.flush()  # what waits at shutdown, after any write still on the thread
            self.close()

    def close(self) -> None:
        """Close the store after whatever is writing to it, then its thread."""
        self._io.close(self.store.close)
