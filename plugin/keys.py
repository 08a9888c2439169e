"""Every `web.AppKey` of the application, in one place, so app state is typed and findable."""

from __future__ import annotations

from aiohttp import web

from plugin.cluster import ClusterCache
from plugin.decision_recorder import DecisionRecorder
from plugin.events import EventSink
from plugin.extender import Extender
from plugin.forecasts import ForecastLoop
from plugin.model_reload import ModelReloader
from plugin.prewarm_loop import PrewarmLoop
from plugin.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
AUDIENCES = web.AppKey("audiences", dict[int, frozenset[str]])  # set by `serve`: port -> audiences
CACHE = web.AppKey("cache", ClusterCache)
EXTENDER = web.AppKey("extender", Extender)
EVENTS = web.AppKey("events", EventSink)
FORECASTS = web.AppKey("forecasts", ForecastLoop)
PREWARM = web.AppKey("prewarm", PrewarmLoop)
RELOADER = web.AppKey("model-reloader", ModelReloader)  # with the onnx policy only
RECORDER = web.AppKey("decision-recorder", DecisionRecorder)  # with KDRL_DECISIONS_RECORD
