"""Time and money: the seed's 1.5 h statement, billing granularity, break-even."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestrator.core import money, throughput
from orchestrator.core.architectures import lookup
from orchestrator.core.sizing import Strategy, Workload
from providers import catalog
from providers.base import Billing, Offer


def w8b(method: str = "qlora", ckpt: bool = True) -> Workload:
    return Workload(lookup("meta-llama/Llama-3.1-8B").architecture, method,  # type: ignore[arg-type]
                    gradient_checkpointing=ckpt)


def test_seed_statement_fits_a_plausible_token_count() -> None:
    # seed-facts.md: QLoRA over 10k instruction pairs on Llama-3.1-8B ≈ 1.5 h on one RTX 4090.
    # It gives no token count, so it is not a calibration point (data/throughput.yaml): at
    # the calibrated rate 1.5 h is 800-1,200 tokens per pair, a plausible instruction set.
    gpu = catalog.gpus()["RTX 4090"]
    seconds_per_token = throughput.training_seconds(w8b(), 10**8, gpu, 1, Strategy.SINGLE) / 1e8
    assert 800 < 1.5 * 3600 / seconds_per_token / 10_000 < 1200


def test_flops_per_token() -> None:
    n = w8b().arch.params
    assert throughput.flops_per_token(w8b("full", ckpt=False)) == 6 * n
    assert throughput.flops_per_token(w8b("lora", ckpt=False)) == 4 * n
    assert throughput.flops_per_token(w8b("lora", ckpt=True)) == 6 * n


def test_more_gpus_are_faster_but_not_linear() -> None:
    gpu = catalog.gpus()["A100 80GB"]
    one = throughput.training_seconds(w8b(), 10**7, gpu, 1, Strategy.SINGLE)
    eight = throughput.training_seconds(w8b(), 10**7, gpu, 8, Strategy.DDP)
    assert one / 8 < eight < one / 4


def test_measured_throughput_overrides_formula() -> None:
    gpu = catalog.gpus()["RTX 4090"]
    assert throughput.training_seconds(w8b(), 3600, gpu, 1, Strategy.SINGLE, 1.0) == 3600


def test_duration_includes_boot_pull_and_eval() -> None:
    offer = next(o for o in catalog.load().offers if o.gpu == "RTX 4090" and o.gpu_count == 1)
    d = throughput.duration(w8b(), 6_000_000, offer, catalog.gpus()["RTX 4090"], Strategy.SINGLE)
    assert d.boot == pytest.approx(5 / 60)
    # 16 GB of bf16 safetensors at 2 Gbit/s ≈ 64 s.
    assert d.model_pull == pytest.approx(8_030_261_248 * 2 * 8 / 2e9 / 3600)
    assert d.total == pytest.approx(d.training + d.overhead)
    cached = throughput.duration(w8b(), 6_000_000, offer, catalog.gpus()["RTX 4090"],
                                 Strategy.SINGLE, model_cached=True)
    assert cached.model_pull == 0


def test_monthly_amortisation_matches_seed() -> None:
    # $2190 a month is $3.00/h over its 730 hours: the break-even (`orch advise`).
    assert money.breakeven_hours(Decimal("2190"), Decimal("3")) == Decimal("730")
    assert money.breakeven_hours(Decimal("2190"), Decimal("1.811")) == Decimal("1209.28")


def test_metered_billing_granularity() -> None:
    price = Decimal("3.60")  # $0.001 per second
    assert money.metered_cost(price, 1.5 / 3600, Billing.PER_SECOND) == Decimal("0.002")
    assert money.metered_cost(price, 61 / 3600, Billing.PER_MINUTE) == Decimal("0.12")
    # The seed's "about $0.27 at spot price" for 1.5 h on a 4090.
    assert money.metered_cost(Decimal("0.177"), 1.5, Billing.PER_SECOND) == \
        Decimal("0.265500")
    with pytest.raises(ValueError):
        money.metered_cost(price, -1.0, Billing.PER_SECOND)
    with pytest.raises(ValueError):
        money.metered_cost(price, 1.0, Billing.MONTHLY)


def _monthly(registered: bool) -> Offer:
    return Offer("dedicated", "s", "H100 SXM", 1, 80 * 2**30, Billing.MONTHLY, False, None,
                 monthly_price=Decimal("2190"), registered=registered)


def test_job_cost_for_monthly_servers() -> None:
    assert money.job_cost(_monthly(True), 500) == 0  # already rented: marginal zero
    assert money.job_cost(_monthly(False), 5) == Decimal("2190")  # commits a month
    assert money.job_cost(_monthly(False), 800) == Decimal("4380")
    assert money.amortised_share(Decimal("2190"), 73) == Decimal("219")


def test_money_stays_decimal() -> None:
    cost = money.metered_cost(Decimal("0.074"), 0.5, Billing.PER_SECOND)
    assert isinstance(cost, Decimal) and cost == Decimal("0.037")


def test_duration_names_the_measured_figure_and_ignores_a_bad_one() -> None:
    offer = next(o for o in catalog.load().offers if o.gpu == "RTX 4090" and o.gpu_count == 1)
    gpu = catalog.gpus()["RTX 4090"]
    d = throughput.duration(w8b(), 3_600_000, offer, gpu, Strategy.SINGLE,
                            measured=throughput.Measured(1000.0, 2))
    assert d.training == pytest.approx(1.0)
    assert d.source == "measured 1,000 tokens/s (2 jobs)"
    bad = throughput.duration(w8b(), 3_600_000, offer, gpu, Strategy.SINGLE,
                              measured=throughput.Measured(0.0, 1))
    assert bad.source.startswith("formula, ")
