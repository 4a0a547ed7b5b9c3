"""vLLM serve / readiness / scoring / stop over real SSH to the simulated host."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import PlaybookHostFactory, Reports

from playbooks import images, ssh
from playbooks.base import Fault, Host, Layout, PlaybookFailed, StepFailed, container_name
from playbooks.evalscore import (
    EvalScores,
    LmEvalContainer,
    lm_eval_argv,
    lm_eval_place_argv,
    normalise,
    parse_lm_eval_results,
    run_lm_eval,
    score_eval_set,
)
from playbooks.evaluate import evaluate
from playbooks.vllm import (
    ServerSpec,
    Serving,
    engine_args,
    ensure_server,
    http_client,
    lora_rank_for,
    served_root,
    server_spec,
    stop_server,
    wait_ready,
)
from simhost import SimHost

TOOLKIT = "1.17.8-1"
IMAGE = images.vllm_image()  # the pinned server (playbooks/data/images.yaml)
ANSWERS = {
    "Capital of France?": "Paris",
    "Capital of Italy?": " rome.\n",
    "What is 6 x 7?": "The answer is 42.",
}
ROWS = [
    {"prompt": "Capital of France?", "expected": "Paris"},  # exact
    {"prompt": "Capital of Italy?", "expected": "Rome"},  # exact after normalising
    {"prompt": "What is 6 x 7?", "expected": "42"},  # contains only
    {"prompt": "Who wrote Hamlet?", "expected": "Shakespeare"},  # default answer: wrong
]


def serving(host: Host, spec: ServerSpec) -> ServerSpec:
    """`spec`'s container started (or reused), as the evaluate playbook's first step does."""
    ensure_server(host, spec)
    return spec


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def refuses(port: int) -> bool:
    with socket.socket() as check:
        return check.connect_ex(("127.0.0.1", port)) != 0


def setup(playbook_host: PlaybookHostFactory, **options: Any) -> tuple[SimHost, Host, Layout]:
    options.setdefault("toolkit_preinstalled", TOOLKIT)
    options.setdefault("completion_answers", ANSWERS)
    sim, host = playbook_host(**options)
    assert sim.nvme_path is not None
    return sim, host, Layout(f"{sim.nvme_path}/orch")


def merged_model(layout: Layout, job: str, config: bool = True) -> str:
    """A merged model directory as the vLLM stand-in needs it (written on the host's disk)."""
    folder = Path(layout.output_dir(job)) / "merged"
    folder.mkdir(parents=True)
    if config:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    return str(folder)


def vllm_running(sim: SimHost, job: str) -> bool:
    record = sim.containers().get(container_name("vllm", job))
    return bool(record and record["State"]["Running"])


def test_server_becomes_ready_through_the_tunnel_scores_and_stops(
    playbook_host: PlaybookHostFactory,
) -> None:
    sim, host, layout = setup(playbook_host, vllm_startup_seconds=1.0)
    model, port = merged_model(layout, "job-a"), free_port()
    spec = serving(host, server_spec(host, "job-a", model, layout, IMAGE, port, 2048))
    assert refuses(port)  # still "loading": the refused phase is what wait_ready polls through
    took = wait_ready(host.conn, port, 20, container=spec.name)
    assert 0.5 < took < 10
    # idempotent
    again = serving(host, server_spec(host, "job-a", model, layout, IMAGE, port, 2048))
    assert again == spec and len(sim.events("docker-run")) == 1

    argv = sim.events("docker-run")[0]["argv"]
    # The model is positional (`--model` is deprecated in vLLM's serve).
    assert argv[:3] == ["vllm", "serve", "/workspace/data/jobs/job-a/output/merged"]
    assert "--model" not in argv
    assert argv[argv.index("--served-model-name") + 1] == "ft"
    assert argv[argv.index("--max-model-len") + 1] == "2048"
    bindings = sim.containers()[spec.name]["HostConfig"]["PortBindings"]
    assert bindings == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
    assert sim.events("docker-public-port") == []

    with ssh.tunnel(host.conn, port) as local:
        scores = score_eval_set(f"http://127.0.0.1:{local}", ROWS, "ft", concurrency=3,
                                max_tokens=16)
    assert isinstance(scores, EvalScores)
    assert scores.metrics == {"eval.exact_match": 0.5, "eval.contains": 0.75, "eval.count": 4}
    assert [(r.exact_match, r.contains) for r in scores.rows] == [
        (True, True), (True, True), (False, True), (False, False),
    ]  # fmt: skip
    assert scores.rows[3].answer == "I do not know." and scores.rows[2].index == 2

    assert stop_server(host, "job-a") is True
    assert refuses(port) and spec.name not in sim.containers()
    assert stop_server(host, "job-a") is False  # already gone: fine


def test_a_server_still_loading_at_the_deadline_fails_with_the_log_tail(
    playbook_host: PlaybookHostFactory,
) -> None:
    _sim, host, layout = setup(playbook_host, vllm_startup_seconds=60)
    port = free_port()
    spec = serving(host, server_spec(host, "job-slow", merged_model(layout, "job-slow"),
                                     layout, IMAGE, port, 1024))
    started = time.monotonic()
    # With `root`: under xdist another test's server once took the port, answered ready, and
    # this wait returned instead of reaching its deadline (vLLM binds with SO_REUSEPORT, so
    # a second server on a port shares it); only this job's model counts as ready.
    with pytest.raises(StepFailed) as info:
        wait_ready(host.conn, port, 1.5, container=spec.name, root=served_root(spec.args))
    assert time.monotonic() - started < 30  # gave up at its 1.5 s deadline, not the 60 s load
    assert info.value.fault is Fault.HOST
    # Still loading; or, the port shared meanwhile, serving another job's model.
    assert "not ready within 1.5s" in str(info.value)
    assert ("not accepting connections" in str(info.value)
            or "another server holds this port" in str(info.value)), info.value
    assert "loading /workspace/data/jobs/job-slow/output/merged as ft" in info.value.stderr_tail
    stop_server(host, "job-slow")


def test_another_jobs_server_on_the_port_is_not_taken_for_ours(
    playbook_host: PlaybookHostFactory,
) -> None:
    # Job A's vLLM serves "ft" on the port; job B's wait must not score A's model. vLLM's
    # /v1/models says where each name is served from (`root`): B waits for its own path.
    _sim, host, layout = setup(playbook_host)
    port = free_port()
    a = serving(host, server_spec(host, "job-a", merged_model(layout, "job-a"), layout, IMAGE,
                                  port, 1024))
    wait_ready(host.conn, port, 20, container=a.name, root=served_root(a.args))
    theirs = served_root(a.args)
    ours = theirs.replace("job-a", "job-b") if theirs else None
    assert theirs == "/workspace/data/jobs/job-a/output/merged"
    with pytest.raises(StepFailed) as info:
        wait_ready(host.conn, port, 1.5, root=ours)
    assert f"serves 'ft' from '{theirs}', not '{ours}'" in str(info.value)
    assert "another server holds this port" in str(info.value)
    # An adapter is reported under its own path, as vLLM's serving_models.py does.
    assert served_root(["/base", "--enable-lora", "--lora-modules", "ft=/adapter"]) == "/adapter"
    stop_server(host, "job-a")


def test_a_crashed_server_fails_at_once_not_at_the_deadline(
    playbook_host: PlaybookHostFactory,
) -> None:
    _sim, host, layout = setup(playbook_host)
    port = free_port()
    model = merged_model(layout, "job-bad", config=False)
    spec = serving(host, server_spec(host, "job-bad", model, layout, IMAGE, port, 1024))
    started = time.monotonic()
    with pytest.raises(StepFailed, match="stopped while loading") as info:
        wait_ready(host.conn, port, 60, container=spec.name)
    assert time.monotonic() - started < 30  # far below the 60 s deadline
    assert "No supported config format" in info.value.stderr_tail
    stop_server(host, "job-bad")


def test_evaluate_runs_the_playbook_and_stops_the_server(
    playbook_host: PlaybookHostFactory, reports: Reports
) -> None:
    sim, host, layout = setup(playbook_host)
    port = free_port()
    result = evaluate(host, "job-e", merged_model(layout, "job-e"), layout, IMAGE, port, 2048,
                      iter(ROWS), ready_deadline_s=20, emit=reports)
    assert result.metrics == {"eval.exact_match": 0.5, "eval.contains": 0.75, "eval.count": 4}
    assert len(result.rows) == 4 and result.server_removed
    assert reports.outcomes("evaluate") == {
        "vllm-server": "changed", "vllm-ready": "changed", "score-eval-set": "changed",
        "stop-server": "changed",
    }  # fmt: skip
    assert not vllm_running(sim, "job-e") and refuses(port)
    assert container_name("vllm", "job-e") not in sim.containers()


def test_evaluate_stops_the_server_when_scoring_raises(
    playbook_host: PlaybookHostFactory, reports: Reports
) -> None:
    sim, host, layout = setup(playbook_host)
    port = free_port()
    rows = [*ROWS, {"prompt": "no expected answer"}]
    with pytest.raises(PlaybookFailed) as info:
        evaluate(host, "job-f", merged_model(layout, "job-f"), layout, IMAGE, port, 2048, rows,
                 ready_deadline_s=20, emit=reports)
    assert info.value.step == "score-eval-set" and info.value.fault is Fault.USER
    assert "eval row 5" in str(info.value)
    assert reports.outcomes() == {
        "vllm-server": "changed", "vllm-ready": "changed", "score-eval-set": "failed",
        "stop-server": "changed",
    }  # fmt: skip
    assert container_name("vllm", "job-f") not in sim.containers() and refuses(port)


def test_unmerged_adapter_is_served_with_an_allowed_lora_rank(
    playbook_host: PlaybookHostFactory,
) -> None:
    sim, host, layout = setup(playbook_host)
    base = Path(layout.model_dir("meta-llama/Llama-3.2-1B"))
    base.mkdir(parents=True)
    (base / "config.json").write_text(json.dumps({"model_type": "llama"}))
    adapter = Path(layout.output_dir("job-l"))
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 24, "lora_alpha": 48}))
    (adapter / "sim_memory.json").write_text(json.dumps({"Say hi": "hi"}))
    port = free_port()
    spec = serving(host, server_spec(host, "job-l", str(base), layout, IMAGE, port, 2048,
                                     lora=str(adapter)))
    args = list(spec.args)
    assert args[args.index("--max-lora-rank") + 1] == "32"  # 24 rounded up to an allowed rank
    assert args[args.index("--lora-modules") + 1] == "ft=/workspace/data/jobs/job-l/output"
    assert "--enable-lora" in args and "--served-model-name" not in args
    wait_ready(host.conn, port, 20, container=spec.name)  # the stand-in checks the rank
    with ssh.tunnel(host.conn, port) as local:
        scores = score_eval_set(f"http://127.0.0.1:{local}",
                                [{"prompt": "Say hi", "expected": "hi"}])
    assert scores.metrics["eval.exact_match"] == 1.0
    stop_server(host, "job-l")
    assert not vllm_running(sim, "job-l")


