"""orch advise: monthly vs per-second over constructed histories (plain values), and the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from orchestrator.cli.advise import (
    HourlyPrice,
    MeteredUsage,
    MonthlyOption,
    ServerUsage,
    advise,
    catalog_hourly,
    catalog_monthly,
    render_lines,
)
from orchestrator.cli.history import register
from orchestrator.records.store import Instance, Job, Server, open_store

D = Decimal
H100 = MonthlyOption("H100 SXM", 1, D("2190"), "catalog dedicated-host 1xH100")
WINDOW = D(30 * 24)  # 720 h


def test_heavy_per_second_use_says_rent_monthly() -> None:
    # 600 GPU-h in 30 days at $2.50 = $1,500; a 730-h month projects 608.33 h = $1,520.83.
    a = advise([MeteredUsage("H100 SXM", D(600), D(1500))], [], {"H100 SXM": H100}, {}, 30)
    [g] = a.gpus
    assert g.rate == D("2.500000")
    assert g.projected_gpu_hours == D("608.33")
    assert g.metered_per_month == D("1520.833333")
    assert g.servers_needed == 1 and g.monthly_per_month == D("2190.000000")
    assert g.breakeven_gpu_hours == D("876.00")  # 2190 / 2.5
    assert g.breakeven_utilisation == D("1.2000")  # 876 of 730 hours: never pays off
    assert g.verdict == "stay per-second" and g.saving_per_month == D("-669.166667")


def test_monthly_wins_above_break_even_and_counts_whole_servers() -> None:
    # 1,400 GPU-h at $3.00 = $4,200 in 30 days; projected 1,419.44 h needs 2 servers.
    a = advise([MeteredUsage("H100 SXM", D(1400), D(4200))], [], {"H100 SXM": H100}, {}, 30)
    [g] = a.gpus
    assert g.servers_needed == 2 and g.monthly_per_month == D("4380.000000")
    assert g.metered_per_month == D("4258.333333")
    assert g.verdict == "stay per-second"
    a = advise([MeteredUsage("H100 SXM", D(700), D(2800))], [], {"H100 SXM": H100}, {}, 30)
    [g] = a.gpus  # $4/GPU-h: break-even 547.5 h (75%)
    assert g.breakeven_gpu_hours == D("547.50") and g.breakeven_utilisation == D("0.7500")
    assert g.verdict == "rent monthly"
    assert g.saving_per_month == D("2838.888889") - D("2190")


def test_registered_server_price_beats_catalog_and_missing_price_is_said() -> None:
    mine = ServerUsage("box", "H100 SXM", 1, D("1500"), D(700), WINDOW)
    a = advise([MeteredUsage("H100 SXM", D(500), D(1250)), MeteredUsage("H200", D(10), D(40))],
               [mine], {"H100 SXM": H100}, {}, 30)
    h100, h200 = a.gpus
    assert h100.option is not None and h100.option.source == "registered server box"
    assert h100.breakeven_gpu_hours == D("600.00")  # 1500 / 2.5
    assert h200.verdict == "no monthly price" and h200.saving_per_month is None
    assert any("no monthly price for H200" in line for line in render_lines(a))


def test_idle_server_should_be_given_up() -> None:
    # Used 72 h of 720 (10%); the same hours on demand at $2.40 project to $175.20 a month.
    idle = ServerUsage("idle-box", "H100 SXM", 1, D("2190"), D(72), WINDOW)
    a = advise([], [idle], {}, {"H100 SXM": HourlyPrice(D("2.4"), "catalog cloud on-demand")},
               30)
    [s] = a.servers
    assert s.utilisation == D("0.1000")
    assert s.breakeven_hours == D("912.50") and s.breakeven_utilisation == D("1.2500")
    assert s.metered_per_month == D("175.200000")
    assert s.verdict == "give up" and s.saving_per_month == D("2014.800000")
    text = "\n".join(render_lines(a))
    assert "idle-box: below break-even" in text and "$2,014.80" in text


def test_busy_server_is_kept_and_unpriced_server_is_said() -> None:
    busy = ServerUsage("busy", "H100 SXM", 1, D("1000"), D(700), WINDOW)  # 97% used
    b200 = ServerUsage("b", "B200", 8, D("20000"), D(0), WINDOW)
    a = advise([], [busy, b200], {}, {"H100 SXM": HourlyPrice(D("2.4"), "x")}, 30)
    s, u = a.servers
    assert s.verdict == "keep" and s.saving_per_month is not None and s.saving_per_month < 0
    assert u.verdict == "no hourly price" and u.saving_per_month is None


def test_new_server_is_judged_on_the_time_it_was_registered() -> None:
    # Registered 3 days ago and busy all of it: 100% utilisation, not 10%.
    new = ServerUsage("new", "H100 SXM", 1, D("2190"), D(72), D(72))
    [s] = advise([], [new], {}, {"H100 SXM": HourlyPrice(D("3.5"), "x")}, 30).servers
    assert s.utilisation == D("1.0000") and s.verdict == "keep"


def test_advise_to_dict_is_json_with_exact_strings() -> None:
    a = advise([MeteredUsage("H100 SXM", D(600), D(1500))], [], {"H100 SXM": H100}, {}, 30)
    data = json.loads(json.dumps(a.to_dict()))
    assert data["gpus"][0]["rate"] == "2.500000"
    assert data["gpus"][0]["option"]["monthly_price"] == "2190"
    with pytest.raises(ValueError, match="days must be >= 1"):
        advise([], [], {}, {}, 0)


def test_catalog_prices() -> None:
    monthly = catalog_monthly()
    assert monthly["H100 SXM"].monthly_price == D("2190")
    assert "H200" not in monthly  # price not published
    hourly = catalog_hourly()
    assert hourly["A100 80GB"] == HourlyPrice(D("0.468"), "catalog cloud on-demand")
    assert hourly["RTX 3090"].source == "catalog cloud spot"  # no on-demand tier


def test_cli_advise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'orch.db'}"
    store = open_store(url)
    now = datetime.now(UTC)
    t = now - timedelta(days=5)
    with store.transaction() as s:
        s.add(Server(name="idle-box", host="10.0.0.1", gpu="H100 SXM", gpu_count=1,
                     monthly_price_micros=2_190_000_000, created_at=now - timedelta(days=60)))
        s.add(Job(id="j-1", name="a", status="succeeded", method="lora", base_model="m",
                  spec_json="{}", spec_hash="a" * 64, created_at=t, updated_at=t))
        s.flush()
        # 10 h on the registered server, 100 h of H100 SXM on demand at $4/h.
        s.add(Instance(job_id="j-1", provider="dedicated", provider_instance_id="idle-box",
                       gpu="H100 SXM", gpu_count=1, billing="monthly", interruptible=False,
                       price_per_hour_micros=0, state="terminated", created_at=t,
                       terminated_at=t + timedelta(hours=10)))
        s.add(Instance(job_id="j-1", provider="runpod", provider_instance_id="r-1",
                       gpu="H100-SXM", gpu_count=1, billing="per_second", interruptible=False,
                       price_per_hour_micros=4_000_000, state="terminated", created_at=t,
                       terminated_at=t + timedelta(hours=100)))
    store.close()
    monkeypatch.setenv("ORCH_DB_URL", url)
    app = typer.Typer()
    register(app)
    res = CliRunner().invoke(app, ["advise", "--days", "30", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    [g] = data["gpus"]
    assert (g["gpu"], g["gpu_hours"], g["rate"]) == ("H100 SXM", "100.00", "4.000000")
    assert g["option"]["source"] == "registered server idle-box"
    [srv] = data["servers"]
    assert srv["name"] == "idle-box" and srv["used_hours"] == "10.00"
    assert srv["verdict"] == "give up"
    text = CliRunner().invoke(app, ["advise"]).output
    assert "idle-box: below break-even" in text
    assert CliRunner().invoke(app, ["advise", "--days", "0"]).exit_code == 2
