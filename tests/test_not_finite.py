"""A run whose loss is not a number (a diverged run's `nan`) through the product.

A learning rate two decades past the landscape's best diverges on the simulated host: from
a tenth of its steps the stand-in trainer logs what transformers logs then (`'loss': 0.0`
beside `'grad_norm': nan`, `'eval_loss': nan`; docs/sim-landscape.md). Before orch stored
such values as NULL, the first `nan` metric failed the poll that read it (SQLite's REAL holds
no NaN; the column was NOT NULL) and an event's bare `NaN` broke every json_extract query a
user ran over the events.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orchfork
import pytest
import test_engine_crash as crash
from emulators.webhook import WebhookReceiver
from termutil import ROOT
from test_engine_crash import env
from test_show_estimates import orch

__all__ = ["env"]

STEPS = 20


def _env(xdg: Path, steps: int) -> dict[str, str]:
    """A fresh history, and the simulated trainer's `steps` of 0.2 s polled every 0.1 s."""
    env = {**os.environ, "XDG_DATA_HOME": str(xdg), "ORCH_SIM_TRAIN_STEPS": str(steps),
           "ORCH_SIM_STEP_S": "0.2", "ORCH_POLL_S": "0.1"}
    for name in ("ORCH_DB_URL", "NO_COLOR", "COLUMNS"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def diverged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    env = _env(tmp_path_factory.mktemp("xdg"), STEPS)
    folder = tmp_path_factory.mktemp("job")
    text = (ROOT / "examples" / "quickstart.yml").read_text()
    # stop_on_nan: false, to see what a run that trains on to its end records.
    text = text.replace("learning_rate: 2.0e-4", "learning_rate: 5.0e-2\n  val_set_size: 0.1"
                        "\n  stop_on_nan: false")
    text += "trainer: {extra: {eval_steps: 4}}\n"
    (folder / "data").symlink_to(ROOT / "examples" / "data")
    with WebhookReceiver() as hook:
        (folder / "job.yml").write_text(text + f"notify: {{url: '{hook.url}/orch'}}\n")
        done = orch(env, "submit", str(folder / "job.yml"))
        job_id = json.loads(orch(env, "jobs", "--json").stdout)[0]["job_id"]
        db = next(Path(env["XDG_DATA_HOME"]).rglob("*.db"))
        yield {"env": env, "id": job_id, "db": db, "hook": [r.json() for r in hook.delivered()],
               "shown": done.stdout + done.stderr}


def _rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as con:  # the user's own sqlite3, as docs/schema.md shows
        return con.execute(sql, params).fetchall()


def test_a_diverged_run_trains_on_and_its_nan_is_null(diverged: dict[str, Any]) -> None:
    db, job_id = diverged["db"], diverged["id"]
    shown = json.loads(orch(diverged["env"], "show", job_id, "--json").stdout)
    assert shown["status"] == "succeeded", shown  # orch says so; it does not stop the run
    # Every event is JSON SQLite reads; the progress events' `nan` losses are null.
    assert _rows(db, "SELECT count(*) FROM event WHERE data_json IS NOT NULL "
                     "AND json_valid(data_json) = 0") == [(0,)]
    losses = _rows(db, "SELECT json_extract(data_json, '$.step'), "
                       "json_extract(data_json, '$.loss') FROM event "
                       "WHERE job_id = ? AND kind = 'train.progress'", job_id)
    assert losses and all(loss is None for step, loss in losses if step >= 2)
    # One row per step; a `nan` one is NULL, the step before the divergence is a number.
    train = _rows(db, "SELECT step, value FROM metric WHERE job_id = ? AND name = "
                      "'train.loss' ORDER BY step", job_id)
    assert [s for s, _ in train] == list(range(1, STEPS + 1))
    assert train[0][1] is not None and all(v is None for _, v in train[1:])
    evals = _rows(db, "SELECT step, value FROM metric WHERE job_id = ? AND name = "
                      "'train.eval_loss' ORDER BY step IS NULL, step", job_id)
    assert evals == [(4, None), (8, None), (12, None), (16, None), (20, None), (None, None)]
    # Said once per metric, as soon as it was seen, with what to do.
    told = _rows(db, "SELECT json_extract(data_json, '$.metric'), "
                     "json_extract(data_json, '$.step'), message FROM event "
                     "WHERE job_id = ? AND kind = 'train.not_finite' ORDER BY id", job_id)
    assert [(m, s) for m, s, _ in told] == [("train.loss", 2), ("train.eval_loss", 4)]
    assert "diverged" in told[0][2] and f"orch cancel {job_id}" in told[0][2]
    assert "it trains on" in told[0][2]
    # ... and sent to the job's `notify:` target as it happened, before the job's end.
    sent = diverged["hook"]
    assert [e["type"] for e in sent] == ["train.not_finite", "train.not_finite",
                                         "job.succeeded"]
    assert {k: sent[0]["data"][k] for k in ("job_id", "metric", "step", "value")} == {
        "job_id": job_id, "metric": "train.loss", "step": 2, "value": "nan"}
    assert sent[0]["data"].get("stops_after") is None  # stop_on_nan: false
    # The webhook's event is the one shown where the job runs, too.
    assert "training: train.loss is nan at step 2: the run has likely diverged" in (
        diverged["shown"])
    # A `nan` read at every poll (a new NaN each time, never equal to the last) is reported
    # once: one progress event per step, and no metric row written twice (an upsert deletes
    # and inserts, so a second write would leave a gap in the ids).
    assert len(losses) <= STEPS + 1
    assert _rows(db, "SELECT max(id), count(*) FROM metric") == [(len(train) + len(evals) + 3,
                                                                   len(train) + len(evals) + 3)]


def test_show_draws_a_diverged_runs_curve(diverged: dict[str, Any]) -> None:
    env = {**diverged["env"], "COLUMNS": "120"}
    text = orch(env, "show", diverged["id"]).stdout
    line = next(x for x in text.splitlines() if x.strip().startswith("train loss:"))
    assert "-> nan (min " in line and "(min nan)" not in line
    assert "train.loss is nan at step 2: the run has likely diverged" in orch(
        env, "logs", diverged["id"]).stdout


def test_a_takeover_does_not_say_it_again(env: dict[str, str]) -> None:
    # kill -9 of the worker after it said the loss was `nan`; the next worker reads the same
    # trainer's log, `nan` steps included, and finds it said already (the events, not its
    # memory): still one `train.not_finite` per metric.
    env.update(ORCH_SIM_TRAIN_STEPS="40", ORCH_SIM_STEP_S="0.25")
    folder = Path(env["XDG_DATA_HOME"]).parent / "jobs"
    folder.mkdir()
    path = folder / "job.yml"
    path.write_text((ROOT / "examples" / "quickstart.yml").read_text()
                    .replace("data/", str(ROOT / "examples" / "data") + "/")
                    .replace("learning_rate: 2.0e-4",
                             "learning_rate: 5.0e-2\n  stop_on_nan: false"))
    job_id = json.loads(crash.orch(env, "submit", str(path), "--detach", "--json").stdout)[
        "job_id"]

    def told() -> list[tuple[Any, ...]]:
        return crash.query(env, "SELECT json_extract(data_json, '$.metric') FROM event "
                                "WHERE job_id = ? AND kind = 'train.not_finite'", job_id)

    first = crash.spawn(env, "worker", "--once")
    try:
        crash.wait_for(told, what="the nan said")
        first.kill()  # SIGKILL: no teardown, the trainer goes on
        first.wait(timeout=30)
    finally:
        first.kill()
    crash.lease_lapsed(env)
    second = crash.spawn(env, "worker", "--once")
    try:
        second.wait(timeout=180)
    finally:
        second.kill()
    assert second.returncode == 0
    assert crash.status(env, job_id) == "succeeded"
    # taken over on the same machine: connected twice, one instance
    assert crash.query(env, "SELECT count(*) >= 2 FROM event WHERE job_id = ? AND kind = "
                            "'connected'", job_id) == [(1,)]
    assert crash.query(env, "SELECT count(*) FROM instance WHERE job_id = ?", job_id) == [(1,)]
    assert told() == [("train.loss",)]
    assert crash.live_instances(env) == []


def test_a_diverged_run_is_stopped_after_three_nan_logs(tmp_path: Path) -> None:
    # The default (training.stop_on_nan): three logged steps in a row with a `nan` training
    # loss (steps 6, 7, 8 here: the stand-in diverges from step 6 and logs every step) stop
    # the job, failed, its machine terminated, the target told; the steps after are never
    # paid for.
    steps = 60  # 12 s of training: a slow first poll still finds it running
    env = _env(tmp_path / "xdg", steps)
    (tmp_path / "data").symlink_to(ROOT / "examples" / "data")
    text = (ROOT / "examples" / "quickstart.yml").read_text().replace(
        "learning_rate: 2.0e-4", "learning_rate: 5.0e-2")
    with WebhookReceiver() as hook:
        (tmp_path / "job.yml").write_text(text + f"notify: {{url: '{hook.url}/orch'}}\n")
        done = orchfork.run(["submit", str(tmp_path / "job.yml")], env=env, cwd=ROOT,
                            timeout=300)
        sent = [r.json() for r in hook.delivered()]
    assert done.returncode != 0
    shown = json.loads(orch(env, "jobs", "--json").stdout)[0]
    job_id = shown["job_id"]
    assert shown["status"] == "failed", shown
    job = json.loads(orch(env, "show", job_id, "--json").stdout)
    assert job["failure_reason"].startswith(
        "diverged: train.loss was nan at every logged step from step "), job
    assert "training.stop_on_nan: false" in job["failure_reason"]
    db = next(Path(env["XDG_DATA_HOME"]).rglob("*.db"))
    # Stopped at the third `nan` log, not trained on to its last step (a poll may have read
    # a few steps more at once).
    last = _rows(db, "SELECT max(step) FROM metric WHERE job_id = ? AND name = 'train.loss'",
                 job_id)[0][0]
    first = _rows(db, "SELECT min(step) FROM metric WHERE job_id = ? AND name = 'train.loss' "
                      "AND value IS NULL", job_id)[0][0]
    assert first == steps // 10  # the stand-in diverges at a tenth of its steps
    assert first + 2 <= last < steps, last
    # From the first `nan` to the newest step read (the third unless a poll read more).
    assert (f"from step {first} to step {last} ({last - first + 1} logs)"
            in job["failure_reason"])
    assert _rows(db, "SELECT count(*) FROM instance WHERE job_id = ? AND terminated_at IS NULL",
                 job_id) == [(0,)]
    assert _rows(db, "SELECT count(*) FROM event WHERE job_id = ? AND kind = "
                     "'instance.terminated'", job_id) == [(1,)]
    told = _rows(db, "SELECT message FROM event WHERE job_id = ? AND kind = "
                     "'train.not_finite'", job_id)
    assert len(told) == 1 and "orch stops it if the loss is nan at 3 logged steps" in told[0][0]
    assert [e["type"] for e in sent] == ["train.not_finite", "job.failed"]
    assert sent[0]["data"]["stops_after"] == 3  # the webhook's text says what orch will do
