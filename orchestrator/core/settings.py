"""orch's settings: every `ORCH_*` environment variable, one model read by pydantic-settings.

`settings()` is the one reader: it parses the environment once (again only after an
`ORCH_*` variable changed, as tests do in-process) and every module takes its values from
it. Nothing else in orch reads `os.environ` for an `ORCH_` name; the layers below core
(`providers/`, `playbooks/`) are handed their values as parameters by the engine. A bad value
raises `SettingsError`, one line per variable in one form:
`ORCH_LEASE_S='abc': must be a number of seconds > 0; unset it for the default 60`;
every `orch` command checks the settings first and exits 2 with it.

A blank value is the same as an unset one (the default), except `ORCH_DB_URL`: a team's env
file sourced without `export`, or an `ORCH_DB_URL=` left behind, would otherwise write to the
private SQLite file silently. docs/settings.md is generated from this model
(`python scripts/settings_doc.py`; tests/test_settings.py checks it is current).

The stand-ins of the simulated hosts (`simhost/`) are separate programs: the `SIMHOST_*`
variables orch passes them are their interface, not orch's settings, and are not here.
"""

from __future__ import annotations

import os
import re
from functools import cache
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from playbooks.ssh.limits import COMMAND_TIMEOUT_S, IO_TIMEOUT_S

PREFIX = "ORCH_"

# Defaults owned here. The SSH layer's are its own (playbooks/ssh/limits.py); the engine's
# timings live in runner_core.Options, the watchdog's and the idle grace in their modules
# (tests/test_settings.py checks that the texts below say what those are).
DB_LOCK_WAIT_S = 300.0
SQL_TIMEOUT_S = 30.0
SQL_MAX_ROWS = 10_000

# Engine timings: None is "the engine's default", which differs for jobs on the simulated
# cloud (quicker polls and a shorter lease there).
ENGINE_DEFAULTS = {"poll_s": "5 (0.5 for jobs on the simulated cloud)",
                   "watch_s": "2 (0.5 for jobs on the simulated cloud)",
                   "lease_s": "60 (15 for jobs on the simulated cloud)",
                   "boot_deadline_s": "900"}
STALL_DEFAULTS = {"preparing": "15300 (4 h 15 min)", "training": "7200 (2 h)",
                  "merging": "15300 (4 h 15 min)", "evaluating": "15300 (4 h 15 min)",
                  "releasing": "21600 (6 h)"}

# The deadline contract's check interval (docs/deadline.md, "Parameters").
DEADLINE_CHECK_S = 300.0
# Checkpoints bound the work an interruption loses: the engine aims for one this often.
CHECKPOINT_EVERY_S = 15 * 60.0

SECONDS = "a number of seconds > 0"
SECONDS_OR_ZERO = "a number of seconds >= 0"


def _setting(default: Any, rule: str, default_text: str, description: str,
             section: str) -> Any:
    """A field with what docs/settings.md and the error message say about it."""
    return Field(default, description=description,
                 json_schema_extra={"rule": rule, "default_text": default_text,
                                    "section": section})


Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
SecondsOrZero = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class SettingsError(ValueError):
    """One or more `ORCH_*` variables hold a value orch cannot use; one line for each."""


def _alias(name: str) -> str:
    return PREFIX + name.upper()


