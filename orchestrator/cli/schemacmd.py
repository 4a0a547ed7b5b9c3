"""`orch schema job|sweep`: the JSON Schema of the job or sweep file, for editors."""


import json
from enum import StrEnum
from typing import Annotated, Any

import typer


class Kind(StrEnum):
    job = "job"
    sweep = "sweep"


def json_schema(kind: Kind) -> dict[str, Any]:
    """The file model's JSON Schema (pydantic's `model_json_schema`), with its $schema."""
    if kind is Kind.job:
        from orchestrator.core.spec import JobSpec as model
    else:
        from orchestrator.core.sweepspec import SweepSpec as model  # type: ignore[assignment]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **model.model_json_schema()}


def register(app: typer.Typer) -> None:
    """Add `orch schema` to the app."""

    @app.command()
    def schema(
        kind: Annotated[Kind, typer.Argument(help="Which file: job or sweep.")],
    ) -> None:
        """Print the JSON Schema of the job or sweep file (editors validate with it;
        docs/job-file.md shows the YAML language-server line)."""
        typer.echo(json.dumps(json_schema(kind), indent=2))
