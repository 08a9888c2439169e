"""Structure-aware fuzzing of every endpoint of a live `kdrl serve`: no input may get a 5xx.

Each body starts as a valid request of its endpoint (extender verbs in both node modes, bind,
CloudEvents in binary, structured and batched mode, ApiServerSource pod events, admission
reviews, the debug endpoints' queries) and is then mutated where it is structured: a value
swapped for a hostile one (huge or negative numbers, 1e1000000 as a quantity, lone
surrogates, NUL, long strings, the wrong type), a key dropped, a value nested thousands deep,
or the bytes themselves broken (invalid UTF-8, truncation, a Content-Encoding they are not).
`mutated` is shared with the test suite, where hypothesis drives the choices.

Every `SCRAPE_EVERY` bodies, and after the last, `/metrics` is scraped too (its own row): a
label that input poisoned fails every later scrape, which no answer to the body itself shows.

    python -m bench.fuzz --bodies 1000000        # status counts per endpoint; exit 1 on any 5xx
"""

from __future__ import annotations

import argparse
import collections
import copy
import http.client
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench import synthetic
from bench.extender import serve_offline

NODE_NAMES = [f"node-{i:05d}" for i in range(1, 13)]  # the example cluster's
SCRAPE_EVERY = 1000
SCRAPE = "metrics (scrape)"
HOSTILE: list[Any] = [
    None,
    True,
    -1,
    0,
    2**63,
    -(2**63),
    2**200,
    1e308,
    -1e-308,
    "",
    "\ud800",
    "\x00",
    "a\nb",
    "x" * 70_000,
    "1e1000000",
    "-5",
    "NaN",
    "Infinity",
    "99999999999999999999Gi",
    [],
    {},
    [[[]]],
    {"": {"": None}},
]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Seed:
    """A valid request of one endpoint, as a document to mutate and a way to send it."""

    endpoint: str
    document: Any
    render: Callable[[Any, random.Random], Request]


def _json(
    method: str, path: str, content_type: str = "application/json"
) -> Callable[[Any, random.Random], Request]:
    def render(document: Any, rng: random.Random) -> Request:
        return Request(method, path, _dumps(document), {"Content-Type": content_type})

    return render


def _binary_event(document: Any, rng: random.Random) -> Request:
    """CloudEvents binary mode: the attributes become ce- headers (strings), data the body."""
    attributes = document if isinstance(document, dict) else {"attributes": document}
    headers = {"Content-Type": "application/json"}
    for key, value in attributes.items():
        if key != "data":
            headers[f"ce-{str(key)[:40]}"] = _header(value)
    return Request("POST", "/events", _dumps(attributes.get("data")), headers)


def _query(path: str) -> Callable[[Any, random.Random], Request]:
    def render(document: Any, rng: random.Random) -> Request:
        values = document if isinstance(document, dict) else {"x": document}
        query = "&".join(
            f"{quote(str(k)[:100], safe='')}={quote(_header(v), safe='')}" for k, v in values.items()
        )
        return Request("GET", f"{path}?{query}")

    return render


def _header(value: Any) -> str:
    """A value as a header can carry it: UTF-8 bytes as latin-1, control characters (which HTTP
    clients refuse to send) as '?'."""
    text = value if isinstance(value, str) else _dumps(value).decode()
    raw = text.encode("utf-8", "surrogatepass").decode("latin-1", "replace")[:2000]
    return raw.translate(_NO_CONTROLS)


_NO_CONTROLS = {c: "?" for c in [*range(0x20), 0x7F]}


def _dumps(document: Any) -> bytes:
    try:
        return json.dumps(document).encode()
    except (ValueError, RecursionError):  # too deep for the encoder: nested by hand
        return b"[" * 5000 + b"]" * 5000


def seeds() -> list[Seed]:
    now = datetime.now(UTC).isoformat()
    pod = synthetic.knative_pod("fuzz-abc", service="fuzz", namespace="shop", uid="fuzz-uid")
    node = synthetic.node(
        "node-00001", cpu="8", memory="32Gi", images=[([synthetic.image_ref(1)], 300 << 20)]
    )
    invocations = {"function": "shop/fuzz", "start": now, "seconds": 60, "count": 3}
    event = {
        "specversion": "1.0",
        "id": "fuzz-1",
        "source": "/fuzz",
        "type": "dev.kdrl.invocations.v1",
        "datacontenttype": "application/json",
        "data": invocations,
    }
    ready_pod = copy.deepcopy(pod)
    ready_pod["kind"] = "Pod"
    ready_pod["metadata"]["creationTimestamp"] = now
    ready_pod["status"] = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}
    lifecycle = dict(event, type="dev.knative.apiserver.resource.update", data=ready_pod)
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "r1", "object": dict(pod, kind="Pod")},
    }
    extender = {"Pod": pod, "NodeNames": NODE_NAMES, "Nodes": None}
    full = {"Pod": pod, "Nodes": {"metadata": {}, "items": [node]}, "NodeNames": None}
    binding = {"PodName": "fuzz-abc", "PodNamespace": "shop", "PodUID": "fuzz-uid", "Node": "node-00001"}
    structured = "application/cloudevents+json"
    return [
        Seed("filter", extender, _json("POST", "/scheduler/filter")),
        Seed("filter (Nodes)", full, _json("POST", "/scheduler/filter")),
        Seed("prioritize", extender, _json("POST", "/scheduler/prioritize")),
        Seed("prioritize (Nodes)", full, _json("POST", "/scheduler/prioritize")),
        Seed("bind", binding, _json("POST", "/scheduler/bind")),
        Seed("events (structured)", event, _json("POST", "/events", structured)),
        Seed("events (binary)", event, _binary_event),
        Seed(
            "events (batch)",
            [event, dict(event, id="fuzz-2")],
            _json("POST", "/events", "application/cloudevents-batch+json"),
        ),
        Seed("events (pod lifecycle)", lifecycle, _json("POST", "/events", structured)),
        Seed("mutate-pods", review, _json("POST", "/mutate-pods")),
        Seed("debug function", {"hours": "2"}, _query("/debug/functions/shop/fuzz")),
        Seed("debug decisions", {"limit": "10"}, _query("/debug/decisions")),
    ]


