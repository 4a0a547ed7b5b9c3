"""Merge the trained adapter into the base model: `axolotl merge-lora` into `<output_dir>/merged`.

Facts: ../shared/reference/pipeline-facts.md ("Merge"). Full fine-tunes have nothing to merge
(their output_dir is the model). The merge runs detached like training (a container named
`container_name("merge", job_id)`, or the orch-job.sh wrapper without Docker) and is polled,
so a long merge outlives an SSH hiccup: a re-run of the step finds a merge still running and
waits for it instead of starting a second one.
"""

from __future__ import annotations

import json
import stat
import time

from playbooks.base import Fault, Host, Step, StepFailed, last_line
from playbooks.train import (
    ADAPTER_WEIGHTS,
    TrainJob,
    TrainState,
    TrainStatus,
    list_dir,
    wrapper_step,
)

MERGE_TIMEOUT_S = 4 * 3600.0  # a 70B merge shard by shard on CPU RAM takes a while
INDEX = "model.safetensors.index.json"


def merge_argv(job: TrainJob) -> list[str]:
    """The command line that starts the merge on the host (what `orch render` shows)."""
    return job.run_argv("merge", ["axolotl", "merge-lora", job.inside(job.config_file),
                                  f"--lora-model-dir={job.inside(job.output_dir)}"])


def merged_dir(job: TrainJob) -> str:
    """Where the model to serve is: `<output_dir>/merged`, or output_dir for full fine-tunes."""
    return job.output_dir if job.config.method == "full" else f"{job.output_dir}/merged"


def served_dirs(job: TrainJob, adapter: bool) -> tuple[str, str | None]:
    """(model, adapter or None) vLLM loads: the merged model, or with `adapter` the base
    model (quantized at load) with the trained adapter, what QLoRA trained."""
    if adapter and job.adapter:
        return job.base_model, job.output_dir
    return merged_dir(job), None


def is_merged(host: Host, job: TrainJob) -> bool:
    """Whether merged/ is complete: config.json and every shard of the index (or the one file)."""
    folder = merged_dir(job)
    entries = list_dir(host, folder) or {}

    def present(name: str) -> bool:
        attrs = entries.get(name)
        return attrs is not None and stat.S_ISREG(attrs.st_mode or 0) and (attrs.st_size or 0) > 0

    if not present("config.json"):
        return False
    if present(INDEX):
        try:
            shards = set(json.loads(host.read(f"{folder}/{INDEX}") or b"")["weight_map"].values())
        except (ValueError, TypeError, KeyError, AttributeError):
            return False  # a cut or foreign index: merge again
        return bool(shards) and all(present(str(shard)) for shard in shards)
    return present("model.safetensors")


def _adapter_present(host: Host, job: TrainJob) -> bool:
    entries = list_dir(host, job.output_dir) or {}
    return any(name in entries for name in ADAPTER_WEIGHTS)


def steps(job: TrainJob, poll_s: float = 2.0, timeout_s: float = MERGE_TIMEOUT_S) -> list[Step]:
    """The merge playbook: merge-lora unless merged/ is complete; skipped for full fine-tunes."""
    if job.config.method == "full":
        # One step that reports `skipped` (rather than no step), so the job's events show
        # the merge was considered and not needed.
        return [Step("merge-lora", check=lambda h: True, apply=lambda h: None)]
    handle = job.handle("merge")

    def merge(h: Host) -> None:
        started = time.monotonic()
        current = handle.status(h)
        if current.state is not TrainState.RUNNING:
            if current.state is not TrainState.MISSING:
                handle.remove(h)  # an earlier merge ended without a complete merged/
            handle.start(h, merge_argv(job), "starting axolotl merge-lora", job.secrets_file)
        # else: a merge from an earlier attempt is still running: wait for it.
        # Polls start fast and slow down to poll_s: a small adapter merges in seconds,
        # and the machine is billed for every second spent not noticing.
        wait = min(0.1, poll_s)
        while True:
            current = handle.status(h)
            if current.state is not TrainState.RUNNING:
                break
            if time.monotonic() - started > timeout_s:
                raise StepFailed(f"axolotl merge-lora still running after {timeout_s:.0f}s",
                                 fault=Fault.HOST)
            time.sleep(wait)
            wait = min(wait * 1.5, poll_s)
        _finish(h, current)

    def _finish(h: Host, current: TrainStatus) -> None:
        if current.state is TrainState.MISSING:
            raise StepFailed("the merge run vanished before it ended (removed by someone else?)")
        tail = handle.tail(h, 40)
        handle.remove(h)
        if current.state is not TrainState.SUCCEEDED:
            raise StepFailed(f"axolotl merge-lora failed (exit {current.exit_code}): "
                             f"{last_line(tail)}", stderr=tail)

    result = [] if job.runner == "docker" else [wrapper_step(job)]
    result.append(Step(
        "adapter-present", check=lambda h: _adapter_present(h, job),
        message=f"no trained adapter in {job.output_dir}: training has not finished; "
                "run the training first"))
    result.append(Step("merge-lora", check=lambda h: is_merged(h, job), apply=merge,
                       timeout_s=timeout_s + 300))
    return result
