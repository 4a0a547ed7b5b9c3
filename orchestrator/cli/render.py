"""`orch render`: what a job would run on a kind of host, without renting anything.

Registered on the main Typer app by `register(app)`. The axolotl config, the image and the
train/merge/evaluate command lines come from playbooks.rendering, which calls the very
functions the pipeline uploads and runs with. Heavy modules are imported inside the command,
so `orch plan` start-up does not pay for them.
"""


import json
import os
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli import deadlineview
from orchestrator.cli.common import EXIT_INVALID, fail
from orchestrator.cli.jobfile import load
from orchestrator.cli.plan import plan_job, servers_for_plan
from orchestrator.core.planning import CONTAINER_RENTALS, total_tokens
from orchestrator.engine.jobinputs import (
    Inputs,
    data_sources,
    first_local,
    serving_for,
    train_config,
)
from playbooks import datasources, images, rendering
from playbooks.base import Layout
from playbooks.deliver import HubTarget
from playbooks.pipeline import DEFAULT_VLLM_IMAGE
from playbooks.train import TrainJob

HostOpt = Annotated[str | None, typer.Option(
    "--host", help="docker: a full machine with Docker (monthly server); container: a "
                   "container rental (Vast.ai, RunPod), where the job runs natively. "
                   "Default: the kind of host the plan chose.", show_default=False)]


def planned_kind(provider: str) -> str:
    """The kind of host a plan's placement is: a container rental runs the job natively in
    the trainer image; a monthly server or a `sim` host runs it in Docker."""
    return "container" if provider in CONTAINER_RENTALS else "docker"


def render_job(file: Path, host: str | None) -> Any:
    """The job file rendered for `host` (a playbooks.rendering.Rendered); None: the kind of
    host the plan chose."""
    if host is not None and host not in images.HOST_KINDS:
        fail(f"--host must be docker or container (got {host!r})", EXIT_INVALID)
    _refuse_sweep(file)
    job = load(file)
    plan = plan_job(job, servers_for_plan())
    chosen = planned_kind(plan.chosen.offer.provider)
    kind: images.HostKind = "docker" if (host or chosen) == "docker" else "container"
    est = plan.estimate
    spec = job.spec
    # The training hours, as the engine sizes `save_steps` (the recorded est_training_hours).
    inputs = Inputs(job, total_tokens(job), plan.chosen.duration.training, {})
    # On a spot placement the trainer checkpoints at the interval the engine gives spot.
    spot = (deadlineview.spot_risk(plan.chosen) if plan.chosen.offer.interruptible
            else None)
    every = inputs.checkpoints(est.gpu_count, spot, est.workload, est.strategy)
    config = train_config(spec, est.strategy.value, every.save_steps,
                          est.workload or plan.workload, keep=every.keep)
    layout = Layout(rendering.NOMINAL_BASE[kind])
    # Each dataset as the host has it: a local file uploaded, a Hub dataset downloaded there.
    sources = data_sources(spec, job.path.parent)
    # Only the variable's name reaches the command line; the value goes to a 0600 file.
    env = {"HF_TOKEN": "(from the environment)"} if os.environ.get("HF_TOKEN") else {}
    tj = TrainJob(job_id=spec.name, layout=layout, dataset=first_local(sources),
                  config=config, sources=sources, base_model=layout.model_dir(spec.base_model.repo,
                                                             spec.base_model.revision),
                  image=images.for_host(spec.trainer.image, kind), env=env,
                  runner="docker" if kind == "docker" else "process")
    out = spec.output
    hub = None if out.push_to_hub is None else HubTarget(out.push_to_hub, out.private,
                                                         out.merged)
    download = rendering.download_argv(tj, spec.base_model.repo, spec.base_model.revision,
                                       job.architecture.params * 2, bool(env))
    rendered = rendering.render(tj, evaluates=bool(spec.eval.eval_set or spec.eval.tasks),
                                vllm_image=DEFAULT_VLLM_IMAGE, kind=kind,
                                eval_tasks=tuple(spec.eval.tasks),
                                download=download, hub=hub,
                                serving=serving_for(job, est.gpu_count,
                                                    plan.chosen.offer.gpu_memory_bytes))
    for cache in datasources.caches(sources, layout, None, None):
        # Run on the host as the model's download is (a container of the trainer image).
        cache.image = tj.image if kind == "docker" else None
        rendered.commands[f"dataset {cache.repo}"] = cache.download_argv()
    rendered.notes.append(f"placement: {plan.chosen.offer.provider} {plan.chosen.offer.gpu} "
                          f"x{est.gpu_count}, strategy {est.strategy.value}")
    if host is None:
        rendered.notes.append(f"host: {kind}, the kind the placement is (--host "
                              f"{'docker' if kind == 'container' else 'container'} renders "
                              "the other)")
    return rendered


def _refuse_sweep(file: Path) -> None:
    """A sweep file renders as its runs' job files do: say which file to render instead."""
    import yaml

    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError):
        return  # the job loader reports it with the file and line
    if isinstance(data, dict) and "grid" in data and "base" in data:
        fail(f"{file} is a sweep file: render its base job "
             f"({file.parent / str(data['base'])}); each run differs from it only in "
             f"{', '.join(map(str, data['grid'] or {}))}", EXIT_INVALID)


def write_dir(rendered: Any, out: Path) -> list[Path]:
    """Write the uploaded files and render.json into `out`; returns what was written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for remote, text in rendered.files.items():
        path = out / Path(remote).name
        path.write_text(text)
        written.append(path)
    path = out / "render.json"
    path.write_text(json.dumps(rendered.to_dict(), indent=2) + "\n")
    written.append(path)
    return written


def render_cmd(
    file: Annotated[Path, typer.Argument(help="The job file (job.yml).")],
    host: HostOpt = None,
    out: Annotated[Path | None, typer.Option(
        "-o", "--out", help="Also write the config files and render.json here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show exactly what would run: axolotl config, image, every command on the host."""
    rendered = render_job(file, host)
    written = write_dir(rendered, out) if out is not None else []
    if json_out:
        typer.echo(json.dumps(rendered.to_dict(), indent=2))
        return
    lines = [f"image: {rendered.image}  (host: {rendered.host})"]
    for remote, text in rendered.files.items():
        lines += ["", f"# {remote}", text.rstrip("\n")]
    lines.append("")
    for name, argv in rendered.commands.items():
        lines.append(f"{name}: {shlex.join(argv) if argv else '(not run)'}")
    lines += [f"note: {n}" for n in rendered.notes]
    lines += [f"wrote {p}" for p in written]
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    """Add `orch render` to `app`."""
    app.command("render")(render_cmd)
