"""Serve the fine-tuned model with vLLM on the GPU host, score it, and stop the server.

`evaluate()` ties `vllm` (the server) and `evalscore` (scoring, lm-eval) together as one
playbook and always stops the server, also when a step fails or the caller is interrupted:
a forgotten vLLM server holds the GPU's memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from playbooks import ssh

from . import evalport
from .base import (
    Emit,
    Host,
    Layout,
    Step,
    StepFailed,
    StepOutcome,
    StepReport,
    container_name,
    run_playbook,
)
from .evalscore import (
    PLAYBOOK,
    EvalResult,
    EvalScores,
    LmEvalContainer,
    LmEvalNative,
    LmEvalPlace,
    run_lm_eval,
    score_eval_set,
)
from .vllm import (
    DEFAULT_SERVING,
    SERVED_NAME,
    ServerSpec,
    Serving,
    _inspect,
    ensure_server,
    host_engine_args,
    probe_once,
    served_root,
    server_spec,
    serving_port,
    stop_server,
    wait_ready,
)
from .vllm_native import NativeServer, served_requirements

log = logging.getLogger(__name__)

# --- the playbook ----------------------------------------------------------------------------


def _ignore(_report: StepReport) -> None:
    return None


@dataclass
class _Served:
    """One evaluation through a vLLM server: its steps and what they found."""

    job_id: str
    model_dir_host: str
    layout: Layout
    image: str
    port: int
    max_model_len: int
    eval_rows: Iterable[Mapping[str, Any]] | None
    tasks: Sequence[str]
    lora: str | None
    tokenizer_dir: str | None
    served_name: str
    ready_deadline_s: float
    concurrency: int
    max_tokens: int
    lm_eval_timeout_s: float
    serving: Serving = DEFAULT_SERVING
    native: Callable[[Host], NativeServer] | None = None  # a container rental's server
    trainer_image: str = ""  # where lm_eval runs on a Docker host (it has none on its OS)
    result: EvalResult = field(default_factory=EvalResult)
    _spec: ServerSpec | None = None
    _native: NativeServer | None = None
    _refused: set[int] = field(default_factory=set)  # ports a start was refused on
    _launched: bool = False  # this run started a rental's server (it may end at once)
    asked: int = field(init=False)  # the port the job asked for (`port`: the one it got)
    _scores: EvalScores | None = None
    _lm: tuple[dict[str, float], str] | None = None

    def spec(self, h: Host) -> ServerSpec:
        if self._spec is None:  # reads adapter_config.json once
            self._spec = server_spec(h, self.job_id, self.model_dir_host, self.layout,
                                     self.image, self.port, self.max_model_len,
                                     self.served_name, self.lora, self.serving)
        return self._spec

    def server(self, h: Host) -> NativeServer:
        assert self.native is not None
        if self._native is None:  # reads adapter_config.json once
            self._native = self.native(h)
        return self._native

    def score(self, h: Host) -> None:
        with ssh.tunnel(h.conn, self.port) as local:
            self._scores = score_eval_set(f"http://127.0.0.1:{local}", self.eval_rows or [],
                                          self.served_name, self.concurrency, self.max_tokens)

    def lm_eval(self, h: Host) -> None:
        output = f"{self.layout.job_dir(self.job_id)}/eval/lm_eval"
        where: LmEvalPlace
        if self.native is not None:  # a container rental: in the rented image, natively
            server = self.server(h)
            where = LmEvalNative(server.wrap, server.uv)
        elif not self.trainer_image:
            raise ValueError("eval.tasks on a Docker host need the trainer image (lm_eval)")
        else:
            where = LmEvalContainer(self.job_id, self.trainer_image, self.layout)
        self._lm = run_lm_eval(h, where, self.tasks, self.port,
                               self.tokenizer_dir or self.model_dir_host, output,
                               self.served_name, self.lm_eval_timeout_s, self.max_model_len)

    def __post_init__(self) -> None:
        self.asked = self.port

    def _use(self, port: int) -> None:
        """Serve (and reach the server) on `port` from now on."""
        if port == self.port:
            return
        self.port = port
        if self._spec is not None:
            self._spec = replace(self._spec, port=port)
        if self._native is not None:
            self._native = replace(self._native, port=port)

    def serve(self, h: Host) -> str | None:
        """Start the server on a port nothing listens on (`evalport`), the asked one first;
        a Docker start refused for its port is tried on the next (a native vLLM's refusal
        may show only while it loads: `ready`). `evalport.TRIES` starts in all. Says where
        it serves when that is not the port asked for (the step's report, an event)."""
        while True:
            before = self.port
            self._use(evalport.pick(before, evalport.listening(h) | self._refused))
            if self.port != before:
                log.warning("port %d is taken on the host's 127.0.0.1: vLLM for job %s serves "
                            "on %d", before, self.job_id, self.port)
            try:
                if self.native is not None:
                    self._start_native(h)
                else:
                    ensure_server(h, self.spec(h))
            except StepFailed as exc:
                self._refuse(exc)
                continue
            return self.moved()

    def moved(self) -> str | None:
        """Where the server serves, when that is not the port the job asked for."""
        if self.port == self.asked:
            return None
        return f"serving on the host's 127.0.0.1:{self.port} (port {self.asked} is taken there)"

    def _refuse(self, exc: StepFailed) -> None:
        """Count a start that failed: raise `exc` unless its port was taken and a start
        is left."""
        if not evalport.refused(exc) or len(self._refused) + 1 >= evalport.TRIES:
            raise exc
        log.warning("vLLM for job %s could not take port %d: starting it again",
                    self.job_id, self.port)
        self._refused.add(self.port)

    def _start_native(self, h: Host) -> None:
        """Start the rental's server; one that already exited because its port was taken
        raises (vLLM binds its socket first), any other exit is left to the checks."""
        server = self.server(h)
        server.start(h)
        self._launched = True
        try:
            server.fail_if_exited(h, 0.0)
        except StepFailed as exc:
            if evalport.refused(exc):
                raise

    def running(self, h: Host) -> bool:
        """Whether the job's server runs (on whichever port it was given: a takeover
        adopts it)."""
        if self.native is not None:
            server = self.server(h)
            state = server.state(h)
            port = server.serving_port(h, state)
            if port is None and self._launched and state != "missing":
                # Started here and ended already (its port taken as it bound, a crash): the
                # step did its part; `ready` starts it again on another port, or reports
                # the end with its log, rather than "applied, but not in the desired state".
                return True
        else:
            port = serving_port(h, self.spec(h))
        if port is None:
            return False
        self._use(port)
        return True

    def root(self, h: Host) -> str | None:
        """The path vLLM reports serving the eval's name from: only our server has it."""
        args = self.server(h).args if self.native is not None else self.spec(h).args
        return served_root(args, self.served_name)

    def ready(self, h: Host) -> str | None:
        """Wait for the server; one that exits because its port was taken meanwhile (its
        socket binds as it starts) is started again on another, and says so."""
        said = None
        while True:
            try:
                self._wait_ready(h)
                return said
            except StepFailed as exc:
                self._refuse(exc)
                said = self.serve(h)

    def _wait_ready(self, h: Host) -> None:
        if self.native is not None:
            wait_ready(h.conn, self.port, self.ready_deadline_s, served_name=self.served_name,
                       alive=lambda elapsed: self.server(h).fail_if_exited(h, elapsed),
                       root=self.root(h))
        else:
            wait_ready(h.conn, self.port, self.ready_deadline_s, served_name=self.served_name,
                       container=self.spec(h).name, root=self.root(h))

    def steps(self) -> list[Step]:
        steps = []
        if self.native is not None:
            steps.append(Step("vllm-install", lambda h: self.server(h).installed(h),
                              lambda h: self.server(h).install(h), timeout_s=1800))
        steps += [
            Step("vllm-server", self.running, self.serve, timeout_s=300),
            Step("vllm-ready", lambda h: probe_once(h.conn, self.port, self.served_name,
                                                    self.root(h)),
                 self.ready, timeout_s=self.ready_deadline_s + 120),
        ]
        if self.eval_rows is not None:
            steps.append(Step("score-eval-set", lambda h: self._scores is not None, self.score,
                              timeout_s=3600))
        if self.tasks:
            steps.append(Step("lm-eval", lambda h: self._lm is not None, self.lm_eval,
                              timeout_s=self.lm_eval_timeout_s + 300))
        return steps

    def stop_step(self) -> Step:
        def stopped(h: Host) -> bool:
            if self.native is not None:
                return self.server(h).state(h) == "missing"
            return _inspect(h, container_name("vllm", self.job_id)) is None

        def stop(h: Host) -> None:
            if self.native is not None:
                self.result.server_removed = self.server(h).stop(h)
            else:
                self.result.server_removed = stop_server(h, self.job_id)

        return Step("stop-server", stopped, stop, timeout_s=120)

    def finish(self) -> EvalResult:
        if self._scores is not None:
            self.result.metrics.update(self._scores.metrics)
            self.result.rows = self._scores.rows
        if self._lm is not None:
            self.result.metrics.update(self._lm[0])
            self.result.lm_eval_results = self._lm[1]
        return self.result


def evaluate(
    host: Host,
    job_id: str,
    model_dir_host: str,
    layout: Layout,
    image: str,
    port: int,
    max_model_len: int,
    eval_rows: Iterable[Mapping[str, Any]] | None = None,
    *,
    tasks: Sequence[str] = (),
    lora: str | None = None,
    tokenizer_dir: str | None = None,
    served_name: str = SERVED_NAME,
    ready_deadline_s: float = 900.0,
    concurrency: int = 8,
    max_tokens: int = 64,
    lm_eval_timeout_s: float = 4 * 3600,
    emit: Emit = _ignore,
    stop_after: bool = True,
    runner: str = "docker",
    native_wrap: Callable[[Sequence[str]], list[str]] = list,
    native_wrapper: str = "",
    native_uv: str = "",
    vllm_version: str = "",
    serving: Serving = DEFAULT_SERVING,
    trainer_image: str = "",
) -> EvalResult:
    """Serve, wait until ready, score the eval set, run lm-eval tasks, always stop the server.

    Steps (reported to `emit` like any playbook): vllm-server, vllm-ready, score-eval-set
    (with `eval_rows`), lm-eval (with `tasks`), stop-server. A failing step raises
    PlaybookFailed after the server was stopped. `tokenizer_dir` defaults to the model.
    `stop_after=False` leaves a successful server running, for a machine that is destroyed
    next (stopping a large model's server gracefully is billed time for nothing).
    `serving` is the plan's: tensor parallel size, memory fraction, concurrency, and
    whether `model_dir_host` is a base to quantize at load (with `lora`).
    On a host without Docker (`runner` "process": a container rental) vLLM `vllm_version`
    is installed with the image's uv (`native_uv`, its path) in a venv of its own and
    served natively under the uploaded orch-job.sh (`native_wrapper`;
    playbooks/vllm_native.py) after a `vllm-install` step; `eval.tasks`
    there run the rented image's lm-eval natively against it. On a Docker host `eval.tasks`
    run in a throwaway container of `trainer_image` against the server. Both use
    `--model local-completions` after adding the `lm_eval[api]` extra (evalscore).
    """
    if runner != "docker":
        return _evaluate_rental(host, job_id, model_dir_host, layout, port, max_model_len,
                                eval_rows, tasks, lora, served_name, ready_deadline_s,
                                concurrency, max_tokens, lm_eval_timeout_s, emit, stop_after,
                                native_wrap, native_wrapper, native_uv, vllm_version, serving)
    run = _Served(job_id, model_dir_host, layout, image, port, max_model_len, eval_rows, tasks,
                  lora, tokenizer_dir, served_name, ready_deadline_s,
                  min(concurrency, serving.max_num_seqs), max_tokens, lm_eval_timeout_s,
                  serving, trainer_image=trainer_image)
    return _run_served(run, host, emit, stop_after)


def _run_served(run: _Served, host: Host, emit: Emit, stop_after: bool) -> EvalResult:
    """The served evaluation's steps, then stop the server (always, when a step failed)."""
    result = run.result
    try:
        result.reports += run_playbook(PLAYBOOK, run.steps(), host, emit)
    except BaseException as exc:
        # Stop the server, but never let a failure to stop hide why evaluation failed.
        said: list[StepReport] = []

        def seen(report: StepReport) -> None:
            said.append(report)
            emit(report)  # the engine's emit may raise a stop that arrived meanwhile

        try:
            result.reports += run_playbook(PLAYBOOK, [run.stop_step()], host, seen)
        except Exception as stop_exc:  # reported on the original error instead
            if any(r.outcome is not StepOutcome.FAILED for r in said):
                # The server was stopped; what raised is the report's recipient (a cancel or
                # a budget stop the engine had pending), not the stop.
                log.info("vLLM for job %s stopped (then: %s)", run.job_id, stop_exc)
            else:
                log.error("stopping vLLM for job %s failed: %s", run.job_id, stop_exc)
                exc.add_note(f"stopping the vLLM server also failed: {stop_exc}")
        raise
    if stop_after:
        result.reports += run_playbook(PLAYBOOK, [run.stop_step()], host, emit)
    return run.finish()


def _evaluate_rental(host: Host, job_id: str, model_dir_host: str, layout: Layout, port: int,
                     max_model_len: int, eval_rows: Iterable[Mapping[str, Any]] | None,
                     tasks: Sequence[str], lora: str | None, served_name: str,
                     ready_deadline_s: float, concurrency: int, max_tokens: int,
                     lm_eval_timeout_s: float, emit: Emit, stop_after: bool,
                     wrap: Callable[[Sequence[str]], list[str]], wrapper: str, uv: str,
                     version: str, serving: Serving) -> EvalResult:
    """`evaluate` on a container rental: vLLM in its own venv serves the model; the eval set
    is scored through it and `tasks` run the image's lm-eval against it
    (`--model local-completions`), as on a Docker host."""
    if not wrapper or not version or not uv:
        raise ValueError("a container rental's evaluation needs the orch-job.sh path, uv's "
                         "path and the vLLM version")

    def server(h: Host) -> NativeServer:
        args = host_engine_args(h, model_dir_host, max_model_len, served_name, lora, serving)
        return NativeServer.for_job(layout, job_id, version, wrapper, port, args, wrap, uv,
                                    served_requirements(serving.quantization))

    run = _Served(job_id, model_dir_host, layout, "", port, max_model_len, eval_rows, tasks,
                  lora, None, served_name, ready_deadline_s,
                  min(concurrency, serving.max_num_seqs), max_tokens, lm_eval_timeout_s,
                  serving, server)
    return _run_served(run, host, emit, stop_after)
