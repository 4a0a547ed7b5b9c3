"""Remove orch's secrets from a host when a job ends (issue 10 §6).

`HF_TOKEN` reaches a host in 0600 files: `<base>/secrets/hf.env` (sourced by the model
download, removed right after it), `<base>/jobs/<id>/secrets.env` (sourced by training and
merge, only when they fetch the model from the Hub themselves: never in the engine's
pipeline, which trains from the model cache, issue 23 §10) and `<base>/jobs/<id>/upload.env`
(`hf upload`, removed after it) and `<base>/secrets/hostcheck.env` (the host check's ranged
GET of the model, removed right after it: playbooks/hostcheck.py). A rented
machine is destroyed with its disk, but a monthly server is kept: there the files, and any
temporary copy a failed upload left (`.<name>.<hex>.tmp`), would stay readable by whoever
gets root on the box next. `scrub` deletes every such file under orch's directory.
"""

from __future__ import annotations

from playbooks.base import Host

# Every name `ssh.write_secret_env` can leave: the files and their temporary copies.
SECRET_NAMES = ("hf.env", "secrets.env", "upload.env", "hostcheck.env", ".hf.env.*.tmp",
                ".secrets.env.*.tmp", ".upload.env.*.tmp", ".hostcheck.env.*.tmp")

# Positional parameters only: the directories are data, never shell syntax.
_SCRUB = r"""
for dir in "$@"; do
  [ -d "$dir" ] || continue
  find "$dir" -maxdepth 2 -type f \( -name hf.env -o -name secrets.env -o -name upload.env \
    -o -name hostcheck.env -o -name '.hf.env.*.tmp' -o -name '.secrets.env.*.tmp' \
    -o -name '.upload.env.*.tmp' -o -name '.hostcheck.env.*.tmp' \) -print -delete
done
"""


def scrub(host: Host, base: str, timeout: float = 60.0) -> list[str]:
    """Delete the secret files under orch's directory `base` (a host path); the paths removed.

    Raises `ssh.SSHError` when the host cannot be reached, `StepFailed` when `find` fails.
    """
    result = host.must(["sh", "-c", _SCRUB, "sh", f"{base}/secrets", f"{base}/jobs"],
                       "removing secret files", timeout=timeout)
    return [line for line in result.stdout.splitlines() if line.strip()]
