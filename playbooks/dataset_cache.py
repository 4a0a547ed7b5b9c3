"""A Hugging Face dataset to the host: `hf download --repo-type dataset`, run ON the GPU host
(datacenter bandwidth; the data never passes through the user's machine), once per
repo@revision and shared by later jobs on the same server, like the model cache.

One step, `dataset:<repo>`:

- check: the folder's `.orch-complete` marker names this repo@revision (written only after
  a download that exited 0, so a cut download is never taken for a finished one);
- apply: `env HF_HOME=... hf download REPO --repo-type=dataset --revision=R --local-dir=DIR`
  (huggingface_hub 1.17.0 cli/download.py flags, real-hosts.md §8), retried a few times
  (`hf` resumes and skips complete files), refusals (gated, missing, unknown revision, bad
  token) failed at once with `classify_download_error`'s words, then the marker.

`HF_TOKEN` travels as for the model download: a 0600 env file (`<base>/secrets/hf.env`,
`ssh.write_secret_env`) sourced by the command and removed right after it (`secrets.scrub`
removes it too if the host stopped answering), never argv. Axolotl then reads the folder
(`load_dataset(DIR, name=subset, split=split)`: axolotl 0.18.0 utils/data/shared.py:290-301).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from playbooks import ssh
from playbooks.base import (
    CONTAINER_ROOT,
    Fault,
    Host,
    Layout,
    Step,
    StepFailed,
    last_line,
    safe_name,
)
from playbooks.hfrepo import repo_id_problem
from playbooks.model_cache import DownloadFailed, classify_download_error, validate_revision
from providers import retrying

MARKER = ".orch-complete"
DEFAULT_ATTEMPTS = 3
DEFAULT_RETRY_WAIT_S = 5.0
DEFAULT_TIMEOUT_S = 2 * 3600.0

# The marker is written through a positional parameter: the folder is data, never syntax.
_MARK = 'printf "%s\\n" "$2" > "$1/.orch-complete.tmp" && mv "$1/.orch-complete.tmp" "$1/' \
        + MARKER + '"'


def dataset_dir(layout: Layout, repo: str, revision: str) -> str:
    """Host path of a dataset's folder (`org/name` as `org--name`, as the Hub cache names it:
    `--` cannot occur in a repo id, so two datasets never share a folder)."""
    return (f"{layout.base}/datasets/{safe_name(repo.replace('/', '--'))}/"
            f"{safe_name(revision)}")


@dataclass
class DatasetCache:
    """One Hub dataset's download; `dir` is the folder the trainer config names."""

    repo: str
    revision: str
    layout: Layout
    hf_token: str | None = field(default=None, repr=False)
    # HF_ENDPOINT where orch runs (None: huggingface.co): the host's `hf` asks the same Hub
    # orch checked before renting (the emulator in tests), through the env file as upload.
    hub_endpoint: str | None = None
    where: str = "dataset.path.hf"  # the job file's field that names it (for errors)
    attempts: int = DEFAULT_ATTEMPTS
    retry_wait_s: float = DEFAULT_RETRY_WAIT_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    # As for the model cache (pipeline.cache_for): a container rental runs `hf` in the
    # image's environment, a Docker host in a throwaway container of the trainer image.
    wrap: Callable[[Sequence[str]], list[str]] | None = field(default=None, repr=False)
    image: str | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1 (got {self.attempts})")

    @property
    def dir(self) -> str:
        """The dataset's folder on the host."""
        return dataset_dir(self.layout, self.repo, self.revision)

    @property
    def env_file(self) -> str:
        """The 0600 file with HF_TOKEN (and HF_ENDPOINT), sourced by the download only."""
        return f"{self.layout.base}/secrets/hf.env"

    def _env(self) -> dict[str, str]:
        return {**({"HF_TOKEN": self.hf_token} if self.hf_token else {}),
                **({"HF_ENDPOINT": self.hub_endpoint} if self.hub_endpoint else {})}

    def steps(self) -> list[Step]:
        """The playbook: one idempotent download step."""
        return [Step(f"dataset:{self.repo}", self._complete, self._download,
                     timeout_s=self.timeout_s + 60.0, fault=Fault.TRANSIENT)]

    def _complete(self, host: Host) -> bool:
        problem = repo_id_problem(self.repo)
        if problem is not None:  # before any command runs with it
            raise StepFailed(f"not a Hugging Face dataset id: {problem}", fault=Fault.USER)
        validate_revision(self.revision)
        marker = host.read(f"{self.dir}/{MARKER}")
        return marker is not None and marker.decode(errors="replace").strip() == self._stamp

    @property
    def _stamp(self) -> str:
        return f"{self.repo}@{self.revision}"

    def download_argv(self) -> list[str]:
        """The download command (no secret in it: the token comes from the env file)."""
        inside = self.layout.container if self.image is not None else str
        argv = ["env", f"HF_HOME={inside(self.layout.base + '/hf-home')}",
                "HF_HUB_DISABLE_PROGRESS_BARS=1", "HF_HUB_DISABLE_UPDATE_CHECK=1",
                "HF_XET_HIGH_PERFORMANCE=1", "hf", "download", self.repo,
                "--repo-type=dataset", f"--revision={self.revision}",
                f"--local-dir={inside(self.dir)}"]
        if self.image is None:
            return argv
        # `-e NAME` passes the sourced env file's value by name, never on the argv.
        names = [x for name in self._env() for x in ("-e", name)]
        return ["docker", "run", "--rm", "--label", "orch.role=dataset-download",
                "-v", f"{self.layout.base}:{CONTAINER_ROOT}", *names, self.image, *argv]

    def _download(self, host: Host) -> None:
        env_file: str | None = None
        if self._env():
            env_file = self.env_file
            ssh.write_secret_env(host.conn, env_file, self._env())
        try:
            self._download_with(host, env_file)
        finally:
            if env_file is not None:
                with contextlib.suppress(ssh.SSHError):
                    ssh.remove_files(host.conn, [env_file],
                                     timeout=min(ssh.IO_TIMEOUT_S, 60.0))
        host.must(["sh", "-c", _MARK, "sh", self.dir, self._stamp],
                  f"marking {self.repo} downloaded")

    def _download_with(self, host: Host, env_file: str | None) -> None:
        argv = self.download_argv()
        if self.wrap is not None:
            argv = self.wrap(argv)

        def once() -> None:
            result = host.run(argv, timeout=self.timeout_s, env_file=env_file)
            if result.ok:
                return
            permanent = classify_download_error(
                result.stderr or result.stdout, result.exit_code, self.repo, self.revision,
                has_token=bool(self.hf_token), field=self.where, repo_type="dataset")
            raise permanent if permanent is not None else DownloadFailed(result)

        try:
            retrying.policy(DownloadFailed, attempts=self.attempts,
                            wait=retrying.steps(self.retry_wait_s, self.retry_wait_s))(once)
        except DownloadFailed as failed:
            error = failed.result.stderr or failed.result.stdout
            raise StepFailed(
                f"hf download of dataset {self.repo} failed {self.attempts} times (last exit "
                f"{failed.result.exit_code}): {last_line(error)}; hf resumes where it "
                "stopped, so retrying the job continues the download",
                fault=Fault.TRANSIENT, stderr=error) from None
