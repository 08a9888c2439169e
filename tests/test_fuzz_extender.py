"""Whatever arrives, the extender answers 200 or 400 with a JSON `Error`: never a 500."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import synthetic

Client = TestClient[web.Request, web.Application]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
POD = synthetic.knative_pod("p", service="s")
quantities = st.text(max_size=6) | st.integers() | st.floats() | st.none()
mangled_pods = st.builds(
    lambda cpu, memory, key: {
        **POD,
        "spec": {
            **POD["spec"],
            "containers": [
                {"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
            ],
            key: cpu,
        },
    },
    quantities,
    quantities,
    st.sampled_from(["overhead", "tolerations", "nodeSelector", "affinity", "initContainers"]),
)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"Pod": json_values, "NodeNames": json_values}),
    st.fixed_dictionaries({"Pod": mangled_pods, "NodeNames": st.just(["roomy", "full"])}),
    st.fixed_dictionaries({"Pod": st.just(POD), "Nodes": json_values}),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, verb=st.sampled_from(["filter", "prioritize", "bind"]))
async def test_any_body_gets_200_or_400(offline_client: Client, body: Any, verb: str) -> None:
    response = await offline_client.post(f"/scheduler/{verb}", data=json.dumps(body))
    assert response.status in (200, 400), await response.text()
    answer = await response.json()
    if response.status == 400:
        assert answer["Error"]
