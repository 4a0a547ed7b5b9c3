"""The simulated loss landscape: its shape (pure), and the stand-in trainer and server that
follow it on a real simulated host over SSH."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_simhost import (
    TOOLKIT,
    SimHostFactory,
    connect,
    start_training,
    wait_exited,
    write_job,
)

from playbooks.ssh import ConnectionFactory, put_file, run
from playbooks.trainjob import parse_progress
from simhost.standins import landscape

lrs = st.floats(1.0e-6, 1.0e-2)
ranks = st.sampled_from([4, 8, 16, 32, 64, 128])
epochs = st.sampled_from([1, 1.5, 2, 3, 4])


def cfg(lr: float, r: int = 16, e: float = 1, adapter: str = "lora") -> dict[str, Any]:
    return {"learning_rate": lr, "lora_r": r, "num_epochs": e, "adapter": adapter}


@settings(max_examples=200, deadline=None)
@given(lr=lrs, r=ranks, e=epochs, seed=st.integers(0, 10**6))
def test_the_landscape_has_its_documented_shape(lr: float, r: int, e: float, seed: int) -> None:
    c = cfg(lr, r, e)
    final = landscape.final_loss(c, seed)
    assert final == landscape.final_loss(dict(c), seed)  # a function of config and seed
    # Noise aside (6 sigma), the learning rate's optimum for the rank is the best.
    best = landscape.final_loss(cfg(landscape.lr_opt(r), r, e), seed)
    assert final >= best - 12 * landscape.NOISE
    # The eval loss falls from final * (1 + START) to final, never below it.
    curve = [landscape.eval_loss(c, p / 20, seed) for p in range(21)]
    assert all(a >= b for a, b in zip(curve, curve[1:], strict=False))
    assert curve[0] == final * (1 + landscape.START) and math.isclose(curve[-1], final)
    assert 0.0 <= landscape.recall(c, seed) <= 1.0


def test_terms_move_the_final_loss_as_documented() -> None:
    at = landscape.final_loss
    assert at(cfg(2.0e-4, 16, 3)) < at(cfg(2.0e-4, 16, 2)) < at(cfg(2.0e-4, 16, 1))
    assert at(cfg(2.0e-4, 16, 5)) > at(cfg(2.0e-4, 16, 3))  # overfitting past 3 epochs
    assert at(cfg(2.0e-4, 32, 3)) < at(cfg(2.0e-4, 8, 3))
    assert at(cfg(1.0e-5)) - at(cfg(2.0e-4)) > 0.2  # over a decade from the optimum
    assert at(cfg(2.0e-4, adapter="qlora")) > at(cfg(2.0e-4))
    # Another seed moves each configuration by its noise only.
    moved = [at(cfg(lr), 1) - at(cfg(lr), 0) for lr in (1.0e-4, 2.0e-4, 5.0e-4)]
    assert all(abs(d) < 6 * landscape.NOISE for d in moved) and len(set(moved)) == 3


def test_the_served_model_recalls_the_landscapes_share() -> None:
    quality = {"recall": 0.7, "seed": 0, "config": [2.0e-4, 16, 1, "lora"]}
    hits = sum(landscape.recalled(quality, f"question {i}") for i in range(2000))
    assert 0.66 < hits / 2000 < 0.74
    assert landscape.recalled({**quality, "recall": 1.0}, "anything")


def _train(simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path,
           lr: float) -> tuple[str, Path, dict[str, Any]]:
    host = simhost(toolkit_preinstalled=TOOLKIT, train_step_seconds=0.0, landscape_seed=5)
    conn = connect(ssh_factory, host)
    name = f"lr{lr:g}".replace(".", "").replace("-", "")
    job = write_job(conn, host, tmp_path, name, steps=12, save_steps=6)
    config = tmp_path / f"{name}.yml"
    text = (config.read_text().replace("learning_rate: 0.0002", f"learning_rate: {lr}")
            + "val_set_size: 0.05\neval_steps: 4\n")
    config.write_text(text)
    put_file(conn, config, str(job / "config.yml"))
    start_training(conn, host, name)
    assert wait_exited(conn, name) == ("exited", 0)
    logs = run(conn, ["docker", "logs", name], 30).check().stdout
    return logs, job / "out", {"learning_rate": lr, "lora_r": 16, "num_epochs": 1,
                               "adapter": "qlora", "load_in_4bit": True}


def test_the_trainer_reports_eval_loss_every_eval_steps_on_the_landscape(
        simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path) -> None:
    logs, out, config = _train(simhost, ssh_factory, tmp_path, 2.0e-4)
    progress = parse_progress(logs)
    assert [s for s, _ in progress.eval_losses] == [4, 8, 12]
    assert [s for s, _ in progress.losses] == list(range(1, 13))
    for step, value in progress.eval_losses:
        assert value == round(landscape.eval_loss(config, step / 12, 5), 4)
    assert progress.eval_losses[-1][1] == round(landscape.final_loss(config, 5), 4)
    # Transformers' own words for the metrics, and in the checkpoint's log history.
    assert "{'eval_loss': " in logs and "'eval_runtime': " in logs
    state = json.loads((out / "checkpoint-12" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == [4, 8, 12]
    quality = json.loads((out / "sim_landscape.json").read_text())
    assert quality["final_eval_loss"] == landscape.final_loss(config, 5)
    # A learning rate far from the optimum ends higher, and its curve says so early.
    worse_logs, _, _ = _train(simhost, ssh_factory, tmp_path, 1.0e-5)
    worse = parse_progress(worse_logs).eval_losses
    assert worse[0][1] > progress.eval_losses[0][1] and worse[-1][1] > progress.eval_losses[-1][1]


def test_eval_losses_parse_in_both_transformers_spellings() -> None:
    # transformers 5's ProgressCallback writes floats as f"{v:.4g}" strings; 4.x as numbers.
    log = ("{'loss': '2.5', 'epoch': '0.1'}\n 10%|#| 1/10 [00:01<00:09]\n"
           "{'eval_loss': '1.875', 'eval_runtime': '0.05', 'epoch': '0.1'}\n"
           " 10%|#| 1/10 [00:01<00:09]\n"
           "{'eval_loss': 1.5, 'epoch': 0.2}\n 20%|##| 2/10 [00:02<00:08]\n{'eval_loss': 9.9}\n")
    progress = parse_progress(log)
    assert progress.eval_losses == ((1, 1.875), (2, 1.5))  # 9.9 waits for its bar
    assert progress.losses == ((1, 2.5),)


def test_a_learning_rate_two_decades_too_high_diverges_as_transformers_logs_it(
        simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path) -> None:
    logs, out, config = _train(simhost, ssh_factory, tmp_path, 5.0e-2)
    assert landscape.diverges_at(config, 12) == 2
    # transformers' NaN filter logs a window of NaN losses as 0.0, its grad norm as nan.
    assert "{'loss': 0.0, 'grad_norm': nan, " in logs
    assert "{'eval_loss': nan, " in logs
    progress = parse_progress(logs)
    assert math.isfinite(progress.losses[0][1]) and progress.losses[0][0] == 1
    assert [s for s, v in progress.losses if math.isnan(v)] == list(range(2, 13))
    assert [s for s, v in progress.eval_losses if math.isnan(v)] == [4, 8, 12]
    quality = json.loads((out / "sim_landscape.json").read_text())
    assert math.isnan(quality["final_eval_loss"]) and quality["recall"] == 0.0
    assert not landscape.diverges(cfg(1.0e-2, 128)) and landscape.diverges(cfg(2.0e-2, 16))


def test_a_zero_loss_beside_a_nan_grad_norm_is_a_nan_loss() -> None:
    # What transformers logs for a window of NaN losses (logging_nan_inf_filter: the NaN
    # steps add the window's average so far, 0), in both of its spellings.
    log = ("{'loss': 2.5, 'grad_norm': 0.4, 'epoch': 0.1}\n 10%|#| 1/10 [00:01<00:09]\n"
           "{'loss': 0.0, 'grad_norm': nan, 'epoch': 0.2}\n 20%|##| 2/10 [00:02<00:08]\n"
           "{'loss': '0', 'grad_norm': 'nan', 'epoch': '0.3'}\n 30%|###| 3/10 [00:03<00:07]\n"
           # an fp16 overflow: the step is skipped, its loss is a number (0.0 included)
           "{'loss': 1.9, 'grad_norm': inf, 'epoch': 0.4}\n 40%|####| 4/10 [00:04<00:06]\n"
           "{'loss': 0.0, 'grad_norm': 0.0, 'epoch': 0.5}\n 50%|#####| 5/10 [00:05<00:05]\n"
           "{'loss': nan, 'epoch': 0.6}\n 60%|######| 6/10 [00:06<00:04]\n"
           "{'loss': 0.0, 'grad_norm': inf, 'epoch': 0.7}\n 70%|#######| 7/10 [00:07<00:03]\n")
    losses = dict(parse_progress(log).losses)
    assert losses[1] == 2.5 and losses[4] == 1.9 and losses[5] == 0.0 and losses[7] == 0.0
    assert all(math.isnan(losses[s]) for s in (2, 3, 6))
