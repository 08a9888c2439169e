"""One port per audience: which routes a listening port serves.

The scheduler calls the extender verbs, Eventing delivers CloudEvents, the API server calls the
admission webhook, and Prometheus and the kubelet read metrics and health. Each audience gets
its own port where the operator gives one (KDRL_EVENTS_PORT, KDRL_ADMIN_PORT, the webhook's
TLS port), so a NetworkPolicy can admit each caller to its own port only, and a caller that
reaches one port finds nothing else there (404). Ports the operator leaves at 0 share
KDRL_PORT, which then serves all of those audiences (local use, the demos).
"""

from __future__ import annotations

from collections.abc import Mapping

from plugin.settings import ServerSettings

EXTENDER, EVENTS, ADMIN, WEBHOOK = "extender", "events", "admin", "webhook"


def of(path: str) -> str:
    """The audience a request path belongs to."""
    if path.startswith("/scheduler/"):
        return EXTENDER
    if path in ("/events", "/"):
        return EVENTS
    if path == "/mutate-pods":
        return WEBHOOK
    return ADMIN  # /healthz, /readyz, /metrics, /debug/*, /ui


def by_port(server: ServerSettings) -> dict[int, frozenset[str]]:
    """Each listening port and the audiences it serves."""
    ports: dict[int, set[str]] = {server.port: {EXTENDER}}
    for audience, port in ((EVENTS, server.events_port), (ADMIN, server.admin_port)):
        ports.setdefault(port or server.port, set()).add(audience)
    if server.tls_dir is not None:  # the webhook's HTTPS port serves the webhook alone
        ports.setdefault(server.tls_port, set()).add(WEBHOOK)
    if server.tls_dir is None or server.tls_port == server.port:
        ports[server.port].add(WEBHOOK)
    return {port: frozenset(audiences) for port, audiences in ports.items()}


def allowed(ports: Mapping[int, frozenset[str]] | None, port: int | None, path: str) -> bool:
    """Whether `path` may be served on `port` (everything, where no map is set: tests, embedding)."""
    if ports is None or port is None:
        return True
    return of(path) in ports.get(port, frozenset())
