"""Settings: frozen dataclasses grouped by concern, read once from CLI flags and `KDRL_*` env.

Each field carries its environment key, its flag, and a sentence on its unit and default in
`metadata`; the CLI's options and the ConfigMap documentation are generated from the same
place. Precedence: flag, then environment, then default. Values are validated once, here,
and errors name the key and the value. Nothing below the entrypoint reads `os.environ`.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from plugin import kube
from plugin.errors import SettingsError
from policies import registry

T = TypeVar("T")
Check = Callable[[Any], str | None]  # an error text, or None when the value is fine


def _setting(
    default: Any,
    env: str,
    help: str,
    *,
    flag: str = "",
    choices: tuple[str, ...] = (),
    check: Check | None = None,
) -> Any:
    flag = flag or "--" + env.removeprefix("KDRL_").lower().replace("_", "-")
    meta = {"env": env, "flag": flag, "help": help, "choices": choices, "check": check}
    return field(default=default, metadata=meta)


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be greater than 0"


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "must be a TCP port (0..65535; 0 picks a free one)"


def _existing_file(value: Path | None) -> str | None:
    return None if value is None or value.is_file() else "no such file"


@dataclass(frozen=True)
class ServerSettings:
    host: str = _setting("0.0.0.0", "KDRL_HOST", "Address to listen on.")
    port: int = _setting(
        8080,
        "KDRL_PORT",
        "TCP port for the extender verbs (and, where their own ports are 0, events and admin).",
        check=_port,
    )
    events_port: int = _setting(
        0, "KDRL_EVENTS_PORT", "TCP port for CloudEvents only; 0: they share KDRL_PORT.", check=_port
    )
    admin_port: int = _setting(
        0,
        "KDRL_ADMIN_PORT",
        "TCP port for /healthz, /readyz, /metrics, /debug and /ui only; 0: they share KDRL_PORT.",
        check=_port,
    )
    extender_tls_dir: Path | None = _setting(
        None,
        "KDRL_EXTENDER_TLS_DIR",
        "Folder with tls.crt, tls.key and ca.crt: the extender port speaks HTTPS and admits only "
        "clients with a certificate signed by ca.crt (mutual TLS, kube-scheduler's tlsConfig). "
        "Read at start.",
        check=lambda d: (
            None
            if d is None or all((d / f).is_file() for f in ("tls.crt", "tls.key", "ca.crt"))
            else "needs tls.crt, tls.key and ca.crt"
        ),
    )
    max_body_bytes: int = _setting(
        32 * 1024 * 1024,
        "KDRL_MAX_BODY_BYTES",
        "Largest request body accepted, in bytes (413 above). 32 MiB holds full Node objects "
        "for ~5,000 nodes when the scheduler is not nodeCacheCapable.",
        check=_positive,
    )
    tls_dir: Path | None = _setting(
        None,
        "KDRL_TLS_DIR",
        "Folder with tls.crt and tls.key (a cert-manager Secret): also serve HTTPS on KDRL_TLS_PORT, "
        "for the admission webhook. Read at start.",
        check=lambda d: (
            None
            if d is None or ((d / "tls.crt").is_file() and (d / "tls.key").is_file())
            else "needs tls.crt and tls.key"
        ),
    )
    tls_port: int = _setting(8443, "KDRL_TLS_PORT", "HTTPS port when KDRL_TLS_DIR is set.", check=_port)
    idle_timeout_s: float = _setting(
        15.0,
        "KDRL_IDLE_TIMEOUT_S",
        "A connection is closed after this many seconds without a complete request header "
        "(idle keep-alive, or headers sent byte by byte).",
        check=_positive,
    )
    body_timeout_s: float = _setting(
        10.0,
        "KDRL_BODY_TIMEOUT_S",
        "Seconds a request body may take to arrive once its handler reads it (408 after).",
        check=_positive,
    )
    metrics: bool = _setting(
        True,
        "KDRL_METRICS",
        "Record metrics (Prometheus at /metrics; OTLP too where OTEL_EXPORTER_OTLP_ENDPOINT is set). "
        "false makes every instrument a no-op.",
    )


@dataclass(frozen=True)
class KubeSettings:
    api_url: str | None = _setting(
        None, "KDRL_KUBE_API_URL", "API server URL; unset: in-cluster credentials, else the kubeconfig."
    )
    kubeconfig: Path | None = _setting(None, "KDRL_KUBECONFIG", "kubeconfig file (default: ~/.kube/config).")
    nodes_file: Path | None = _setting(
        None,
        "KDRL_NODES_FILE",
        flag="--nodes",
        help="Offline mode: serve these nodes (`kubectl get nodes -o json`), watch no API server.",
        check=_existing_file,
    )
    pods_file: Path | None = _setting(
        None,
        "KDRL_PODS_FILE",
        flag="--pods",
        help="Offline mode: pods placed on those nodes (`kubectl get pods -A -o json`).",
        check=_existing_file,
    )
    request_timeout_s: float = _setting(
        5.0,
        "KDRL_KUBE_TIMEOUT_S",
        "Timeout of one API request (bind, list), seconds; the extender's own budget is 5 s.",
        check=_positive,
    )
    watch_timeout_s: int = _setting(
        300,
        "KDRL_WATCH_TIMEOUT_S",
        "Server-side length of one watch, seconds; it then resumes.",
        check=_positive,
    )
    backoff_max_s: float = _setting(
        30.0,
        "KDRL_BACKOFF_MAX_S",
        "Longest wait between reconnects to an unreachable API server, seconds.",
        check=_positive,
    )


@dataclass(frozen=True)
class HistorySettings:
    path: Path = _setting(
        Path("kdrl-history.db"),
        "KDRL_HISTORY_PATH",
        "SQLite file of the invocation history (WAL mode); put it on a persistent volume.",
    )
    events_max_body_bytes: int = _setting(
        1024 * 1024,
        "KDRL_EVENTS_MAX_BODY_BYTES",
        "Largest CloudEvents request body, bytes (413 above).",
        check=_positive,
    )
    events_max_pending: int = _setting(
        1024,
        "KDRL_EVENTS_MAX_PENDING",
        "Event requests waiting for a commit before new ones get 429 (Eventing retries them).",
        check=_positive,
    )
    forecast_engine: str = _setting(
        "local",
        "KDRL_FORECAST_ENGINE",
        "Where forecast cycles run: local (this process), or ray (chunks as tasks on the Ray cluster "
        "at KDRL_RAY_ADDRESS; a cycle it fails runs locally).",
        choices=("local", "ray"),
    )
    ray_address: str | None = _setting(
        None,
        "KDRL_RAY_ADDRESS",
        "Ray cluster of the ray forecast engine, e.g. ray://kdrl-ray-head-svc.kdrl-system.svc:10001.",
        check=lambda a: (
            None if a is None or (a.strip() and ":" in a) else "expected HOST:PORT or ray://HOST:PORT"
        ),
    )
    record_decisions: bool = _setting(
        True,
        "KDRL_DECISIONS_RECORD",
        "Record each placement served (the candidates' features as the model saw them, the node, the "
        "policy, its model hash) and the pod's start delay, into the history database, for `kdrl train "
        "--from-decisions`. Written off the request path.",
    )
    decisions_retention_h: float = _setting(
        72.0,
        "KDRL_DECISIONS_RETENTION_H",
        "Hours of recorded decisions kept.",
        check=_positive,
    )
    decisions_max_per_s: float = _setting(
        10.0,
        "KDRL_DECISIONS_MAX_PER_S",
        "Placements recorded per second at most; beyond, counted and not recorded (the writer shares "
        "the extender's process: this bounds what it takes from it).",
        check=_positive,
    )
    decisions_max_rows: int = _setting(
        50_000,
        "KDRL_DECISIONS_MAX_ROWS",
        "Recorded decisions kept at most (the oldest go first): about 8 KiB each at 470 candidate "
        "nodes, so 400 MiB of the history volume.",
        check=_positive,
    )
    max_functions: int = _setting(
        20_000,
        "KDRL_MAX_FUNCTIONS",
        "Functions whose minute history is held in memory and forecast (Knative Services first; "
        "names only events know are evicted, least recently invoked first). The database keeps all.",
        check=_positive,
    )


def _not_negative(value: float) -> str | None:
    return None if value >= 0 else "must be 0 or more"


@dataclass(frozen=True)
class PolicySettings:
    name: str = _setting(
        "tuned",
        "KDRL_POLICY",
        "Placement policy (tuned: the grid-searched heuristic; onnx: the learned model; "
        "kube-default if their file cannot load).",
        choices=registry.PLACEMENT_NAMES,
    )
    seed: int = _setting(0, "KDRL_POLICY_SEED", "Seed of the random policy (for reproducible runs).")
    model: Path | None = _setting(
        None,
        "KDRL_MODEL",
        "ONNX model of the `onnx` policy (default: the model shipped in the package). "
        "Missing, corrupt or for another feature schema: kube-default serves, /readyz says degraded.",
    )
    device: str = _setting(
        "auto",
        "KDRL_DEVICE",
        "Where ONNX Runtime runs the model: auto (CUDA when it really works), cuda, cpu.",
        choices=("auto", "cuda", "cpu"),
    )
    threads: int = _setting(1, "KDRL_MODEL_THREADS", "ONNX Runtime intra-op threads.", check=_positive)
    reload_s: float = _setting(
        10.0,
        "KDRL_MODEL_RELOAD_S",
        "Seconds between checks of the onnx policy's model file; a changed file serves without a "
        "restart, one that fails to load leaves the serving model in place (/readyz says why). "
        "0: only on SIGHUP.",
        check=_not_negative,
    )


@dataclass(frozen=True)
class PrewarmSettings:
    enabled: bool = _setting(
        True,
        "KDRL_PREWARM",
        "Plan prewarming every minute (watching an API server only; offline it never runs).",
    )
    shadow: bool = _setting(
        False,
        "KDRL_SHADOW",
        "Shadow mode: plan and record (spans, /debug/prewarm), change nothing in the cluster.",
        flag="--shadow",
    )
    keep_on_shutdown: bool = _setting(
        False,
        "KDRL_PREWARM_KEEP_ON_SHUTDOWN",
        "Leave warm replicas in place on a clean shutdown (default: restore them).",
    )
    warm_memory_gib: float = _setting(
        64.0,
        "KDRL_PREWARM_WARM_MEMORY_GIB",
        "Budget of memory held warm by prewarming, GiB; spent highest benefit per expected idle byte "
        "first, smaller functions favoured.",
        check=_not_negative,
    )
    pulls_per_minute: int = _setting(
        10,
        "KDRL_PREWARM_PULLS_PER_MINUTE",
        "Image pre-pulls started per minute at most.",
        check=_not_negative,
    )
    window_minutes: int = _setting(
        10,
        "KDRL_PREWARM_WINDOW_MINUTES",
        "How long warm replicas last unless the next plan renews them, minutes.",
        check=_positive,
    )
    hybrid_memory_share: float = _setting(
        0.75,
        "KDRL_PREWARM_HYBRID_MEMORY_SHARE",
        "Leave no more memory idle, in expectation, than this share of what the hybrid histogram "
        "(SitW) would leave idle now; 0 turns this cap off (the GiB budget still holds).",
        check=_not_negative,
    )
    scale_down_utilization: float = _setting(
        0.5,
        "KDRL_PREWARM_SCALE_DOWN_UTILIZATION",
        "The cluster autoscaler's --scale-down-utilization-threshold: a warm replica in free memory "
        "of a node above it costs idle power only, elsewhere node-hours too.",
        check=_not_negative,
    )
    gpu_price_per_hour: float = _setting(
        1.0,
        "KDRL_PREWARM_GPU_PRICE_PER_HOUR",
        "What a GPU costs an hour where GPU nodes carry no kdrl.dev/hourly-price label: a warm GPU "
        "replica pays it while idle unless a node that stays up has a GPU free.",
        check=_not_negative,
    )
    namespace: str = _setting(
        kube.PLUGIN_NAMESPACE,
        "KDRL_NAMESPACE",
        "The plugin's namespace: its leader-election Lease and the pre-pull pods live here.",
    )
    lease: str = _setting("kdrl-prewarm", "KDRL_LEASE_NAME", "The Lease that decides which replica actuates.")
    identity: str = _setting(
        "",
        "KDRL_POD_NAME",
        "This replica's name in the Lease (the manifests set the pod name; default: host name).",
    )
    sink: str = _setting(
        "", "K_SINK", "CloudEvents sink for applied changes (a SinkBinding sets it).", flag="--sink"
    )


@dataclass(frozen=True)
class LogSettings:
    level: str = _setting(
        "INFO", "KDRL_LOG_LEVEL", "Log level.", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    format: str = _setting(
        "plain",
        "KDRL_LOG_FORMAT",
        "Log lines as plain text or one JSON object each.",
        choices=("plain", "json"),
    )


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    prewarm: PrewarmSettings = field(default_factory=PrewarmSettings)
    log: LogSettings = field(default_factory=LogSettings)

    @property
    def offline(self) -> bool:
        return self.kube.nodes_file is not None


GROUPS: tuple[tuple[str, type[Any]], ...] = (
    ("server", ServerSettings),
    ("kube", KubeSettings),
    ("policy", PolicySettings),
    ("history", HistorySettings),
    ("prewarm", PrewarmSettings),
    ("log", LogSettings),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per setting (by default named after its environment key), default 'not given'."""
    for title, group_class in GROUPS:
        group = parser.add_argument_group(f"{title} settings")
        hints = typing.get_type_hints(group_class)
        for f in dataclasses.fields(group_class):
            meta = f.metadata
            help_text = f"{meta['help']} [env {meta['env']}; default {f.default}]"
            # A yes/no setting's flag alone means yes (`--shadow`); `--shadow false` works too.
            switch: dict[str, Any] = {"nargs": "?", "const": "true"} if hints[f.name] is bool else {}
            group.add_argument(
                meta["flag"],
                dest=meta["env"],
                default=None,
                help=help_text,
                choices=meta["choices"] or None,
                **switch,
            )


