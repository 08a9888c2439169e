"""One turn of the closed loop, start to end, on this machine: record, learn, gate.

    python -m bench.closed_loop [--pods 600] [--nodes 40] [--seeds 3]

`kdrl serve` (offline, the learned policy, recording on) places `--pods` pods of 30 functions
through filter, prioritize and bind, as kube-scheduler calls them; each pod's Ready event
follows, its start 1 s plus its image's pull where the node lacked the image (its size over
100 MB/s): the outcome the placement decided. Then `kdrl train --from-decisions` fine-tunes the
serving model on the exported record and `kdrl evaluate --against` gates the result on the
evaluation protocol (small and medium, `--seeds` seeds, paired). Prints the record's size, the
fine-tuning report and the gate's verdict.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from bench import synthetic
from bench.extender import start_server

PULL_BYTES_PER_S = 100e6


def post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


def serve(port: int, nodes: list[dict[str, Any]], pods: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    names = [n["metadata"]["name"] for n in nodes]
    images = {
        n["metadata"]["name"]: {name: e["sizeBytes"] for e in n["status"]["images"] for name in e["names"]}
        for n in nodes
    }
    sizes = {name: size for table in images.values() for name, size in table.items()}
    created = datetime.now(UTC) - timedelta(hours=1)
    for i in range(pods):
        function = int(rng.integers(30))
        image = synthetic.image_ref(function)
        obj = synthetic.knative_pod(
            f"fn{function}-{i}",
            service=f"fn{function}",
            namespace="bench",
            uid=f"loop-{i}",
            image=image,
            priority=("critical", "high", "normal", "low")[function % 4],
        )
        obj["metadata"]["creationTimestamp"] = created.isoformat()
        args = json.dumps({"Pod": obj, "NodeNames": names}).encode()
        passed = post(port, "/scheduler/filter", args)["NodeNames"]
        ranked = post(port, "/scheduler/prioritize", json.dumps({"Pod": obj, "NodeNames": passed}).encode())
        node = max(ranked, key=lambda e: e["Score"])["Host"]
        binding = {
            "PodName": obj["metadata"]["name"],
            "PodNamespace": "bench",
            "PodUID": f"loop-{i}",
            "Node": node,
        }
        post(port, "/scheduler/bind", json.dumps(binding).encode())
        pull = 0.0 if image in images[node] else sizes.get(image, 200e6) / PULL_BYTES_PER_S
        conditions = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": (created + timedelta(seconds=0.2)).isoformat(),
            },
            {
                "type": "Ready",
                "status": "True",
                "lastTransitionTime": (created + timedelta(seconds=1.2 + pull)).isoformat(),
            },
        ]
        data = {"kind": "Pod", "apiVersion": "v1", **obj, "status": {"conditions": conditions}}
        attributes = {
            "type": "dev.knative.apiserver.resource.update",
            "source": "/bench",
            "id": f"ready-{i}",
            "datacontenttype": "application/json",
        }
        message = to_binary_event(CloudEvent(attributes=attributes, data=data))
        post(port, "/events", message.body, dict(message.headers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=600)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        nodes, _ = synthetic.cluster(args.nodes, seed=args.nodes)  # what start_server writes
        env = {"KDRL_DECISIONS_MAX_PER_S": "1000", "KDRL_HISTORY_PATH": str(work / "history.db")}
        server, port = start_server(work, args.nodes, "onnx", env=env)
        try:
            serve(port, nodes, args.pods, args.seed)
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/debug/decisions/export", timeout=120
            ) as response:
                (work / "decisions.db").write_bytes(response.read())
        finally:
            server.terminate()
            server.wait(timeout=30)
        size = (work / "decisions.db").stat().st_size
        print(f"recorded: {args.pods} placements on {args.nodes} nodes, {size / 1024:.0f} KiB exported")
        kdrl = [sys.executable, "-m", "plugin"]
        subprocess.run(
            [*kdrl, "train", "--from-decisions", str(work / "decisions.db"), "--out", str(work / "new")],
            check=True,
        )
        print(
            "fine-tuning:",
            (work / "new" / "report.json").read_text().split('"losses"')[0].strip().rstrip(","),
            "}",
        )
        gate = [*kdrl, "evaluate", "--model", str(work / "new" / "placement.onnx"), "--against"]
        gate += [str(Path(__file__).resolve().parent.parent / "policies" / "models" / "placement.onnx")]
        gate += [
            "--cluster",
            "small,medium",
            "--shifted",
            "",
            "--seeds",
            str(args.seeds),
            "--out",
            str(work / "gate"),
        ]
        code = subprocess.run(gate, check=False).returncode
        print(f"gate exit {code}:", (work / "gate" / "gate.json").read_text())


if __name__ == "__main__":
    main()
