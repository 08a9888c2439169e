"""The kube-scheduler extender: filter, prioritize and bind over HTTP (protocols.md §1).

`Extender` takes decoded wire types and returns wire types; the thin HTTP handlers live in
`app`. `filter` and `prioritize` read the cache's current snapshot and never await; `bind`
is the one verb that talks to the API server.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
from kubernetes.aio.client import ApiClient
from opentelemetry import trace

from plugin import convert, kube, metrics, wire
from plugin.cluster import ClusterCache, Snapshot
from plugin.decisions import Decision, DecisionLog
from plugin.errors import BadRequest, KubeApiError, ObjectError
from policies import filtering, ranking
from policies.onnx_policy import LoadedPolicy
from policies.types import ClusterObjects, FloatArray, IntArray, NodeTable, PodRequest

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

MAX_EXTENDER_PRIORITY = 10  # extender/v1 MaxExtenderPriority
NEUTRAL_PRIORITY = 5  # every candidate equal: no preference, in the middle of the range
TOP_SCORES_IN_SPANS = 5
RECENT_PODS = 4096  # pods seen in filter/prioritize, kept so bind can assume their requests
REASONS = 5  # filter reasons kept per decision, as examples


class Binder(Protocol):
    async def pod(self, *, namespace: str, name: str) -> dict[str, object] | None:
        """The pod as the API server has it now (None where there is none to ask); raises
        `KubeApiError`."""

    async def bind(self, *, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind or raise `KubeApiError`."""


@dataclasses.dataclass(frozen=True)
class KubeBinder:
    api: ApiClient
    timeout_s: float

    async def pod(self, *, namespace: str, name: str) -> dict[str, object] | None:
        return await kube.get_pod(self.api, namespace=namespace, name=name, timeout_s=self.timeout_s)

    async def bind(self, *, namespace: str, name: str, uid: str, node: str) -> None:
        await kube.bind_pod(
            self.api, namespace=namespace, name=name, uid=uid, node=node, timeout_s=self.timeout_s
        )


class OfflineBinder:
    """Offline mode has no API server: binding only updates the in-memory cluster, for pods the
    extender has seen (there is no authority to ask who schedules them)."""

    async def pod(self, *, namespace: str, name: str) -> dict[str, object] | None:
        return None

    async def bind(self, *, namespace: str, name: str, uid: str, node: str) -> None:
        logger.debug("offline mode: %s/%s bound to %s in memory only", namespace, name, node)


def _rejections(by_reason: Mapping[str, int], unknown: list[str]) -> dict[str, int]:
    """Rejected nodes per reason code, the names the cache does not know among them."""
    return {**by_reason, "unknown_node": len(unknown)} if unknown else dict(by_reason)


def extender_scores(raw: FloatArray) -> IntArray:
    """Raw policy scores -> integers 0..10: the policy's best (its highest score, exact ties
    included) get 10, the others min-max onto 0..9.

    kube-scheduler weighs one extender point above all its own score plugins together
    (knative/base/scheduler.yaml), so the pod goes where the policy chose and the default plugins
    only break the policy's own ties, as the simulator breaks them (`simulator.engine.best_row`).
    Rounding alone would give 10 to every node within 5 % of the best, and the default plugins
    (LeastAllocated first) would choose among those instead. Non-finite scores get 0; if every
    candidate scores the same, all get the neutral 5.
    """
    finite = np.isfinite(raw)
    if not finite.any():
        return np.zeros(raw.shape, dtype=np.int64)
    lo, hi = raw[finite].min(), raw[finite].max()
    if hi - lo <= 0:
        return np.where(finite, NEUTRAL_PRIORITY, 0).astype(np.int64)
    below_best = MAX_EXTENDER_PRIORITY - 1
    scaled = np.minimum(np.rint((np.where(finite, raw, lo) - lo) / (hi - lo) * below_best), below_best)
    scaled = np.where(raw == hi, MAX_EXTENDER_PRIORITY, scaled)
    return np.where(finite, scaled, 0).astype(np.int64)


@dataclasses.dataclass(frozen=True, slots=True)
class _Filtered:
    """The last filter answer, for the prioritize call kube-scheduler makes next for the same
    pod: it sends exactly the names filter passed (extenders filter last), on the same snapshot."""

    uid: str
    snapshot: Snapshot
    pod: PodRequest
    names: list[str]
    nodes: NodeTable  # the passed rows, in that order


@dataclasses.dataclass(frozen=True, slots=True)
class Priorities:
    """A prioritize answer: candidate nodes with 0..10 scores (a `HostPriorityList` on the wire)."""

    nodes: NodeTable
    scores: IntArray
    encoder: wire.HostPriorityEncoder  # built for `nodes.cluster`

    def encode(self) -> bytes:
        return self.encoder.encode(self.nodes.origin, self.scores)


