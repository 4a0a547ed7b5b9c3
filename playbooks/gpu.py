"""Driver and GPU inventory check: the host has a working NVIDIA driver and the GPUs promised.

Two verification steps (nothing is changed on the host), following
../shared/reference/pipeline-facts.md ("GPU and driver check"): `nvidia-smi` must answer
(else the host is broken: `Fault.HOST`), and the GPUs it lists must be the model, count and
memory the offer promised (else the provider delivered something else: `Fault.PROVIDER`, a
reason to release the instance and try the next offer, not a training failure).

Playbooks never import `providers`, so the catalog names (providers/catalog/gpus.yaml) are
mapped from nvidia-smi's names by the small table `NVIDIA_SMI_NAMES` below.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from playbooks import images, ssh
from playbooks.base import Fault, Host, Step, StepFailed, last_line

QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,memory.used",
         "--format=csv,noheader,nounits"]
# The processes holding GPU memory. nvidia-smi in a container lists none of another PID
# namespace (another container's, the host's), so an empty list does not mean no process.
APPS_QUERY = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
              "--format=csv,noheader,nounits"]

# Catalog name -> the product names nvidia-smi prints for it (`--query-gpu=name`), matched
# whole, ignoring case and repeated spaces. Source: the names NVIDIA's drivers report on
# these boards as seen in nvidia-smi output on cloud hosts (R470+ drivers prefix
# "NVIDIA "; older ones print "GeForce RTX 3090" without it). RunPod's GPU type ids are these
# names (docs.runpod.io/references/gpu-types); the rest are the names NVIDIA's drivers give
# the boards (A100-PCIE-40GB, A10, RTX PRO 4000/5000 Blackwell, RTX 5070 Ti). Each pattern is
# matched whole, so a variant that is another product (RTX 4090 D vs RTX 4090, H100 NVL vs
# H100 PCIe, A100 40GB vs 80GB) never fulfils an offer for its neighbour. B300 names are not
# yet settled across driver releases ("NVIDIA B300 SXM6 AC" is one), so any "NVIDIA B300 ..."
# matches.
NVIDIA_SMI_NAMES: dict[str, tuple[str, ...]] = {
    "RTX 3090": (r"(NVIDIA )?GeForce RTX 3090",),
    "RTX 4090": (r"(NVIDIA )?GeForce RTX 4090",),
    "RTX 5090": (r"(NVIDIA )?GeForce RTX 5090",),
    "A100 80GB": (r"NVIDIA A100-SXM4-80GB", r"NVIDIA A100-SXM-80GB", r"NVIDIA A100 80GB PCIe"),
    "H100 PCIe": (r"NVIDIA H100 PCIe",),
    "H100 SXM": (r"NVIDIA H100 80GB HBM3",),
    "H200": (r"NVIDIA H200",),
    "B200": (r"NVIDIA B200",),
    "B300": (r"NVIDIA B300( .*)?",),
    "A100 40GB": (r"NVIDIA A100-PCIE-40GB", r"NVIDIA A100-SXM4-40GB"),
    "A30": (r"NVIDIA A30",),
    "A40": (r"NVIDIA A40",),
    "A10": (r"NVIDIA A10",),
    "L4": (r"NVIDIA L4",),
    "L40": (r"NVIDIA L40",),
    "L40S": (r"NVIDIA L40S",),
    "H100 NVL": (r"NVIDIA H100 NVL",),
    "H200 NVL": (r"NVIDIA H200 NVL",),
    "RTX A6000": (r"NVIDIA RTX A6000",),
    "RTX A5000": (r"NVIDIA RTX A5000",),
    "RTX A4500": (r"NVIDIA RTX A4500",),
    "RTX A4000": (r"NVIDIA RTX A4000",),
    "RTX A2000": (r"NVIDIA RTX A2000( 12GB)?",),
    "RTX 6000 Ada": (r"NVIDIA RTX 6000 Ada Generation",),
    "RTX 5000 Ada": (r"NVIDIA RTX 5000 Ada Generation",),
    "RTX 4000 Ada": (r"NVIDIA RTX 4000 Ada Generation",),
    "RTX 4000 SFF Ada": (r"NVIDIA RTX 4000 SFF Ada Generation",),
    "RTX 2000 Ada": (r"NVIDIA RTX 2000 Ada Generation",),
    "RTX PRO 6000": (r"NVIDIA RTX PRO 6000 Blackwell Server Edition",
                     r"NVIDIA RTX PRO 6000 Blackwell Workstation Edition"),
    "RTX PRO 6000 Max-Q": (r"NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",),
    "RTX PRO 5000": (r"NVIDIA RTX PRO 5000 Blackwell",),
    "RTX PRO 4500": (r"NVIDIA RTX PRO 4500 Blackwell",),
    "RTX PRO 4000": (r"NVIDIA RTX PRO 4000 Blackwell",),
    "RTX 3090 Ti": (r"(NVIDIA )?GeForce RTX 3090 Ti",),
    "RTX 3080 Ti": (r"(NVIDIA )?GeForce RTX 3080 Ti",),
    "RTX 3080": (r"(NVIDIA )?GeForce RTX 3080",),
    "RTX 3070": (r"(NVIDIA )?GeForce RTX 3070",),
    "RTX 4080 SUPER": (r"NVIDIA GeForce RTX 4080 SUPER",),
    "RTX 4080": (r"NVIDIA GeForce RTX 4080",),
    "RTX 4070 Ti": (r"NVIDIA GeForce RTX 4070 Ti",),
    "RTX 5080": (r"NVIDIA GeForce RTX 5080",),
    "RTX 5070 Ti": (r"NVIDIA GeForce RTX 5070 Ti",),
}

_PATTERNS: dict[str, tuple[re.Pattern[str], ...]] = {
    model: tuple(re.compile(p, re.IGNORECASE) for p in patterns)
    for model, patterns in NVIDIA_SMI_NAMES.items()
}


def catalog_model(smi_name: str) -> str | None:
    """Our catalog name for an nvidia-smi GPU name, or None when it is none of ours."""
    name = " ".join(smi_name.split())
    for model, patterns in _PATTERNS.items():
        if any(p.fullmatch(name) for p in patterns):
            return model
    return None


@dataclass(frozen=True)
class GpuExpectation:
    """What the offer promised: catalog model, GPU count, and optionally memory per GPU.

    `exact_count=False` accepts a host with more GPUs than `count` (a dedicated server whose
    job uses only some of them); by default the count must match, because the trainer
    uses every visible GPU and the world size changes the effective batch size.
    """

    model: str
    count: int
    min_memory_mib: int | None = None
    exact_count: bool = True
    # The trainer image's CUDA ("13.0") and the image, when the driver must be checked for it.
    min_cuda: str | None = None
    image: str = ""
    # What the job needs free on each of its GPUs before it starts: MiB for training (the
    # plan's peak with headroom), and the fraction of each GPU's memory its evaluation's
    # vLLM takes (`--gpu-memory-utilization`), which vLLM refuses to start without (0: no
    # vLLM). Checked by the pre-flight host check (`busy`), as nvidia-smi reports memory.used.
    free_mib: int = 0
    serve_utilization: float = 0.0
    serve_gpus: int = 1  # of which vLLM uses the first this many (its tensor-parallel size)

    def __post_init__(self) -> None:
        if self.model not in NVIDIA_SMI_NAMES:
            known = ", ".join(NVIDIA_SMI_NAMES)
            raise ValueError(f"unknown GPU model {self.model!r} (known: {known})")
        if self.count < 1:
            raise ValueError(f"GPU count must be >= 1 (got {self.count})")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi reports it; `model` is our catalog name (None: not ours)."""

    name: str
    memory_mib: int
    driver_version: str
    model: str | None = field(default=None)
    used_mib: int | None = None  # memory in use by any process (None: nvidia-smi did not say)


