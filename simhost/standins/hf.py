"""`hf` (huggingface_hub >= 1.0 CLI): `download`, `cache verify`, `auth whoami`, `version`.

Every repository holds the same shape of files (config.json, tokenizer files, safetensors
shards and their index): tiny real files whose shard headers declare the logical size, so
disk accounting, speed and completeness checks behave as for the real model.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import secrets
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

from .common import Host, SimError, container_to_host, say
from .disks import logical_size, mount_for

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any

# What axolotl 0.18.0 pins (its pyproject.toml), so the images ship it.
VERSION = "1.17.0"

# huggingface_hub 1.17.0's CLI prints a known error as `Error: <text>` on stderr, this hint
# on stdout, and exits 1 (cli/hf.py); anything else is a Python traceback, exit 1.
# tests/test_hf_cli.py compares every text below with the real client's.
DEBUG_HINT = "Set HF_DEBUG=1 as environment variable for full traceback."
BAD_TOKEN = "Invalid credentials in Authorization header"

DEFAULT_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

_LAYER_TENSORS = (
    "input_layernorm.weight",
    "mlp.down_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "post_attention_layernorm.weight",
    "self_attn.k_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_proj.weight",
    "self_attn.v_proj.weight",
)


def safetensors_bytes(
    names: list[str], logical_bytes: int, metadata: dict[str, str] | None = None
) -> bytes:
    """A valid safetensors file with one 1x1 bf16 tensor per name, declaring its logical size."""
    header: dict[str, Any] = {
        "__metadata__": {
            "format": "pt",
            "simhost_logical_bytes": str(logical_bytes),
            **(metadata or {}),
        }
    }
    for i, name in enumerate(names):
        header[name] = {"dtype": "BF16", "shape": [1, 1], "data_offsets": [2 * i, 2 * i + 2]}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\x3f\x80" * len(names)


def model_config(host: Host) -> dict[str, Any]:
    """The base model's config.json (SimHostOptions.model_config overrides the default)."""
    config: dict[str, Any] = dict(DEFAULT_CONFIG)
    config.update(host.options.get("model_config") or {})
    return config


def tokenizer_files() -> list[tuple[str, bytes]]:
    """Tokenizer files a model directory needs (content is a tiny stand-in)."""
    vocab = {tok: i for i, tok in enumerate(["<s>", "</s>", "<unk>", "a", "b", "c"])}
    return [
        (
            "tokenizer.json",
            json.dumps(
                {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []}}
            ).encode(),
        ),
        (
            "tokenizer_config.json",
            json.dumps(
                {
                    "bos_token": "<s>",
                    "eos_token": "</s>",
                    "model_max_length": 131072,
                    "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
                }
            ).encode(),
        ),
        ("special_tokens_map.json", json.dumps({"bos_token": "<s>", "eos_token": "</s>"}).encode()),
    ]


