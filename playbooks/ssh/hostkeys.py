"""Host keys: parsing, fingerprints, and the policy that accepts exactly the pinned key.

The key to pin comes from the provider or from `trust_on_first_use` at first contact and is
recorded by the caller; the client's known-hosts store stays empty.
"""

from __future__ import annotations

import base64
import hashlib
from typing import TypeAlias

import paramiko

from playbooks.ssh.errors import HostKeyMismatch

HostKey: TypeAlias = "paramiko.PKey | str"
"""A pinned host key: a paramiko key or its OpenSSH text `ssh-ed25519 AAAA...`."""

_RSA_ALGORITHMS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


def parse_host_key(text: str) -> paramiko.PKey:
    """A key from its OpenSSH text form, `TYPE BASE64 [comment]`."""
    parts = text.split()
    if len(parts) < 2:
        raise ValueError("a host key looks like 'ssh-ed25519 AAAA...'")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except Exception as exc:  # paramiko raises several types for bad key data
        raise ValueError(f"not a valid {parts[0]} host key: {exc}") from None


def format_host_key(key: paramiko.PKey) -> str:
    """The OpenSSH text form of a key, what the caller records (`ssh-ed25519 AAAA...`)."""
    return f"{key.get_name()} {key.get_base64()}"


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...` as OpenSSH prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _as_key(key: HostKey) -> paramiko.PKey:
    return parse_host_key(key) if isinstance(key, str) else key


def _same_key(a: paramiko.PKey, b: paramiko.PKey) -> bool:
    return bool(a.get_name() == b.get_name() and a.asbytes() == b.asbytes())


class PinnedHostKeyPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # untyped base
    """Accept the one expected host key; anything else raises `HostKeyMismatch`.

    The client's known-hosts store stays empty, so paramiko asks this policy about every
    key the server presents.
    """

    def __init__(self, expected: paramiko.PKey, port: int) -> None:
        self.expected = expected
        self.port = port

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        """Called by paramiko with the server's key, before authentication."""
        if not _same_key(key, self.expected):
            host = hostname.removeprefix("[").split("]")[0]
            raise HostKeyMismatch(host, self.port, fingerprint(self.expected), fingerprint(key))


def _host_key_algorithms(key: paramiko.PKey) -> list[str]:
    name = key.get_name()
    return list(_RSA_ALGORITHMS) if name == "ssh-rsa" else [name]


def _disabled_host_key_algorithms(key: paramiko.PKey) -> list[str]:
    """Every host key algorithm but the pinned key's, so negotiation picks the pinned type."""
    allowed = set(_host_key_algorithms(key))
    known: tuple[str, ...] = tuple(getattr(paramiko.Transport, "_preferred_keys", ()))
    return [algorithm for algorithm in known if algorithm not in allowed]
