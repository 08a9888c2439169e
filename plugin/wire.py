"""kube-scheduler extender wire types (k8s.io/kube-scheduler/extender/v1), spelled as upstream.

The Go structs have no JSON tags, so top-level keys are the Go field names (PascalCase) and
nil pointers are `null`; nested Pod/Node/NodeList objects are ordinary camelCase Kubernetes
JSON. Go decodes keys case-insensitively, and so does `parse_*` here. Decoding checks types
and raises `BadRequest` with the offending key; encoding always writes every key.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from plugin.errors import BadRequest

Obj = dict[str, Any]


class NodeList(TypedDict):
    metadata: Obj
    items: list[Obj]


class ExtenderArgs(TypedDict):
    Pod: Obj
    Nodes: NodeList | None  # when the extender is not nodeCacheCapable
    NodeNames: list[str] | None  # when it is


class ExtenderFilterResult(TypedDict):
    Nodes: NodeList | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    Host: str
    Score: int


class ExtenderBindingArgs(TypedDict):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(TypedDict):
    Error: str


class HostPriorityEncoder:
    """Encodes `HostPriorityList`s over one cluster's nodes: the extender's hot answer.

    Each node's `{"Host":"<name>","Score":` prefix is built once; an answer then joins
    prefixes with one of eleven score suffixes. Equal to `json.dumps([HostPriority(...)])`
    up to whitespace.
    """

    _SUFFIXES = np.array([f"{score}}}" for score in range(11)], dtype=object)

    def __init__(self, names: Sequence[str]) -> None:
        self._prefixes = np.array(
            [f'{{"Host":{json.dumps(name)},"Score":' for name in names] or [""], dtype=object
        )[: len(names)]

    def encode(self, rows: npt.NDArray[np.int64], scores: npt.NDArray[np.int64]) -> bytes:
        """The list for `rows` (indices into the names) with their 0..10 `scores`."""
        prefixes = self._prefixes[rows].tolist()
        suffixes = self._SUFFIXES[np.clip(scores, 0, 10)].tolist()
        return ("[" + ",".join(map(operator.add, prefixes, suffixes)) + "]").encode()


def decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"request body is not valid JSON: {error}") from error
    except RecursionError:  # nesting no Kubernetes object has, deep enough to exhaust the stack
        raise BadRequest("request body is nested too deeply") from None


def parse_extender_args(document: Any) -> ExtenderArgs:
    fields = _fold(document, "ExtenderArgs")
    pod = fields.get("pod")
    if not isinstance(pod, dict):
        raise BadRequest("ExtenderArgs.Pod: expected a Pod object")
    names, nodes = fields.get("nodenames"), fields.get("nodes")
    if names is None and nodes is None:
        raise BadRequest("ExtenderArgs: one of NodeNames or Nodes is required")
    if names is not None and (not isinstance(names, list) or not all(map(isinstance, names, repeat(str)))):
        raise BadRequest("ExtenderArgs.NodeNames: expected a list of node names")
    return ExtenderArgs(Pod=pod, Nodes=None if names is not None else _node_list(nodes), NodeNames=names)


def _node_list(nodes: Any) -> NodeList:
    if not isinstance(nodes, dict) or not isinstance(nodes.get("items", []), list):
        raise BadRequest("ExtenderArgs.Nodes: expected a NodeList with an items list")
    if not isinstance(nodes.get("metadata") or {}, dict):
        raise BadRequest("ExtenderArgs.Nodes.metadata: expected an object")
    items = nodes.get("items") or []
    for i, item in enumerate(items):
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
            raise BadRequest(f"ExtenderArgs.Nodes.items[{i}]: expected a Node with metadata.name")
    return NodeList(metadata=nodes.get("metadata") or {}, items=items)


def parse_binding_args(document: Any) -> ExtenderBindingArgs:
    fields = _fold(document, "ExtenderBindingArgs")
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = fields.get(key.lower(), "")
        if not isinstance(value, str):
            raise BadRequest(f"ExtenderBindingArgs.{key}: expected a string")
        values[key] = value
    for key in ("PodName", "Node"):
        if not values[key]:
            raise BadRequest(f"ExtenderBindingArgs.{key} is required")
    return ExtenderBindingArgs(
        PodName=values["PodName"],
        PodNamespace=values["PodNamespace"] or "default",
        PodUID=values["PodUID"],
        Node=values["Node"],
    )


def _fold(document: Any, type_name: str) -> Mapping[str, Any]:
    """Keys lower-cased, as Go's encoding/json matches them."""
    if not isinstance(document, dict):
        raise BadRequest(f"{type_name}: expected a JSON object")
    return {key.lower(): value for key, value in document.items() if isinstance(key, str)}


def filter_result(
    *,
    names: list[str] | None,
    nodes: NodeList | None,
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> ExtenderFilterResult:
    return ExtenderFilterResult(
        Nodes=nodes, NodeNames=names, FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable, Error=error
    )