def weight_files(config: dict[str, Any], shards: int, total: int) -> list[tuple[str, bytes, int]]:
    """Safetensors shards (+ index when sharded) for a model of `total` logical bytes."""
    layers = int(config["num_hidden_layers"])
    names = ["model.embed_tokens.weight"]
    for layer in range(layers):
        names.extend(f"model.layers.{layer}.{t}" for t in _LAYER_TENSORS)
    names.append("model.norm.weight")
    if not config.get("tie_word_embeddings", False):
        names.append("lm_head.weight")
    if shards <= 1:
        return [("model.safetensors", safetensors_bytes(names, total), total)]
    per = -(-len(names) // shards)
    files: list[tuple[str, bytes, int]] = []
    weight_map: dict[str, str] = {}
    for i in range(shards):
        chunk = names[i * per : (i + 1) * per]
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        size = total // shards + (total % shards if i == shards - 1 else 0)
        files.append((name, safetensors_bytes(chunk, size), size))
        weight_map.update(dict.fromkeys(chunk, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    index_bytes = json.dumps(index, indent=2).encode()
    return [("model.safetensors.index.json", index_bytes, len(index_bytes)), *files]


def repo_files(host: Host, repo: str) -> list[tuple[str, bytes, int]]:
    """(name, content, logical size) of every file of `repo`, small files first."""
    config = dict(model_config(host), _name_or_path=repo)
    small = [
        ("config.json", json.dumps(config, indent=2).encode()),
        ("generation_config.json", json.dumps({"bos_token_id": 0, "eos_token_id": 1}).encode()),
        *tokenizer_files(),
    ]
    weights = weight_files(
        config, int(host.options["model_shards"]), int(host.options["model_size_bytes"])
    )
    return [(n, c, len(c)) for n, c in small] + weights


def _hf_home() -> Path:
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("HOME", "/"), ".cache", "huggingface"
    )
    return Path(home)


def _token(explicit: str | None) -> tuple[str | None, str | None]:
    if explicit:
        return explicit, "argument"
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"], "env"
    path = _hf_home() / "token"
    if path.exists() and path.read_text().strip():
        return path.read_text().strip(), "file"
    return None, None


def _parse(
    argv: list[str], value_flags: set[str], multi: set[str]
) -> tuple[list[str], dict[str, Any]]:
    positional: list[str] = []
    flags: dict[str, Any] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in multi:
            values = [value] if eq else []
            while not eq and args and not args[0].startswith("--"):
                values.append(args.pop(0))
            flags.setdefault(name, []).extend(values)
        elif name in value_flags:
            flags[name] = value if eq else args.pop(0)
        elif arg.startswith("--"):
            flags[name] = True
        else:
            positional.append(arg)
    return positional, flags


def _snapshot_dir(repo: str, revision: str, cache_dir: str | None) -> Path:
    base = Path(cache_dir) if cache_dir else _hf_home() / "hub"
    commit = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
    repo_dir = base / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / revision.replace("/", "_")).write_text(commit)
    return repo_dir / "snapshots" / commit


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _hf_error(message: str) -> SimError:
    """A known error as hf prints it: the hint on stdout, `Error: ...` on stderr, exit 1."""
    if not os.environ.get("HF_DEBUG"):
        say(DEBUG_HINT)
    return SimError(f"Error: {message}", 1)


def _traceback(last_line: str) -> SimError:
    """An exception hf does not map to a message: Python prints a traceback, exit 1."""
    return SimError("Traceback (most recent call last):\n"
                    '  File "/usr/local/bin/hf", line 8, in <module>\n'
                    "    sys.exit(main())\n" + last_line, 1)


def hub_request_id(trace_id: str | None) -> str:
    """The `X-Request-Id` the Hub answers with: an AWS trace root, then the trace id the
    client sent (huggingface_hub sends `X-Amzn-Trace-Id`, a uuid4, with every request:
    utils/_http.py). hf shows it after the first line of an error it does not map, as
    "(Request ID: Root=1-68a3ff5e-10e4d1e1466c791270052ddc;1ac8f963-5a40-...)" in
    Comfy-Org/ComfyUI#9415 (2025-08-19) and deepbeepmeep/Wan2GP#455 (2025-07-01). The
    simulated Hubs answer with it too (providers/sim/hubserver.py `request_id`)."""
    root = f"Root=1-{int(time.time()):08x}-{secrets.token_hex(12)}"
    return f"{root};{trace_id}" if trace_id else root


def _check_access(host: Host, repo: str, revision: str, repo_type: str,
                  token: str | None) -> None:
    """The Hub's refusals in the order it checks them (token, repo, revision, gate)."""
    opts = host.options
    label = repo_type.capitalize()
    if opts["hf_token"] is not None and token is not None and token != opts["hf_token"]:
        url = f"{_endpoint()}/api/{repo_type}s/{repo}/revision/{revision}"
        rid = hub_request_id(str(uuid.uuid4()))  # hf sends a uuid4 as its trace id
        raise _hf_error(
            f"Client error '401 Unauthorized' for url '{url}' (Request ID: {rid})\n"
            "For more information check: "
            "https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/401\n\n" + BAD_TOKEN)
    if repo in opts["hf_repos_not_found"]:
        raise _hf_error(f"{label} '{repo}' not found. If the repo is private, make sure you are "
                        "authenticated and your token has the required permissions.")
    if revision in opts["hf_revisions_not_found"]:
        raise _hf_error(f"Revision not found in {repo_type} '{repo}'.")
    if repo in opts["hf_gated_repos"] and token is None:
        # The repo's info is public; its files are not, and a file URL names no repo.
        raise _hf_error("Access denied. This repository requires approval.")


def _speed(opts: dict[str, Any]) -> float | None:
    """Bytes per second a download reaches: the network's, and no more than the disk writes
    (a set `disk_write_bytes_per_second`); None: instant."""
    limits = [float(v) for v in (opts["download_bytes_per_second"],
                                 opts.get("disk_write_bytes_per_second")) if v]
    return min(limits) if limits else None


def _download(host: Host, argv: list[str]) -> int:
    positional, flags = _parse(
        argv,
        {"--local-dir", "--cache-dir", "--revision", "--token", "--repo-type", "--type",
         "--max-workers"},
        {"--include", "--exclude"},
    )
    if not positional:
        raise SimError("usage: hf download REPO_ID [FILENAMES...] [--local-dir DIR]", 2)
    repo, wanted = positional[0], positional[1:]
    revision = str(flags.get("--revision", "main"))
    token, source = _token(flags.get("--token"))
    if os.environ.get("HF_HUB_ENABLE_HF_TRANSFER"):
        say("Warning: HF_HUB_ENABLE_HF_TRANSFER is deprecated and has no effect.", err=True)
    repo_type = str(flags.get("--repo-type") or flags.get("--type") or "model")
    if host.options.get("hub_unreachable"):  # the first request (the repo's info) fails
        host.event("hf-download", repo=repo, revision=revision, ok=False, error="no-route")
        raise _traceback("httpx.ConnectError: [Errno -3] Temporary failure in name resolution")
    if repo_type == "dataset":
        return _dataset(host, argv, repo, revision, flags, token, source)
    _check_access(host, repo, revision, repo_type, token)
    files = repo_files(host, repo)
    includes: list[str] = flags.get("--include", [])
    excludes: list[str] = flags.get("--exclude", [])
    files = [
        f
        for f in files
        if (not wanted or f[0] in wanted)
        and (not includes or any(fnmatch.fnmatch(f[0], p) for p in includes))
        and not any(fnmatch.fnmatch(f[0], p) for p in excludes)
    ]
    # In a container (`docker run` of the trainer image) paths go through its `-v` mounts.
    if "--local-dir" in flags:
        target = host.writable(container_to_host(flags["--local-dir"]))
    else:
        cache_dir = flags.get("--cache-dir")
        target = host.writable(_snapshot_dir(repo, revision, None if cache_dir is None
                                             else container_to_host(cache_dir)))
    target.mkdir(parents=True, exist_ok=True)
    partial_dir = target / ".cache" / "huggingface" / "download"
    opts = host.options
    with host.lock():
        state = host.read_json("hf.json", {"failed_runs": 0})
        failing = state["failed_runs"] < int(opts["download_failures"])
        if failing:
            state["failed_runs"] += 1
            host.write_json("hf.json", state)
    speed = _speed(opts)
    written: list[str] = []
    skipped = 0

    def record(ok: bool, error: str | None = None) -> None:
        host.event(
            "hf-download",
            repo=repo,
            revision=revision,
            local_dir=str(target),
            downloaded=written,
            skipped=skipped,
            token=source,
            hf_home=os.environ.get("HF_HOME"),
            xet_high_performance=os.environ.get("HF_XET_HIGH_PERFORMANCE") == "1",
            ok=ok,
            error=error,
        )

    # tqdm's bars on stderr, unless disabled (orch disables them: they would bury errors).
    bars = not os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    if bars:
        say(f"Fetching {len(files)} files: 0%", err=True)
    for name, content, logical in files:
        dest = target / name
        if (
            "--force-download" not in flags
            and dest.exists()
            and dest.stat().st_size == len(content)
            and logical_size(dest) == logical
        ):
            skipped += 1
            continue
        partial_dir.mkdir(parents=True, exist_ok=True)
        partial = partial_dir / f"{name}.incomplete"
        if failing and len(written) >= int(opts["download_fail_after_files"]):
            partial.write_bytes(content[: len(content) // 2])
            record(False, "network")
            raise _traceback(
                "httpx.RemoteProtocolError: peer closed connection without sending complete "
                f"message body (received {len(content) // 2} bytes, expected {len(content)})"
            )
        if logical > int(mount_for(host, target)["avail"]):
            partial.write_bytes(content[: len(content) // 2])
            record(False, "disk-full")
            raise _traceback(f"OSError: [Errno 28] No space left on device: '{partial}'")
        if speed:
            time.sleep(logical / float(speed))
        partial.write_bytes(content)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, dest)  # finished files move into place atomically
        written.append(name)
    if bars:
        say(f"Fetching {len(files)} files: 100%", err=True)
    record(True)
    say("✓ Downloaded", f"  path: {target}")
    return 0


# What a dataset downloaded without a Hub (no HF_ENDPOINT) holds: one JSON Lines file per
# split, named as `datasets` finds splits in a folder (data/{split}-00000-of-00001.jsonl),
# each row with the columns of every format orch renders (alpaca, chat messages in OpenAI and
# ShareGPT form, raw text, segments), so a rehearsal on `sim` trains whatever format the job
# names. Real datasets come from a Hub: with HF_ENDPOINT set the real client downloads them.
SYNTHETIC_SPLITS = {"train": 16, "test": 4}


def synthetic_rows(split: str, n: int) -> list[dict[str, Any]]:
    """`n` rows of the synthetic dataset's `split`."""
    rows = []
    for i in range(n):
        q, a = f"What is {i} + {i}? ({split})", str(2 * i)
        rows.append({
            "instruction": q, "input": "", "output": a, "text": f"{q} {a}",
            "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
            "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}],
            "segments": [{"label": False, "text": q + "\n"}, {"label": True, "text": a}],
        })
    return rows


def _dataset(host: Host, argv: list[str], repo: str, revision: str, flags: dict[str, Any],
             token: str | None, source: str | None) -> int:
    """`hf download --repo-type dataset`: the real client when a Hub is named (HF_ENDPOINT:
    the emulator in tests), else the synthetic dataset above."""
    if os.environ.get("HF_ENDPOINT"):
        code = _real_hf(["download", *_mapped(argv)])
        host.event("hf-download", repo=repo, revision=revision, repo_type="dataset",
                   token=source, real_client=True, ok=code == 0)
        return code
    _check_access(host, repo, revision, "dataset", token)
    if "--local-dir" not in flags:
        raise SimError("simhost: `hf download --repo-type dataset` is simulated with "
                       "--local-dir only", 2)
    target = host.writable(container_to_host(flags["--local-dir"]))
    for split, n in SYNTHETIC_SPLITS.items():
        dest = target / "data" / f"{split}-00000-of-00001.jsonl"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(split, n)))
    host.event("hf-download", repo=repo, revision=revision, repo_type="dataset",
               local_dir=str(target), token=source, real_client=False, ok=True)
    say("✓ Downloaded", f"  path: {target}")
    return 0


def _mapped(argv: list[str]) -> list[str]:
    """`argv` with the folders it names inside a container as the host's (`-v` mounts)."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name not in ("--local-dir", "--cache-dir"):
            out.append(arg)
        elif eq:
            out.append(f"{name}={container_to_host(value)}")
        else:
            out += [arg, container_to_host(next(args, ""))]
    return out


def _verify(host: Host, argv: list[str]) -> int:
    positional, flags = _parse(
        argv, {"--local-dir", "--cache-dir", "--revision", "--repo-type", "--token"}, set()
    )
    if not positional:
        raise SimError("usage: hf cache verify REPO_ID [--local-dir DIR]", 2)
    repo = positional[0]
    if "--local-dir" in flags:
        folder = Path(flags["--local-dir"])
    else:
        revision = str(flags.get("--revision", "main"))
        base = Path(flags["--cache-dir"]) if "--cache-dir" in flags else _hf_home() / "hub"
        commit = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
        folder = base / ("models--" + repo.replace("/", "--")) / "snapshots" / commit
    missing: list[str] = []
    mismatched: list[str] = []
    expected = repo_files(host, repo)
    for name, content, _logical in expected:
        path = folder / name
        if not path.exists():
            missing.append(name)
        elif path.read_bytes() != content:
            mismatched.append(name)
    extra = []
    if folder.is_dir():
        known = {n for n, _c, _l in expected}
        for path in folder.rglob("*"):
            rel = path.relative_to(folder).as_posix()
            if path.is_file() and not rel.startswith(".cache/") and rel not in known:
                extra.append(rel)
    checked = len(expected) - len(missing)
    if mismatched:
        say(
            f"❌ Checksum verification failed for {len(mismatched)} file(s):", *mismatched, err=True
        )
        return 1
    say(f"✅ Verified {checked} file(s) for '{repo}' (model) in {folder}", "  All checksums match.")
    code = 0
    if missing:
        say(f"Missing files ({len(missing)}):", *(f"  {m}" for m in missing), err=True)
        code = 1 if "--fail-on-missing-files" in flags else 0
    if extra and "--fail-on-extra-files" in flags:
        say(f"Extra files ({len(extra)}):", *(f"  {e}" for e in extra), err=True)
        code = 1
    return code


def hf(host: Host, argv: list[str]) -> int:
    """Dispatch `hf download|cache verify|auth whoami|version`."""
    if argv[:1] == ["download"]:
        return _download(host, argv[1:])
    if argv[:2] == ["cache", "verify"]:
        return _verify(host, argv[2:])
    if argv[:2] == ["auth", "whoami"]:
        token, _source = _token(None)
        if token is None:
            raise SimError("Not logged in", 1)
        if host.options["hf_token"] is not None and token != host.options["hf_token"]:
            raise SimError("Invalid user token.", 1)
        say("user: sim-user")
        return 0
    if argv[:1] in (["version"], ["--version"]):
        say(f"huggingface_hub version: {VERSION}")
        return 0
    if argv[:1] == ["upload"]:
        return _upload(argv[1:])
    raise SimError(f"simhost: `hf {' '.join(argv)}` is not simulated", 2)


def _upload(args: list[str]) -> int:
    """`hf upload`: the real client (huggingface_hub installed beside this interpreter, as
    in the test environment), on the host's files, against `HF_ENDPOINT`. Uploading is not
    simulated: the Hub (or its emulator) sees exactly what the real tool sends."""
    # Folders and files named inside a container go through its `-v` mounts.
    translated = [container_to_host(a) if a.startswith("/") else a for a in args]
    return _real_hf(["upload", *translated])


def _real_hf(argv: list[str]) -> int:
    """The real huggingface_hub `hf` (installed beside this interpreter, as in the test
    environment) with `argv`, against HF_ENDPOINT."""
    real = Path(sys.executable).parent / "hf"
    if not real.is_file():
        raise SimError(f"simhost: `hf {argv[0]}` runs the real huggingface_hub client, which "
                       f"is not installed beside {sys.executable} (pip install "
                       "huggingface_hub)", 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMHOST_")}
    return subprocess.run([str(real), *argv], env=env, check=False).returncode

