"""One exception family per boundary; HTTP status mapping happens in one place (`extender`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class KdrlError(Exception):
    """Base of every error this project raises on purpose."""


class BadRequest(KdrlError):
    """A request body that is not what the protocol says; answered with 400 and this text."""


class SlowRequest(KdrlError):
    """A request body that did not arrive in time; answered with 408, the connection closed."""


@contextlib.asynccontextmanager
async def body_deadline(seconds: float) -> AsyncIterator[None]:
    """Bound a body read: a client sending a byte now and then holds its own connection for
    `seconds`, not a handler for ever."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise SlowRequest(f"request body not received within {seconds:g} s") from None


class ObjectError(BadRequest):
    """A Kubernetes object (pod or node JSON) with a missing, mistyped or absurd field."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path


class KubeApiError(KdrlError):
    """The Kubernetes API server refused, failed or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SettingsError(KdrlError):
    """A setting with a bad value; the message names the key and the value."""
