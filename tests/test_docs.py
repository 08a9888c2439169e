"""The README stays true: its test command is what CI runs, its settings table is complete."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from plugin import settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def fenced_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", README, flags=re.S)


def test_ci_runs_the_readme_test_command() -> None:
    test_command = fenced_commands()[1]
    ci_lines = [
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and line[0] not in "#"
    ]
    assert test_command in ci_lines


def test_readme_documents_every_setting() -> None:
    for _, group in settings.GROUPS:
        for field in dataclasses.fields(group):
            assert f"| `{field.metadata['env']}` | `{field.metadata['flag']}` |" in README


def test_the_main_command_runs_the_simulator_and_examples_exist() -> None:
    assert fenced_commands()[0].endswith("kdrl simulate")
    for path in re.findall(r"examples/\S+\.json", README):
        assert (ROOT / path).is_file()
