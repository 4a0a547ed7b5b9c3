"""The pre-flight host check: is a freshly rented machine fit for the job, before it is used?

Five verification steps, cheapest first, each recording a typed result (playbooks/hostreport.py)
and failing the host (`Fault.PROVIDER`: release it and rent another) when it is not fit:

1. `inventory`: the GPUs nvidia-smi lists are the offer's model and count, with its memory,
   and no other process holds so much of it that the job's training or its evaluation's
   vLLM would not fit in what is left (`gpu.busy`).
2. `driver`: the driver supports the trainer image's CUDA (nvidia-smi's "CUDA Version") and is
   at least the toolkit's minimum driver (NVIDIA's table, hostchecks.yaml).
3. `disk`: on the disk the model cache will use, free space for the job's need, and a flushed
   `dd` write and a direct read of `test_mib` at a fraction of the planned download rate.
4. `hub`: a ranged GET of the base model's largest file with the job's token (read from a
   0600 env file, never on a command line), at Vast.ai's verification floor for the machine.
5. `matmul`: a timed bf16 matmul on every GPU in the trainer's own environment (the image's
   venv python on a container rental, `docker run` of the trainer image on a Docker host),
   against the catalog's rated dense bf16 figure.

Nothing is left behind for the job's own steps to trip over: the test file, the token file
and the probe's pid file live in orch's directory beside (never in) `models/` and `jobs/`,
and are removed by the same command that made them (a shell trap) or by the next run; a
probe left by a killed run is killed before a new one starts (its pid file, checked against
its command line), and every probe ends itself after the matmul timeout (SIGALRM). Running
the check again does the same measurements again: it changes nothing on the host.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from playbooks import gpu, images, ssh, train
from playbooks.base import (
    Emit,
    Fault,
    Host,
    Layout,
    PlaybookFailed,
    Step,
    StepFailed,
    last_line,
    run_playbook,
    safe_name,
)
from playbooks.hostreport import (
    Check,
    DiskResult,
    DriverResult,
    HostReport,
    HubResult,
    InventoryResult,
    MatmulResult,
    Result,
    Thresholds,
    Verdict,
    thresholds,
)
from playbooks.model_cache import find_nvme, gb

PLAYBOOK = "hostcheck"
PROBE = (Path(__file__).parent / "remote" / "matmul_probe.py").read_text()
PROBE_MARKER = "orch-hostcheck-probe"  # in the probe's argv: how a stale probe is recognised
HUB = "https://huggingface.co"
PULL_TIMEOUT_S = 3600  # a ~10 GB trainer image, as the training playbook's own pull allows
DEFAULT_PULL_BYTES_PER_S = 250e6  # the catalog's pull_gbps 2.0 (providers/catalog/cloud.yaml)


@dataclass(frozen=True)
class HostCheckSpec:
    """What the check needs to know about the job and the offer, as plain values."""

    job_id: str
    gpu: gpu.GpuExpectation  # the offer's GPUs (min_cuda/image: the trainer image's CUDA)
    rated_tflops: float  # the catalog's dense bf16 TFLOPS of one such GPU
    disk_need_bytes: int  # what the job needs on the host's disk (planning.host_disk_gb)
    repo: str  # the base model
    revision: str = "main"
    trainer_image: str = train.DEFAULT_IMAGE
    pull_bytes_per_s: float = DEFAULT_PULL_BYTES_PER_S  # the plan's model download rate
    hub_endpoint: str | None = None  # HF_ENDPOINT (None: huggingface.co)
    hub_file: str | None = None  # the file to fetch (None: a shard named by the repo's index)
    layout: Layout | None = None  # orch's directory on the host (None: on the NVMe found)
    hf_token: str | None = field(default=None, repr=False)
    limits: Thresholds = field(default_factory=thresholds)
    # Run every check even after one failed (a registered server: it is not released, so its
    # report shows everything it found, and each fix is named at once); a check that cannot
    # mean anything after an earlier failure (the driver without GPUs, the matmul without a
    # working driver) is then `unknown`.
    complete: bool = False

    def __post_init__(self) -> None:
        if self.rated_tflops <= 0 or self.disk_need_bytes < 0 or self.pull_bytes_per_s <= 0:
            raise ValueError("rated_tflops and pull_bytes_per_s must be > 0, disk_need_bytes "
                             f">= 0 (got {self.rated_tflops}, {self.pull_bytes_per_s}, "
                             f"{self.disk_need_bytes})")


# The disk test: positional parameters only (directory, file, MiB, seconds, model dir). The
# file is removed before and, by the trap, after; `timeout -s INT` lets dd print what it did;
# the read runs only when the write passed.
DISK_SCRIPT = r"""
d=$1; f=$1/$2; n=$3; t=$4; m=$5
mkdir -p "$d" || exit 3
rm -f "$f"
trap 'rm -f "$f"' EXIT
trap 'exit 130' HUP INT TERM
echo "free $(df -B1 --output=avail "$d" | tail -n 1)"
if [ -d "$m" ]; then echo "cached $(du -s -B1 "$m" 2>/dev/null | cut -f1)"; else echo "cached 0"; fi
echo "--write"
LC_ALL=C timeout -s INT "$t" dd if=/dev/zero of="$f" bs=1M count="$n" conv=fdatasync 2>&1
rc=$?
echo "--rc $rc"
[ "$rc" -eq 0 ] || exit 0
echo "--read"
LC_ALL=C timeout -s INT "$t" dd if="$f" of=/dev/null bs=1M iflag=direct 2>&1
echo "--rc $?"
"""

# The Hub test: URL, seconds, range end ('' for none), output. The token, when the sourced
# env file has one, goes to curl on its standard input (`-H @-`), never on a command line;
# curl does not send it on to the CDN the Hub redirects to (another host).
HUB_SCRIPT = r"""
u=$1; t=$2; r=$3; o=$4
w='\n--orch-curl %{http_code} %{size_download} %{time_total}\n'
set -- -sS -L -o "$o" --max-time "$t" -w "$w"
[ -n "$r" ] && set -- "$@" -r "0-$r"
if [ -n "${HF_TOKEN:-}" ]; then
  printf 'Authorization: Bearer %s\n' "$HF_TOKEN" | curl "$@" -H @- "$u"
