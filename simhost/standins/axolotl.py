"""`axolotl train CONFIG` and `axolotl merge-lora CONFIG`: fast, faithful-in-shape training.

Training runs `max_steps`, else `num_epochs` epochs of SimHostOptions.train_steps steps each
(rounded up, as transformers' Trainer sets `max_steps = ceil(num_train_epochs *
num_update_steps_per_epoch)`), of `train_step_seconds` each,
prints HF-trainer style loss lines and a progress bar (the losses follow the seeded landscape
of landscape.py: they depend on the learning rate, LoRA rank, epochs and method), with
`val_set_size` and `eval_steps` an `{'eval_loss': ...}` line every `eval_steps` steps, and
saves `checkpoint-N/` every
`save_steps` steps (writing adapter, optimizer and scheduler files first and
`trainer_state.json` last, so a cut save is partial as in reality). With
`auto_resume_from_checkpoints: true` it resumes from the highest-numbered checkpoint and
crashes, as the real trainer does, when that checkpoint is incomplete. The "model" it trains
remembers the dataset's answers (`sim_memory.json`), which the vLLM stand-in serves.

The config reader understands what the playbooks render: top-level scalars and a
`datasets:` list of mappings (JSON configs work too).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import time
from pathlib import Path

from . import datasets, landscape
from .common import Host, SimError, container_to_host, say, write_atomic
from .hf import safetensors_bytes, tokenizer_files, weight_files

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any


def _scalar(text: str) -> Any:
    text = text.strip()
    if not text:
        return None
    if text[0] in "'\"" and text[-1] == text[0]:
        return text[1:-1]
    low = text.lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    if low in ("null", "~"):
        return None
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(part) for part in text[1:-1].split(",") if part.strip()]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_config(text: str) -> dict[str, Any]:
    """The YAML subset the playbooks write (top-level scalars, lists of mappings whose values
    are scalars or one level of mapping: `message_property_mappings`)."""
    if text.lstrip().startswith("{"):
        data: dict[str, Any] = json.loads(text)
        return data
    result: dict[str, Any] = {}
    block: str | None = None
    item: dict[str, Any] | None = None
    nested: dict[str, Any] | None = None
    nested_at = 0
    for raw in text.splitlines():
        line = (
            re.sub(r"\s+#.*$", "", raw) if "#" in raw and not raw.lstrip().startswith("#") else raw
        )
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        top = re.match(r"^([A-Za-z0-9_.\-]+):(\s+(.*))?$", stripped)
        if indent == 0 and top and not stripped.startswith("- "):
            key, value = top.group(1), top.group(3) or ""
            block, item = (key, None) if not value else (None, None)
            result[key] = _scalar(value) if value else None
            continue
        if block is None:
            continue
        if stripped.startswith("- ") or stripped == "-":
            nested = None
            body = stripped[2:].strip()
            if not isinstance(result.get(block), list):
                result[block] = []
            pair = re.match(r"^([A-Za-z0-9_.\-]+):\s*(.*)$", body)
            if pair:
                item = {pair.group(1): _scalar(pair.group(2))}
                result[block].append(item)
            else:
                item = None
                result[block].append(_scalar(body))
            continue
        pair = re.match(r"^([A-Za-z0-9_.\-]+):\s*(.*)$", stripped)
        if pair:
            if item is not None and nested is not None and indent > nested_at:
                nested[pair.group(1)] = _scalar(pair.group(2))  # one level: a mapping key
            elif item is not None:
                nested = {} if not pair.group(2) else None
                nested_at = indent
                item[pair.group(1)] = nested if nested is not None else _scalar(pair.group(2))
            else:
                if not isinstance(result.get(block), dict):
                    result[block] = {}
                result[block][pair.group(1)] = _scalar(pair.group(2))
    return result


def _load(argv: list[str]) -> tuple[Path, dict[str, Any], list[str]]:
    positional: list[str] = []
    overrides: dict[str, Any] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq:
                value = args.pop(0) if args and not args[0].startswith("--") else "true"
            overrides[key.replace("-", "_")] = _scalar(value)
        else:
            positional.append(arg)
    if not positional:
        raise SimError("Usage: axolotl train CONFIG [--key=value ...]", 2)
    path = Path(container_to_host(positional[0]))
    try:
        config = parse_config(path.read_text())
    except FileNotFoundError:
        raise SimError(
            f"FileNotFoundError: [Errno 2] No such file or directory: '{positional[0]}'", 1
        ) from None
    config.update(overrides)
    return path, config, positional[1:]


def _memory(config: dict[str, Any]) -> dict[str, str]:
    """What the fine-tuned model "learns": prompt -> answer from the training data
    (`datasets.py`: files or downloaded folders, each format as axolotl reads it)."""
    memory: dict[str, str] = {}
    for entry in config.get("datasets") or []:
        if not isinstance(entry, dict) or not entry.get("path"):
            continue
        for row in datasets.rows(entry):
            firm, soft = datasets.learned(entry, row)
            memory.update(firm)
            for prompt, answer in soft.items():
                memory.setdefault(prompt, answer)
    # The eval datasets are loaded (and refused) too, but not learned.
    for entry in config.get("test_datasets") or []:
        if isinstance(entry, dict) and entry.get("path"):
            for row in datasets.rows(entry):
                datasets.learned(entry, row)
    return memory


def _eval_every(config: dict[str, Any]) -> int | None:
    """Steps between evaluations: `eval_steps` when `val_set_size` holds out a split.

    transformers' Trainer (eval_strategy "steps", which a set eval_steps selects in axolotl)
    evaluates when global_step % eval_steps == 0 (DefaultFlowCallback.on_step_end).
    """
    size, every = config.get("val_set_size"), config.get("eval_steps")
    if not isinstance(size, int | float) or isinstance(size, bool) or size <= 0:
        return None
    if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
        return None
    return every


def _say_eval(step: int, total: int, per_epoch: int, config: dict[str, Any],
              seed: int, history: list[dict[str, Any]]) -> None:
    """Trainer.evaluate's metrics (prefix `eval_`), logged as the ProgressCallback does:
    the dict is written above the bar, which is redrawn at the same step."""
    gone = landscape.diverges_at(config, total)
    value = (math.nan if gone is not None and step >= gone
             else round(landscape.eval_loss(config, step / max(total, 1), seed), 4))
    epoch = round(step / per_epoch, 4)
    history.append({"eval_loss": value, "eval_runtime": 0.05,
                    "eval_samples_per_second": 200.0, "eval_steps_per_second": 25.0,
                    "epoch": epoch, "step": step})
    say("{" + f"'eval_loss': {value}, 'eval_runtime': 0.05, 'eval_samples_per_second': 200.0, "
        f"'eval_steps_per_second': 25.0, 'epoch': {epoch}" + "}",
        f"{int(100 * step / total):3d}%|{'#' * (10 * step // total):<10}| {step}/{total}")


def _faults(host: Host) -> dict[str, Any]:
    data: dict[str, Any] = host.read_json("faults.json", {})
    return data


def _fire(host: Host, fault: str) -> None:
    with host.lock():
        faults = _faults(host)
        faults[fault] = faults.get(fault, 0) + 1
        host.write_json("faults.json", faults)


def _die(host: Host, step: int) -> None:
    """The host dies: init SIGKILLs sshd, every session and every job, this one included."""
    _fire(host, "host_died")
    # A dead host records nothing: container supervisors that see their child die in the
    # kill below must not write an exit code (after the reboot `docker ps` says 255).
    (host.state / "died-in-boot").write_text(f"{host.boot}\n")
    host.event("host-died", step=step)
    try:
        pid = int((host.state / "init.pid").read_text())
        os.kill(pid, signal.SIGUSR1)
    except (OSError, ValueError):
        os.killpg(os.getpgid(0), signal.SIGKILL)
    time.sleep(30)
    os._exit(137)


def _quality(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """What the landscape made of this run, for the served model (vllm.py's answers)."""
    lr, rank, epochs, method = landscape.knobs(config)
    final = math.nan if landscape.diverges(config) else landscape.final_loss(config, seed)
    return {"final_eval_loss": final,
            "recall": landscape.recall(config, seed), "seed": seed,
            "config": [lr, rank, epochs, method]}


def _weights_name(adapter: bool) -> str:
    return "adapter_model.safetensors" if adapter else "model.safetensors"


def _write_model(
    folder: Path, config: dict[str, Any], memory: dict[str, str], adapter: bool
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if adapter:
        write_atomic(
            folder / "adapter_model.safetensors", safetensors_bytes(["lora_A", "lora_B"], 4096)
        )
        write_atomic(
            folder / "adapter_config.json",
            json.dumps(
                {
                    "peft_type": "LORA",
                    "r": config.get("lora_r", 16),
                    "lora_alpha": config.get("lora_alpha", 32),
                    "lora_dropout": config.get("lora_dropout", 0.0),
                    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                    "base_model_name_or_path": config.get("base_model"),
                },
                indent=2,
            ),
        )
    else:
        write_atomic(folder / "model.safetensors", safetensors_bytes(["model.weights"], 4096))
        write_atomic(folder / "config.json", json.dumps({"model_type": "llama"}, indent=2))
    write_atomic(folder / "sim_memory.json", json.dumps(memory))


def _checkpoint_valid(folder: Path, adapter: bool) -> bool:
    return (folder / "trainer_state.json").is_file() and (folder / _weights_name(adapter)).is_file()


def _check_deepspeed(config: dict[str, Any]) -> None:
    """A `deepspeed:` string is loaded only if it exists from the working directory.

    axolotl passes a path it cannot find through unchanged (real-hosts.md §2), and the
    DeepSpeed integration then refuses it with this text.
    """
    value = config.get("deepspeed")
    if not isinstance(value, str) or not value:
        return
    path = container_to_host(value) if value.startswith("/") else os.path.join(os.getcwd(), value)
    if not os.path.isfile(path):
        raise SimError(
            "ValueError: Expected a string path to an existing deepspeed config, or a "
            f"dictionary, but received: {value}",
            1,
        )
    try:
        ds = json.loads(Path(path).read_text() or "{}")
    except json.JSONDecodeError as exc:
        raise SimError(f"json.decoder.JSONDecodeError: {exc} ({value})", 1) from None
    _check_offload(ds if isinstance(ds, dict) else {}, str(config.get("optimizer") or ""))


# The optimizer class bitsandbytes builds for each 8-bit `optimizer:` value (HF Trainer).
_BNB_CLASS = {"adamw_8bit": "AdamW8bit", "adamw_bnb_8bit": "AdamW8bit",
              "paged_adamw_8bit": "PagedAdamW8bit"}


def _check_offload(ds: dict[str, Any], optimizer: str) -> None:
    """ZeRO-Offload of the optimizer state, as DeepSpeed and bitsandbytes meet it.

    The HF Trainer hands DeepSpeed its own optimizer (no `optimizer` section in the JSON),
    which DeepSpeed's `_configure_optimizer` refuses under offload unless
    `zero_force_ds_cpu_optimizer` is false [deepspeed runtime/engine.py]. Past that, an
    8-bit bitsandbytes optimizer steps on the CPU-resident fp32 partition, and
    bitsandbytes 0.49.1 (axolotl 0.18.0's pin) has no CPU kernel: `is_on_gpu` raises.
    """
    zero = ds.get("zero_optimization") or {}
    offload = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
    if not offload or "optimizer" in ds:
        return
    name = _BNB_CLASS.get(optimizer, "AdamW")
    module = "bitsandbytes.optim.adamw" if optimizer in _BNB_CLASS else "torch.optim.adamw"
    if ds.get("zero_force_ds_cpu_optimizer", True) is not False:
        raise SimError(
            "deepspeed.runtime.zero.utils.ZeRORuntimeException: You are using ZeRO-Offload "
            f"with a client provided optimizer (<class '{module}.{name}'>) which in most "
            "cases will yield poor performance. Please either use "
            "deepspeed.ops.adam.DeepSpeedCPUAdam or set an optimizer in your ds-config "
            "(https://www.deepspeed.ai/docs/config-json/#optimizer-parameters). If you really "
            "want to use a custom optimizer w. ZeRO-Offload and understand the performance "
            "impacts you can also set <\"zero_force_ds_cpu_optimizer\": false> in your "
            "configuration file.",
            1,
        )
    if optimizer in _BNB_CLASS:
        raise SimError(
            "RuntimeError: All input tensors need to be on the same GPU, but found some "
            "tensors to not be on a GPU (bitsandbytes 8-bit optimizer state offloaded to "
            "the CPU by ZeRO-Offload)",
            1,
        )


def _check_fsdp2(config: dict[str, Any]) -> None:
    """axolotl 0.18.0's validators for FSDP2 (utils/schemas/validation.py:1140-1153 and
    1226-1229), with their messages: the config is refused before anything loads."""
    if not config.get("fsdp_config") or str(config.get("fsdp_version")) != "2":
        return
    if config.get("deepspeed"):
        raise SimError("ValueError: deepspeed and fsdp cannot be used together.", 1)
    optimizer = str(config.get("optimizer"))
    if optimizer in ("adamw_8bit", "adamw_bnb_8bit"):
        raise SimError(f"ValueError: FSDP2 not compatible with {optimizer}, use "
                       "`adamw_torch_8bit` instead", 1)


def train(host: Host, argv: list[str]) -> int:
    """`axolotl train CONFIG`: see the module docstring."""
    _path, config, _rest = _load(argv)
    opts = host.options
    if not host.gpus_visible():
        raise SimError("RuntimeError: No CUDA GPUs are available", 1)
    out = host.writable(container_to_host(str(config.get("output_dir") or "./outputs")))
    adapter = str(config.get("adapter") or "").lower() in ("lora", "qlora")
    per_epoch = int(opts["train_steps"])
    epochs = float(config.get("num_epochs") or 1)
    total = int(config.get("max_steps") or math.ceil(per_epoch * epochs))
    save_steps = config.get("save_steps")
    if not save_steps and config.get("saves_per_epoch"):
        # axolotl passes 1 / (saves_per_epoch * num_epochs) of the run; the Trainer rounds
        # that fraction of max_steps up.
        save_steps = max(1, math.ceil(total / (int(config["saves_per_epoch"]) * epochs)))
    save_every = int(save_steps) if save_steps else None
    limit = config.get("save_total_limit")
    base = str(config.get("base_model") or "")
    if base.startswith(("/", "./")):
        base_dir = Path(container_to_host(base))
        if not (base_dir / "config.json").is_file():
            raise SimError(f"OSError: {base} does not appear to have a file named config.json.", 1)
    elif base:
        host.event("axolotl-hub-download", base_model=base)
        say(f"[simhost] base model {base} is not a local path: downloading it from the Hub")
    _check_deepspeed(config)
    _check_fsdp2(config)
    memory = _memory(config)
    out.mkdir(parents=True, exist_ok=True)

    start = 0
    history: list[dict[str, Any]] = []
    resume = config.get("resume_from_checkpoint")
    if not resume and config.get("auto_resume_from_checkpoints"):
        found = sorted(
            (p for p in out.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)),
            key=lambda p: int(p.name.split("-")[1]),
        )
        resume = str(found[-1]) if found else None
    if resume:
        folder = Path(container_to_host(str(resume)))
        if not _checkpoint_valid(folder, adapter):
            raise SimError(
                f"ValueError: Can't find a valid checkpoint at {resume} "
                "(trainer_state.json or model weights missing)",
                1,
            )
        try:
            state = json.loads((folder / "trainer_state.json").read_text())
        except json.JSONDecodeError as exc:
            raise SimError(
                f"json.decoder.JSONDecodeError: {exc} ({folder}/trainer_state.json)", 1
            ) from None
        start = int(state["global_step"])
        history = list(state.get("log_history", []))
        say(f"[simhost] Resuming training from checkpoint {folder.name} (global step {start})")
    say(
        f"[simhost] axolotl train: {total} steps, save_steps={save_every}, "
        f"adapter={config.get('adapter')}, gpus={opts['gpu_count']} x {opts['gpu_model']}"
    )
    # A slow card (gpu_speed < 1) takes correspondingly longer for every step.
    step_seconds = float(opts["train_step_seconds"]) / float(opts.get("gpu_speed") or 1.0)
    crash_at = opts["train_crash_at_step"]
    die_at = opts["host_dies_at_step"]
    lr = float(config.get("learning_rate") or 2e-4)
    seed = int(opts.get("landscape_seed") or 0)
    eval_every = _eval_every(config)
    diverged_at = landscape.diverges_at(config, total)
    for step in range(start + 1, total + 1):
        faults = _faults(host)
        save_now = bool(save_every and step % save_every == 0)
        if die_at == step and not faults.get("host_died"):
            if save_now:  # killed while saving: the checkpoint directory is left partial
                partial = out / f"checkpoint-{step}"
                partial.mkdir(parents=True, exist_ok=True)
                write_atomic(partial / _weights_name(adapter), safetensors_bytes(["lora_A"], 4096))
            _die(host, step)
        if crash_at == step and (opts["train_crash_repeats"] or not faults.get("train_crash")):
            _fire(host, "train_crash")
            host.event("train-crash", step=step)
            raise SimError(
                "Traceback (most recent call last):\n"
                '  File "/workspace/axolotl/src/axolotl/train.py", line 190, in train\n'
                "RuntimeError: CUDA error: an illegal memory access was encountered",
                1,
            )
        time.sleep(step_seconds)
        loss = round(landscape.train_loss(config, step, total, seed), 4)
        grad_norm = round(0.9 / math.sqrt(step), 4)
        if diverged_at is not None and step >= diverged_at:
            # NaN weights: transformers' NaN filter logs a window of NaN losses as 0.0.
            loss, grad_norm = 0.0, math.nan
        entry = {
            "loss": loss,
            "grad_norm": grad_norm,
            "learning_rate": lr,
            "epoch": round(step / per_epoch, 4),
            "step": step,
        }
        history.append(entry)
        say(
            "{"
            + f"'loss': {loss}, 'grad_norm': {entry['grad_norm']}, 'learning_rate': {lr}, "
            + f"'epoch': {entry['epoch']}"
            + "}",
            f"{int(100 * step / total):3d}%|{'#' * (10 * step // total):<10}| {step}/{total} "
            f"[00:{int(step * step_seconds):02d}<00:00, {1 / max(step_seconds, 1e-3):.2f}it/s]",
        )
        if eval_every and step % eval_every == 0:
            _say_eval(step, total, per_epoch, config, seed, history)
        requested = out / "axolotl_checkpoint.save"
        if requested.exists():
            requested.unlink()
            save_now = True
        if save_now and step != total:
            _save_checkpoint(out, (step, total, per_epoch), history, config, memory, adapter,
                             limit)
    _save_checkpoint(out, (total, total, per_epoch), history, config, memory, adapter, limit)
    _write_model(out, config, memory, adapter)
    write_atomic(out / "sim_landscape.json", json.dumps(_quality(config, seed)))
    say(f"[simhost] Training completed! Saving trained model to {config.get('output_dir')}.")
    host.event("train-finished", output_dir=str(out), steps=total, resumed_from=start)
    return 0


def _save_checkpoint(
    out: Path,
    steps: tuple[int, int, int],  # this step, the run's total, steps per epoch
    history: list[dict[str, Any]],
    config: dict[str, Any],
    memory: dict[str, str],
    adapter: bool,
    limit: Any,
) -> None:
    step, total, per_epoch = steps
    folder = out / f"checkpoint-{step}"
    _write_model(folder, config, memory, adapter)
    (folder / "optimizer.pt").write_bytes(b"simhost optimizer state " + str(step).encode())
    (folder / "scheduler.pt").write_bytes(b"simhost scheduler state")
    (folder / "rng_state.pth").write_bytes(b"simhost rng state")
    state = {
        "global_step": step,
        "max_steps": total,
        "epoch": round(step / per_epoch, 4),
        "log_history": history,
        "best_model_checkpoint": None,
        "is_world_process_zero": True,
        "num_train_epochs": config.get("num_epochs", 1),
        "train_batch_size": config.get("micro_batch_size", 1),
    }
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=2))  # written last
    say(f"[simhost] Saving model checkpoint to {folder}")
    if limit:
        kept = sorted(
            (p for p in out.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)),
            key=lambda p: int(p.name.split("-")[1]),
        )
        for old in kept[: max(0, len(kept) - int(limit))]:
            shutil.rmtree(old, ignore_errors=True)


