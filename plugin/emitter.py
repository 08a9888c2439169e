"""CloudEvents about what the plugin changed, to the sink a SinkBinding injects as `K_SINK`.

Binary content mode over HTTP with the `cloudevents` SDK. Emitting is best effort: a sink that
is down or refuses costs a warning and a counter, never the change itself (which is already
recorded on the object and in its span).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp
from cloudevents.core.bindings.http import to_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

logger = logging.getLogger(__name__)
SOURCE = "/apis/kdrl.dev/prewarm"
TYPE_PREFIX = "dev.kdrl.prewarm."


class Emitter:
    def __init__(self, sink_url: str, *, timeout_s: float = 5.0) -> None:
        self.sink_url, self.timeout = sink_url, aiohttp.ClientTimeout(total=timeout_s)
        self.session: aiohttp.ClientSession | None = None
        self.failed = 0

    async def emit(self, kind: str, subject: str, data: Mapping[str, Any]) -> bool:
        """Send `dev.kdrl.prewarm.<kind>` about `subject`; whether the sink accepted it."""
        event = CloudEvent(
            attributes={
                "type": TYPE_PREFIX + kind,
                "source": SOURCE,
                "id": str(uuid.uuid4()),
                "subject": subject,
                "datacontenttype": "application/json",
            },
            data=dict(data),
        )
        message = to_binary(event, JSONFormat())
        self.session = self.session or aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self.session.post(self.sink_url, data=message.body, headers=message.headers) as reply:
                if reply.status < 300:
                    return True
                problem = f"HTTP {reply.status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            problem = f"{type(error).__name__}: {error}"
        self.failed += 1
        logger.warning("K_SINK %s refused %s%s (%s)", self.sink_url, TYPE_PREFIX, kind, problem)
        return False

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
