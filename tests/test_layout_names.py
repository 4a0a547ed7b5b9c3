"""Migration 0007 (honest layout names) and `orch history --layout`, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from conftest import BACKENDS, database_url
from typer.testing import CliRunner

from orchestrator.cli.history import register
from orchestrator.records import history as h
from orchestrator.records import store as store_mod
from orchestrator.records.store import Store, open_store

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, str]]:
    url = database_url(request.param, tmp_path, request)
    store = open_store(url)
    yield store, url
    store.close()


def _plan(strategy: str, gpu_count: int, alternative: str) -> dict[str, Any]:
    """The parts of an `orch plan --json` object that name a layout, as 0006 stored them."""
    return {"estimate": {"gpu_count": gpu_count, "strategy": strategy},
            "placement": {"gpu": "A100 80GB", "gpu_count": gpu_count, "strategy": strategy},
            "alternatives": [{"gpu_count": 8, "strategy": alternative}],
            "job_file": "/home/u/fsdp-offload/job.yml"}


def _text(plan: dict[str, Any]) -> str:
    return json.dumps(plan, sort_keys=True, separators=(",", ":"))


def _migrate(store: Store, target: str, down: bool = False) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(store_mod.migrations_dir()))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, target)


def _insert(store: Store, jid: str, placement_json: str | None) -> None:
    # The columns of the schema at 0006 only: the model's later columns (0010's trial number,
    # 0012's deadline choice) do not exist in a database downgraded there.
    row = {"id": jid, "name": jid, "status": "succeeded", "method": "full",
           "base_model": "Qwen/Qwen2.5-32B", "spec_json": "{}", "spec_hash": "b" * 64,
           "placement_json": placement_json,
           "created_at": AT.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
           "updated_at": AT.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO job ({', '.join(row)}) VALUES "
                             f"({', '.join(':' + k for k in row)})"), row)


def _stored(store: Store) -> dict[str, str | None]:
    with store.engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT id, placement_json FROM job")).all())  # type: ignore[arg-type]


OLD = {"j-old-zero3": _plan("fsdp", 4, "fsdp+offload"),
       "j-old-offld": _plan("offload", 1, "fsdp"),
       "j-old-ddp00": _plan("ddp", 2, "fsdp")}


def test_upgrade_renames_every_stored_layout_and_downgrade_restores_them(
        db: tuple[Store, str]) -> None:
    store, _ = db
    _migrate(store, "0006", down=True)
    for jid, plan in OLD.items():
        _insert(store, jid, _text(plan))
    _insert(store, "j-not-json", "not json: fsdp")
    _insert(store, "j-no-plan00", None)
    _migrate(store, "head")
    got = _stored(store)
    assert got["j-old-zero3"] == _text(_plan("zero3", 4, "zero3_offload"))
    assert got["j-old-offld"] == _text(_plan("zero3_offload", 1, "zero3"))
    assert got["j-old-ddp00"] == _text(_plan("ddp", 2, "zero3"))
    # Only `strategy` values change: a path that says fsdp stays as it was.
    assert json.loads(got["j-old-zero3"] or "")["job_file"] == "/home/u/fsdp-offload/job.yml"
    assert got["j-not-json"] == "not json: fsdp" and got["j-no-plan00"] is None
    _migrate(store, "0006", down=True)
    assert {jid: json.loads(text or "") for jid, text in _stored(store).items()
            if jid.startswith("j-old")} == OLD
    _migrate(store, "head")


def test_history_filters_on_the_planned_layout_old_names_included(
        db: tuple[Store, str]) -> None:
    store, url = db
    _migrate(store, "0006", down=True)
    _insert(store, "j-recorded0", _text(_plan("fsdp", 4, "ddp")))  # before the rename
    _migrate(store, "head")
    _insert(store, "j-zero3new0", _text(_plan("zero3", 8, "ddp")))
    _insert(store, "j-fsdp2new0", _text(_plan("fsdp2", 4, "zero3")))
    _insert(store, "j-single000", _text(_plan("single", 1, "ddp")))
    reader = h.open_reader(url)
    assert reader is not None
    try:
        def ids(*layouts: str) -> list[str]:
            return sorted(r.id for r in h.history(reader, h.Filters(layouts=layouts), now=AT))

        assert ids("zero3") == ["j-recorded0", "j-zero3new0"]
        assert ids("fsdp") == ids("zero3")  # a script written before the rename still works
        assert ids("fsdp2") == ["j-fsdp2new0"]
        assert ids("single", "fsdp2") == ["j-fsdp2new0", "j-single000"]
        with pytest.raises(h.HistoryError, match="--layout fsdp3: use one of single, ddp"):
            ids("fsdp3")
    finally:
        reader.close()


def test_cli_history_layout(db: tuple[Store, str], monkeypatch: pytest.MonkeyPatch) -> None:
    store, url = db
    _insert(store, "j-fsdp2new0", _text(_plan("fsdp2", 4, "zero3")))
    _insert(store, "j-zero3new0", _text(_plan("zero3", 8, "ddp")))
    monkeypatch.setenv("ORCH_DB_URL", url)
    app = typer.Typer()
    register(app)
    res = CliRunner().invoke(app, ["history", "--layout", "fsdp2", "--json"])
    assert res.exit_code == 0, res.output
    assert [r["job_id"] for r in json.loads(res.output)] == ["j-fsdp2new0"]
    bad = CliRunner().invoke(app, ["history", "--layout", "megatron"])
    assert bad.exit_code != 0 and "--layout megatron: use one of" in bad.output