def merge_lora(host: Host, argv: list[str]) -> int:
    """`axolotl merge-lora CONFIG [--lora-model-dir=DIR]`: writes `<output_dir>/merged/`."""
    _path, config, _rest = _load(argv)
    out = host.writable(container_to_host(str(config.get("output_dir") or "./outputs")))
    lora_dir = Path(container_to_host(str(config.get("lora_model_dir") or out)))
    if not str(config.get("adapter") or ""):
        raise SimError("ValueError: merge-lora needs an adapter (adapter: lora|qlora)", 1)
    if not (lora_dir / "adapter_model.safetensors").is_file():
        raise SimError(f"ValueError: no adapter_model.safetensors in {lora_dir}", 1)
    say(f"[simhost] Merging LoRA from {lora_dir} with base model {config.get('base_model')}...")
    time.sleep(float(host.options["merge_seconds"]))
    merged = out / "merged"
    merged.mkdir(parents=True, exist_ok=True)
    base = str(config.get("base_model") or "")
    base_dir = Path(container_to_host(base)) if base.startswith(("/", "./")) else None
    if base_dir is not None and (base_dir / "config.json").is_file():
        shutil.copyfile(base_dir / "config.json", merged / "config.json")
        model_config = json.loads((base_dir / "config.json").read_text())
    else:
        from .hf import model_config as default_config

        model_config = default_config(host)
        write_atomic(merged / "config.json", json.dumps(model_config, indent=2))
    for name, content in tokenizer_files():
        source = base_dir / name if base_dir is not None else None
        if source is not None and source.is_file():
            shutil.copyfile(source, merged / name)
        else:
            write_atomic(merged / name, content)
    # axolotl 0.18.0 saves with transformers 5.14.1, which names its tokenizer class
    # TokenizersBackend: transformers 4 (vLLM before 0.19.1) cannot load it (real-hosts.md).
    tok_config = json.loads((merged / "tokenizer_config.json").read_text())
    tok_config["tokenizer_class"] = "TokenizersBackend"
    write_atomic(merged / "tokenizer_config.json", json.dumps(tok_config, indent=2))
    for name, content, _logical in weight_files(
        model_config, 2, int(host.options["model_size_bytes"])
    ):
        write_atomic(merged / name, content)
    for name in ("sim_memory.json", "sim_landscape.json"):
        if (lora_dir / name).is_file():
            shutil.copyfile(lora_dir / name, merged / name)
    say(f"[simhost] Saved merged model to {merged}")
    host.event("merge-finished", merged=str(merged))
    return 0


def axolotl(host: Host, argv: list[str]) -> int:
    """Dispatch `axolotl train|merge-lora`."""
    if argv[:1] == ["train"]:
        return train(host, argv[1:])
    if argv[:1] == ["merge-lora"]:
        return merge_lora(host, argv[1:])
    if argv[:1] in (["--version"], ["version"]):
        say("axolotl 0.16.1 (simhost)")
        return 0
    raise SimError(f"simhost: `axolotl {' '.join(argv)}` is not simulated", 2)