def test_lora_rank_rounding_and_engine_args() -> None:
    assert [lora_rank_for(r) for r in (1, 2, 8, 16, 17, 64, 200, 300, 320, 512)] == [
        1, 8, 8, 16, 32, 64, 256, 320, 320, 512,
    ]  # fmt: skip
    with pytest.raises(StepFailed) as info:
        lora_rank_for(513)
    assert info.value.fault is Fault.USER
    assert engine_args("/workspace/m", 4096) == [
        "/workspace/m", "--served-model-name", "ft", "--max-model-len", "4096",
        "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "8",
    ]  # fmt: skip
    # The QLoRA path: the base quantized at load, the adapter served as `ft`, over two GPUs.
    assert engine_args("/workspace/base", 2048, lora="/workspace/out", lora_rank=16,
                       serving=Serving("adapter", 2, 0.85, 4)) == [
        "/workspace/base", "--max-model-len", "2048", "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.85", "--max-num-seqs", "4",
        "--quantization", "bitsandbytes", "--enable-lora", "--lora-modules", "ft=/workspace/out",
        "--max-lora-rank", "16",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        engine_args("/workspace/m", 4096, lora="/workspace/a=b", lora_rank=8)


def test_normalise_for_exact_match() -> None:
    assert normalise("  The  Eiffel\tTower!\n") == "the eiffel tower"
    assert normalise("U.S.A.") == normalise("usa") == "usa"
    assert normalise("«Ça va?»") == "ça va"
    assert normalise("ＡＢＣ") == "abc"  # NFKC: full-width letters


def test_lm_eval_argv() -> None:
    argv = lm_eval_argv(["gsm8k", "hellaswag"], 8123, "/mnt/nvme/orch/jobs/j/output/merged",
                        "/mnt/nvme/orch/jobs/j/eval/lm_eval", max_length=4096)
    assert argv == [
        "lm_eval", "--model", "local-completions", "--tasks", "gsm8k,hellaswag",
        "--model_args",
        "model=ft,base_url=http://127.0.0.1:8123/v1/completions,"
        "tokenizer=/mnt/nvme/orch/jobs/j/output/merged,tokenizer_backend=huggingface,"
        "tokenized_requests=True,add_bos_token=True,max_length=4096,num_concurrent=8,"
        "max_retries=3",
        "--output_path", "/mnt/nvme/orch/jobs/j/eval/lm_eval",
    ]  # fmt: skip
    # lm-eval's own default context unless the server's is given (images.yaml `lm_eval`).
    default = lm_eval_argv(["gsm8k"], 8123, "/t", "/o")
    assert "max_length=2048" in default[default.index("--model_args") + 1]
    with pytest.raises(StepFailed) as info:
        lm_eval_argv(["gsm8k; rm -rf /"], 8000, "/t", "/o")
    assert info.value.fault is Fault.USER
    with pytest.raises(ValueError):
        lm_eval_argv(["gsm8k"], 8000, "/odd,dir", "/o")


LM_EVAL_RESULTS = {
    "results": {
        "gsm8k": {
            "alias": "gsm8k",
            "exact_match,strict-match": 0.25,
            "exact_match_stderr,strict-match": 0.01,
            "exact_match,flexible-extract": 0.3,
            "exact_match_stderr,flexible-extract": 0.012,
        },
        "hellaswag": {
            "alias": "hellaswag",
            "acc,none": 0.5,
            "acc_stderr,none": 0.005,
            "acc_norm,none": 0.625,
            "acc_norm_stderr,none": "N/A",
        },
    },
    "versions": {"gsm8k": 3, "hellaswag": 1},
    "n-shot": {"gsm8k": 5, "hellaswag": 0},
}


def test_parse_lm_eval_results() -> None:
    expected = {
        "lm_eval.gsm8k.exact_match.strict-match": 0.25,
        "lm_eval.gsm8k.exact_match.flexible-extract": 0.3,
        "lm_eval.hellaswag.acc": 0.5,
        "lm_eval.hellaswag.acc_norm": 0.625,
    }
    assert parse_lm_eval_results(LM_EVAL_RESULTS) == expected
    assert parse_lm_eval_results(json.dumps(LM_EVAL_RESULTS).encode()) == expected
    with pytest.raises(ValueError):
        parse_lm_eval_results({"config": {}})


def test_a_failing_lm_eval_task_fails_clearly_and_stops_the_server(
    playbook_host: PlaybookHostFactory, reports: Reports
) -> None:
    sim, host, layout = setup(playbook_host)
    port = free_port()
    with pytest.raises(PlaybookFailed) as info:
        evaluate(host, "job-t", merged_model(layout, "job-t"), layout, IMAGE, port, 2048, ROWS,
                 tasks=["no_such_task"], ready_deadline_s=20, emit=reports,
                 trainer_image=TRAINER)
    assert info.value.step == "lm-eval" and info.value.fault is Fault.HOST
    assert f"lm_eval in {TRAINER} failed (exit 1)" in str(info.value)
    assert "Tasks not found: no_such_task" in str(info.value)
    assert reports.outcomes()["stop-server"] == "changed" and refuses(port)
    assert container_name("vllm", "job-t") not in sim.containers()


TRAINER = images.default_image("docker")


def test_the_vllm_stand_in_refuses_a_prompt_longer_than_its_context_as_vllm_does(
        playbook_host: PlaybookHostFactory) -> None:
    # vLLM 0.19.1's 400 texts (vllm/renderers/params.py:314-338, 397-424; the error body
    # from entrypoints/utils.py:302-347): a text prompt is counted as its tokenizer truncates
    # it (max input + 1, hence "at least"), token ids as given; BOS is added to text only.
    _sim, host, layout = setup(playbook_host)
    port = free_port()
    model = merged_model(layout, "job-l")
    (Path(model) / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    spec = serving(host, server_spec(host, "job-l", model, layout, IMAGE, port, 64))
    try:
        wait_ready(host.conn, port, 20, container=spec.name)
        with ssh.tunnel(host.conn, port) as local, \
                http_client(f"http://127.0.0.1:{local}", 30) as client:

            def post(prompt: Any, max_tokens: int = 16) -> httpx.Response:
                return client.post("/v1/completions", json={"model": "ft", "prompt": prompt,
                                                            "max_tokens": max_tokens})

            fits = [post("x" * 47), post([[0] + [123] * 47])]  # BOS + 47 + 16 = 64
            text, ids, chars = post("x" * 48), post([[0] + [123] * 49]), post("x" * 300)
            too_many = post("x", 65)
    finally:
        stop_server(host, "job-l")
    assert [r.status_code for r in fits] == [200, 200]
    tail = " Please reduce the length of the input prompt or the number of requested output tokens."
    head = ("This model's maximum context length is 64 tokens. However, you requested 16 output "
            "tokens and your prompt contains ")
    assert text.status_code == 400 and text.json() == {"error": {
        "message": f"{head}at least 49 input tokens, for a total of at least 65 tokens.{tail}",
        "type": "BadRequestError", "param": "input_tokens", "code": 400}}
    assert ids.status_code == 400
    assert ids.json()["error"]["message"] == (
        f"{head}50 input tokens, for a total of 66 tokens.{tail}")
    assert chars.json()["error"]["message"] == (
        f"{head}300 characters (more than 240 characters, which is the upper bound for 48 input "
        f"tokens).{tail}")
    assert too_many.json()["error"]["message"] == (
        "max_tokens=65cannot be greater than max_model_len=max_total_tokens=64. Please "
        "request fewer output tokens.")


def test_loglikelihood_requests_score_the_continuation_with_bos_first(
        playbook_host: PlaybookHostFactory) -> None:
    # vLLM adds BOS to a text prompt, not to token ids; lm-eval counts the context in its
    # own encoding. orch's settings send token ids with the tokenizer's BOS, so the span
    # lm-eval scores (token_logprobs[ctxlen:-1]) is the continuation, after BOS as in
    # training; with text prompts (tokenized_requests=False) it slid into the context.
    sim, host, layout = setup(playbook_host)
    port = free_port()
    model = merged_model(layout, "job-b")
    (Path(model) / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    spec = serving(host, server_spec(host, "job-b", model, layout, IMAGE, port, 2048))
    where = LmEvalContainer("job-b", TRAINER, layout)
    try:
        wait_ready(host.conn, port, 20, container=spec.name)
        metrics, _ = run_lm_eval(host, where, ["hellaswag", "arc_easy"], port, model,
                                 f"{layout.job_dir('job-b')}/eval/lm_eval")
    finally:
        stop_server(host, "job-b")
    assert metrics["lm_eval.hellaswag.acc_norm"] == 0.625
    requests = sim.events("lm-eval-request")
    assert len(requests) == 8  # 4 choices of each task's question
    for request in requests:
        assert request["aligned"] and request["scored"] == request["continuation"], request
        assert request["bos_first"], request


def test_a_killed_lm_eval_container_is_reported_as_killed(
    playbook_host: PlaybookHostFactory, reports: Reports
) -> None:
    # In the trainer image's container on a Docker host: the OOM killer's SIGKILL is named.
    _, host, layout = setup(playbook_host, lm_eval_oom_killed=True)
    with pytest.raises(PlaybookFailed) as info:
        evaluate(host, "job-k", merged_model(layout, "job-k"), layout, IMAGE, free_port(), 2048,
                 None, tasks=["arc_easy"], ready_deadline_s=20, emit=reports,
                 trainer_image=TRAINER)
    assert info.value.step == "lm-eval"
    assert f"lm_eval in {TRAINER} was killed by SIGKILL (exit 137)" in info.value.reason
    assert "Requesting API: arc_easy: 1 request sent" in info.value.reason
    assert reports.outcomes()["stop-server"] == "changed"


def test_lm_eval_runs_in_the_trainer_image_against_the_server(
        playbook_host: PlaybookHostFactory) -> None:
    sim, host, layout = setup(playbook_host)
    port = free_port()
    model = merged_model(layout, "job-h")
    spec = serving(host, server_spec(host, "job-h", model, layout, IMAGE, port, 2048))
    where = LmEvalContainer("job-h", TRAINER, layout)
    output = f"{layout.job_dir('job-h')}/eval/lm_eval"
    try:
        wait_ready(host.conn, port, 20, container=spec.name)
        metrics, path = run_lm_eval(host, where, ["arc_easy", "mmlu"], port, model, output)
        # What the stand-in refuses as the real tools would, in that same image:
        argv = lm_eval_place_argv(where, ["arc_easy"], port, model, output)
        cmd = argv[argv.index("lm_eval"):]
        bridge = host.run([*argv[:argv.index("--network")], *argv[argv.index("-v"):]])
        bare_image = host.run(["docker", "run", "--rm", "--network", "host",
                               "-v", f"{layout.base}:/workspace/data", TRAINER, *cmd])
    finally:
        stop_server(host, "job-h")
    assert metrics == {"lm_eval.arc_easy.acc": 0.7, "lm_eval.arc_easy.acc_norm": 0.68,
                       "lm_eval.mmlu.acc": 0.45}
    assert path.startswith(f"{output}/ft/results_") and path.endswith(".json")
    assert [e["backend"] for e in sim.events("lm-eval")] == ["local-completions"]
    # On Docker's bridge network the container's 127.0.0.1 is its own: nothing listens.
    assert bridge.exit_code == 1 and "Cannot connect to host 127.0.0.1" in bridge.stderr
    # The image pins bare lm_eval: without the api extra, local-completions cannot start.
    assert bare_image.exit_code == 1 and "pip install lm-eval[api]" in bare_image.stderr


def test_a_stop_that_arrives_as_a_failed_evaluation_stops_its_server_is_not_a_failed_stop(
    playbook_host: PlaybookHostFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # The server ends while loading (no config); as its stop is reported, the recipient (the
    # engine's emit, with a cancel pending) raises. The server was stopped: neither the log
    # nor the error may say the stop failed.
    sim, host, layout = setup(playbook_host)
    model = merged_model(layout, "job-c", config=False)

    def emit(report: Any) -> None:
        if report.step == "stop-server":
            raise RuntimeError("job job-c was cancelled")

    with caplog.at_level("INFO", logger="playbooks.evaluate"), \
            pytest.raises(PlaybookFailed, match="stopped while loading") as info:
        evaluate(host, "job-c", model, layout, IMAGE, free_port(), 1024, ROWS, emit=emit)
    assert container_name("vllm", "job-c") not in sim.containers()
    assert "vLLM for job job-c stopped (then: job job-c was cancelled)" in caplog.text
    assert "failed: job job-c was cancelled" not in caplog.text
    assert not any("also failed" in note for note in getattr(info.value, "__notes__", []))