def mutated(seed: Seed, rng: random.Random) -> Request:
    """`seed`'s request with one to three structural mutations, then maybe its bytes broken."""
    document = copy.deepcopy(seed.document)
    for _ in range(rng.randint(1, 3)):
        document = _mutate(document, rng)
    request = seed.render(document, rng)
    roll = rng.random()
    if roll < 0.05:
        cut = rng.randint(0, max(len(request.body) - 1, 0))
        return Request(
            request.method,
            request.path,
            request.body[:cut] + b"\xff\xfe" + request.body[cut:],
            request.headers,
        )
    if roll < 0.08:
        return Request(
            request.method, request.path, request.body[: rng.randint(0, len(request.body))], request.headers
        )
    if roll < 0.10:
        return Request(
            request.method, request.path, request.body, {**request.headers, "Content-Encoding": "gzip"}
        )
    return request


def _mutate(document: Any, rng: random.Random) -> Any:
    """One change at a random place of the tree."""
    path = _random_path(document, rng)
    if not path:
        return _changed(document, rng)
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if isinstance(parent, dict) and rng.random() < 0.15:
        del parent[last]
    else:
        parent[last] = _changed(parent[last], rng)
    return document


def _changed(value: Any, rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.7:
        return copy.deepcopy(rng.choice(HOSTILE))  # a later mutation must not change the list
    if roll < 0.8:
        nested: Any = value
        for _ in range(rng.choice((10, 500, 3000))):
            nested = [nested]
        return nested
    if roll < 0.9:
        return [value, value]
    return {"wrapped": value}


def _random_path(document: Any, rng: random.Random) -> list[Any]:
    path: list[Any] = []
    node = document
    while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        node = node[key]
    return path


def send(connection: http.client.HTTPConnection, request: Request) -> int:
    connection.request(request.method, request.path, body=request.body or None, headers=request.headers)
    response = connection.getresponse()
    response.read()
    return response.status


def run(bodies: int, seed: int) -> dict[str, collections.Counter[str]]:
    rng = random.Random(seed)
    examples = Path(__file__).resolve().parent.parent / "examples" / "cluster"
    server, port, _ = serve_offline(
        examples / "nodes.json",
        examples / "pods.json",
        "--log-level",
        "ERROR",
        "--history-path",
        str(Path(tempfile.mkdtemp()) / "h.db"),
    )
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    all_seeds = seeds()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for i in range(bodies):
            chosen = rng.choice(all_seeds)
            request = mutated(chosen, rng)
            try:
                counts[chosen.endpoint][str(send(connection, request))] += 1
                if (i + 1) % SCRAPE_EVERY == 0 or i + 1 == bodies:
                    counts[SCRAPE][str(send(connection, Request("GET", "/metrics")))] += 1
            except (OSError, http.client.HTTPException) as error:
                if server.poll() is not None:
                    raise RuntimeError(f"kdrl serve died on body {i} ({chosen.endpoint})") from error
                counts[chosen.endpoint]["closed"] += 1  # the server closed it (e.g. a bad encoding)
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    finally:
        connection.close()
        server.terminate()
        server.wait(timeout=10)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.perf_counter()
    counts = run(args.bodies, args.seed)
    statuses = sorted({s for c in counts.values() for s in c})
    print(f"{args.bodies:,} bodies in {time.perf_counter() - started:.0f} s (seed {args.seed})")
    print(f"{'endpoint':<24}" + "".join(f"{s:>9}" for s in statuses) + f"{'>= 500':>9}")
    failures = 0
    for endpoint, count in sorted(counts.items()):
        bad = sum(n for s, n in count.items() if s.isdigit() and int(s) >= 500)
        failures += bad
        print(f"{endpoint:<24}" + "".join(f"{count.get(s, 0):>9}" for s in statuses) + f"{bad:>9}")
    print(f"answers >= 500: {failures} (target 0)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