def parse_inventory(text: str) -> list[GpuInfo]:
    """GPUs from `nvidia-smi --query-gpu=name,memory.total,driver_version[,memory.used]` CSV
    lines (memory.used may be `[N/A]`: then unknown)."""
    gpus: list[GpuInfo] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        # The name comes first and never contains a comma in NVIDIA's product names, but
        # split from the right so an odd one cannot shift the numeric columns.
        parts = [p.strip() for p in line.rsplit(",", 3)]
        if len(parts) == 4 and not parts[1].removesuffix("MiB").strip().isdigit():
            three = [p.strip() for p in line.rsplit(",", 2)]  # a name with a comma, no used?
            if three[1].removesuffix("MiB").strip().isdigit():
                parts = three
        if len(parts) not in (3, 4):
            raise ValueError(f"unexpected nvidia-smi line {line!r}")
        name, memory, driver = parts[:3]
        memory = memory.removesuffix("MiB").strip()
        if not memory.isdigit():
            raise ValueError(f"unexpected memory.total {memory!r} in nvidia-smi line {line!r}")
        used = parts[3].removesuffix("MiB").strip() if len(parts) == 4 else ""
        gpus.append(GpuInfo(name, int(memory), driver, catalog_model(name),
                            int(used) if used.isdigit() else None))
    return gpus