else
  curl "$@" "$u"
fi
"""

# The probe's wrapper: kill a probe a killed run left (pid file + its argv's marker), run
# this one, keep its pid until it ends. Arguments: pid file, then the probe's argv.
PROBE_SCRIPT = r"""
f=$1; shift
mkdir -p "$(dirname "$f")"
if [ -s "$f" ]; then
  old=$(cat "$f")
  case "$old" in
    ''|*[!0-9]*) ;;
    *) if tr '\0' ' ' < "/proc/$old/cmdline" 2>/dev/null | grep -q orch-hostcheck-probe; then
         kill -9 "$old" 2>/dev/null; sleep 1
       fi ;;
  esac
fi
"$@" &
child=$!
echo "$child" > "$f"
trap 'kill -9 "$child" 2>/dev/null; rm -f "$f"; exit 130' HUP INT TERM
wait "$child"
rc=$?
rm -f "$f"
exit $rc
"""

_DD_STATS = re.compile(r"^(\d+) bytes? .*copied, ([0-9.eE+-]+) s,", re.M)
CURL_STATS = re.compile(r"^--orch-curl (\d+) (\d+) ([0-9.]+)\s*$", re.M)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def dd_rate(output: str) -> tuple[int, float] | None:
    """(bytes, seconds) from GNU dd's last statistics line, or None when it printed none."""
    found = _DD_STATS.findall(output)
    if not found:
        return None
    done, seconds = found[-1]
    return int(done), float(seconds)