class Settings(BaseModel):
    """Every `ORCH_*` variable orch reads (field `lease_s` is `ORCH_LEASE_S`).

    The fields and their rules; pydantic-settings reads them from the environment
    (`_from_environment`). `Settings(ORCH_LEASE_S="90")` validates given values as the
    environment's are."""

    # defer_build: the validator is built on first validation, which a process with no
    # `ORCH_*` variable never asks for (`settings()` takes the defaults as they are).
    model_config = ConfigDict(
        extra="ignore", frozen=True, validate_default=True, defer_build=True,
        alias_generator=AliasGenerator(validation_alias=_alias))

    # --- storage ------------------------------------------------------------------------
    db_url: str | None = _setting(
        None, "a database URL, e.g. postgresql+psycopg://USER@HOST/DB (in a shell script that "
        "sources an env file, `set -a; . FILE; set +a` exports it)",
        "SQLite file $XDG_DATA_HOME/orch/orch.db (~/.local/share/orch/orch.db)",
        "The database orch records everything in: any SQLAlchemy URL, e.g. "
        "`postgresql+psycopg://orch@db.example/orch` for a team sharing one history "
        "(docs/team.md). Set but empty is refused (exit 2), never the private SQLite file.",
        "Storage")
    db_lock_wait_s: Seconds = _setting(
        DB_LOCK_WAIT_S, SECONDS, f"{DB_LOCK_WAIT_S:g}",
        "How long a writer waits for SQLite's write lock in all before it gives up "
        "(DatabaseBusy).", "Storage")
    sql_timeout_s: Seconds = _setting(
        SQL_TIMEOUT_S, SECONDS, f"{SQL_TIMEOUT_S:g}",
        "How long one `orch sql` query may run before it is stopped.", "Storage")
    sql_max_rows: Annotated[int, Field(gt=0)] = _setting(
        SQL_MAX_ROWS, "a whole number of rows > 0", f"{SQL_MAX_ROWS}",
        "How many rows one `orch sql` query may return.", "Storage")

    # --- the engine ---------------------------------------------------------------------
    poll_s: Seconds | None = _setting(
        None, SECONDS, ENGINE_DEFAULTS["poll_s"],
        "How often a worker polls a job's training progress.", "Engine")
    watch_s: Seconds | None = _setting(
        None, SECONDS, ENGINE_DEFAULTS["watch_s"],
        "How often a worker asks the provider whether the instance is still running "
        "(interruption detection).", "Engine")
    lease_s: Seconds | None = _setting(
        None, SECONDS, ENGINE_DEFAULTS["lease_s"],
        "How long a worker's claim on a job lasts without renewal: a worker that died is "
        "taken over this long after its last renewal.", "Engine")
    boot_deadline_s: Seconds | None = _setting(
        None, SECONDS, ENGINE_DEFAULTS["boot_deadline_s"],
        "How long a new instance may take to run with an SSH endpoint.", "Engine")
    idle_grace_s: SecondsOrZero | None = _setting(
        None, SECONDS_OR_ZERO, "600",
        "How long `orch reconcile` keeps the instance of a requeued job for a worker to "
        "adopt before it terminates it.", "Engine")
    stall_preparing_s: Seconds | None = _setting(
        None, SECONDS, STALL_DEFAULTS["preparing"],
        "The watchdog: the longest a job may prepare its host without progress.", "Engine")
    stall_training_s: Seconds | None = _setting(
        None, SECONDS, STALL_DEFAULTS["training"],
        "The watchdog: the longest training may go without a new step.", "Engine")
    stall_merging_s: Seconds | None = _setting(
        None, SECONDS, STALL_DEFAULTS["merging"],
        "The watchdog: the longest the adapter merge may go without progress.", "Engine")
    stall_evaluating_s: Seconds | None = _setting(
        None, SECONDS, STALL_DEFAULTS["evaluating"],
        "The watchdog: the longest the evaluation may go without progress.", "Engine")
    stall_releasing_s: Seconds | None = _setting(
        None, SECONDS, STALL_DEFAULTS["releasing"],
        "The watchdog: the longest copying the outputs back may go without progress.",
        "Engine")
    host_checks: bool = _setting(
        True, "on or off (also 1/0, true/false)", "on",
        "The pre-flight host check of every fresh rental, and of a registered server when "
        "due (docs/hostchecks.md): a rental that fails it is released at once and the job "
        "placed elsewhere; a registered server that fails it fails the job, naming the fix. "
        "Off: both are used unchecked.", "Engine")
    deadline_check_s: Seconds = _setting(
        DEADLINE_CHECK_S, SECONDS, f"{DEADLINE_CHECK_S:g}",
        "How often a running job with `resources.deadline_hours` asks the deadline policy "
        "again (docs/deadline.md); also its margin for a move to on-demand.", "Engine")
    checkpoint_every_s: Seconds = _setting(
        CHECKPOINT_EVERY_S, SECONDS, f"{CHECKPOINT_EVERY_S:g}",
        "How often training saves a checkpoint (the trainer's `save_steps`, from the "
        "estimated training time): the most work a preemption loses. On spot, orch "
        "checkpoints more often where Young's interval for the GPU's preemption rate and "
        "the job's checkpoint is shorter, never under a minute unless this is "
        "(docs/deadline.md).", "Engine")

    # --- SSH ----------------------------------------------------------------------------
    ssh_command_timeout_s: Seconds = _setting(
        COMMAND_TIMEOUT_S, SECONDS, f"{COMMAND_TIMEOUT_S:g}",
        "How long a remote command may run when its caller gives no timeout of its own.",
        "SSH")
    ssh_io_timeout_s: Seconds = _setting(
        IO_TIMEOUT_S, SECONDS, f"{IO_TIMEOUT_S:g}",
        "How long each SFTP reply may take (playbooks also cap it by the step's remaining "
        "time).", "SSH")

    # --- providers ----------------------------------------------------------------------
    vastai_url: str | None = _setting(
        None, "a URL", "(Vast.ai's own API)", "Vast.ai's API base URL (an emulator's, in "
        "tests).", "Providers")
    runpod_url: str | None = _setting(
        None, "a URL", "(RunPod's own API)", "RunPod's API base URL (an emulator's, in tests).",
        "Providers")

    datasets_server_url: str | None = _setting(
        None, "an http(s) URL", "https://datasets-server.huggingface.co (asked only when the "
        "Hub is huggingface.co)", "The Hugging Face dataset viewer's base URL, asked for a Hub "
        "dataset's rows and bytes when its card lists none (an emulator's, in tests).",
        "Providers")

    # --- notifications --------------------------------------------------------------------
    notify_url: str | None = _setting(
        None, "an http(s) URL", "(none)", "A webhook every job's events are POSTed to, besides "
        "the job file's `notify:` targets (docs/integrations.md): the Standard Webhooks "
        "payload, or Slack's message when the host is hooks.slack.com.", "Notifications")
    notify_secret_env: str | None = _setting(
        None, "an environment variable's name (letters, digits, _)", "(unsigned)",
        "The variable holding ORCH_NOTIFY_URL's signing secret (whsec_ + base64): each POST "
        "is then signed as the Standard Webhooks spec says.", "Notifications")

    # --- the simulated cloud --------------------------------------------------------------
    sim_boot_s: SecondsOrZero = _setting(
        0.0, SECONDS_OR_ZERO, "0", "Seconds until a simulated instance runs.", "Simulated cloud")
    sim_preempt_after_s: Seconds | None = _setting(
        None, SECONDS, "(never)", "Simulated spot instances are preempted this long after they "
        "are created.", "Simulated cloud")
    sim_capacity: str = _setting(
        "", "GPU=COUNT pairs separated by commas, e.g. 'RTX 3090=0,H100 PCIe=2'",
        "(no limit)", "Live simulated instances allowed per GPU model.", "Simulated cloud")
    sim_train_steps: Annotated[int, Field(gt=0)] | None = _setting(
        None, "a whole number of steps > 0", "(the stand-in trainer's own)",
        "How many steps the stand-in trainer runs.", "Simulated cloud")
    sim_step_s: Seconds | None = _setting(
        None, SECONDS, "(the stand-in trainer's own)", "Seconds each stand-in training step "
        "takes.", "Simulated cloud")
    sim_model_bytes: Annotated[int, Field(gt=0)] | None = _setting(
        None, "a whole number of bytes > 0", "(the stand-in's own)",
        "The base model's size on the simulated hosts.", "Simulated cloud")
    sim_download_bps: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = _setting(
        None, "a number of bytes per second > 0", "(the stand-in's own)",
        "The simulated hosts' download rate: `hf download` of the base model takes "
        "model bytes / this.", "Simulated cloud")
    sim_market: str = _setting(
        "", "key=value pairs, e.g. 'seed=7,bad=0.2,kinds=slow_gpu+no_hub,machines=10,"
        "offers=model' (offers=machine: one offer per machine)", "(every machine good)",
        "The simulated cloud as a marketplace with bad machines (docs/hostchecks.md, "
        "providers/sim/market.yaml): the seed, the bad fraction of each GPU model's machines, "
        "their faults, how many machines per model, and whether offers name the machine.",
        "Simulated cloud")
    sim_spot_regime: Literal["calm", "bursty", "heavy"] | None = _setting(
        None, "calm, bursty or heavy", "(no market: spot always available)",
        "The simulated cloud's spot market (providers/sim/spot_regimes.yaml, docs/deadline.md):"
        " a seeded trace per GPU model says when its spot offers are gone and when a spot "
        "instance is preempted.", "Simulated cloud")
    sim_spot_seed: Annotated[int, Field(ge=0)] = _setting(
        0, "a whole number >= 0", "0", "The seed of the simulated spot market's traces.",
        "Simulated cloud")
    sim_spot_seconds_per_hour: Seconds = _setting(
        3600.0, SECONDS, "3600", "Wall seconds per hour of the simulated spot market's trace "
        "(48: a trace hour in 48 s, as bench/deadline.py runs it).", "Simulated cloud")

    # --- diagnostics and test hooks -------------------------------------------------------
    debug: bool = _setting(
        False, "any text (set: on)", "(off)", "Any value: an internal error shows its "
        "traceback instead of one line.", "Diagnostics")
    failpoint: str | None = _setting(
        None, "a failpoint name", "(none)", "Test hook (the crash tests): the process kills "
        "itself with SIGKILL at this point: after-create, training, merging, evaluating, "
        "releasing, after-terminate, after-park, after-take, warm-ending, sweep-proposed, "
        "sweep-queued, pruned-decided, pruned, host-check (after the host check's first "
        "step), move-decided, move-released, move-placed.", "Diagnostics")

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        if value.strip() or info.field_name == "db_url":
            return value.strip()
        field = cls.model_fields[info.field_name or ""]
        return field.get_default(call_default_factory=True)

    @field_validator("db_url")
    @classmethod
    def _db_url_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("blank")
        return value

    @field_validator("debug", mode="before")
    @classmethod
    def _any_text_is_on(cls, value: Any) -> Any:
        return bool(value.strip()) if isinstance(value, str) else value

    @field_validator("notify_url", "datasets_server_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        parts = urlsplit(value or "")
        if value is not None and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError("not an http(s) URL")
        return value

    @field_validator("notify_secret_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", value):
            raise ValueError("not a variable name")
        return value

    @field_validator("sim_market")
    @classmethod
    def _market(cls, value: str) -> str:
        if value:  # the default (every machine good) needs no parse, nor the sim's module
            from providers.sim.market import Market

            Market.parse(value)
        return value

    @field_validator("sim_capacity")
    @classmethod
    def _gpu_counts(cls, value: str) -> str:
        capacity_by_gpu(value)
        return value

    def stall_deadlines(self) -> dict[str, float]:
        """The watchdog's deadlines that are set, by phase (the others keep their default)."""
        found = {phase: getattr(self, f"stall_{phase}_s") for phase in STALL_DEFAULTS}
        return {phase: value for phase, value in found.items() if value is not None}

    def api_url(self, provider: str) -> str | None:
        """The API base URL set for `provider` (vastai, runpod), or None for its own."""
        value = getattr(self, f"{provider}_url", None)
        return value if isinstance(value, str) else None

    def sim_capacity_by_gpu(self) -> dict[str, int]:
        """ORCH_SIM_CAPACITY as {GPU model: live instances allowed}."""
        return capacity_by_gpu(self.sim_capacity)


def capacity_by_gpu(text: str) -> dict[str, int]:
    """'RTX 3090=0,H100 PCIe=2' as {'RTX 3090': 0, 'H100 PCIe': 2}; ValueError if malformed."""
    capacity: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        gpu, sep, count = part.rpartition("=")
        if not sep or not gpu.strip() or not count.strip().isdigit():
            raise ValueError(f"{part!r} is not GPU=COUNT")
        capacity[gpu.strip()] = int(count)
    return capacity


def env_name(field: str) -> str:
    """The variable of a field: `lease_s` is ORCH_LEASE_S."""
    return PREFIX + field.upper()


def _message(error: Any) -> str:
    """One line in the one form: NAME='value': must be RULE; unset it for the default D."""
    name = str(error["loc"][0]) if error.get("loc") else "?"
    field = Settings.model_fields.get(name.removeprefix(PREFIX).lower())
    extra = field.json_schema_extra if field is not None else None
    info = extra if isinstance(extra, dict) else {}
    raw = error.get("input")
    shown = repr(raw) if isinstance(raw, str) else repr(str(raw))
    return (f"{name}={shown}: must be {info.get('rule', 'valid')}; unset it for the default "
            f"{info.get('default_text', '')}").rstrip()


@cache
def _from_environment() -> type[Settings]:
    """`Settings` read from the environment by pydantic-settings (the environment only, and
    keyword arguments for tests: no .env or secrets files).

    Built on first use: importing pydantic-settings (asyncio, argparse, its cloud secret
    sources) and building this class cost about a sixth of `orch plan`'s start-up
    (bench/startup.py), and with no `ORCH_*` variable set there is nothing for it to read:
    `settings()` then takes the fields' defaults, validated by the same model."""
    from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

    class FromEnvironment(BaseSettings, Settings):
        model_config = SettingsConfigDict(
            case_sensitive=True, extra="ignore", frozen=True, validate_default=True,
            alias_generator=AliasGenerator(validation_alias=_alias))

        @classmethod
        def settings_customise_sources(
                cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                env_settings: PydanticBaseSettingsSource,
                dotenv_settings: PydanticBaseSettingsSource,
                file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings

    return FromEnvironment


_cache: tuple[tuple[tuple[str, str], ...], Settings] | None = None


def defaults() -> Settings:
    """The settings of a process with no `ORCH_*` variable: every field's default, taken as
    written (tests/test_settings.py checks they equal the validated `Settings()`, type and
    value), so that most commands never build the model's validator (a tenth of `orch
    plan`'s start-up)."""
    return Settings.model_construct()


def settings() -> Settings:
    """orch's settings from this process's environment, parsed once (and again only after an
    ORCH_* variable changed); SettingsError names each bad variable."""
    global _cache
    ours = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX)))
    if _cache is None or _cache[0] != ours:
        try:
            _cache = (ours, _from_environment()() if ours else defaults())
        except ValidationError as exc:
            raise SettingsError("\n".join(_message(e) for e in exc.errors())) from None
    return _cache[1]
