"""orch's canonical form: the identities recorded so far stay valid, and it is orch's own.

Sweeps skip a run whose spec hash is recorded, so a changed hash would run paid work again.
The hashes below were recorded by earlier releases (pydantic's JSON dump of the same models,
orchestrator/core/spec.py as of f30cbd6); the canonical form must reproduce them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import canonical
from orchestrator.core.spec import JobSpec, spec_hash
from orchestrator.core.sweepspec import SweepSpec, load_sweep

ROOT = Path(__file__).resolve().parent.parent

RECORDED_HASHES = {
    "full-32b": "f0997eac70f370454c966c4c9f21ea2ea7303aabe3d43e376e41e332eae376ed",
    "lora-14b": "34d332fd089db3d40d709664542f69ac4234f2074d1bd52c6c812f73e2ef7112",
    "qlora-70b": "c865b1c6b1de69c49a63b9bb8bfe2ac58849334c70dd0cb3de4e327582c2ecf8",
    "qlora-8b": "ba33d65279bf41b13be06a1372f1bbc1688493c95f0a4ae59885291b03aca199",
    # Qwen2.5-0.5B since issue 36 §6 (the earlier Llama-3.2-1B quickstart is gated on the
    # Hub, and `sim` now refuses it without HF_TOKEN as the Hub does): a new job, a new hash.
    "quickstart": "15e7f9293f2510ea4c2e27c02a83f34e0f9b8a6a2efb449ea58627390d167907",
}

# examples/quickstart.yml as recorded before issue 36 (it named the gated Llama-3.2-1B): its
# hash stays the identity of that job.
OLD_QUICKSTART = """\
name: quickstart-llama32-1b
base_model: meta-llama/Llama-3.2-1B
method: qlora
lora: {r: 16, alpha: 32, dropout: 0.05, target: all-linear}
training:
  sequence_len: 1024
  micro_batch_size: 2
  gradient_accumulation_steps: 4
  epochs: 1
  learning_rate: 2.0e-4
dataset:
  path: data/train.jsonl
  format: alpaca
eval:
  eval_set: data/eval.jsonl
resources:
  spot: allowed
  providers: [sim]
"""


def test_the_old_quickstart_hashes_as_recorded() -> None:
    spec = JobSpec.model_validate(yaml.safe_load(OLD_QUICKSTART))
    assert spec_hash(spec) == "8c47225aabe6673e371119ae467754cf0bb54bc161efff3eb4f42a1d46a3abec"


@pytest.mark.parametrize("example", sorted(RECORDED_HASHES))
def test_the_examples_hash_as_recorded(example: str) -> None:
    raw = yaml.safe_load((ROOT / "examples" / f"{example}.yml").read_text())
    spec = JobSpec.model_validate(raw)
    assert spec_hash(spec) == RECORDED_HASHES[example]
    # As the engine reloads a recorded spec (the job row's spec_json).
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec and spec_hash(again) == RECORDED_HASHES[example]


def test_the_sweep_file_is_recorded_as_before() -> None:
    # The `sweep` table's spec_json of examples/sweep-lr.yml (sha256), and a random
    # section's, which nests a model in a mapping and aliases `int`.
    loaded = load_sweep(ROOT / "examples" / "sweep-lr.yml")
    digest = hashlib.sha256(loaded.spec_json.encode()).hexdigest()
    assert digest == "38f718470ade8881d63571d2a81aab017065db0486610575dd54228a7401f982"
    spec = SweepSpec.model_validate({
        "name": "s", "base": "b.yml", "budget": "12.5", "random": {"n": 3, "seed": 7, "params": {
            "training.learning_rate": {"loguniform": [1e-5, 1e-3]}, "lora.r": {"int": [8, 64]},
            "training.epochs": {"choice": [1, 2.5]}}}})
    # Sections added later (search, early_stop, notify) are left out while unset.
    assert canonical.dumps(spec.model_dump(by_alias=True)) == (
        '{"base":"b.yml","budget":"12.5","grid":{},"max_parallel":4,"name":"s",'
        '"objective":null,"random":{"n":3,"params":{"lora.r":{"choice":null,"int":[8,64],"loguniform":null,'
        '"uniform":null},"training.epochs":{"choice":[1,2.5],"int":null,"loguniform":null,'
        '"uniform":null},"training.learning_rate":{"choice":null,"int":null,'
        '"loguniform":[1e-05,0.001],"uniform":null}},"seed":7}}')


def test_spelling_a_default_out_keeps_the_identity() -> None:
    base = {"name": "j", "base_model": "Qwen/Qwen2.5-0.5B", "method": "lora",
            "dataset": {"path": "d.jsonl"}}
    plain = spec_hash(JobSpec.model_validate(base))
    spelled = {**base, "training": {"epochs": 1, "learning_rate": 2.0e-4},
               "resources": {"gpus": "any", "headroom": 0.2}, "lora": {"target": "all-linear"}}
    assert spec_hash(JobSpec.model_validate(spelled)) == plain
    assert spec_hash(JobSpec.model_validate({**base, "training": {"epochs": 2}})) != plain
    # Whether a diverged run is stopped is no part of what a healthy run produces: a sweep
    # that turns it off must not run its finished runs again.
    assert spec_hash(JobSpec.model_validate(
        {**base, "training": {"stop_on_nan": False}})) == plain


def test_the_spellings_are_defined_here_not_by_a_library() -> None:
    value = {"b": [1, 2.5, 1e-05, float("inf")], "a": Decimal("12.50"), "é": True,
             "when": dt.datetime(2026, 12, 3, 7, 17, 44, tzinfo=dt.UTC), "day": dt.date(2026, 1, 2),
             "raw": b"x", 3: None, "t": (1,)}
    assert canonical.dumps(value) == (
        '{"3":null,"a":"12.50","b":[1,2.5,1e-05,null],"day":"2026-01-02","raw":"x",'
        '"t":[1],"when":"2026-12-03T07:17:44Z","\\u00e9":true}')
    with pytest.raises(TypeError, match="no canonical form for complex"):
        canonical.dumps({"x": 1j})


# Free-form values a YAML job file can hold (trainer.extra), as yamlpos reads them.
_scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.text(max_size=8)
            | st.floats(allow_nan=False, allow_infinity=False))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(extra=st.dictionaries(st.text(min_size=1, max_size=8), _values, max_size=4),
       lr=st.floats(1e-9, 0.999), epochs=st.integers(1, 50) | st.floats(0.01, 1000),
       cost=st.none() | st.decimals(Decimal("0.01"), Decimal(10**6), places=4),
       gpus=st.none() | st.lists(st.sampled_from(["RTX 4090", "A100", 4090]), min_size=1))
def test_identities_equal_those_the_recorded_ones_were_made_with(
        extra: dict[str, Any], lr: float, epochs: float, cost: Decimal | None,
        gpus: list[Any] | None) -> None:
    # Same text as json.dumps over pydantic's JSON-mode dump, which made the recorded hashes.
    raw: dict[str, Any] = {
        "name": "j", "base_model": "Qwen/Qwen2.5-0.5B", "method": "lora",
        "dataset": {"path": "d.jsonl"}, "training": {"learning_rate": lr, "epochs": epochs},
        "resources": {"max_cost": None if cost is None else str(cost), "gpus": gpus},
        "trainer": {"extra": extra}}
    spec = JobSpec.model_validate(raw)
    before = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert canonical.dumps(spec.model_dump()) == before