# Memory an idle card may report in use, which `busy` allows for against the job's training
# need: a headless card reports a few MiB, one that drives a display a few hundred (its X
# server). That need is the plan's peak with its headroom (`sizing`: x 1.2 by default), which
# covers that much.
IDLE_USED_MIB = 512
# vLLM measures the free memory after its own CUDA context exists (`init_device`), so that
# must be free on top of its fraction of the card: the same figure as
# orchestrator/core/evalsizing.py's CUDA_CONTEXT.
VLLM_CONTEXT_MIB = 768


def busy(expected: GpuExpectation, gpus: Sequence[GpuInfo]) -> str | None:
    """Why the job's GPUs (the first `expected.count`: Docker's `--gpus N` takes those) have
    too little memory free for it (`GpuExpectation.free_mib`, `serve_utilization`); None when
    they have enough or nvidia-smi did not report memory.used. Call it before anything of
    the job runs on them: its own trainer or server holds memory too."""
    short: list[str] = []
    serve_need = 0
    for i, g in enumerate(gpus[:expected.count]):
        if g.used_mib is None:
            continue
        free = g.memory_mib - g.used_mib
        serve = 0
        if expected.serve_utilization and i < expected.serve_gpus:
            serve = math.ceil(expected.serve_utilization * g.memory_mib)
        # Training: an idle card's use is allowed for (the headroom covers it); vLLM: its
        # own check, with its CUDA context.
        if free + IDLE_USED_MIB >= expected.free_mib and (
                not serve or free >= serve + VLLM_CONTEXT_MIB):
            continue
        short.append(f"GPU {i}: {g.used_mib} of {g.memory_mib} MiB in use")
        serve_need = max(serve_need, serve)
    if not short:
        return None
    needs = []
    if expected.free_mib:
        needs.append(f"training needs {expected.free_mib} MiB free")
    if serve_need:
        needs.append(f"its evaluation's vLLM takes {expected.serve_utilization:g} of a GPU's "
                     f"memory ({serve_need} MiB, and {VLLM_CONTEXT_MIB} MiB for its CUDA "
                     "context) and does not start with less free")
    return (f"GPU memory is already in use by processes outside this job ({'; '.join(short)})"
            f": less is free than the job needs on each GPU ({' and '.join(needs)})")


def holders(run: Callable[[list[str]], ssh.Result]) -> str:
    """The processes nvidia-smi says hold GPU memory, as a clause: "pid 4242 (python3, 21504
    MiB)"; "" when it lists none (in a container it sees no other PID namespace's)."""
    try:
        result = run(APPS_QUERY)
    except ssh.SSHError:
        return ""
    apps = []
    for line in result.stdout.splitlines() if result.ok else []:
        pid, _, rest = line.partition(",")
        name, _, used = rest.rpartition(",")  # a process name may hold a comma
        pid, name, used = pid.strip(), name.strip(), used.strip()
        if pid.isdigit() and name:
            apps.append(f"pid {pid} ({name}" + (f", {used} MiB)" if used.isdigit() else ")"))
    return ", ".join(apps)