class HostCheck:
    """The check's steps over one host, and the report they build (see the module doc)."""

    def __init__(self, spec: HostCheckSpec, pull: bool = False) -> None:
        self.spec = spec
        # On a Docker host: pull the trainer image for the matmul when it is not there
        # (`measure_gpu`, after the job's set-up); else the matmul is unknown until it is.
        self.pull = pull
        self.results: dict[Check, Result] = {}
        self._started = time.monotonic()
        self._gpus: list[gpu.GpuInfo] = []
        self._base: str | None = None  # orch's directory on the host (a host path)

    @property
    def report(self) -> HostReport:
        """What has been measured so far (all of it once the steps ran)."""
        fields: dict[str, object] = {check.value: r for check, r in self.results.items()}
        return HostReport.model_validate({"checked_at": datetime.now(UTC), "seconds": round(
            time.monotonic() - self._started, 3), **fields})

    def steps(self) -> list[Step]:
        """inventory, driver, disk, hub, matmul (each a verification)."""
        lim = self.spec.limits
        return [
            Step(Check.INVENTORY.value, self._inventory, timeout_s=90, fault=Fault.PROVIDER),
            Step(Check.DRIVER.value, self._driver, timeout_s=90, fault=Fault.PROVIDER),
            Step(Check.DISK.value, self._disk, timeout_s=2 * lim.disk.timeout_s + 60,
                 fault=Fault.PROVIDER),
            Step(Check.HUB.value, self._hub, timeout_s=2 * lim.hub.timeout_s + 60,
                 fault=Fault.PROVIDER),
            Step(Check.MATMUL.value, self._matmul, timeout_s=lim.matmul.timeout_s + 60
                 + (PULL_TIMEOUT_S if self.pull else 0), fault=Fault.PROVIDER),
        ]

    # -- recording

    def _record(self, check: Check, result: Result) -> bool:
        """Keep `result`; a failing one fails the step (the host is released)."""
        self.results[check] = result
        if result.verdict is Verdict.FAIL and not self.spec.complete:
            raise StepFailed(f"host check {check.value}: {result.reason}", fault=Fault.PROVIDER)
        return True

    def _after_failed(self, check: Check, *earlier: Check) -> bool:
        """In a complete check, record `check` as not measured when one of `earlier` failed
        (its result would only repeat that failure); True when it did."""
        failed = [c.value for c in earlier
                  if (r := self.results.get(c)) is not None and r.verdict is Verdict.FAIL]
        if not failed:
            return False
        kind = DriverResult if check is Check.DRIVER else MatmulResult
        self.results[check] = kind(verdict=Verdict.UNKNOWN, reason="not measured: the "
                                   f"{' and '.join(failed)} check failed")
        return True

    def _since(self, started: float) -> float:
        return round(time.monotonic() - started, 3)

    # -- 1. GPUs

    def _inventory(self, host: Host) -> bool:
        started = time.monotonic()
        try:
            self._gpus = gpu.check_gpus(host)
        except StepFailed as exc:
            return self._record(Check.INVENTORY, InventoryResult(
                verdict=Verdict.FAIL, reason=str(exc), seconds=self._since(started)))
        problem = gpu.mismatch(self.spec.gpu, self._gpus)
        crowded = None if problem else gpu.busy(self.spec.gpu, self._gpus)
        if crowded is not None:
            # A fresh rental (nothing of the job runs yet) or a registered server before the
            # job: the memory is someone else's, and the job would fail on it after paying
            # for the download (training out of memory, or vLLM refused after training).
            problem = f"{crowded}; {gpu.held_by(host.run)}"
        return self._record(Check.INVENTORY, InventoryResult(
            verdict=Verdict.FAIL if problem else Verdict.PASS, reason=problem or "",
            seconds=self._since(started), gpus=[g.name for g in self._gpus],
            memory_mib=[g.memory_mib for g in self._gpus],
            used_mib=[g.used_mib for g in self._gpus],
            busy=crowded is not None))

    # -- 2. driver and CUDA

    def _driver(self, host: Host) -> bool:
        started = time.monotonic()
        if not self._gpus and self._after_failed(Check.DRIVER, Check.INVENTORY):
            return True
        try:
            gpus = self._gpus or gpu.check_gpus(host)
            cuda = gpu.driver_cuda(host)
        except StepFailed as exc:  # nvidia-smi without a CUDA version: a broken driver
            return self._record(Check.DRIVER, DriverResult(
                verdict=Verdict.FAIL, reason=str(exc), seconds=self._since(started)))
        driver = gpus[0].driver_version
        need = images.min_cuda(self.spec.trainer_image)
        floor = self.spec.limits.driver.min_driver.get(need)
        problems = []
        if images.cuda_tuple(cuda) < images.cuda_tuple(need):
            problems.append(f"the driver supports CUDA {cuda}, the trainer image "
                            f"{self.spec.trainer_image} needs CUDA >= {need}")
        if floor is not None and _version(driver) < _version(floor):
            problems.append(f"driver {driver} is older than {floor}, the lowest NVIDIA lists "
                            f"for CUDA {need}")
        return self._record(Check.DRIVER, DriverResult(
            verdict=Verdict.FAIL if problems else Verdict.PASS, reason="; ".join(problems),
            seconds=self._since(started), driver_version=driver, cuda_version=cuda,
            image_cuda=need, min_driver=floor))

    # -- 3. disk

    def base(self, host: Host) -> str:
        """orch's directory on the host (the layout's, else `<NVMe mount>/orch`)."""
        if self._base is None:
            if self.spec.layout is not None:
                self._base = self.spec.layout.base
            else:
                self._base = f"{find_nvme(host).mount_point.rstrip('/')}/orch"
        return self._base

    @property
    def test_file(self) -> str:
        """The disk test's file, in orch's directory (never in models/ or jobs/)."""
        return f".hostcheck-{safe_name(self.spec.job_id)}.tmp"

    def _disk(self, host: Host) -> bool:
        started = time.monotonic()
        lim = self.spec.limits.disk
        try:
            base = self.base(host)
        except StepFailed as exc:  # no disk for the model cache at all
            return self._record(Check.DISK, DiskResult(
                verdict=Verdict.FAIL, reason=str(exc), seconds=self._since(started)))
        model_dir = Layout(base).model_dir(self.spec.repo, self.spec.revision)
        bound = round(lim.bound_s(self._disk_floor), 1)
        result = host.run(["sh", "-c", DISK_SCRIPT, "sh", base, self.test_file,
                           str(lim.test_mib), f"{bound:g}", model_dir],
                          timeout=2 * bound + 30)
        return self._record(Check.DISK, self.judge_disk(result, _server(host, base),
                                                         self._since(started)))

    @property
    def _disk_floor(self) -> float:
        return self.spec.limits.disk.floor(self.spec.pull_bytes_per_s)

    def judge_disk(self, result: ssh.Result, where: str, seconds: float) -> DiskResult:
        """The disk result from DISK_SCRIPT's output (`where`: the server path measured)."""
        lim, spec = self.spec.limits.disk, self.spec
        text = result.stdout
        free = _field(text, "free")
        cached = _field(text, "cached") or 0
        need = max(0, spec.disk_need_bytes - cached)
        floor = self._disk_floor
        bound = round(lim.bound_s(floor), 1)  # as the script was given it
        write, write_rc = _section(text, "--write")
        read, read_rc = _section(text, "--read")
        wrote, got = dd_rate(write), dd_rate(read)
        write_bps = wrote[0] / wrote[1] if wrote and wrote[1] > 0 else None
        read_bps = got[0] / got[1] if got and got[1] > 0 and read_rc == 0 else None
        problems: list[str] = []
        if free is None:
            problems.append(f"could not read the free space ({last_line(text + result.stderr)})")
        elif free < need:
            problems.append(f"{gb(free)} free, the job needs {gb(need)}")
        if write_rc == 124:
            problems.append(f"writing {lim.test_mib} MiB took over {bound:.1f} s (under "
                            f"{lim.test_mib * 2**20 / bound / 1e6:.0f} MB/s)")
        elif write_rc != 0 or write_bps is None:
            problems.append(f"the write test failed: {last_line(write)}")
        elif write_bps < floor:
            problems.append(f"writes at {write_bps / 1e6:.0f} MB/s, under {floor / 1e6:.0f} MB/s")
        if read_rc == 124:
            problems.append(f"reading {lim.test_mib} MiB took over {bound:.1f} s (under "
                            f"{lim.test_mib * 2**20 / bound / 1e6:.0f} MB/s)")
        elif read_bps is not None and read_bps < floor:
            problems.append(f"reads at {read_bps / 1e6:.0f} MB/s, under {floor / 1e6:.0f} MB/s")
        reason = "; ".join(problems)
        if not problems and read_bps is None:
            reason = f"read not measured (no direct I/O here: {last_line(read)})"
        return DiskResult(verdict=Verdict.FAIL if problems else Verdict.PASS, reason=reason,
                          seconds=seconds, path=where, free_bytes=free or 0,
                          need_bytes=need, write_bytes_per_s=write_bps,
                          read_bytes_per_s=read_bps, min_bytes_per_s=floor)

    # -- 4. the Hub

    def _hub(self, host: Host) -> bool:
        started = time.monotonic()
        env_file = f"{self.base(host)}/secrets/hostcheck.env"
        source: str | None = None
        if self.spec.hf_token:
            ssh.write_secret_env(host.conn, env_file, {"HF_TOKEN": self.spec.hf_token})
            source = env_file
        try:
            result = self._fetch(host, source)
        finally:
            if source is not None:
                with contextlib.suppress(ssh.SSHError):
                    host.remove(env_file)
        return self._record(Check.HUB, result.model_copy(
            update={"seconds": self._since(started)}))

    def _url(self, name: str) -> str:
        endpoint = (self.spec.hub_endpoint or HUB).rstrip("/")
        return f"{endpoint}/{self.spec.repo}/resolve/{self.spec.revision}/{name}"

    def _curl(self, host: Host, url: str, env_file: str | None, span: int | None,
              output: str, bound: float) -> tuple[ssh.Result, tuple[int, int, float] | None]:
        result = host.run(["sh", "-c", HUB_SCRIPT, "sh", url, f"{round(bound, 1):g}",
                           "" if span is None else str(span - 1), output],
                          timeout=bound + 30, env_file=env_file)
        found = CURL_STATS.findall(result.stdout)
        stats = (int(found[-1][0]), int(found[-1][1]), float(found[-1][2])) if found else None
        return result, stats

    def _file(self, host: Host, env_file: str | None) -> str:
        """The file to fetch: the one given, the first shard of the index, or the single file."""
        if self.spec.hub_file:
            return self.spec.hub_file
        result, stats = self._curl(host, self._url("model.safetensors.index.json"), env_file,
                                   None, "-", self.spec.limits.hub.timeout_s)
        if stats is not None and stats[0] == 200:
            body = result.stdout.rpartition("\n--orch-curl")[0]
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                shards = sorted({str(v) for v in json.loads(body)["weight_map"].values()})
                if shards:
                    return shards[0]
        return "model.safetensors"

    def _fetch(self, host: Host, env_file: str | None) -> HubResult:
        lim = self.spec.limits.hub
        vram = sum(g.memory_mib for g in self._gpus) or (
            self.spec.gpu.count * (self.spec.gpu.min_memory_mib or 0))
        floor = lim.min_bytes_per_s(vram)
        url = self._url(self._file(host, env_file))
        result, stats = self._curl(host, url, env_file, lim.range_mib * 2**20, "/dev/null",
                                   lim.bound_s(floor))
        base = HubResult(verdict=Verdict.UNKNOWN, url=url, min_bytes_per_s=floor)
        if stats is None or stats[0] == 0:
            return base.model_copy(update={
                "verdict": Verdict.FAIL, "http_status": 0,
                "reason": f"no route to the Hub ({last_line(result.stderr or result.stdout)}, "
                          f"curl exit {result.exit_code})"})
        status, size, seconds = stats
        rate = size / seconds if seconds > 0 and size else None
        update: dict[str, object] = {"http_status": status, "bytes": size,
                                     "transfer_seconds": seconds, "bytes_per_s": rate}
        if status >= 400 or status == 0:
            update["reason"] = (f"the Hub answered HTTP {status} for {url}: not a verdict on "
                                "the host (the model's access was checked before renting)")
        elif result.exit_code not in (0, 28) or rate is None:
            update.update(verdict=Verdict.FAIL, reason=f"the download broke off (curl exit "
                          f"{result.exit_code}: {last_line(result.stderr)})")
        elif rate < floor:
            update.update(verdict=Verdict.FAIL, reason=f"downloads from the Hub at "
                          f"{rate * 8 / 1e6:.0f} Mbit/s, under {floor * 8 / 1e6:.0f} Mbit/s")
        else:
            update["verdict"] = Verdict.PASS
        return base.model_copy(update=update)

    # -- 5. GPU throughput

    def _matmul(self, host: Host) -> bool:
        started = time.monotonic()
        if self._after_failed(Check.MATMUL, Check.INVENTORY, Check.DRIVER):
            return True
        lim = self.spec.limits.matmul
        probe = ["python", "-c", PROBE, PROBE_MARKER, str(lim.size), f"{lim.seconds:g}",
                 str(int(lim.timeout_s))]
        if train.detect_runner(host) == "docker":
            ran = self._docker_probe(host, probe)
            if isinstance(ran, MatmulResult):
                return self._record(Check.MATMUL, ran)
            result = ran
        else:
            native = train.NativeEnv.mapped(host.paths)
            result = host.run(native.wrap(["sh", "-c", PROBE_SCRIPT, "orch-hostcheck",
                                           self.pid_file(host), *probe]),
                              timeout=lim.timeout_s + 30)
        return self._record(Check.MATMUL, self.judge_matmul(result, self._since(started)))

    def pid_file(self, host: Host) -> str:
        """Where a running probe's pid is kept (a container rental's), in orch's directory."""
        return f"{self.base(host)}/.hostcheck-{safe_name(self.spec.job_id)}.pid"

    def _docker_probe(self, host: Host, probe: list[str]) -> ssh.Result | MatmulResult:
        """`docker run` of the trainer image on a Docker host; an unknown verdict when the
        image is not there yet or Docker cannot give it the GPUs (the toolkit comes later)."""
        image = images.for_host(self.spec.trainer_image, "docker")
        name = f"orch-hostcheck-{safe_name(self.spec.job_id)}"[:120]
        host.run(["docker", "rm", "-f", name], timeout=60)  # a probe a killed run left
        if not host.run(["docker", "image", "inspect", image], timeout=60).ok:
            if not self.pull:
                return MatmulResult(verdict=Verdict.UNKNOWN, reason=f"{image} is not on the "
                                    "host yet: measured after the job's set-up pulls it")
            # The pull the job's training step would do next (a transient failure, as there).
            host.must(["docker", "pull", image], f"docker pull {image}", fault=Fault.TRANSIENT,
                      timeout=PULL_TIMEOUT_S)
        result = host.run(["docker", "run", "--rm", "--name", name, "--gpus", "all",
                           "--label", "orch.role=hostcheck", image, *probe],
                          timeout=self.spec.limits.matmul.timeout_s + 30)
        if result.exit_code == 125:
            return MatmulResult(verdict=Verdict.UNKNOWN, reason="Docker could not start the "
                                f"probe: {last_line(result.stderr)}")
        return result

    def judge_matmul(self, result: ssh.Result, seconds: float) -> MatmulResult:
        """The matmul result from the probe's output (its last JSON line) and exit status."""
        lim, spec = self.spec.limits.matmul, self.spec
        rated = spec.rated_tflops
        base = MatmulResult(verdict=Verdict.FAIL, seconds=seconds, rated_tflops=rated,
                            healthy_tflops=round(rated * lim.healthy_fraction_of_rated, 2),
                            min_tflops=round(rated * lim.min_fraction_of_rated, 2))
        lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
        try:
            out = json.loads(lines[-1]) if lines else {}
        except ValueError:
            out = {}
        if result.exit_code == 128 + 14:  # SIGALRM: the probe's own bound
            return base.model_copy(update={"reason": "the matmul probe did not finish within "
                                           f"{lim.timeout_s:g} s"})
        if not result.ok or "gpus" not in out:
            why = out.get("error") or last_line(result.stderr or result.stdout)
            return base.model_copy(update={"reason": f"torch could not run a matmul on the "
                                           f"GPUs: {why}"})
        tflops = [float(g["tflops"]) for g in out["gpus"]]
        slowest = min(tflops)
        update: dict[str, object] = {"tflops": tflops, "torch": str(out.get("torch", "")),
                                     "verdict": Verdict.PASS}
        if slowest < base.min_tflops:
            update.update(verdict=Verdict.FAIL, reason=(
                f"a GPU reaches {slowest:.0f} TFLOPS in a bf16 matmul, under {base.min_tflops:.0f}"
                f" ({lim.min_fraction_of_rated:.0%} of the rated {rated:g}; a healthy card "
                f"reaches ~{base.healthy_tflops:.0f})"))
        return base.model_copy(update=update)


