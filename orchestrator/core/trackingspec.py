"""`tracking:` in the job file (W&B, MLflow), what it needs before renting, and the run's URL.

Pure: the engine gives the names of the environment variables that are set (never their
values, except where a check needs one: none here) and the job's id; `axolotl_data`
renders the keys. The run is named after the orch job unless the file names it, and its W&B
id is the orch job id, so a re-placed job resumes the same run (`WANDB_RESUME=allow`) and the
URL is known before training starts: `https://wandb.ai/ENTITY/PROJECT/runs/ID` (W&B's run
page; `WANDB_BASE_URL` for a self-hosted server). MLflow gives its run an id of its own; its
page is `TRACKING_URI/#/experiments/EXPERIMENT_ID/runs/RUN_ID` (the MLflow UI's routes), found
after the run starts by searching the experiment for the run name (phase B).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from orchestrator.core.strictmodel import Strict
from playbooks.axolotl_data import WANDB_RESUME, TrackerKeys

WANDB_KEYS_PAGE = "https://wandb.ai/authorize"
WANDB_DEFAULT_BASE = "https://wandb.ai"
# W&B refuses these in entity and project names (its "invalid characters" check).
_WANDB_NAME = re.compile(r"^[^/\\#?%:]{1,128}$")
_RUN_ID_BAD = re.compile(r"[^A-Za-z0-9_-]")


def _wandb_name(value: str) -> str:
    if not _WANDB_NAME.fullmatch(value):
        raise ValueError(f"{value!r}: W&B names are 1-128 characters without / \\ # ? % :")
    return value


WandbName = Annotated[str, AfterValidator(_wandb_name)]


class WandbSpec(Strict):
    """Weights & Biases: the run reports its loss and learning rate there."""

    project: WandbName = Field(examples=["llama-finetunes"],
                               description="The W&B project (created on first use).")
    entity: WandbName | None = Field(
        default=None, examples=["my-team"],
        description="The W&B team or user; default: the API key's default entity.")
    name: str | None = Field(default=None, min_length=1, max_length=128,
                             examples=["alpaca-r16"],
                             description="The run's display name; default: the orch job's "
                                         "name.")
    mode: Literal["online", "offline", "disabled"] = Field(
        default="online", examples=["online"],
        description="`online` (needs `WANDB_API_KEY`), `offline` (logged on the GPU host "
                    "only: lost with a rental) or `disabled`.")


def _tracking_uri(value: str) -> str:
    if value == "databricks" or value.startswith("databricks://"):
        return value
    parts = urlsplit(value)
    if parts.scheme in ("http", "https") and parts.hostname:
        if parts.username or parts.password:
            raise ValueError("do not put credentials in the URI (they would be stored with "
                             "the job): set MLFLOW_TRACKING_USERNAME and "
                             "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN")
        return value.rstrip("/")
    raise ValueError(f"{value!r}: give the MLflow tracking server's http(s) URL (or "
                     "databricks); a file path would be on the GPU host, lost with it")


class MlflowSpec(Strict):
    """MLflow: the run is logged to a tracking server."""

    tracking_uri: Annotated[str, AfterValidator(_tracking_uri)] = Field(
        examples=["https://mlflow.example.com"],
        description="The tracking server's http(s) URL, or `databricks`.")
    experiment: str | None = Field(default=None, min_length=1, examples=["llama-finetunes"],
                                   description="The experiment (created on first use); "
                                               "default: the server's default experiment.")
    run_name: str | None = Field(default=None, min_length=1, examples=["alpaca-r16"],
                                 description="The run's name; default: the orch job's name.")


class TrackingSpec(Strict):
    """Where the training run is logged, besides orch's own records."""

    wandb: WandbSpec | None = Field(default=None,
                                    examples=[{"project": "llama-finetunes"}],
                                    description="Weights & Biases (`WANDB_API_KEY`).")
    mlflow: MlflowSpec | None = Field(
        default=None, examples=[{"tracking_uri": "https://mlflow.example.com"}],
        description="An MLflow tracking server (`MLFLOW_TRACKING_TOKEN`, or "
                    "`MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD`, when it asks "
                    "for credentials).")

    @model_validator(mode="after")
    def _something(self) -> TrackingSpec:
        if self.wandb is None and self.mlflow is None:
            raise ValueError("name a tracker (wandb or mlflow), or remove tracking")
        return self


