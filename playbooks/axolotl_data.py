"""The axolotl config's data and tracking keys (pure; plain values, no orchestrator import).

Datasets: each entry is one of axolotl 0.18.0's `SFTDataset`s (src/axolotl/utils/schemas/
datasets.py:39-202): `path` (a file or a directory on the host), `split` (datasets.py:48-51),
`name` (the subset: datasets.py:93-96), `type` and the format's column keys, `field`
(completion, datasets.py:101-106), `field_messages` (datasets.py:109-114) and
`message_property_mappings` (datasets.py:137-142; it replaces the deprecated
`message_field_role`/`message_field_content`, datasets.py:133-136, utils.py
`handle_legacy_message_fields_logic`). A Hub dataset is downloaded on the host first
(`playbooks/dataset_cache.py`), so `path` is always local and axolotl never asks the Hub
(shared.py:179-180 loads an existing path before any Hub lookup; a directory goes to
`load_dataset(dir, name=, split=)`, shared.py:290-301).

Tracking (utils/schemas/integrations.py:12-30 `MLFlowConfig`, 50-89 `WandbConfig`): axolotl
copies every `wandb_*` and `mlflow_*` key into the environment upper-cased (utils/wandb_.py,
utils/mlflow_.py), so `wandb_run_id` becomes `WANDB_RUN_ID`, the id W&B gives the run, and
orch knows the run's URL before it starts. `use_wandb`/`use_mlflow` turn the HF Trainer's
reporting on (core/builders/base.py:527-539); the run name is `wandb_name` (or
`mlflow_run_name`), base.py:541-548.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

DatasetFormat = Literal["alpaca", "chat_template", "completion", "input_output"]

# The secrets a tracker reads from the trainer's environment: they reach the host the way
# HF_TOKEN does (the job's 0600 secrets.env, `docker run -e NAME`), never a config or argv.
TRACKER_SECRETS = ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
                   "MLFLOW_TRACKING_PASSWORD", "DATABRICKS_TOKEN")
# Not secret, but read from the environment only (no axolotl key): W&B resumes the run with
# the same id after a preemption instead of refusing a second run of that id (W&B docs,
# "Resume a run": allow = resume if the id exists, else create it).
WANDB_RESUME = ("WANDB_RESUME", "allow")


class DatasetEntry(NamedTuple):
    """One training (or eval) dataset as axolotl reads it on the host."""

    path: str  # inside the container (or the host path for a native run)
    format: DatasetFormat = "alpaca"
    split: str | None = None  # None: axolotl's default (train for a single file)
    subset: str | None = None
    text_field: str | None = None  # completion: the raw text column
    messages_field: str | None = None  # chat_template
    role_key: str | None = None
    content_key: str | None = None


def dataset_keys(e: DatasetEntry) -> dict[str, Any]:
    """One `datasets:` (or `test_datasets:`) item of the axolotl config."""
    out: dict[str, Any] = {"path": e.path, "type": e.format}
    if e.split is not None:
        out["split"] = e.split
    if e.subset is not None:
        out["name"] = e.subset
    if e.format == "completion" and e.text_field not in (None, "text"):
        out["field"] = e.text_field
    if e.format == "chat_template":
        out["field_messages"] = e.messages_field or "messages"
        mapping = {"role": e.role_key or "role", "content": e.content_key or "content"}
        if mapping != {"role": "role", "content": "content"}:
            out["message_property_mappings"] = mapping
    return out


class TrackerKeys(NamedTuple):
    """The trackers a run reports to (None: not used)."""

    wandb_project: str | None = None
    wandb_entity: str | None = None
    wandb_name: str | None = None
    wandb_run_id: str | None = None
    wandb_mode: str | None = None  # online | offline | disabled
    mlflow_tracking_uri: str | None = None
    mlflow_experiment_name: str | None = None
    mlflow_run_name: str | None = None


# Keys orch writes from `tracking:` (axolotl key -> job-file field): `trainer.extra` may not
# replace them (`axolotl.extra_clash`).
TRACKER_FIELDS = {
    "use_wandb": "tracking.wandb", "wandb_project": "tracking.wandb.project",
    "wandb_entity": "tracking.wandb.entity", "wandb_name": "tracking.wandb.name",
    "wandb_run_id": "tracking.wandb (orch names the run after the job)",
    "wandb_mode": "tracking.wandb.mode", "use_mlflow": "tracking.mlflow",
    "mlflow_tracking_uri": "tracking.mlflow.tracking_uri",
    "mlflow_experiment_name": "tracking.mlflow.experiment",
    "mlflow_run_name": "tracking.mlflow.run_name",
}


def tracker_keys(t: TrackerKeys) -> dict[str, Any]:
    """The axolotl keys that make the run report to W&B and/or MLflow."""
    out: dict[str, Any] = {}
    if t.wandb_project is not None:
        out["use_wandb"] = True
        for key in ("wandb_project", "wandb_entity", "wandb_name", "wandb_run_id",
                    "wandb_mode"):
            if getattr(t, key) is not None:
                out[key] = getattr(t, key)
    if t.mlflow_tracking_uri is not None:
        # axolotl turns MLflow on only with an experiment name (utils/mlflow_.py): say so.
        out["use_mlflow"] = True
        for key in ("mlflow_tracking_uri", "mlflow_experiment_name", "mlflow_run_name"):
            if getattr(t, key) is not None:
                out[key] = getattr(t, key)
    return out