def _field(text: str, name: str) -> int | None:
    found = re.search(rf"^{name}\s+(\d+)\s*$", text, re.M)
    return int(found.group(1)) if found else None


def _section(text: str, marker: str) -> tuple[str, int | None]:
    """The output after `marker` up to its `--rc N` line, and N."""
    _, _, rest = text.partition(marker + "\n")
    body, _, tail = rest.partition("--rc ")
    code = re.match(r"(\d+)", tail)
    return body, int(code.group(1)) if code else None


def _server(host: Host, path: str) -> str:
    root = host.paths.root.rstrip("/")
    if root and path.startswith(root + "/"):
        return path[len(root):]
    return path


class HostRejected(PlaybookFailed):
    """The host failed its check (`report` says how): release it and place the job again."""

    def __init__(self, report: HostReport) -> None:
        failures = report.failures
        first = next(iter(failures), Check.INVENTORY)
        super().__init__(PLAYBOOK, first.value, "; ".join(
            f"{check.value}: {why}" for check, why in failures.items()), Fault.PROVIDER)
        self.report = report


def measure_gpu(host: Host, spec: HostCheckSpec, report: HostReport, emit: Emit,
                check: Callable[[], None] | None = None) -> HostReport:
    """`report` with the matmul measured now: on a Docker host the first check cannot run it
    before the job's set-up (the trainer image is not pulled, the Container Toolkit that
    gives Docker the GPUs not installed), so it runs once they are, pulling the image (the
    training step's pull then finds it), before any training. As `run`: a failing verdict
    is reported, the rest raised."""
    checker = HostCheck(spec, pull=True)
    checker.results.update(report.results())
    try:
        run_playbook(PLAYBOOK, checker.steps()[-1:], host, emit, check)
    except PlaybookFailed as exc:
        late = checker.results.get(Check.MATMUL)
        if exc.fault is not Fault.PROVIDER or late is None or late.verdict is not Verdict.FAIL:
            raise
    done = checker.report
    return done.model_copy(update={"seconds": round(report.seconds + done.seconds, 3)})


def run(host: Host, spec: HostCheckSpec, emit: Emit,
        check: Callable[[], None] | None = None) -> HostReport:
    """Run the check; the report says whether the host passed.

    A failing verdict is reported, not raised. What is not a verdict on the host is raised as
    the playbook's failure: the connection dropped (`Fault.TRANSIENT`), `check` stopped it.
    """
    checker = HostCheck(spec)
    try:
        run_playbook(PLAYBOOK, checker.steps(), host, emit, check)
    except PlaybookFailed as exc:
        failed = any(r.verdict is Verdict.FAIL for r in checker.results.values())
        if exc.fault is not Fault.PROVIDER or not failed:
            raise
    return checker.report
