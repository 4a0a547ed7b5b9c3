"""What a job runs on a host, rendered without renting anything (`orch render`).

Every piece comes from the function the playbooks themselves upload or run with:
`train.render_config` and `train.deepspeed_text` (the uploaded files), `train.train_argv`
and `merge.merge_argv` (the detached start commands), and `evaluate_argv` below (the
evaluation server, built like `vllm.server_spec`). So what `orch render` shows is what
the pipeline does on that kind of host.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from playbooks import deliver, evalscore, images, merge, train, vllm
from playbooks.base import container_name
from playbooks.model_cache import ModelCache
from playbooks.pipeline import cache_for
from playbooks.vllm_native import NativeServer, served_requirements

# Where orch's directory is on each kind of host when nothing has been discovered yet (the
# model_cache playbook picks the real NVMe mount at run time).
NOMINAL_BASE: dict[images.HostKind, str] = {
    "docker": "/mnt/nvme/orch",  # a monthly server's NVMe
    "container": "/workspace/orch",  # a rental's container disk (no mount over /workspace)
}


@dataclass(frozen=True)
class Rendered:
    """A job as it would run on one kind of host."""

    host: images.HostKind
    image: str
    axolotl_config: dict[str, Any]
    files: dict[str, str]  # host path -> contents of every file uploaded besides the data
    commands: dict[str, list[str]]  # download, train, merge, evaluate, lm_eval, deliver ->
    # argv ([] = not run)
    layout_base: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The `orch render --json` object."""
        return {"image": self.image, "host": self.host, "layout_base": self.layout_base,
                "axolotl_config": self.axolotl_config, "commands": self.commands,
                "files": sorted(self.files), "notes": self.notes}


def evaluate_argv(tj: train.TrainJob, vllm_image: str, port: int,
                  max_model_len: int, serving: vllm.Serving = vllm.DEFAULT_SERVING) -> list[str]:
    """The evaluation server's command line, as `evaluate.evaluate` starts it.

    On a container rental (no Docker) it is `vllm serve` from orch's vLLM venv under
    orch-job.sh (`native_server`); on a Docker host, the vLLM image's container.
    """
    if tj.runner == "process":
        return native_server(tj, port, max_model_len, serving).serve_argv()
    model, adapter = merge.served_dirs(tj, serving.served == "adapter")
    args = vllm.engine_args(tj.layout.container(model), max_model_len,
                            lora=None if adapter is None else tj.layout.container(adapter),
                            lora_rank=tj.config.lora_r, serving=serving)
    spec = vllm.ServerSpec(container_name("vllm", tj.job_id), tj.job_id, vllm_image, port,
                               tj.layout.base, tuple(args))
    return spec.docker_argv()


def lm_eval_argv(tj: train.TrainJob, port: int, tasks: Sequence[str],
                 serving: vllm.Serving = vllm.DEFAULT_SERVING,
                 max_length: int = evalscore.LM_EVAL_MAX_LENGTH) -> list[str]:
    """The command that runs `eval.tasks`, as `evaluate.evaluate` runs it.

    `lm_eval --model local-completions` against the vLLM server: on a Docker host in a
    throwaway container of the trainer image, on a container rental natively in the rented
    image; both after adding the `lm_eval[api]` extra.
    """
    if not tasks:
        return []
    eval_dir = f"{tj.layout.job_dir(tj.job_id)}/eval"
    model, _adapter = merge.served_dirs(tj, serving.served == "adapter")
    where: evalscore.LmEvalPlace = (
        evalscore.LmEvalNative(tj.native.wrap, tj.native.uv) if tj.runner == "process"
        else evalscore.LmEvalContainer(tj.job_id, tj.image, tj.layout))
    return evalscore.lm_eval_place_argv(where, tasks, port, model, f"{eval_dir}/lm_eval",
                                        max_length=max_length)


def download_argv(tj: train.TrainJob, repo: str, revision: str, model_bytes: int,
                  token: bool) -> list[str]:
    """The base model's download, as `pipeline.prepare` runs it on this kind of host."""
    cache = ModelCache(repo, revision, model_bytes, tj.layout,
                       hf_token="(from the environment)" if token else None)
    cache = cache_for(cache, tj.image, tj.runner, tj.native)
    argv = cache.download_argv()
    return cache.wrap(argv) if cache.wrap is not None else argv


def native_server(tj: train.TrainJob, port: int, max_model_len: int,
                  serving: vllm.Serving = vllm.DEFAULT_SERVING) -> NativeServer:
    """The vLLM server `evaluate` runs on a container rental for `tj`."""
    model, adapter = merge.served_dirs(tj, serving.served == "adapter")
    args = vllm.engine_args(model, max_model_len, lora=adapter, lora_rank=tj.config.lora_r,
                            serving=serving)
    return NativeServer.for_job(tj.layout, tj.job_id, images.vllm_version(), tj.wrapper,
                                port, args, tj.native.wrap, tj.native.uv,
                                served_requirements(serving.quantization))


def render(tj: train.TrainJob, *, evaluates: bool, vllm_image: str, vllm_port: int = 8000,
           kind: images.HostKind | None = None, eval_tasks: Sequence[str] = (),
           serving: vllm.Serving = vllm.DEFAULT_SERVING,
           download: Sequence[str] = (), hub: deliver.HubTarget | None = None) -> Rendered:
    """`tj` as it runs: config files, image and every command line it runs on the host
    (`download`: the base model's, from `download_argv`; `hub`: the upload, if any)."""
    kind = kind or ("docker" if tj.runner == "docker" else "container")
    config_text = train.render_config(tj)
    files = {tj.config_file: config_text}
    ds_text, ds_file = train.deepspeed_text(tj), tj.deepspeed_file
    if ds_text is not None and ds_file is not None:
        files[ds_file] = ds_text
    notes = []
    context = images.eval_context(tj.config.sequence_len, bool(eval_tasks))
    if tj.runner == "process":
        notes.append(f"no Docker on a container rental: the rented image ({tj.image}) is the "
                     "runtime; commands run natively under playbooks/remote/orch-job.sh")
        if evaluates:
            installs = native_server(tj, vllm_port, context, serving).install_argvs()
            notes.append("before `evaluate`, vLLM is installed once per machine: "
                         + "; ".join(shlex.join(argv) for argv in installs))
    commands = {
        "download": list(download),
        "train": train.train_argv(tj),
        "merge": merge.merge_argv(tj) if tj.adapter else [],
        "evaluate": evaluate_argv(tj, vllm_image, vllm_port, context,
                                  serving) if evaluates else [],
        "lm_eval": lm_eval_argv(tj, vllm_port, eval_tasks, serving,
                                context) if evaluates else [],
        "deliver": deliver.upload_argv(tj, hub, token=True) if hub is not None else [],
    }
    notes.append("delivery: the results are copied back over SFTP and checked by sha256"
                 + ("" if hub is None else f"; {hub.repo} gets the "
                    f"{'merged model' if hub.merged else 'adapter'} from the host"))
    return Rendered(kind, tj.image, yaml.safe_load(config_text), files, commands,
                    tj.layout.base, notes)
