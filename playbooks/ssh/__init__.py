"""SSH to GPU hosts: pinned host keys, bounded retries, quoted commands, SFTP, secrets, tunnels.

A leaf of the tree: nothing here imports from `orchestrator` (but its bottom layer, the one
retry policy `providers.retrying`), `providers` or other playbooks modules
(tests/test_layers.py). Callers write `from playbooks.ssh import X`; the names load lazily
(PEP 562) so that `playbooks.ssh.limits`, whose defaults orch's settings name, does not pull
in paramiko and fabric at start-up. The modules:

- `errors`: what this layer raises, and a command's `Result`;
- `hostkeys`: parsing, fingerprints, the pinned-key policy;
- `connection`: the connection factory, retries, trust on first use;
- `commands`: `run` and `build_command` (argv quoted word by word, always a timeout);
- `sftp`: stat, list, remove, upload, download, read (one SFTP channel per thread);
- `secret_env`: the 0600 env file that carries secrets;
- `forwarding`: `tunnel`, a local port carried to the host;
- `limits`: the timeouts' defaults and a connection's own (no third-party imports).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playbooks.ssh.commands import build_command, run
    from playbooks.ssh.connection import ConnectionFactory, is_transient, trust_on_first_use
    from playbooks.ssh.errors import (
        AuthenticationFailed,
        CommandFailed,
        CommandTimeout,
        ConnectionLost,
        HostKeyMismatch,
        HostUnreachable,
        Result,
        SSHError,
    )
    from playbooks.ssh.forwarding import tunnel
    from playbooks.ssh.hostkeys import (
        HostKey,
        PinnedHostKeyPolicy,
        fingerprint,
        format_host_key,
        parse_host_key,
    )
    from playbooks.ssh.limits import COMMAND_TIMEOUT_S, IO_TIMEOUT_S, command_timeout, io_timeout
    from playbooks.ssh.secret_env import write_secret_env
    from playbooks.ssh.sftp import (
        get_file,
        list_dir,
        put_file,
        read_file,
        remove_files,
        stat,
    )

__all__ = [
    "AuthenticationFailed",
    "COMMAND_TIMEOUT_S",
    "CommandFailed",
    "CommandTimeout",
    "ConnectionFactory",
    "ConnectionLost",
    "HostKey",
    "HostKeyMismatch",
    "HostUnreachable",
    "IO_TIMEOUT_S",
    "PinnedHostKeyPolicy",
    "Result",
    "SSHError",
    "build_command",
    "command_timeout",
    "fingerprint",
    "format_host_key",
    "get_file",
    "io_timeout",
    "is_transient",
    "list_dir",
    "parse_host_key",
    "put_file",
    "read_file",
    "remove_files",
    "run",
    "stat",
    "trust_on_first_use",
    "tunnel",
    "write_secret_env",
]

# Where each public name is defined, for the lazy look-up below (the same names as __all__).
_HOME = {
    "SSHError": "errors",
    "HostKeyMismatch": "errors",
    "AuthenticationFailed": "errors",
    "HostUnreachable": "errors",
    "ConnectionLost": "errors",
    "CommandTimeout": "errors",
    "CommandFailed": "errors",
    "Result": "errors",
    "HostKey": "hostkeys",
    "PinnedHostKeyPolicy": "hostkeys",
    "parse_host_key": "hostkeys",
    "format_host_key": "hostkeys",
    "fingerprint": "hostkeys",
    "ConnectionFactory": "connection",
    "is_transient": "connection",
    "trust_on_first_use": "connection",
    "COMMAND_TIMEOUT_S": "limits",
    "command_timeout": "limits",
    "io_timeout": "limits",
    "build_command": "commands",
    "run": "commands",
    "IO_TIMEOUT_S": "limits",
    "stat": "sftp",
    "list_dir": "sftp",
    "remove_files": "sftp",
    "put_file": "sftp",
    "get_file": "sftp",
    "read_file": "sftp",
    "write_secret_env": "secret_env",
    "tunnel": "forwarding",
}


def __getattr__(name: str) -> Any:
    """Load the module that defines `name` on first use (start-up laziness, see above)."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
