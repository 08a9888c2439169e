"""The prewarm cycle of the service: plan every minute, and let the leader apply the plan.

Every replica plans (so `/debug/prewarm` shows the same reasoning everywhere); only the
replica holding the Lease changes anything, and in shadow mode none does. Applying a plan
means: hold each warm entry's replicas on the function's routed revisions until the entry
expires, restore every revision that carries the plugin's records but is not held by the plan
(whoever warmed it: a leader that crashed leaves no one else to), and run the pre-pulls. A
failing API server costs a logged cycle and a growing pause (never a tight loop); on a clean
shutdown the functions this replica warmed are restored unless told to keep them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from opentelemetry import trace

from forecaster import phase
from forecaster.forecasting import Forecast
from plugin import metrics
from plugin.emitter import Emitter
from plugin.errors import KubeApiError
from plugin.functions import FunctionCatalog
from plugin.informer import Backoff
from plugin.prewarming import Applied, Prepuller, RevisionActuator
from policies.placement import PlacementPolicy
from policies.types import NodeTable
from prewarm import prepull
from prewarm.planning import Budget, PlannerSettings, PrewarmPlan, PullEntry, WarmEntry, plan

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclass
class PrewarmLoop:
    catalog: FunctionCatalog
    forecasts: Callable[[], Mapping[str, Forecast]]
    nodes: Callable[[], NodeTable]
    policy: Callable[[], PlacementPolicy]
    actuator: RevisionActuator
    prepuller: Prepuller
    budget: Budget
    leading: Callable[[], bool]
    clock: Callable[[], float]
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    emitter: Emitter | None = None
    forecast_context: Callable[[], trace.SpanContext | None] = lambda: None
    interval_s: float = 60.0
    # Whether `function` was invoked at or after `minute`: judges each warm window a hit or a
    # miss for the metrics (None: windows are not judged).
    invoked: Callable[[str, int], bool] | None = None
    latest: PrewarmPlan | None = None
    warmed: set[str] = field(default_factory=set)  # functions this replica holds warm
    windows: dict[str, int] = field(default_factory=dict)  # warm function -> minute its window began
    served: set[str] = field(default_factory=set)  # warm functions invoked during their window
    scores: phase.Scores = field(default_factory=phase.Scores)  # which answer each function takes
    # Where the scores are kept after each cycle, to be resumed after a restart (None: not kept).
    keep_scores: Callable[[phase.Judged], Awaitable[None]] | None = None
    _kept_minute: int | None = None

    async def cycle(self) -> PrewarmPlan:
        """Plan, and apply when this replica leads."""
        forecast = self.forecast_context()
        links = [trace.Link(forecast)] if forecast is not None and forecast.is_valid else []
        with tracer.start_as_current_span("kdrl.prewarm.plan", links=links) as span:
            # Planning is CPU work over every function: a worker thread does it, on inputs
            # taken now, so the event loop keeps answering the scheduler meanwhile.
            states, forecasts, nodes, policy = (
                self.catalog.snapshot(),
                self.forecasts(),
                self.nodes(),
                self.policy(),
            )
            minute = int(self.clock() // 60)

            def planned() -> tuple[PrewarmPlan, int, phase.Judged | None]:
                known = states()
                chosen = self.scores.choose(forecasts, self.settings.lookahead_minutes)
                decided = plan(
                    minute, chosen, known, nodes, self.budget, policy=policy, settings=self.settings
                )
                memory = sum(e.replicas * known[e.function].memory_bytes for e in decided.warm)
                return decided, memory, self.scores.judged()

            decided, memory, judged = await asyncio.get_running_loop().run_in_executor(None, planned)
            self.latest = decided
            await self._keep(judged)  # before applying: a failing API server must not stop it
            leading = self.leading()
            mode = {"kdrl.mode": "shadow" if self.actuator.shadow else "applied" if leading else "follower"}
            metrics.prewarm_functions.set(len(decided.warm), mode)
            metrics.prewarm_replicas.set(sum(e.replicas for e in decided.warm), mode)
            metrics.prewarm_memory.set(memory, mode)
            metrics.prewarm_idle_memory.set(decided.idle_bytes, {**mode, "kdrl.budget": "expected"})
            if decided.idle_target_bytes is not None:
                metrics.prewarm_idle_memory.set(decided.idle_target_bytes, {**mode, "kdrl.budget": "target"})
            span.set_attributes(
                {
                    "kdrl.prewarm.warm": len(decided.warm),
                    "kdrl.prewarm.pulls": len(decided.pulls),
                    "kdrl.prewarm.skipped": len(decided.skipped),
                    "kdrl.prewarm.leader": leading,
                    "kdrl.shadow": self.actuator.shadow,
                }
            )
            entries: list[WarmEntry | PullEntry] = [*decided.warm, *decided.pulls]
            for entry in entries:  # why, per function: what SREs ask
                span.add_event(
                    f"kdrl.prewarm.{'warm' if isinstance(entry, WarmEntry) else 'pull'}", _why(entry)
                )
            if leading:
                await self._apply(decided)
            self._judge_windows(minute)
        return decided

    async def _keep(self, judged: phase.Judged | None) -> None:
        """Keep the scores once per judged minute; a failure costs only what a restart would
        forget, so it is logged, not raised."""
        if self.keep_scores is None or judged is None or judged.minute == self._kept_minute:
            return
        try:
            await self.keep_scores(judged)
            self._kept_minute = judged.minute
        except Exception as error:
            logger.warning("could not keep the answer losses (%s); the next cycle tries again", error)

    def _judge_windows(self, minute: int) -> None:
        """Each warm window counted once: a hit when its function is invoked while held, a miss
        when it is released unused."""
        for function in self.warmed - self.windows.keys():
            self.windows[function] = minute
        for function, began in list(self.windows.items()):
            if function not in self.warmed:
                del self.windows[function]
                if function not in self.served:
                    metrics.prewarm_windows.add(1, {"kdrl.result": "miss"})
                self.served.discard(function)
            elif self.invoked is not None and function not in self.served and self.invoked(function, began):
                self.served.add(function)
                metrics.prewarm_windows.add(1, {"kdrl.result": "hit"})

    async def _apply(self, decided: PrewarmPlan) -> None:
        kept: set[str] = set()
        now = datetime.fromtimestamp(self.clock(), UTC)
        for entry in decided.warm:
            until = datetime.fromtimestamp(entry.expires_minute * 60, UTC)
            for applied in await _counted(
                "warm", self.actuator.warm(entry.function, entry.replicas, until, now)
            ):
                kept.add(applied.revision)
                await self._emit("warm", applied, {"replicas": entry.replicas, "until": until.isoformat()})
            if not self.actuator.shadow:  # shadow mode holds nothing warm
                self.warmed.add(entry.function)
        for revision in await self.actuator.held():
            if revision not in kept:
                namespace, _, name = revision.partition("/")
                restored = await _counted("restore", _listed(self.actuator.restore_revision(namespace, name)))
                await self._emit("restore", restored[0], {})
        self.warmed &= {e.function for e in decided.warm}
        targets = [prepull.Target(node=p.node, image=p.image) for p in decided.pulls]
        for applied in await self.prepuller.ensure(targets):
            await self._emit("prepull", applied, {})
        await self.prepuller.sweep()

    async def restore(self, function: str) -> None:
        for applied in await _counted("restore", self.actuator.restore(function)):
            await self._emit("restore", applied, {})
        self.warmed.discard(function)

    async def _emit(self, kind: str, applied: Applied, data: Mapping[str, object]) -> None:
        if self.emitter is not None and applied.patched:
            await self.emitter.emit(kind, applied.revision, {**data, "reason": applied.reason})

    async def run(self) -> None:
        backoff = Backoff(self.interval_s, 10 * self.interval_s)
        while True:
            pause = self.interval_s
            try:
                await self.cycle()
                backoff.reset()
            except KubeApiError as error:  # the API server refused or timed out: wait longer
                pause = backoff.next()
                logger.warning("prewarm cycle failed (%s); next try in %.0f s", error, pause)
            except Exception:
                pause = backoff.next()
                logger.exception("prewarm cycle failed; next try in %.0f s", pause)
            await asyncio.sleep(pause)

    async def shutdown(self, *, keep: bool) -> None:
        """Restore what this replica warmed (unless `keep`); errors are logged, not raised."""
        if keep:
            if self.warmed:
                logger.info(
                    "keeping %d functions warm on shutdown (kdrl cleanup undoes it)", len(self.warmed)
                )
            return
        for function in sorted(self.warmed):
            try:
                await self.restore(function)
            except Exception as error:
                logger.warning("could not restore %s on shutdown (%s); run kdrl cleanup", function, error)
        if self.emitter is not None:
            await self.emitter.close()


async def _counted(action: str, change: Awaitable[list[Applied]]) -> list[Applied]:
    """Await revision changes, counting the ones sent (applied) and a failure (then re-raised)."""
    try:
        done = await change
    except Exception:
        metrics.prewarm_changes.add(1, {"kdrl.action": action, "kdrl.result": "failed"})
        raise
    metrics.prewarm_changes.add(
        sum(a.patched for a in done), {"kdrl.action": action, "kdrl.result": "applied"}
    )
    return done


async def _listed(change: Awaitable[Applied]) -> list[Applied]:
    return [await change]


def _why(entry: WarmEntry | PullEntry) -> dict[str, str | int | float]:
    """A plan entry's reasons as span event attributes."""
    reason = entry.reason
    out: dict[str, str | int | float] = {
        "kdrl.function": entry.function,
        "kdrl.prewarm.probability": reason.probability,
        "kdrl.prewarm.benefit_usd": reason.benefit_usd,
        "kdrl.prewarm.cost_usd": reason.cost_usd,
        "kdrl.prewarm.answer": reason.answer,
    }
    if isinstance(entry, WarmEntry):
        out["kdrl.prewarm.replicas"] = entry.replicas
    else:
        out["k8s.node.name"] = entry.node
    return out
