"""The simulated trainer's loss landscape: how a run's hyperparameters shape its curves.

A documented, seeded synthetic function (docs/sim-landscape.md explains each term), so
that a sweep's search and early stopping can be measured on `sim` at all:

    final = BASE + LR_CURVE * log10(lr / lr_opt(r))^2 + RANK_GAIN / r
            + EPOCH_GAIN * (1 / epochs - 1 / EPOCH_OPT) [+ EPOCH_OVERFIT * (epochs - EPOCH_OPT)^2
            past EPOCH_OPT] + METHOD[method] + noise(seed, config)
    lr_opt(r) = LR_OPT * (16 / r) ^ LR_RANK

`final` is the eval loss at the run's end. During the run (p: the share of its steps done)
the eval loss decays towards it, `final * (1 + START * g(p))` with
`g(p) = (exp(-k p) - exp(-k)) / (1 - exp(-k))` and `k = SPEED * epochs * (lr / lr_opt)^LR_SPEED`:
more epochs see more data per share of the run, a larger learning rate learns faster early
(which is where early rungs and the end disagree: a realistic amount of crossing). The
training loss is the eval loss less a memorisation gap growing with the data seen, plus
step-to-step noise. Stdlib only (a stand-in module: see common.py).
"""

from __future__ import annotations

import hashlib
import math

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any

BASE = 0.95  # the eval loss the best configuration tends to (before noise)
LR_OPT = 2.0e-4  # the best learning rate at LoRA rank 16
LR_RANK = 0.3  # lr_opt scales as (16 / r)^LR_RANK: larger adapters take smaller steps
LR_CURVE = 0.2  # loss per squared decade away from lr_opt
RANK_GAIN = 0.16  # capacity: + RANK_GAIN / r (8: +0.02, 32: +0.005; diminishing)
EPOCH_OPT = 3.0  # epochs past which the run overfits
EPOCH_GAIN = 0.06  # under-training: EPOCH_GAIN * (1/epochs - 1/EPOCH_OPT)
EPOCH_OVERFIT = 0.02  # per squared epoch past EPOCH_OPT
METHOD = {"lora": 0.0, "qlora": 0.01, "full": -0.01}  # 4-bit base costs a little
NOISE = 0.006  # std of the seeded per-configuration noise on `final`
START = 1.5  # the eval loss starts at final * (1 + START)
DIVERGE = 100.0  # a learning rate this many times lr_opt(r) or more diverges ...
DIVERGE_AT = 0.1  # ... once this share of its steps is done: its weights become NaN
SPEED = 2.0  # decay rate of one epoch's run
LR_SPEED = 0.1  # how much faster a larger learning rate learns early
TRAIN_GAP = 0.03  # train loss below eval loss, per epoch of data seen
STEP_NOISE = 0.02  # std of the training loss's step-to-step noise


def _gauss(*parts: Any) -> float:
    """A standard normal draw, a pure function of `parts` (Box-Muller over sha256)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    u1 = (int.from_bytes(digest[:8], "big") + 1) / 2.0**64
    u2 = int.from_bytes(digest[8:16], "big") / 2.0**64
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def _num(config: dict[str, Any], key: str, default: float) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return float(value)


def knobs(config: dict[str, Any]) -> tuple[float, float, float, str]:
    """(learning rate, LoRA rank, epochs, method) of an axolotl config."""
    adapter = str(config.get("adapter") or "").lower()
    method = "qlora" if adapter == "qlora" or config.get("load_in_4bit") is True else (
        "lora" if adapter == "lora" else "full")
    return (_num(config, "learning_rate", 2.0e-4), _num(config, "lora_r", 16.0),
            _num(config, "num_epochs", 1.0), method)


def lr_opt(rank: float) -> float:
    """The best learning rate at LoRA rank `rank`."""
    return LR_OPT * (16.0 / rank) ** LR_RANK


def final_loss(config: dict[str, Any], seed: int = 0) -> float:
    """The eval loss at the end of a run of `config` (the landscape's value)."""
    lr, rank, epochs, method = knobs(config)
    epoch_term = EPOCH_GAIN * (1.0 / epochs - 1.0 / EPOCH_OPT)
    if epochs > EPOCH_OPT:
        epoch_term = EPOCH_OVERFIT * (epochs - EPOCH_OPT) ** 2
    value = (BASE + LR_CURVE * math.log10(lr / lr_opt(rank)) ** 2 + RANK_GAIN / rank
             + epoch_term + METHOD[method]
             + NOISE * _gauss("final", seed, round(lr, 12), rank, epochs, method))
    return round(value, 6)


def _decay(p: float, k: float) -> float:
    return (math.exp(-k * p) - math.exp(-k)) / (1.0 - math.exp(-k))


def diverges(config: dict[str, Any]) -> bool:
    """Whether the run's learning rate is two decades past the best one: it diverges."""
    lr, rank, _, _ = knobs(config)
    return lr >= DIVERGE * lr_opt(rank)


def diverges_at(config: dict[str, Any], total: int) -> int | None:
    """The first step whose loss is NaN (None: the run converges). From there the trainer
    logs what transformers logs for NaN losses: `'loss': 0.0` beside `'grad_norm': nan`
    (its logging_nan_inf_filter), and `'eval_loss': nan`."""
    return max(1, math.ceil(DIVERGE_AT * total)) if diverges(config) else None


def eval_loss(config: dict[str, Any], p: float, seed: int = 0) -> float:
    """The eval loss after share `p` (0..1) of the run's steps."""
    lr, rank, epochs, _ = knobs(config)
    k = SPEED * epochs * (lr / lr_opt(rank)) ** LR_SPEED
    return final_loss(config, seed) * (1.0 + START * _decay(min(max(p, 0.0), 1.0), k))


def train_loss(config: dict[str, Any], step: int, total: int, seed: int = 0) -> float:
    """The training loss logged at `step` of `total`."""
    _, _, epochs, _ = knobs(config)
    p = step / max(total, 1)
    noise = STEP_NOISE * _gauss("step", seed, step, sorted(
        (k, repr(v)) for k, v in config.items() if k in ("learning_rate", "lora_r",
                                                          "num_epochs", "adapter")))
    return max(0.01, eval_loss(config, p, seed) - TRAIN_GAP * epochs * p + noise)


def recall(config: dict[str, Any], seed: int = 0) -> float:
    """The share of trained answers the model gives back (the eval set's exact match when
    the host opts in): 1 at BASE, falling by 0.05 per 0.01 of loss above it; 0 for a run
    that diverged (NaN weights answer nothing right)."""
    if diverges(config):
        return 0.0
    return min(1.0, max(0.0, 1.0 - 5.0 * (final_loss(config, seed) - BASE)))


def recalled(quality: dict[str, Any], prompt: str) -> bool:
    """Whether a trained model (`quality`: axolotl.py's sim_landscape.json) gives back its
    trained answer to `prompt`: a seeded draw per prompt and configuration under `recall`."""
    digest = hashlib.sha256(repr(("recall", quality.get("seed"), quality.get("config"),
                                  prompt)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < float(quality.get("recall", 1.0))