def load(flags: Mapping[str, Any], env: Mapping[str, str]) -> Settings:
    """Settings from parsed flags (keyed by env name, None when not given) and the environment."""
    groups = {title: _load_group(cls, flags, env) for title, cls in GROUPS}
    return Settings(**groups)


def _load_group(cls: type[T], flags: Mapping[str, Any], env: Mapping[str, str]) -> T:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f.metadata["env"]
        raw = flags.get(key)
        if raw is None:
            raw = env.get(key)
        if raw is None or raw == "":
            continue
        values[f.name] = _parse(key, raw, hints[f.name], f.metadata)
    return cls(**values)


def _parse(key: str, raw: Any, kind: Any, meta: Mapping[str, Any]) -> Any:
    target = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
    try:
        value = target(raw) if target is not bool else raw.lower() in ("1", "true", "yes")
    except (TypeError, ValueError):
        raise SettingsError(f"{key}={raw!r}: expected {getattr(target, '__name__', target)}") from None
    if meta["choices"] and value not in meta["choices"]:
        raise SettingsError(f"{key}={raw!r}: expected one of {', '.join(meta['choices'])}")
    problem = meta["check"](value) if meta["check"] else None
    if problem:
        raise SettingsError(f"{key}={raw!r}: {problem}")
    return value
