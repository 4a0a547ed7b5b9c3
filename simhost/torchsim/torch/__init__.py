"""A stand-in for the trainer image's `torch`, as much of it as orch's matmul probe uses.

The simulated host's image python (the axolotl venv's `python` on a container rental, the
image's `python` in a `docker run` of it) puts this folder first on its path, so the probe
(playbooks/remote/matmul_probe.py) runs as it is, with its own arithmetic and output; only
the GPU is simulated. A GPU does `matmul`s asynchronously: each one adds its FLOPs to the
device's queue, and `cuda.synchronize` waits until the queue is done, at the host's
`gpu_matmul_tflops` x `gpu_speed` (simhost/host.py SimHostOptions).

What torch itself refuses is refused in its words: no driver (or a container started without
`--gpus`) means no device; a driver older than the CUDA the image's torch was built for
fails the first CUDA tensor with torch's "driver on your system is too old". Stdlib only;
anything the probe does not use is absent (AttributeError), as a missing API would be.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from standins import gpumem, images  # simhost/standins (this python's path holds simhost/)
from standins.common import Host

_HOST = Host.from_env()
_OPTS = _HOST.options
_IMAGE = os.environ.get("SIMHOST_IMAGE") or str(_OPTS.get("container_image") or "")
_TAG = images.tag(_IMAGE)

__version__ = f"{_TAG.get('torch', '2.12.0')}+cu{_TAG.get('cuda', '13.0').replace('.', '')}"
version = SimpleNamespace(cuda=_TAG.get("cuda", "13.0"))
bfloat16 = "torch.bfloat16"
float32 = "torch.float32"

_NO_DRIVER = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
              "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx")


def _cuda_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split(".") if part.isdigit())


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError."""


class device:  # noqa: N801 - torch's own spelling
    """`torch.device("cuda", i)`."""

    def __init__(self, kind: str, index: int = 0) -> None:
        if kind != "cuda":
            raise RuntimeError(f"simhost torch: only cuda devices are simulated (got {kind})")
        self.type, self.index = kind, int(index)

    def __repr__(self) -> str:
        return f"device(type='cuda', index={self.index})"


class Tensor:
    """A tensor on a simulated GPU: its shape and device; no data."""

    def __init__(self, shape: tuple[int, ...], dev: device, dtype: str) -> None:
        self.shape, self.device, self.dtype = shape, dev, dtype


_RELAUNCH_S = 0.05  # the most of a late wake-up after a synchronize not counted as idle


class _Cuda:
    """`torch.cuda`."""

    def __init__(self) -> None:
        # Device index -> when (time.monotonic) the work launched on it is done. A real GPU
        # runs a kernel while Python launches the next: the launches' own time overlaps the
        # work, so it counts from when each is launched, not after the last (a loaded machine
        # made the simulated card measure slower than its speed).
        self._busy_until: dict[int, float] = {}
        # Device index -> when its work finished at the last synchronize. A real, unloaded
        # host launches the next kernel microseconds after the wait returns; this process,
        # on a test machine running many jobs, may get the CPU back milliseconds late, and
        # the simulated card then idled: a healthy one measured 414 TFLOPS against a floor of
        # 416 (55 % of its rated 756) in a CI run. Up to `_RELAUNCH_S` of that lateness is
        # not the card's: the next kernel starts when the last one finished.
        self._synced: dict[int, float] = {}

    def device_count(self) -> int:
        # NVML's count: the devices exist even when the driver is too old to run a kernel.
        return int(_OPTS["gpu_count"]) if _HOST.gpus_visible() else 0

    def is_available(self) -> bool:
        return self.device_count() > 0 and _driver_error() is None

    def get_device_name(self, index: int = 0) -> str:
        self._check(index)
        return str(_OPTS["gpu_model"])

    def synchronize(self, dev: device | int | None = None) -> None:
        index = dev.index if isinstance(dev, device) else int(dev or 0)
        self._check(index)
        done = self._busy_until.pop(index, 0.0)
        time.sleep(max(0.0, done - time.monotonic()))
        self._synced[index] = done

    def empty_cache(self) -> None:
        return None

    def enqueue(self, index: int, flops: float) -> None:
        """A kernel of `flops` was launched on device `index`."""
        tflops = float(_OPTS.get("gpu_matmul_tflops") or 1.0) * float(_OPTS.get("gpu_speed")
                                                                       or 1.0)
        now = time.monotonic()
        synced = self._synced.pop(index, now)
        idle_from = synced if now - synced <= _RELAUNCH_S else now
        start = max(idle_from, self._busy_until.get(index, idle_from))
        self._busy_until[index] = start + flops / (tflops * 1e12)

    def _check(self, index: int) -> None:
        if self.device_count() == 0:
            raise RuntimeError(_NO_DRIVER)
        problem = _driver_error()
        if problem is not None:
            raise RuntimeError(problem)
        if not 0 <= index < self.device_count():
            raise RuntimeError("CUDA error: invalid device ordinal")


