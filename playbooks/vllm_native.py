"""vLLM on a container rental (Vast.ai, RunPod): installed in a venv of its own, run detached.

A rental is a container of the axolotl image: there is no Docker to start `vllm/vllm-openai`
in, and the image has no vLLM (real-hosts.md §1, §6). So orch installs the same vLLM
release the Docker hosts run (playbooks/data/images.yaml, `vllm`) with the image's `uv`
into a venv of its own under the job layout (never into the axolotl venv: vLLM brings its
own torch), calling that `uv` by its path in the image (images.yaml `layout.uv`: an SSH
session does not get the image's PATH), and runs `vllm serve` there under
`playbooks/remote/orch-job.sh` (setsid, pid and exit-code files), listening on the
rental's 127.0.0.1 only and reached through the SSH tunnel as on a Docker host.
docs/playbooks.md ("Evaluation on container rentals") has the design and its cost; the
venv lives on the job's disk, so a takeover on the same machine (or a volume) finds it
installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import images, vllm
from .base import Fault, Host, Layout, StepFailed

Wrap = Callable[[Sequence[str]], list[str]]
PYTHON = "3.12"  # the axolotl images' Python (images.yaml tags), for uv's venv
# Prints a module's __version__ (the install check imports what the served form needs).
_VERSION_OF = "import importlib, sys; print(importlib.import_module(sys.argv[1]).__version__)"


def served_requirements(quantization: str | None) -> tuple[tuple[str, str], ...]:
    """(package, version) the served form needs in the vLLM venv besides vLLM: bitsandbytes
    for the 4-bit base (vLLM's wheel does not require it; images.yaml `vllm`)."""
    if quantization == "bitsandbytes":
        return (("bitsandbytes", images.catalog().vllm["bitsandbytes"]),)
    return ()


@dataclass(frozen=True)
class NativeServer:
    """One job's vLLM process on a container rental."""

    venv: str  # host path of the vLLM venv
    version: str  # the vllm release to install
    run_dir: str  # orch-job.sh's pid / log / exit_code for the server
    wrapper: str  # the uploaded orch-job.sh
    port: int  # on the rental's 127.0.0.1
    args: tuple[str, ...]  # engine arguments (host paths)
    wrap: Wrap  # restores the image's environment (the cu13 libraries, HF_* variables)
    uv: str  # the image's uv (host path)
    # (package, version) the served form needs besides vLLM (`served_requirements`)
    extras: tuple[tuple[str, str], ...] = ()

    @classmethod
    def for_job(cls, layout: Layout, job_id: str, version: str, wrapper: str, port: int,
                args: Sequence[str], wrap: Wrap, uv: str,
                extras: Sequence[tuple[str, str]] = ()) -> NativeServer:
        """The server of `job_id`, with the venv shared by the jobs of this layout."""
        return cls(f"{layout.base}/vllm-venv/{version}", version,
                   f"{layout.job_dir(job_id)}/run/vllm", wrapper, port, tuple(args), wrap, uv,
                   tuple(extras))

    @property
    def vllm(self) -> str:
        return f"{self.venv}/bin/vllm"

    def install_argvs(self) -> list[list[str]]:
        """`uv venv` then `uv pip install vllm==VERSION` (and `extras`, resolved together)
        into it (through the image's env).

        `--allow-existing`: a venv left by an install that did not finish (a lost
        connection, a step timeout) is reused; uv refuses an existing one without it."""
        wanted = [f"vllm=={self.version}", *(f"{name}=={v}" for name, v in self.extras)]
        return [self.wrap([self.uv, "venv", "--allow-existing", "--python", PYTHON,
                           self.venv]),
                self.wrap([self.uv, "pip", "install", "--python", f"{self.venv}/bin/python",
                           *wanted])]

    def installed(self, host: Host) -> bool:
        """Whether the venv holds this vLLM release (`vllm --version`) and imports each of
        `extras` at its version (a venv an adapter-less job made has no bitsandbytes)."""
        result = host.run([self.vllm, "--version"])
        if not (result.ok and result.stdout.strip().splitlines()[-1:] == [self.version]):
            return False
        for name, version in self.extras:
            # As `vllm serve` runs (`serve_argv`): the venv's python, not the image's env.
            found = host.run([f"{self.venv}/bin/python", "-c", _VERSION_OF, name])
            if not (found.ok and found.stdout.strip().splitlines()[-1:] == [version]):
                return False
        return True

    def install(self, host: Host) -> None:
        if not host.run(["test", "-x", self.uv]).ok:
            raise StepFailed(f"uv is not on the rental at {self.uv} (where the axolotl uv "
                             "images install it: is the job's image one of them?); orch "
                             "installs vLLM with it", fault=Fault.HOST)
        for argv in self.install_argvs():
            host.must(argv, f"installing vLLM {self.version} on the rental", fault=Fault.HOST,
                      timeout=1800)
        if not self.installed(host):
            wanted = ", ".join([f"vLLM {self.version}",
                                *(f"{name} {v}" for name, v in self.extras)])
            raise StepFailed(f"{wanted} were installed in {self.venv} but `vllm --version` "
                             "or importing them does not say so", fault=Fault.HOST)

    def serve_argv(self) -> list[str]:
        """`vllm serve` started detached by orch-job.sh, on 127.0.0.1 only, offline."""
        return ["sh", self.wrapper, "start", self.run_dir, "env", "HF_HUB_OFFLINE=1",
                self.vllm, "serve", *self.args, "--host", "127.0.0.1", "--port",
                str(self.port)]

    def state(self, host: Host) -> str:
        """orch-job.sh's status line: running | exited CODE | lost | missing."""
        script = '[ -f "$1" ] || { echo missing; exit 0; }; exec sh "$@"'
        result = host.run(["sh", "-c", script, "sh", self.wrapper, "status", self.run_dir])
        return result.stdout.strip() if result.ok else "missing"

    def running(self, host: Host) -> bool:
        return self.state(host) == "running"

    def serving_port(self, host: Host, state: str | None = None) -> int | None:
        """The port the running server serves on when it serves this model with these
        arguments (a takeover finds the server the last worker started, on the port it
        picked); None when none runs, or one started otherwise. `state`: the run's status
        line when the caller has just read it (`state`)."""
        if (state or self.state(host)) != "running":
            return None
        # The run's process is `sh orch-job.sh run DIR CMD...`: the words after DIR are the
        # command `serve_argv` gave, its last one the port.
        script = 'read -r pid _ < "$1/pid" && tr "\\000" "\\n" < "/proc/$pid/cmdline"'
        words = host.run(["sh", "-c", script, "sh", self.run_dir]).stdout.splitlines()
        if len(words) < 5 or words[4:-1] != self.serve_argv()[4:-1]:
            return None
        return int(words[-1]) if words[-1].isdigit() else None

    def start(self, host: Host) -> None:
        """Start the server unless it runs as `serve_argv` says (whatever its port); a
        finished or lost run, or one with other arguments, is ended first."""
        state = self.state(host)
        if self.serving_port(host, state) is not None:
            return
        if state != "missing":
            host.must(["sh", self.wrapper, "stop", self.run_dir], "clearing the old vLLM run")
            # orch-job.sh appends to `log`: the last run's lines (a port refused) must not
            # read as this one's in `fail_if_exited`'s tail.
            host.run(["mv", "-f", f"{self.run_dir}/log", f"{self.run_dir}/log.1"])
        host.must(self.serve_argv(), "starting vLLM", fault=Fault.HOST)

    def log_tail(self, host: Host, lines: int = 50) -> str:
        result = host.run(["tail", "-n", str(lines), f"{self.run_dir}/log"])
        return (result.stdout or result.stderr).strip() or "(vLLM logged nothing)"

    def fail_if_exited(self, host: Host, elapsed: float) -> None:
        """Raise with the log's tail when the server is no longer running."""
        state = self.state(host)
        if state == "running":
            return
        logged = self.log_tail(host, vllm.CAUSE_LINES)
        why = vllm.failure(logged, lambda argv: host.run(argv, timeout=30))
        raise StepFailed(f"vLLM on the rental stopped while loading ({state}, after "
                         f"{elapsed:.0f}s): {why}", fault=Fault.HOST,
                         stderr=vllm.last_lines(logged))

    def stop(self, host: Host) -> bool:
        """End the server (absent is fine); True when one was running."""
        was = self.running(host)
        script = '[ -f "$1" ] || exit 0; exec sh "$@"'
        host.must(["sh", "-c", script, "sh", self.wrapper, "stop", self.run_dir],
                  "stopping vLLM")
        return was
