"""Sizing accuracy: orch's memory and time estimates beside each published point.

Memory: data/calibration.yaml (estimate vs measured GiB). Time: data/throughput.yaml
(estimated vs published tokens/s; the error is on hours, positive when orch expects the run
to take longer). For each, the mean and worst absolute error over the asserted points and
over all. Asserts nothing. Usage: python bench/sizing_accuracy.py [--json]
"""

from __future__ import annotations

import json
import sys
from typing import Any

from orchestrator.core import calibration, throughputcal
from providers import catalog


def _summary(errors: list[tuple[float, bool]]) -> dict[str, Any]:
    out = {}
    asserted = [e for e, a in errors if a]
    for label, group in (("asserted", asserted), ("all", [e for e, _ in errors])):
        absolute = [abs(e) for e in group]
        out[label] = {"points": len(group), "mean_abs_error": sum(absolute) / len(absolute),
                      "worst_abs_error": max(absolute)}
    return out


def results() -> dict[str, Any]:
    """Every point with orch's estimate and the error, and the summaries."""
    gpus = catalog.gpus()
    mem_points, time_points = calibration.points(), throughputcal.points()
    memory = [{"point": p.name, "kind": p.kind, "compare": p.compare,
               "estimate_gib": p.estimate_gib(), "published_gib": p.measured_gib,
               "error": p.error, "asserted": p.asserted} for p in mem_points]
    time = [{"point": p.name, "gpu": f"{p.gpu} x{p.gpu_count}", "compiled": p.compiled,
             "estimate_tokens_per_s": p.estimate_tokens_per_s(gpus),
             "published_tokens_per_s": p.measured_tokens_per_s, "error": p.error(gpus),
             "asserted": p.asserted} for p in time_points]
    return {"memory": memory,
            "memory_summary": _summary([(p.error, p.asserted) for p in mem_points]),
            "time": time,
            "time_summary": _summary([(p.error(gpus), p.asserted) for p in time_points]),
            "time_band": throughputcal.band()}

def _print_summary(summary: dict[str, Any]) -> None:
    for label, s in summary.items():
        print(f"{label:9} points {s['points']}: mean |error| {s['mean_abs_error']:.1%}, "
              f"worst {s['worst_abs_error']:.1%}")


def main() -> None:
    r = results()
    if "--json" in sys.argv[1:]:
        print(json.dumps(r, indent=2))
        return
    print("Memory (GiB per GPU)")
    print(f"{'point':52} {'kind':11} {'compare':7} {'orch GiB':>9} {'published':>10} "
          f"{'error':>7}  asserted")
    for m in r["memory"]:
        print(f"{m['point']:52} {m['kind']:11} {m['compare']:7} {m['estimate_gib']:9.2f} "
              f"{m['published_gib']:10.2f} {m['error']:+7.1%}  {'yes' if m['asserted'] else 'no'}")
    _print_summary(r["memory_summary"])
    print(f"\nTime (training tokens/s; error on hours, band ±{r['time_band']:.0%})")
    print(f"{'point':64} {'GPU':14} {'orch tok/s':>10} {'published':>10} {'error':>7}  asserted")
    for t in r["time"]:
        print(f"{t['point']:64} {t['gpu']:14} {t['estimate_tokens_per_s']:10,.0f} "
              f"{t['published_tokens_per_s']:10,.0f} {t['error']:+7.1%}  "
              f"{'yes' if t['asserted'] else 'no'}")
    _print_summary(r["time_summary"])


if __name__ == "__main__":
    main()
