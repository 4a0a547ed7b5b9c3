"""`orch schema job|sweep` prints a JSON Schema that accepts every example and refuses mistakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import orchfork
import pytest
from termutil import ROOT

from orchestrator.core import yamlpos

JOBS = sorted(p for p in (ROOT / "examples").glob("*.yml") if "sweep" not in p.name)
SWEEPS = sorted(p for p in (ROOT / "examples").glob("*.yml") if "sweep" in p.name)


def _schema(kind: str) -> dict[str, Any]:
    out = orchfork.run(["schema", kind], cwd=ROOT, check=True, timeout=60)
    schema = json.loads(out.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _errors(schema: dict[str, Any], data: Any) -> list[str]:
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(data)]


def _read(path: Path) -> Any:
    # As an editor's YAML 1.2 language server reads it (orch's own loader does the same).
    return yamlpos.load(path.read_text(), str(path))[0]


def test_every_example_job_validates() -> None:
    schema = _schema("job")
    assert JOBS
    for path in JOBS:
        assert _errors(schema, _read(path)) == [], path


def test_every_example_sweep_validates() -> None:
    schema = _schema("sweep")
    assert SWEEPS
    for path in SWEEPS:
        assert _errors(schema, _read(path)) == [], path


@pytest.mark.parametrize(("change", "words"), [
    ({"traning": {}}, "Additional properties"),
    ({"training": {"learning_rate": -1}}, "less than or equal to the minimum of 0"),
    ({"method": "qlorra"}, "is not one of"),
    ({"resources": {"spot": True}}, "is not one of"),
])
def test_the_schema_refuses_what_orch_refuses(change: dict[str, Any], words: str) -> None:
    data = {**_read(ROOT / "examples" / "quickstart.yml"), **change}
    errors = _errors(_schema("job"), data)
    assert any(words in e for e in errors), errors
