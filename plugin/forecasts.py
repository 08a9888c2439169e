"""The forecast cycle of the service: re-choose models hourly, forecast every minute.

Forecasting is CPU work (numba inside statsforecast), so it runs on a worker thread, never on
the event loop; numba compiles on a warm-up before the first cycle, not on a request. The
latest forecasts are swapped in whole, like the cluster snapshot, for readers to take as is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from opentelemetry import trace

from forecaster.forecasting import Forecast, Forecaster, LocalEngine, Stopped
from plugin import metrics

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

HORIZON_MINUTES = 30
Result = TypeVar("Result")


@dataclass
class ForecastLoop:
    forecaster: Forecaster
    clock: Callable[[], float]
    interval_s: float = 60.0
    rechoose_s: float = 3600.0
    latest: Mapping[str, Forecast] = field(default_factory=dict)
    context: trace.SpanContext | None = None  # the span of the latest forecast, for plans to link
    # First-minute predictions waiting for their minute to end: minute -> function -> expected.
    _predicted: dict[int, dict[str, float]] = field(default_factory=dict)
    _models: set[str] = field(default_factory=set)  # models reported so far, to zero the unused

    def cycle(self, choose: bool) -> Mapping[str, Forecast]:
        """One cycle, synchronously: optionally re-run the backtest, then forecast."""
        started = time.perf_counter()
        end = int(self.clock() // 60) + 1
        with tracer.start_as_current_span("kdrl.forecast") as span:
            if choose:
                self._on_engine(partial(self.forecaster.choose, end, horizon=HORIZON_MINUTES))
            self.latest = self._on_engine(partial(self.forecaster.forecast, end, horizon=HORIZON_MINUTES))
            span.set_attributes(
                {"kdrl.forecast.functions": len(self.latest), "kdrl.forecast.rechosen": choose}
            )
            self.context = span.get_span_context()
        self._measure(end)
        metrics.forecast_cycle.record(time.perf_counter() - started, {"kdrl.rechosen": choose})
        return self.latest

    def _on_engine(self, step: Callable[..., Result]) -> Result:
        """`step` on the forecaster's engine; where that is a remote one (Ray) that fails,
        unreachable or a worker lost mid-cycle, the same step again here, so that this cycle's
        forecasts are fresh all the same (logged, and counted by engine)."""
        try:
            return step()
        except Stopped:
            raise
        except Exception as error:
            if isinstance(self.forecaster.engine, LocalEngine):
                raise
            engine = type(self.forecaster.engine).__name__
            logger.warning("forecast engine %s failed (%s); this cycle runs locally", engine, error)
            metrics.forecast_fallbacks.add(1, {"kdrl.engine": engine})
            return step(engine=LocalEngine())

    def _measure(self, end: int) -> None:
        """Gauges: functions, functions per model, and the one-minute-ahead error of the
        forecasts whose first minute has ended (the minute before `end` is still running)."""
        metrics.forecast_functions.set(len(self.latest))
        models = Counter(forecast.model for forecast in self.latest.values())
        self._models |= set(models)
        metrics.set_all(metrics.forecast_models, {m: models.get(m, 0) for m in self._models}, "kdrl.model")
        for minute in sorted(m for m in self._predicted if m < end - 1):
            predicted = self._predicted.pop(minute)
            if predicted:
                counts = self.forecaster.counts
                errors = [abs(counts.series(f, minute + 1, 1)[0] - e) for f, e in predicted.items()]
                metrics.forecast_error.set(sum(errors) / len(errors))
        self._predicted[end] = {f: float(forecast.expected[0]) for f, forecast in self.latest.items()}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last_choice = -float("inf")
        while True:
            choose = self.clock() - last_choice >= self.rechoose_s
            try:
                await loop.run_in_executor(None, self.cycle, choose)
                if choose:
                    last_choice = self.clock()
            except asyncio.CancelledError:
                self.forecaster.stop.set()  # the worker thread gives up at its next chunk
                raise
            except Exception:  # a failed cycle keeps the previous forecasts
                metrics.forecast_failures.add(1)
                logger.exception("forecast cycle failed; keeping the previous forecasts")
            await asyncio.sleep(self.interval_s)
