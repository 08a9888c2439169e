"""Settings: flag over environment over default, and errors that name the key and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin import settings
from plugin.errors import SettingsError


def test_defaults() -> None:
    loaded = settings.load({}, {})
    assert loaded == settings.Settings()
    assert loaded.server.port == 8080 and loaded.policy.name == "tuned" and not loaded.offline


def test_flag_beats_environment_beats_default(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text("[]")
    loaded = settings.load(
        {"KDRL_PORT": "9000", "KDRL_NODES_FILE": str(nodes)},
        {"KDRL_PORT": "7000", "KDRL_POLICY": "most-allocated", "KDRL_KUBE_TIMEOUT_S": "2.5"},
    )
    assert loaded.server.port == 9000
    assert loaded.policy.name == "most-allocated"
    assert loaded.kube.request_timeout_s == 2.5
    assert loaded.kube.nodes_file == nodes and loaded.offline


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KDRL_PORT": "eighty"}, "KDRL_PORT='eighty': expected int"),
        ({"KDRL_PORT": "70000"}, "KDRL_PORT='70000': must be a TCP port"),
        ({"KDRL_POLICY": "magic"}, "KDRL_POLICY='magic': expected one of kube-default"),
        ({"KDRL_KUBE_TIMEOUT_S": "0"}, "KDRL_KUBE_TIMEOUT_S='0': must be greater than 0"),
        ({"KDRL_NODES_FILE": "/no/such/file"}, "KDRL_NODES_FILE='/no/such/file': no such file"),
        ({"KDRL_LOG_FORMAT": "xml"}, "KDRL_LOG_FORMAT='xml'"),
    ],
)
def test_errors_name_key_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings.load({}, env)
    assert str(caught.value).startswith(message)


def test_every_setting_has_a_documented_env_key_and_flag() -> None:
    import dataclasses

    for _, group in settings.GROUPS:
        for field in dataclasses.fields(group):
            # K_SINK is Knative's own name: a SinkBinding injects it.
            assert field.metadata["env"].startswith("KDRL_") or field.metadata["env"] == "K_SINK"
            assert field.metadata["flag"].startswith("--")
            assert field.metadata["help"].endswith(".")


@pytest.mark.parametrize(
    ("argv", "shadow"), [(["--shadow"], True), (["--shadow", "false"], False), ([], False)]
)
def test_a_yes_no_flag_alone_means_yes(argv: list[str], shadow: bool) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    assert settings.load(vars(parser.parse_args(argv)), {}).prewarm.shadow is shadow
