"""`uv venv DIR` and `uv pip install --python DIR/bin/python PKG==VER` (the axolotl uv images).

Only what orch runs on a container rental to install vLLM beside the image's own venv
(playbooks/vllm_native.py); the axolotl uv images have uv in /root/.local/bin
(standins/container.py). A venv is a directory with `bin/python` and `pyvenv.cfg`; as uv
(0.8 on; these texts are uv 0.13.9's), `uv venv DIR` refuses a non-empty DIR ("A virtual
environment already exists at: DIR", exit 2) unless given `--allow-existing`. Installing
`vllm==X` puts a `bin/vllm` there that is the vLLM stand-in of release X (so `vllm --version`
says X and `vllm serve` reads models as that release does); every package installed is
recorded (`installed.json`, which `vllm serve` reads for bitsandbytes) and becomes a module
of that name whose `__version__` is X, importable by the venv's `bin/python` (which sees
nothing else installed). Unknown commands and flags fail with uv's usage error (exit 2).

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
    allow_existing = False
    while args:
        arg = args.pop(0)
        if arg == "--python":
            args.pop(0)
        elif arg == "--allow-existing":
            allow_existing = True
        elif arg.startswith("-"):
            raise SimError(f"error: unexpected argument '{arg}' found\n\nUsage: uv venv "
                           "[OPTIONS] [PATH]", 2)
        else:
            target = arg
    shown = target or ".venv"
    folder = host.writable(Path(shown))
    say(f"Creating virtual environment at: {shown}", err=True)
    if not allow_existing and folder.is_dir() and any(folder.iterdir()):
        # uv (0.8 on) refuses a non-empty directory without --allow-existing or --clear.
        what = ("virtual environment" if (folder / "pyvenv.cfg").is_file() else "directory")
        raise SimError(f"error: Failed to create virtual environment\n  cause: A {what} "
                       f"already exists at: {shown}\n\nhint: Use the `--clear` flag or set "
                       f"`UV_VENV_CLEAR=1` to replace the existing {what}", 2)
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "pyvenv.cfg", "home = /usr/bin\nimplementation = CPython\n")
    # The venv's interpreter sees what was installed into it and nothing of the machine's
    # packages (-S: no site-packages but the venv's; `uv pip install` writes modules there).
    python = shlex.quote(sys.executable)
    site = shlex.quote(str(_site_packages(folder)))
    write_atomic(folder / "bin" / "python",
                 f'#!/bin/sh\nPYTHONPATH={site} exec {python} -S "$@"\n', 0o755)
    return 0


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / "python3" / "site-packages"


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
        # An importable module that says its version, as the wheel's `__version__` does.
        module = host.writable(_site_packages(venv) / name.lower().replace("-", "_"))
        module.mkdir(parents=True, exist_ok=True)
        write_atomic(module / "__init__.py", f"__version__ = {version!r}\n")
        if name.lower() == "vllm":
            script = (f"#!/bin/sh\nSIMHOST_VLLM_VERSION={shlex.quote(version)} "
                      f"SIMHOST_VLLM_VENV={shlex.quote(str(venv))} exec "
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
