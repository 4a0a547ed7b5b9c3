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

import shlex

from playbooks.base import Host

# The files `ssh.write_secret_env` writes HF_TOKEN to (`model_cache`: hf.env, `Layout`:
# secrets.env, `deliver`: upload.env, `hostcheck`: hostcheck.env), and the temporary copy
# each is written through
# (`.<name>.<hex>.tmp`, playbooks/ssh/secret_env.py), which a failed upload leaves.
SECRET_FILES = ("hf.env", "secrets.env", "upload.env", "hostcheck.env")
SECRET_NAMES = (*SECRET_FILES, *(f".{name}.*.tmp" for name in SECRET_FILES))

# Generated from SECRET_NAMES, the one list. Positional parameters only: the directories
# are data, never shell syntax.
_SCRUB = ('for dir in "$@"; do\n'
          '  [ -d "$dir" ] || continue\n'
          '  find "$dir" -maxdepth 2 -type f \\( '
          + " -o ".join(f"-name {shlex.quote(name)}" for name in SECRET_NAMES)
          + ' \\) -print -delete\n'
          'done\n')


def scrub(host: Host, base: str, timeout: float = 60.0) -> list[str]:
    """Delete the secret files under orch's directory `base` (a host path); the paths removed.

    Raises `ssh.SSHError` when the host cannot be reached, `StepFailed` when `find` fails.
    """
    result = host.must(["sh", "-c", _SCRUB, "sh", f"{base}/secrets", f"{base}/jobs"],
                       "removing secret files", timeout=timeout)
    return [line for line in result.stdout.splitlines() if line.strip()]
