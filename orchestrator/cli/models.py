"""`orch models`: the base models orch knows the shape of, and how to size any other.

Registered on the main Typer app by `register(app)`; reads orchestrator/core/data/models.yaml.
"""


import typer

from orchestrator.cli.common import JsonFlag
from orchestrator.cli.tables import table
from orchestrator.core.architectures import known_aliases, known_models
from orchestrator.core.spec import ArchitectureFields


def _models_cmd(json_out: JsonFlag = False) -> None:
    """Known base models (repo ids usable as `base_model:`) and how to size any other."""
    found = sorted({m.repo: m for m in known_models().values()}.values(), key=lambda m: m.repo)
    aliases = known_aliases()
    required = [n for n, f in ArchitectureFields.model_fields.items() if f.is_required()]
    if json_out:
        import json

        typer.echo(json.dumps({
            "models": [{"repo": m.repo, "params": m.published_params,
                        "layers": m.architecture.num_hidden_layers,
                        "hidden_size": m.architecture.hidden_size,
                        "aliases": sorted(aliases[m.repo])} for m in found],
            "architecture_required": required}, indent=2))
        return
    typer.echo(table(["base_model", "params", "layers", "hidden", "also known as"],
                     [[m.repo, f"{m.published_params / 1e9:.2f}B",
                       m.architecture.num_hidden_layers, m.architecture.hidden_size,
                       ", ".join(sorted(aliases[m.repo])) or "-"] for m in found],
                     right=[1, 2, 3], drop=[4, 3, 2]))
    typer.echo("\nAny other model: give its shape in the job file, either its config.json\n"
               "  base_model: {repo: ORG/NAME, config: path/to/config.json}\n"
               "or the fields themselves\n"
               "  base_model: {repo: ORG/NAME, architecture: {"
               + ", ".join(f"{k}: .." for k in required) + "}}\n"
               "Gated models (meta-llama/*): set HF_TOKEN where orch runs the job. "
               "All keys: docs/job-file.md")


def register(app: typer.Typer) -> None:
    """Add `models` to `app`."""
    app.command("models")(_models_cmd)