def held_by(run: Callable[[list[str]], ssh.Result]) -> str:
    """Who holds the GPUs' memory, as a clause of a reason (`holders`, or why none is named)."""
    who = holders(run)
    return (f"held by {who}" if who else "no process holding it is visible from orch's login "
            "(nvidia-smi in a container lists none of another container or of the host)")


def memory_report(run: Callable[[list[str]], ssh.Result]) -> str:
    """What nvidia-smi says of the GPUs' memory and who holds it, for an error message that
    follows a server or trainer finding too little free ("" when it cannot tell)."""
    try:
        result = run(QUERY)
        gpus = parse_inventory(result.stdout) if result.ok else []
    except (ssh.SSHError, ValueError):
        return ""
    if not gpus:
        return ""
    used = "; ".join(f"GPU {i}: {g.used_mib} of {g.memory_mib} MiB in use" for i, g in
                     enumerate(gpus) if g.used_mib is not None)
    return f"nvidia-smi on the host: {used or 'memory in use not reported'}; {held_by(run)}"


# How long `free_step` looks again before it fails: memory a process is still releasing as
# it exits (a server stopped just before) is not held against the job.
FREE_WAIT_S = 20.0


def free_step(expected: GpuExpectation, wait_s: float = FREE_WAIT_S) -> Step:
    """A verification that no other process holds the memory the job needs on its GPUs
    (`busy`): before a trainer first starts on a registered server that was not just
    host-checked, when nothing of the job runs on its GPUs yet."""
    def free(host: Host) -> bool:
        until = time.monotonic() + wait_s
        while (problem := busy(expected, check_gpus(host))) is not None \
                and time.monotonic() < until:
            time.sleep(2.0)
        if problem is not None:
            raise StepFailed(
                f"{problem}; {held_by(host.run)}. Nothing was trained: free that memory "
                "(`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv` "
                "lists what holds it) and run the job again.", fault=Fault.HOST)
        return True

    return Step("memory-free", free, timeout_s=90, fault=Fault.HOST,
                message="other processes hold the GPU memory the job needs")


def check_gpus(host: Host) -> list[GpuInfo]:
    """The host's GPUs; raises StepFailed (Fault.HOST) when there is no working driver."""
    result = host.run(QUERY, timeout=60)
    if result.exit_code == 127:
        raise StepFailed(
            "no working NVIDIA driver: nvidia-smi is not installed on the host. Install the "
            "NVIDIA driver (e.g. `apt-get install nvidia-driver-570-server`, then reboot) or "
            "choose an offer whose image ships it.",
            fault=Fault.HOST, stderr=result.stderr)
    if not result.ok:
        raise StepFailed(
            f"no working NVIDIA driver: nvidia-smi failed (exit {result.exit_code}): "
            f"{last_line(result.stderr or result.stdout)}. The driver is installed but not "
            "usable (module not loaded, or a driver/kernel mismatch): reboot the host or "
            "reinstall the driver; on a rented instance, release it and take another.",
            fault=Fault.HOST, stderr=result.stderr)
    try:
        gpus = parse_inventory(result.stdout)
    except ValueError as exc:
        raise StepFailed(f"no working NVIDIA driver: {exc}", fault=Fault.HOST,
                         stderr=result.stderr) from None
    if not gpus:
        raise StepFailed("no working NVIDIA driver: nvidia-smi lists no GPU. Check that the "
                         "GPUs are attached to this host (`nvidia-smi -L`).", fault=Fault.HOST)
    return gpus