class Extender:
    """The three verbs over a cluster cache, a placement policy and a binder."""

    def __init__(
        self,
        *,
        cache: ClusterCache,
        policy: LoadedPolicy,
        binder: Binder,
        decisions: DecisionLog | None = None,
    ) -> None:
        self.cache = cache
        self.decisions = decisions or DecisionLog()
        self.use(policy)
        self._binder = binder
        # Told of each pod bound with its decision (the closed loop's recorder); must not block.
        self.on_bound: Callable[[Decision, LoadedPolicy], None] | None = None
        self._recent: OrderedDict[str, PodRequest] = OrderedDict()
        self._filtered: _Filtered | None = None
        self._encoder: tuple[ClusterObjects, wire.HostPriorityEncoder] | None = None

    def use(self, policy: LoadedPolicy) -> None:
        """Serve `policy` from the next call on (at start, and when a changed model reloads)."""
        self.loaded = policy
        self.policy = policy.policy
        self._scored = "fallback" if policy.degraded else "scored"  # the outcome of a ranked pod
        self._labels = {"kdrl.policy": self.policy.name}
        self._policy_attributes: dict[str, str | bool] = {
            "kdrl.policy": self.policy.name,
            "kdrl.policy.provider": policy.provider,
            "kdrl.policy.fallback": bool(policy.degraded),
            "kdrl.policy.model": policy.model,
        }
        if policy.degraded:
            self._policy_attributes["kdrl.policy.degraded"] = policy.degraded

    def _encoder_for(self, cluster: ClusterObjects) -> wire.HostPriorityEncoder:
        """The answer encoder of the current cluster, rebuilt when a new snapshot arrives."""
        if self._encoder is None or self._encoder[0] is not cluster:
            self._encoder = (cluster, wire.HostPriorityEncoder(cluster.names.tolist()))
        return self._encoder[1]

    def filter(self, args: wire.ExtenderArgs) -> wire.ExtenderFilterResult:
        with tracer.start_as_current_span("kdrl.extender.filter") as span:
            pod, snapshot = self._pod(args, span)
            candidates, unknown = self._candidates(args, snapshot)
            verdicts = filtering.filter_nodes(pod, candidates)
            failed, unresolvable = verdicts.failed(candidates.names)
            failed.update(
                {name: "node unknown to the kdrl cache (it may have just joined)" for name in unknown}
            )
            passed = [name for name, ok in zip(candidates.names, verdicts.feasible) if ok]
            self._record_filter(pod, span, verdicts.rejections, failed, unresolvable, unknown, bool(passed))
            metrics.soon(metrics.candidates.record, len(candidates) + len(unknown))
            span.set_attribute("kdrl.candidates", len(candidates) + len(unknown))
            span.set_attribute("kdrl.feasible", len(passed))
            span.set_attribute("kdrl.unknown_nodes", len(unknown))
            if args["NodeNames"] is not None:
                rows = np.flatnonzero(verdicts.feasible)
                self._filtered = _Filtered(pod.uid, snapshot, pod, passed, candidates.take(rows))
                return wire.filter_result(names=passed, nodes=None, failed=failed, unresolvable=unresolvable)
            keep = set(passed)
            given = args["Nodes"] or wire.NodeList(metadata={}, items=[])
            items = [n for n in given["items"] if n["metadata"]["name"] in keep]
            nodes = wire.NodeList(metadata=given["metadata"], items=items)
            return wire.filter_result(names=None, nodes=nodes, failed=failed, unresolvable=unresolvable)

    def prioritize(self, args: wire.ExtenderArgs) -> Priorities:
        with tracer.start_as_current_span("kdrl.extender.prioritize") as span:
            filtered = self._reusable_filter(args)
            span.set_attribute("kdrl.filter_reused", filtered is not None)
            if filtered is not None:  # the pod and its candidates as filter just saw them
                pod, candidates, unknown = filtered.pod, filtered.nodes, list[str]()
                self._describe(pod, filtered.snapshot, span)
                result = ranking.rank(pod, candidates, self.policy, prefiltered=True)
            else:
                pod, snapshot = self._pod(args, span)
                candidates, unknown = self._candidates(args, snapshot)
                result = ranking.rank(pod, candidates, self.policy)
            scores = extender_scores(result.scores)
            feasible = int(result.verdicts.feasible.sum())
            outcome = self._scored if feasible else "all_filtered"
            metrics.decisions.add(1, {**self._labels, "kdrl.outcome": outcome})
            decision = self._decision(pod, span)
            decision.candidates, decision.scores, decision.outcome = candidates, result.scores, outcome
            if filtered is None:  # no filter came first: its count and verdicts are this call's
                metrics.soon(metrics.candidates.record, len(candidates) + len(unknown))
                decision.rejections = _rejections(result.verdicts.rejections, unknown)
            span.set_attribute("kdrl.candidates", len(candidates) + len(unknown))
            span.set_attribute("kdrl.feasible", feasible)
            span.set_attribute("kdrl.unknown_nodes", len(unknown))
            best = result.best_first(limit=TOP_SCORES_IN_SPANS)
            if len(best) and result.verdicts.feasible[best[0]]:
                span.set_attribute("kdrl.best_node", candidates.names[best[0]])
                span.set_attribute(
                    "kdrl.top_scores",
                    [
                        f"{candidates.names[r]}={result.scores[r]:.4g}"
                        for r in best
                        if result.verdicts.feasible[r]
                    ],
                )
            return Priorities(nodes=candidates, scores=scores, encoder=self._encoder_for(candidates.cluster))

    async def bind(self, args: wire.ExtenderBindingArgs) -> wire.ExtenderBindingResult:
        namespace, name, uid, node = args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"]
        with tracer.start_as_current_span("kdrl.extender.bind") as span:
            span.set_attributes(
                {
                    "k8s.namespace.name": namespace,
                    "k8s.pod.name": name,
                    "k8s.pod.uid": uid,
                    "k8s.node.name": node,
                    "kdrl.chosen_node": node,
                    **self._policy_attributes,
                }
            )
            try:
                pod, refusal = await self._bindable(namespace, name, uid, node)
            except KubeApiError as error:
                pod, refusal = None, f"cannot read pod {namespace}/{name}: {error}"
            decision = None
            if pod is not None:
                span.set_attributes(
                    {"kdrl.function": pod.function or "", "kdrl.priority": pod.priority.value}
                )
                decision = self._decision(pod, span)
                decision.bound_node = node
            if refusal:
                span.set_status(trace.StatusCode.ERROR, refusal)
                logger.warning("bind refused: %s", refusal)
                self._bound(decision, "bind_refused", refusal)
                return wire.ExtenderBindingResult(Error=refusal)
            try:
                await self._binder.bind(namespace=namespace, name=name, uid=uid, node=node)
            except KubeApiError as error:
                message, outcome = str(error), "bind_error"
                if error.status == 409:
                    message = (
                        f"pod {namespace}/{name} is already bound or was replaced (409 Conflict): {error}"
                    )
                    outcome = "bind_conflict"
                span.set_status(trace.StatusCode.ERROR, message)
                logger.warning("%s", message)
                self._bound(decision, outcome, message)
                return wire.ExtenderBindingResult(Error=message)
            if pod is not None:
                self.cache.assume(uid, node, pod)
            self._bound(decision, "bound", "")
            if decision is not None and self.on_bound is not None:
                self.on_bound(decision, self.loaded)
            return wire.ExtenderBindingResult(Error="")

    async def _bindable(
        self, namespace: str, name: str, uid: str, node: str
    ) -> tuple[PodRequest | None, str]:
        """The pod to bind and why not, if not: only pods whose `schedulerName` is the plugin's
        scheduler, as the API server has them now (not as a request claims), and only to a node
        the filter passes for them now. Offline, the pod the extender saw stands in."""
        obj = await self._binder.pod(namespace=namespace, name=name)
        if obj is None:
            pod = self._recent.get(uid)
        else:
            spec = obj.get("spec")
            meta = obj.get("metadata")
            scheduler = spec.get("schedulerName") if isinstance(spec, dict) else None
            if scheduler != convert.SCHEDULER_NAME:
                return None, (
                    f"pod {namespace}/{name} is scheduled by {scheduler or 'default-scheduler'!r}, "
                    f"not {convert.SCHEDULER_NAME!r}: kdrl binds only its own pods"
                )
            if uid and isinstance(meta, dict) and meta.get("uid") != uid:
                return None, f"pod {namespace}/{name} has another uid than {uid!r} (it was replaced)"
            try:
                pod = convert.pod_request(obj)
            except ObjectError as error:
                return None, f"pod {namespace}/{name}: {error}"
        if pod is None:
            return None, ""  # offline and unseen: nothing to check against (no API server either)
        table = self.cache.snapshot.nodes
        (row,) = table.rows([node])
        if row is None:
            return pod, f"node {node} is unknown to the kdrl cache"
        verdicts = filtering.filter_nodes(pod, table.take([row]))
        if not verdicts.feasible[0]:
            return pod, f"node {node} does not pass the filter for {namespace}/{name}: {verdicts.reason(0)}"
        return pod, ""

    def _bound(self, decision: Decision | None, outcome: str, error: str) -> None:
        metrics.decisions.add(1, {**self._labels, "kdrl.outcome": outcome})
        if decision is not None:
            decision.outcome, decision.error = outcome, error

    def _decision(self, pod: PodRequest, span: trace.Span) -> Decision:
        """The pod's entry in the decision log, stamped with this verb's trace."""
        context = span.get_span_context()
        trace_id = format(context.trace_id, "032x") if context.is_valid else ""
        return self.decisions.entry(pod, self.policy.name, trace_id)

    def _record_filter(
        self,
        pod: PodRequest,
        span: trace.Span,
        rejections: Mapping[str, int],
        failed: Mapping[str, str],
        unresolvable: Mapping[str, str],
        unknown: list[str],
        passed: bool,
    ) -> None:
        """A filter answer into the metrics and the decision log (a few reasons as examples)."""
        decision = self._decision(pod, span)
        decision.rejections = _rejections(rejections, unknown)
        for code, count in decision.rejections.items():
            metrics.rejections.add(count, {"kdrl.reason": code})
        examples = list(itertools.islice(itertools.chain(unresolvable.items(), failed.items()), REASONS))
        decision.reasons = dict(examples)
        decision.candidates = decision.scores = None
        decision.outcome = "filtered" if passed else "all_filtered"
        if not passed:
            metrics.decisions.add(1, {**self._labels, "kdrl.outcome": "all_filtered"})

    def _reusable_filter(self, args: wire.ExtenderArgs) -> _Filtered | None:
        """The last filter answer when this prioritize is for the same pod, on the same
        snapshot and over exactly the nodes it passed; None otherwise."""
        filtered, self._filtered = self._filtered, None  # used once at most
        if filtered is None or not filtered.uid or filtered.snapshot is not self.cache.snapshot:
            return None
        metadata = args["Pod"].get("metadata") if isinstance(args["Pod"], dict) else None
        uid = metadata.get("uid") if isinstance(metadata, dict) else None
        return filtered if uid == filtered.uid and args["NodeNames"] == filtered.names else None

    def _pod(self, args: wire.ExtenderArgs, span: trace.Span) -> tuple[PodRequest, Snapshot]:
        snapshot = self.cache.snapshot
        pod = convert.pod_request(args["Pod"])
        self._describe(pod, snapshot, span)
        return pod, snapshot

    def _describe(self, pod: PodRequest, snapshot: Snapshot, span: trace.Span) -> None:
        """Remember the pod for bind and put who and what on the span."""
        if pod.uid:
            self._recent[pod.uid] = pod
            self._recent.move_to_end(pod.uid)
            while len(self._recent) > RECENT_PODS:
                self._recent.popitem(last=False)
        span.set_attributes(
            {
                "k8s.namespace.name": pod.namespace,
                "k8s.pod.name": pod.name,
                "k8s.pod.uid": pod.uid,
                "kdrl.function": pod.function or "",
                "kdrl.priority": pod.priority.value,
                **self._policy_attributes,
                "kdrl.snapshot.age_s": snapshot.age(self.cache.clock()),
                "kdrl.snapshot.synced": snapshot.synced,
            }
        )

    def _candidates(self, args: wire.ExtenderArgs, snapshot: Snapshot) -> tuple[NodeTable, list[str]]:
        """The candidate nodes as a table, in request order, and the names the cache lacks."""
        table = snapshot.nodes
        names = args["NodeNames"]
        if names is not None:
            if names == table.name_list:  # the scheduler sent every node, in our order
                return table, []
            rows = table.rows(names)
            unknown = [name for name, row in zip(names, rows) if row is None]
            return table.take([row for row in rows if row is not None]), unknown
        return self._candidates_from_objects(args, table), []

    @staticmethod
    def _candidates_from_objects(args: wire.ExtenderArgs, table: NodeTable) -> NodeTable:
        """Full Node objects: the cached rows (they carry pod usage) when the cache knows them all.

        Otherwise a table of the given nodes, cached rows where known and the objects for the
        rest; image spread is then measured over the given nodes, the best this request tells.
        """
        items = (args["Nodes"] or wire.NodeList(metadata={}, items=[]))["items"]
        rows = table.rows([item["metadata"]["name"] for item in items])
        if all(row is not None for row in rows):
            return table.take([row for row in rows if row is not None])
        nodes = []
        for i, (item, row) in enumerate(zip(items, rows)):
            try:
                nodes.append(table.node(row) if row is not None else convert.node_row(item))
            except ObjectError as error:
                raise BadRequest(f"ExtenderArgs.Nodes.items[{i}]: {error}") from error
        return NodeTable.from_nodes(nodes)
