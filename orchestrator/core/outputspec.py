"""The job file's `output:` section: what the job delivers and where (issue 19 §2).

The field descriptions are the documentation (docs/job-file.md is generated from them);
`output_problems` is what `spec.resolve` checks once the model's size is known.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from orchestrator.core.strictmodel import Strict
from playbooks.hfrepo import repo_id_problem


def _hub_repo(value: str) -> str:
    problem = repo_id_problem(value)
    if problem is not None:
        raise ValueError(problem + " (e.g. my-org/llama31-8b-support)")
    if "/" not in value:
        raise ValueError(f"{value!r} has no owner: give ORG/NAME (your user or organisation)")
    return value


# A merged model above this size is not copied to the machine running orch unless the job
# says `output.local: true` (a merged 70B model is ~140 GB).
LOCAL_MERGED_LIMIT_BYTES = 20 * 10**9


class OutputSpec(Strict):
    merged: bool = Field(
        default=False, examples=[True],
        description="Keep the base model with the adapter merged in (LoRA/QLoRA), as well as "
                    "the adapter. Its size is the base model's in bf16 (~2 bytes a "
                    "parameter): `orch plan` shows it with the delivery's time and cost.")
    local: bool | None = Field(
        default=None, examples=[True],
        description="Copy the results into orch's artifacts directory on this machine. "
                    "Unset: the adapter always comes back, a merged model only when it is "
                    "under 20 GB and no `push_to_hub` takes it; `true`: everything; "
                    "`false`: nothing (the results go to `push_to_hub` only). On a monthly "
                    "or registered server the job's outputs (checkpoints, adapter, merged "
                    "model) also stay on its disk; `orch show` says where.")
    push_to_hub: Annotated[str, AfterValidator(_hub_repo)] | None = Field(
        default=None, examples=["my-org/llama31-8b-support"],
        description="Upload the result (the merged model with `merged: true`, else the "
                    "adapter) to this Hugging Face repo from the GPU host with `hf upload`, "
                    "using `HF_TOKEN` (a write token); the repo is created if missing.")
    private: bool = Field(
        default=True, examples=[False],
        description="Create the `push_to_hub` repo private (set `false` for a public one).")

    def merged_local(self) -> bool:
        """Whether the merged model is copied to this machine (see `local`)."""
        if not self.merged or self.local is False:
            return False
        return self.local is True or self.push_to_hub is None


def output_problems(out: OutputSpec, method: str,
                    params: int | None) -> list[tuple[tuple[str | int, ...], str]]:
    """What `output` asks must be deliverable: something to merge, somewhere to put it
    ((field location, problem) pairs; `params`: the base model's, when known)."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    if out.merged and method == "full":
        found.append((("output", "merged"), "a full fine-tune has no adapter to merge: its "
                      "weights are the model; remove output.merged"))
    if out.local is False and out.push_to_hub is None:
        found.append((("output", "local"), "with local: false and no push_to_hub the results "
                      "would go nowhere: set output.push_to_hub or drop local: false"))
    if (out.merged and params is not None and out.local is None and out.push_to_hub is None
            and params * 2 > LOCAL_MERGED_LIMIT_BYTES):
        found.append((("output", "merged"), f"the merged model is ~{params * 2 / 1e9:.0f} GB: "
                      "say where it goes: output.push_to_hub: ORG/NAME, or output.local: true "
                      "to copy it to this machine"))
    return found
