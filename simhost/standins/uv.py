"""`uv venv DIR` and `uv pip install --python DIR/bin/python PKG==VER` (the axolotl uv images).

Only what orch runs on a container rental to install vLLM beside the image's own venv
(playbooks/vllm_native.py). A venv is a directory with `bin/python` and `pyvenv.cfg`;
installing `vllm==X` puts a `bin/vllm` there that is the vLLM stand-in of release X (so
`vllm --version` says X and `vllm serve` reads models as that release does). Other packages
are recorded only. Unknown commands and flags fail with uv's usage error (exit 2).

`uv pip install --python <image venv>/bin/python PKG` adds to the axolotl image's own venv:
recorded in $HOME (standins/lm_eval.py reads `lm_eval[api]` there): in a container of the
image, its own root, gone with the container as on Docker; on a container rental (the image
is the machine), the rental's home, kept as long as the rental.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from . import images
from .common import BIN_DIR, Host, SimError, say, write_atomic
from .lm_eval import IMAGE_VENV_RECORD


def _venv(host: Host, args: list[str]) -> int:
    target: str | None = None
    while args:
        arg = args.pop(0)
        if arg == "--python":
            args.pop(0)
        elif arg.startswith("-"):
            raise SimError(f"error: unexpected argument '{arg}' found\n\nUsage: uv venv "
                           "[OPTIONS] [PATH]", 2)
        else:
            target = arg
    folder = host.writable(Path(target or ".venv"))
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "pyvenv.cfg", "home = /usr/bin\nimplementation = CPython\n")
    python = shlex.quote(sys.executable)
    write_atomic(folder / "bin" / "python", f'#!/bin/sh\nexec {python} "$@"\n', 0o755)
    say(f"Creating virtual environment at: {target or '.venv'}", err=True)
    return 0


def _pip_install(host: Host, args: list[str]) -> int:
    python: str | None = None
    packages: list[str] = []
    quiet = False
    while args:
        arg = args.pop(0)
        if arg in ("--python", "-p"):
            python = args.pop(0)
        elif arg in ("--quiet", "-q"):
            quiet = True
        elif arg.startswith("-"):
            raise SimError(f"error: unexpected argument '{arg}' found\n\nUsage: uv pip install "
                           "[OPTIONS] <PACKAGE|--requirements <REQUIREMENTS>|--editable "
                           "<EDITABLE>>", 2)
        else:
            packages.append(arg)
    if python == f"{images.layout('venv')}/bin/python":
        return _image_venv_install(host, packages, quiet)
    venv = Path(python).parent.parent if python else None
    if venv is None or not (venv / "pyvenv.cfg").is_file():
        raise SimError("error: No virtual environment found; run `uv venv` to create an "
                       "environment, or pass `--system` to install into a non-virtual "
                       "environment", 2)
    record = venv / "installed.json"
    installed: dict[str, str] = json.loads(record.read_text()) if record.is_file() else {}
    for spec in packages:
        name, _, version = spec.partition("==")
        installed[name.lower()] = version
        if name.lower() == "vllm":
            script = (f"#!/bin/sh\nSIMHOST_VLLM_VERSION={shlex.quote(version)} exec "
                      f'{shlex.quote(sys.executable)} -S -E {shlex.quote(str(BIN_DIR / "vllm"))}'
                      ' "$@"\n')
            write_atomic(host.writable(venv / "bin" / "vllm"), script, 0o755)
    write_atomic(record, json.dumps(installed, indent=1))
    host.event("uv-pip-install", venv=str(venv), packages=packages)
    if not quiet:
        say(f"Installed {len(packages)} package(s)", err=True)
    return 0


def _image_venv_install(host: Host, packages: list[str], quiet: bool) -> int:
    record = Path(os.environ["HOME"]) / IMAGE_VENV_RECORD
    added: dict[str, bool] = json.loads(record.read_text()) if record.is_file() else {}
    for spec in packages:
        added[spec.partition("==")[0]] = True
    write_atomic(record, json.dumps(added))
    host.event("uv-pip-install", venv=images.layout("venv"), packages=packages,
               container=os.environ.get("SIMHOST_CONTAINER"))
    if not quiet:
        say(f"Installed {len(packages)} package(s)", err=True)
    return 0


def uv(host: Host, argv: list[str]) -> int:
    """`uv venv ...` and `uv pip install ...`."""
    if argv[:1] == ["venv"]:
        return _venv(host, argv[1:])
    if argv[:2] == ["pip", "install"]:
        return _pip_install(host, argv[2:])
    raise SimError(f"simhost: `uv {' '.join(argv)}` is not simulated", 2)