def run_id(job_id: str) -> str:
    """The W&B run id of an orch job (letters, digits, `-`, `_`; at most 64)."""
    return _RUN_ID_BAD.sub("-", job_id)[:64]


def tracker_keys(t: TrackingSpec | None, job_name: str, job_id: str) -> TrackerKeys | None:
    """The axolotl tracker keys of a job (None: no tracking)."""
    if t is None:
        return None
    w, m = t.wandb, t.mlflow
    return TrackerKeys(
        wandb_project=None if w is None else w.project,
        wandb_entity=None if w is None else w.entity,
        wandb_name=None if w is None else w.name or job_name,
        wandb_run_id=None if w is None else run_id(job_id),
        wandb_mode=None if w is None or w.mode == "online" else w.mode,
        mlflow_tracking_uri=None if m is None else m.tracking_uri,
        mlflow_experiment_name=None if m is None else m.experiment,
        mlflow_run_name=None if m is None else m.run_name or job_name)


def env_problems(t: TrackingSpec | None, present: Collection[str]) -> list[str]:
    """What the job lacks to log where `tracking:` says, given the names of the environment
    variables set where orch runs: each problem names the field and what to set."""
    found: list[str] = []
    if t is None:
        return found
    if t.wandb is not None and t.wandb.mode == "online" and "WANDB_API_KEY" not in present:
        found.append(f"tracking.wandb: W&B needs WANDB_API_KEY in the environment of the orch "
                     f"process that runs the job (your key: {WANDB_KEYS_PAGE}); or set "
                     "tracking.wandb.mode: offline")
    if t.mlflow is not None:
        uri = t.mlflow.tracking_uri
        if uri.startswith("databricks"):
            missing = [n for n in ("DATABRICKS_HOST", "DATABRICKS_TOKEN") if n not in present]
            if missing:
                found.append(f"tracking.mlflow.tracking_uri: {uri} needs {' and '.join(missing)}"
                             " in the environment of the orch process that runs the job")
        elif ("MLFLOW_TRACKING_USERNAME" in present) != ("MLFLOW_TRACKING_PASSWORD" in present):
            have, lack = (("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
                          if "MLFLOW_TRACKING_USERNAME" in present
                          else ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME"))
            found.append(f"tracking.mlflow: {have} is set without {lack}; set both (or "
                         "MLFLOW_TRACKING_TOKEN)")
    return found


def mlflow_auth_problem(status: int, has_credentials: bool) -> str | None:
    """What an MLflow server's answer to an unauthenticated (or authenticated) request says
    is missing: 401/403 mean the server wants credentials (MLflow's basic-auth app answers
    401 without them, 403 for a user without permission)."""
    if status == 401:
        what = ("rejected the credentials" if has_credentials
                else "asks for credentials and none are set")
        return (f"tracking.mlflow.tracking_uri: the server {what}: set MLFLOW_TRACKING_TOKEN, "
                "or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
    if status == 403:
        return ("tracking.mlflow: the server refused the credentials access (403): give the "
                "account permission on the experiment, or use another account")
    return None


def trainer_env(t: TrackingSpec | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the trainer gets for `tracking:` (secrets included: they go to the host's
    0600 env file only), taken from `environ` where orch runs."""
    if t is None:
        return {}
    names: list[str] = []
    if t.wandb is not None:
        names += ["WANDB_API_KEY", "WANDB_BASE_URL"]
    if t.mlflow is not None:
        names += ["MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
                  "MLFLOW_TRACKING_PASSWORD", "DATABRICKS_HOST", "DATABRICKS_TOKEN"]
    out = {n: environ[n] for n in names if environ.get(n)}
    if t.wandb is not None:
        out[WANDB_RESUME[0]] = WANDB_RESUME[1]
    return out


def wandb_run_url(project: str, run: str, entity: str | None,
                  base_url: str | None = None) -> str | None:
    """The W&B run page (None while the entity is unknown: the API key's default entity is
    asked of W&B by the engine)."""
    if entity is None:
        return None
    base = (base_url or WANDB_DEFAULT_BASE).rstrip("/")
    if base == "https://api.wandb.ai":  # the API host serves no pages
        base = WANDB_DEFAULT_BASE
    return f"{base}/{entity}/{project}/runs/{run}"


def mlflow_run_url(tracking_uri: str, experiment_id: str, run: str | None = None) -> str:
    """The MLflow UI page of a run (or of its experiment while the run id is unknown)."""
    base = f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}"
    return base if run is None else f"{base}/runs/{run}"
