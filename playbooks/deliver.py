"""The trained model to a Hugging Face repo, uploaded from the GPU host with `hf upload`.

A merged 70B model is ~140 GB: it goes from the host (datacenter bandwidth) straight to the
Hub, never through the machine running orch. `hf upload REPO FOLDER . --private` (hugging-
face_hub 1.17.0, `cli/upload.py`) creates the repo when it is missing (`--private` applies
only then: an existing repo keeps its visibility), hashes the files and uploads the large
ones through LFS/Xet. Run where `hf` is: in the trainer image (a container on a Docker
host, the rented image's venv on a container rental), with `HF_TOKEN` from a 0600 env file
sourced by the command, never on its argv.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from playbooks import artifacts, merge, ssh
from playbooks.base import CONTAINER_ROOT, Fault, Host, Step, StepFailed, last_line
from playbooks.trainjob import TrainJob

# What is never uploaded with an adapter: checkpoints (resume state), axolotl's prepared
# dataset cache, the merged model (uploaded on its own when asked), hidden files.
NOT_UPLOADED = ("checkpoint-*", "prepared/*", f"{artifacts.MERGED}/*", ".*")
UPLOAD_TIMEOUT_S = 6 * 3600.0


@dataclass(frozen=True)
class HubTarget:
    """Where the result goes on the Hub."""

    repo: str
    private: bool = True
    merged: bool = False  # the merged model (else the adapter and the trainer's files)


def folder(tj: TrainJob, target: HubTarget) -> str:
    """The host directory uploaded."""
    return merge.merged_dir(tj) if target.merged else tj.output_dir


def upload_argv(tj: TrainJob, target: HubTarget, *, token: bool) -> list[str]:
    """The upload command as it runs on `tj`'s kind of host (no secret in it)."""
    local = folder(tj, target)
    if tj.runner == "docker":
        local = tj.layout.container(local)
    argv = ["env", "HF_HUB_DISABLE_PROGRESS_BARS=1", "HF_HUB_DISABLE_UPDATE_CHECK=1",
            "hf", "upload", target.repo, local, ".", "--repo-type=model",
            "--private" if target.private else "--no-private",
            f"--commit-message=orch: {'merged model' if target.merged else 'adapter'} of "
            f"job {tj.job_id}",
            *([] if target.merged else [f"--exclude={p}" for p in NOT_UPLOADED])]
    if tj.runner == "docker":
        env = [x for name in (("HF_TOKEN",) if token else ()) + ("HF_ENDPOINT",)
               for x in ("-e", name)]
        return ["docker", "run", "--rm", "--label", "orch.role=upload",
                "-v", f"{tj.layout.base}:{CONTAINER_ROOT}", *env, tj.image, *argv]
    return tj.native.wrap(argv)


def hub_url(repo: str, endpoint: str | None) -> str:
    """The repo's page."""
    return f"{(endpoint or 'https://huggingface.co').rstrip('/')}/{repo}"


def push(host: Host, tj: TrainJob, target: HubTarget, token: str | None,
         endpoint: str | None = None, timeout_s: float = UPLOAD_TIMEOUT_S) -> str:
    """Upload the result; the repo's URL. StepFailed (USER) when the Hub refuses it."""
    if not token:
        raise StepFailed(f"output.push_to_hub ({target.repo}) needs HF_TOKEN: set it to a "
                         "write token (https://huggingface.co/settings/tokens)",
                         fault=Fault.USER)
    if not host.run(["test", "-d", folder(tj, target)]).ok:
        raise StepFailed(f"nothing to upload: {folder(tj, target)} is not on the host",
                         fault=Fault.HOST)
    env_file = f"{tj.layout.job_dir(tj.job_id)}/upload.env"
    values = {"HF_TOKEN": token, **({"HF_ENDPOINT": endpoint} if endpoint else {})}
    ssh.write_secret_env(host.conn, env_file, values)
    try:
        result = host.run(upload_argv(tj, target, token=True), timeout=timeout_s,
                          env_file=env_file)
    finally:
        with contextlib.suppress(ssh.SSHError):
            ssh.remove_files(host.conn, [env_file], timeout=min(ssh.io_timeout(host.conn), 60.0))
    if not result.ok:
        raise classify_upload_error(result.stderr or result.stdout, target.repo)
    return hub_url(target.repo, endpoint)


def classify_upload_error(stderr: str, repo: str) -> StepFailed:
    """What a failed `hf upload` means for the user (its `Error: ...` texts)."""
    if "rights to create" in stderr or "rights to write" in stderr or "403" in stderr:
        return StepFailed(f"the Hub refused to write {repo}: HF_TOKEN needs write access to "
                          f"the namespace {repo.split('/')[0]!r} (a write token of a member)",
                          fault=Fault.USER, stderr=stderr)
    if "Invalid credentials" in stderr or "Invalid username or password" in stderr:
        return StepFailed("Hugging Face rejected HF_TOKEN: set HF_TOKEN to a valid write "
                          "token", fault=Fault.USER, stderr=stderr)
    return StepFailed(f"hf upload to {repo} failed: {last_line(stderr)}; the results are "
                      "still on the host and in the artifacts", fault=Fault.TRANSIENT,
                      stderr=stderr)


@dataclass
class Upload:
    """The `deliver` playbook: one upload step; `url` is set once it is done."""

    tj: TrainJob
    target: HubTarget
    token: str | None = field(default=None, repr=False)
    endpoint: str | None = None
    url: str | None = None

    def steps(self) -> list[Step]:
        return [Step("hf-upload", lambda _host: self.url is not None, self._apply,
                     timeout_s=UPLOAD_TIMEOUT_S + 60, fault=Fault.TRANSIENT)]

    def _apply(self, host: Host) -> None:
        self.url = push(host, self.tj, self.target, self.token, self.endpoint)
