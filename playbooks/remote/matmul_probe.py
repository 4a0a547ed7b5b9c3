"""orch's GPU throughput probe: a timed bf16 matmul on every visible GPU; one JSON line out.

Run by playbooks/hostcheck.py in the trainer image's python (its torch) as
`python -c <this file> orch-hostcheck-probe SIZE SECONDS LIMIT_S`. Stdlib and torch only.
The process ends itself after LIMIT_S (SIGALRM's default action), so a probe whose caller
died never lingers beside the job's training. Exit 0 with {"torch", "cuda", "gpus":
[{"index", "name", "tflops"}]}; 3 with {"error"} when torch sees no GPU; anything else
(a traceback) is torch's own failure.
"""

import json
import signal
import sys
import time


def measure(torch, index, size, seconds):
    """TFLOPS of `size`^3 bf16 matmuls on GPU `index`, timed for `seconds` after a warm-up."""
    dev = torch.device("cuda", index)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    c = torch.empty(size, size, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize(dev)
    done, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(dev)
        done += 10
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    del a, b, c
    torch.cuda.empty_cache()
    return 2.0 * size**3 * done / elapsed / 1e12


def main(argv):
    """argv: `-c orch-hostcheck-probe SIZE SECONDS LIMIT_S` (see the module docstring)."""
    size, seconds, limit = int(argv[2]), float(argv[3]), int(argv[4])
    signal.alarm(limit)
    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": []}
    count = torch.cuda.device_count()
    if count == 0:
        out["error"] = "torch sees no CUDA device"
        print(json.dumps(out), flush=True)
        return 3
    for index in range(count):
        tflops = measure(torch, index, size, seconds)
        out["gpus"].append({"index": index, "name": torch.cuda.get_device_name(index),
                            "tflops": round(tflops, 2)})
    print(json.dumps(out), flush=True)
    return 0


sys.exit(main(sys.argv))
