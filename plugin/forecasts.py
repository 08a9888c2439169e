"""The forecast cycle of the service: re-choose models hourly, forecast every minute.

Forecasting is CPU work (numba inside statsforecast), so it runs on a worker thread, never on
the event loop; numba compiles on a warm-up before the first cycle, not on a request. The
latest forecasts are swapped in whole, like the cluster snapshot, for readers to take as is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from opentelemetry import trace

from forecaster.forecasting import Forecast, Forecaster

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

HORIZON_MINUTES = 30


@dataclass
class ForecastLoop:
    forecaster: Forecaster
    clock: Callable[[], float]
    interval_s: float = 60.0
    rechoose_s: float = 3600.0
    latest: Mapping[str, Forecast] = field(default_factory=dict)
    context: trace.SpanContext | None = None  # the span of the latest forecast, for plans to link

    def cycle(self, choose: bool) -> Mapping[str, Forecast]:
        """One cycle, synchronously: optionally re-run the backtest, then forecast."""
        end = int(self.clock() // 60) + 1
        with tracer.start_as_current_span("kdrl.forecast") as span:
            if choose:
                self.forecaster.choose(end, horizon=HORIZON_MINUTES)
            self.latest = self.forecaster.forecast(end, horizon=HORIZON_MINUTES)
            span.set_attributes(
                {"kdrl.forecast.functions": len(self.latest), "kdrl.forecast.rechosen": choose}
            )
            self.context = span.get_span_context()
        return self.latest

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last_choice = -float("inf")
        while True:
            choose = self.clock() - last_choice >= self.rechoose_s
            try:
                await loop.run_in_executor(None, self.cycle, choose)
                if choose:
                    last_choice = self.clock()
            except Exception:  # a failed cycle keeps the previous forecasts
                logger.exception("forecast cycle failed; keeping the previous forecasts")
            await asyncio.sleep(self.interval_s)