def mismatch(expected: GpuExpectation, gpus: Sequence[GpuInfo]) -> str | None:
    """Why `gpus` are not what was promised, naming promised vs found; None when they are."""
    found = _describe(gpus)
    promised = f"{expected.count}x {expected.model}"
    if expected.min_memory_mib is not None:
        promised += f" with >= {expected.min_memory_mib} MiB each"
    problems: list[str] = []
    wrong = sorted({g.name for g in gpus if g.model != expected.model})
    if wrong:
        problems.append(f"model {', '.join(wrong)} is not a {expected.model}")
    if len(gpus) < expected.count or (expected.exact_count and len(gpus) != expected.count):
        problems.append(f"{len(gpus)} GPU(s) instead of {expected.count}")
    if expected.min_memory_mib is not None:
        small = min(g.memory_mib for g in gpus)
        if small < expected.min_memory_mib:
            problems.append(f"{small} MiB of GPU memory instead of >= {expected.min_memory_mib}")
    if not problems:
        return None
    return (f"the host is not what the offer promised: promised {promised}, found {found} "
            f"({'; '.join(problems)}). Release it and report the offer to the provider.")


def _describe(gpus: Sequence[GpuInfo]) -> str:
    counts: dict[tuple[str, int], int] = {}
    for gpu in gpus:
        counts[(gpu.name, gpu.memory_mib)] = counts.get((gpu.name, gpu.memory_mib), 0) + 1
    return " + ".join(f"{n}x {name} ({mib} MiB)" for (name, mib), n in counts.items())


_CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*([0-9]+(?:\.[0-9]+)*)")


def driver_cuda(host: Host) -> str:
    """The highest CUDA version the host's driver supports, from `nvidia-smi`'s header."""
    result = host.run(["nvidia-smi"], timeout=60)
    found = _CUDA_VERSION.search(result.stdout) if result.ok else None
    if found is None:
        raise StepFailed("nvidia-smi did not report the driver's CUDA version "
                         f"({last_line(result.stderr or result.stdout)})", fault=Fault.HOST,
                         stderr=result.stderr)
    return found.group(1)


def cuda_problem(expected: GpuExpectation, have: str, driver: str) -> str | None:
    """Why a driver supporting CUDA `have` cannot run the trainer image; None when it can."""
    if expected.min_cuda is None:
        return None
    if images.cuda_tuple(have) >= images.cuda_tuple(expected.min_cuda):
        return None
    return (f"the host's NVIDIA driver {driver} supports CUDA {have}, but the trainer image "
            f"{expected.image or '(the job`s)'} needs CUDA >= {expected.min_cuda}: upgrade the "
            f"driver to one that supports CUDA {expected.min_cuda} (R580 or newer for 13.0, "
            "e.g. `apt-get install nvidia-driver-580-server`, then reboot) before running "
            "jobs on this server. Nothing was pulled or started.")


def steps(expected: GpuExpectation) -> list[Step]:
    """The GPU playbook: a working driver, the GPUs the offer promised, and a driver new
    enough for the trainer image's CUDA (checked before anything is pulled)."""
    # Both steps need the same nvidia-smi answer: ask once per run and share it.
    seen: list[GpuInfo] = []

    def driver_works(host: Host) -> bool:
        seen[:] = check_gpus(host)
        return True

    def inventory_matches(host: Host) -> bool:
        gpus = list(seen) or check_gpus(host)
        problem = mismatch(expected, gpus)
        if problem is not None:
            raise StepFailed(problem, fault=Fault.PROVIDER)
        return True

    def cuda_supported(host: Host) -> bool:
        gpus = list(seen) or check_gpus(host)
        problem = cuda_problem(expected, driver_cuda(host), gpus[0].driver_version)
        if problem is not None:
            raise StepFailed(problem, fault=Fault.HOST)
        return True

    result = [
        Step("driver", driver_works, timeout_s=90, fault=Fault.HOST,
             message="no working NVIDIA driver"),
        Step("inventory", inventory_matches, timeout_s=90, fault=Fault.PROVIDER,
             message="the GPUs are not what the offer promised"),
    ]
    if expected.min_cuda is not None:
        result.append(Step("driver-cuda", cuda_supported, timeout_s=90, fault=Fault.HOST,
                           message="the driver does not support the trainer image's CUDA"))
    return result
