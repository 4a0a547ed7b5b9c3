"""Container rentals: a simulated host that IS a container of the rented image (Vast.ai, RunPod).

Facts modelled (../shared/reference/real-hosts.md §1, §4, §5):

* no Docker inside and no systemd (`SimHost` turns both off);
* the image's commands live where the image puts them: in the axolotl uv images the venv
  `/workspace/axolotl-venv/bin` (axolotl, hf, lm_eval) and uv in `/root/.local/bin` (astral's
  installer's place: docker/Dockerfile-uv-base:27-29 at v0.18.0), both reached through the
  image's `ENV PATH` only;
  other images have no axolotl at all, and vLLM is in none of them;
* SSH sessions do NOT get the image's environment: they start from sshd's defaults plus what
  login reads from `/etc/environment` (pam_env). Something at boot must persist it there
  (Vast: `env >> /etc/environment` in onstart); RunPod's axolotl-cloud entrypoint writes it to
  `/etc/rp_environment` as `export K="V"` lines, which only interactive bash (~/.bashrc)
  sources, so a non-interactive `ssh host cmd` does not see it either;
* a volume mounted over `/workspace` (RunPod's default path) hides the image's
  `/workspace/axolotl` and `/workspace/axolotl-venv`.

Server paths in the environment written here are the simulated host's (under its root), so a
command that sources those files finds the stand-ins, exactly as on a real host.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from . import images
from .common import (
    BIN_DIR,
    SYSTEM_PATH,
    Host,
    image_python,
    is_container,
    write_atomic,
)

AXOLOTL_SOURCE = "/workspace/axolotl"
AXOLOTL_VENV = "/workspace/axolotl-venv"
#: What the axolotl image's venv provides of them (lm_eval is a core axolotl dependency).
AXOLOTL_VENV_COMMANDS = ("axolotl", "hf", "lm_eval")
#: The uv images' uv: outside the venv, in root's ~/.local/bin (images.yaml `layout.uv`), so a
#: volume over /workspace does not hide it.
AXOLOTL_UV = images.layout("uv")
#: The variables cloud-entrypoint.sh dumps to /etc/rp_environment (prefixes, and PATH).
RP_ENVIRONMENT_PREFIXES = ("HF_", "BNB_", "CUDA_", "NCCL_", "NV", "RUNPOD_")


def is_axolotl_image(image: str) -> bool:
    """An `axolotlai/axolotl[-cloud][-uv|-term]` image, which ships the axolotl venv."""
    repo = image.split("@")[0]
    head, _, last = repo.rpartition("/")
    repo = f"{head}/{last.split(':')[0]}" if head else last.split(":")[0]
    return re.fullmatch(r"(?:.+/)?axolotlai/axolotl(?:-[a-z-]+)?", repo) is not None


def hidden(path: str, volume_mount: str | None) -> bool:
    """Whether a volume mounted at `volume_mount` covers `path` of the image."""
    if not volume_mount:
        return False
    mount = "/" + volume_mount.strip("/")
    return mount == "/" or path == mount or path.startswith(mount + "/")


def venv_bin(host: Host) -> Path | None:
    """The image's venv bin directory on the host, or None when the image has none (or a
    volume hides it)."""
    opts = host.options
    if not is_container(host) or not is_axolotl_image(str(opts["container_image"])):
        return None
    if hidden(AXOLOTL_VENV, opts.get("volume_mount")):
        return None
    return host.path(AXOLOTL_VENV) / "bin"


def uv_path(host: Host) -> Path | None:
    """Where the image's uv is on the host, or None when the image has none."""
    opts = host.options
    if not is_container(host) or not is_axolotl_image(str(opts["container_image"])):
        return None
    return host.path(AXOLOTL_UV)


def image_env(host: Host) -> dict[str, str]:
    """The image's environment (its `ENV` lines) with the host's paths."""
    path = f"{host.bin}:{SYSTEM_PATH}"
    env: dict[str, str] = {}
    uv = uv_path(host)
    if uv is not None:  # ENV PATH="/root/.local/bin:${PATH}" (Dockerfile-uv-base:29)
        path = f"{uv.parent}:{path}"
    venv = venv_bin(host)
    if venv is not None:
        path = f"{venv}:{path}"
        env["VIRTUAL_ENV"] = str(venv.parent)
        data = host.path("/workspace/data")
        env["HF_HOME"] = str(data / "huggingface-cache")
        env["HF_HUB_CACHE"] = str(data / "huggingface-cache" / "hub")
    env["PATH"] = path
    env["NVIDIA_VISIBLE_DEVICES"] = "all"
    return env


def _stand_in(python: str, name: str, target: Path) -> None:
    """Make `target` run stand-in `name` (unchanged when it already does)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    script = f'#!/bin/sh\nexec {python} -S -E {shlex.quote(str(BIN_DIR / name))} "$@"\n'
    if not target.exists() or target.read_text() != script:
        write_atomic(target, script, 0o755)


def install(host: Host) -> None:
    """Lay the image out on the host at boot: its venv commands, the volume's mount point, and
    the environment files the boot wrote (`persisted_env`)."""
    opts = host.options
    if not is_container(host):
        return
    mount = opts.get("volume_mount")
    if mount:
        host.path(mount).mkdir(parents=True, exist_ok=True)
    python = shlex.quote(sys.executable)
    uv = uv_path(host)
    if uv is not None:
        _stand_in(python, "uv", uv)
    venv = venv_bin(host)
    if venv is not None:
        for name in AXOLOTL_VENV_COMMANDS:
            if name == "lm_eval" and opts.get("has_lm_eval") is False:
                continue  # the fault: an image without lm-eval
            _stand_in(python, name, venv / name)
        for name in ("python", "python3"):  # the venv's interpreter, with the image's torch
            target = venv / name
            if not target.exists() or target.read_text() != image_python(python):
                write_atomic(target, image_python(python), 0o755)
        # What an SSH command must source for the cu13 libraries (the uv image's entrypoint
        # does it; SSH runtypes replace that entrypoint).
        write_atomic(host.path(AXOLOTL_SOURCE) / "scripts" / "cuda13_env.sh",
                     f'export LD_LIBRARY_PATH="{venv.parent}/lib:${{LD_LIBRARY_PATH:-}}"\n')
    env = image_env(host)
    for name in opts.get("persisted_env") or ():
        if name == "/etc/rp_environment":
            keep = {k: v for k, v in env.items()
                    if k == "PATH" or k.startswith(RP_ENVIRONMENT_PREFIXES)}
            text = "".join(f'export {k}="{v}"\n' for k, v in keep.items())
        else:  # /etc/environment: what `env >> /etc/environment` appends
            text = "".join(f"{k}={v}\n" for k, v in env.items())
        target = host.writable(host.path(name))
        previous = target.read_text() if target.exists() else ""
        if text not in previous:
            write_atomic(target, previous + text)