def _driver_error() -> str | None:
    """torch's refusal of a driver older than the CUDA it was built for (None: usable)."""
    have = _cuda_tuple(_OPTS.get("cuda_version") or "0")
    if have >= _cuda_tuple(version.cuda):
        return None
    found = have[0] * 1000 + (have[1] if len(have) > 1 else 0) * 10
    return (f"The NVIDIA driver on your system is too old (found version {found}). Please "
            "update your GPU driver by downloading and installing a new version from the URL: "
            "http://www.nvidia.com/Download/index.aspx Alternatively, go to: "
            "https://pytorch.org to install a PyTorch version that has been compiled with your "
            "version of the CUDA driver.")


cuda = _Cuda()


def _new(shape: tuple[int, ...], dev: device | str | None, dtype: str | None) -> Tensor:
    if not isinstance(dev, device):
        raise RuntimeError("simhost torch: tensors on the CPU are not simulated")
    cuda._check(dev.index)
    size = 2 if dtype == bfloat16 else 4
    count = 1
    for n in shape:
        count *= int(n)
    total = int(_OPTS["gpu_memory_mib"])
    held = gpumem.used_mib(_HOST, dev.index or 0)  # other processes'
    if count * size > (total - held) * 2**20:
        # torch's text; a process of another PID namespace is not named (a container's).
        others = [(4242, int(_OPTS.get("gpu_memory_held_mib") or 0))] + [
            (h.pid, h.mib) for h in gpumem.holders(_HOST) if (dev.index or 0) in h.gpus]
        other = ("".join(f" Process {pid} has {mib / 1024:.2f} GiB memory in use."
                         for pid, mib in others if mib)
                 if not (os.environ.get("SIMHOST_CONTAINER")
                         or _OPTS.get("container_image")) else "")
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {count * size / 2**30:.2f}"
                               f" GiB. GPU {dev.index} has a total capacity of "
                               f"{total / 1024:.2f} GiB of which {(total - held) / 1024:.2f} GiB"
                               f" is free.{other}")
    return Tensor(tuple(int(n) for n in shape), dev, dtype or float32)


def randn(*shape: int, device: device | str | None = None, dtype: str | None = None) -> Tensor:
    """`torch.randn(m, n, device=..., dtype=...)`."""
    return _new(shape, device, dtype)


def empty(*shape: int, device: device | str | None = None, dtype: str | None = None) -> Tensor:
    """`torch.empty(m, n, device=..., dtype=...)`."""
    return _new(shape, device, dtype)


def matmul(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """`torch.matmul` of two 2-D tensors on one device: queued, 2*m*n*k FLOPs."""
    if a.device.index != b.device.index:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least "
                           f"two devices, cuda:{a.device.index} and cuda:{b.device.index}!")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {k2}x{n})")
    cuda.enqueue(a.device.index, 2.0 * m * n * k)
    return out if out is not None else Tensor((m, n), a.device, a.dtype)
