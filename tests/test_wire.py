"""Extender wire types against upstream's golden JSON: exact keys both ways, strict decoding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugin import wire
from plugin.errors import BadRequest

GOLDEN: dict[str, Any] = json.loads((Path(__file__).parent / "golden" / "extender_v1.json").read_text())


def roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


def test_binding_args_round_trip() -> None:
    golden = GOLDEN["ExtenderBindingArgs"]
    assert roundtrip(wire.parse_binding_args(golden)) == golden


def test_binding_result_round_trip() -> None:
    golden = GOLDEN["ExtenderBindingResult"]
    assert roundtrip(wire.ExtenderBindingResult(Error=golden["Error"])) == golden


def test_host_priority_round_trip() -> None:
    golden = GOLDEN["HostPriority"]
    assert roundtrip(wire.HostPriority(Host=golden["Host"], Score=golden["Score"])) == golden


def test_filter_result_round_trip() -> None:
    golden = GOLDEN["ExtenderFilterResult"]
    result = wire.filter_result(
        names=golden["NodeNames"],
        nodes=wire.NodeList(**golden["Nodes"]),
        failed=golden["FailedNodes"],
        unresolvable=golden["FailedAndUnresolvableNodes"],
        error=golden["Error"],
    )
    assert json.dumps(result, sort_keys=True) == json.dumps(golden, sort_keys=True)


@pytest.mark.parametrize("key", ["ExtenderArgs", "ExtenderArgsWithNodes"])
def test_extender_args_round_trip(key: str) -> None:
    golden = GOLDEN[key]
    assert roundtrip(wire.parse_extender_args(golden)) == golden


def test_keys_decode_case_insensitively_like_go() -> None:
    lowered = {k.lower(): v for k, v in GOLDEN["ExtenderArgs"].items()}
    assert wire.parse_extender_args(lowered)["NodeNames"] == ["node-a", "node-b", "node-c"]
    binding = {k.upper(): v for k, v in GOLDEN["ExtenderBindingArgs"].items()}
    assert wire.parse_binding_args(binding)["Node"] == "mynode"


@pytest.mark.parametrize(
    ("document", "complaint"),
    [
        ([], "expected a JSON object"),
        ({"Pod": "x", "NodeNames": []}, "ExtenderArgs.Pod"),
        ({"Pod": {}}, "one of NodeNames or Nodes"),
        ({"Pod": {}, "NodeNames": "node-a"}, "ExtenderArgs.NodeNames"),
        ({"Pod": {}, "NodeNames": [1, 2]}, "ExtenderArgs.NodeNames"),
        ({"Pod": {}, "Nodes": {"items": [{"spec": {}}]}}, "Nodes.items[0]"),
        ({"Pod": {}, "Nodes": []}, "ExtenderArgs.Nodes"),
    ],
)
def test_malformed_extender_args_name_the_key(document: Any, complaint: str) -> None:
    with pytest.raises(BadRequest, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        wire.parse_extender_args(document)


@pytest.mark.parametrize(
    "document",
    [{"PodName": "p"}, {"PodName": 3, "Node": "n"}, {"Node": "n"}, "bind"],
)
def test_malformed_binding_args(document: Any) -> None:
    with pytest.raises(BadRequest):
        wire.parse_binding_args(document)


def test_invalid_json_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        wire.decode(b'{"Pod": ')


@pytest.mark.parametrize("hosts", [["node-a", "node-b.example.com"], ['odd"name', "nœud", "tab\there"], []])
def test_fast_host_priorities_equal_the_typed_encoding(hosts: list[str]) -> None:
    scores = np.arange(len(hosts), dtype=np.int64)[::-1]
    rows = np.arange(len(hosts), dtype=np.int64)[::-1]
    typed = [wire.HostPriority(Host=hosts[r], Score=int(s)) for r, s in zip(rows, scores)]
    encoded = wire.HostPriorityEncoder(hosts).encode(rows, scores)
    assert json.loads(encoded) == json.loads(json.dumps(typed))
