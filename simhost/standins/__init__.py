"""The commands of a simulated GPU host (`nvidia-smi`, `docker`, `apt-get`, `hf`, ...).

Each script in `simhost/bin/` calls `main(name, argv)`. Stdlib only; state lives in
the host directory named by `SIMHOST_DIR`, so what one command changes the next one sees.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module

from .common import Host, SimError, say

# command -> (module, function); modules are imported on demand to keep each command quick.
_COMMANDS: dict[str, tuple[str, str]] = {
    "nvidia-smi": ("gpu", "nvidia_smi"),
    "apt-get": ("system", "apt_get"),
    "apt": ("system", "apt_get"),
    "dpkg-query": ("system", "dpkg_query"),
    "nvidia-ctk": ("system", "nvidia_ctk"),
    "systemctl": ("system", "systemctl"),
    "service": ("system", "service"),
    "curl": ("system", "curl"),
    "gpg": ("system", "gpg"),
    "lsblk": ("disks", "lsblk"),
    "df": ("disks", "df"),
    "dd": ("dd", "dd"),
    "docker": ("docker", "docker"),
    "hf": ("hf", "hf"),
    "axolotl": ("axolotl", "axolotl"),
    "vllm": ("vllm", "vllm"),
    "lm_eval": ("lm_eval", "lm_eval"),
    "sudo": ("system", "sudo"),
    "id": ("system", "id_cmd"),
    "uv": ("uv", "uv"),
}


# Set in the process the host's init forked to run a relayed command (init.py): its
# `command` event says so, for tests and benchmarks.
RELAYED = False


def main(name: str, argv: list[str]) -> int:
    """Run stand-in `name` with `argv`; returns the exit status."""
    if name == "simhost-init":
        from .init import main as init_main

        return init_main(argv)
    try:
        host = Host.from_env()
        host.event("command", cmd=name, argv=argv, **({"relayed": True} if RELAYED else {}))
        module, function = _COMMANDS[name]
        handler: Callable[[Host, list[str]], int] = getattr(
            import_module(f".{module}", __name__), function
        )
        return handler(host, argv)
    except SimError as exc:
        say(exc.message, err=True)
        return exc.code
    except BrokenPipeError:
        return 141
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1], sys.argv[2:]))
