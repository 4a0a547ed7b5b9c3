"""Sizing accuracy: orch's memory and time estimates beside each published point.

Memory: data/calibration.yaml (estimate vs measured GiB per GPU at three stages side by side,
as recorded in the file: "main" before issue 36 (0f7499d), "r36" after its recalibration of
sharded full fine-tunes (r36-sizing at 5485ec0), and now, with the sharded adapter terms),
with the signed error summed up per layout and method, and for the points the
recalibrations were fitted to apart from those held out of them. Time: data/throughput.yaml
(estimated vs published tokens/s; the error is on hours, positive when orch expects the run
to take longer). For each, the mean and worst absolute error over the asserted points and over all.
Asserts nothing. Usage: python bench/sizing_accuracy.py [--json]
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


def _signed(errors: list[float]) -> dict[str, Any]:
    """Mean error, the most over and the most under (negative: an underestimate)."""
    return {"points": len(errors), "mean_error": sum(errors) / len(errors),
            "max_over": max(errors), "max_under": min(errors)}


def _memory_groups(points: list[calibration.Point]) -> dict[str, Any]:
    """Signed errors before and after, per layout/method and for fitted vs held-out points."""
    groups: dict[str, list[calibration.Point]] = {}
    for p in points:
        if not p.asserted:
            groups.setdefault("not asserted", []).append(p)
            continue
        groups.setdefault(f"{p.layout}/{p.workload.method}", []).append(p)
        if p.sharded:
            groups.setdefault("sharded, held out" if p.held_out else "sharded, fitted",
                              []).append(p)
    out = {}
    for name, group in sorted(groups.items()):
        out[name] = {"after": _signed([p.error for p in group]),
                     "before": _signed([p.before_error for p in group
                                        if p.before_error is not None]),
                     "prev": _signed([p.prev_error for p in group
                                      if p.prev_error is not None])}
    return out


def results() -> dict[str, Any]:
    """Every point with orch's estimate and the error, and the summaries."""
    gpus = catalog.gpus()
    mem_points, time_points = calibration.points(), throughputcal.points()
    memory = [{"point": p.name, "kind": p.kind, "compare": p.compare,
               "layout": str(p.layout), "gpu_count": p.gpu_count, "method": p.workload.method,
               "measured_as": p.measured_as, "held_out": p.held_out,
               "before_gib": p.before_gib, "before_error": p.before_error,
               "prev_gib": p.prev_gib, "prev_error": p.prev_error,
               "estimate_gib": p.estimate_gib(), "published_gib": p.measured_gib,
               "error": p.error, "asserted": p.asserted, "why": p.why} for p in mem_points]
    time = [{"point": p.name, "gpu": f"{p.gpu} x{p.gpu_count}", "compiled": p.compiled,
             "estimate_tokens_per_s": p.estimate_tokens_per_s(gpus),
             "published_tokens_per_s": p.measured_tokens_per_s, "error": p.error(gpus),
             "asserted": p.asserted} for p in time_points]
    return {"memory": memory,
            "memory_summary": _summary([(p.error, p.asserted) for p in mem_points]),
            "memory_groups": _memory_groups(mem_points),
            "time": time,
            "time_summary": _summary([(p.error(gpus), p.asserted) for p in time_points]),
            "time_band": throughputcal.band()}

def _print_summary(summary: dict[str, Any]) -> None:
    for label, s in summary.items():
        print(f"{label:9} points {s['points']}: mean |error| {s['mean_abs_error']:.1%}, "
              f"worst {s['worst_abs_error']:.1%}")


def _stage(gib: float | None, error: float | None) -> str:
    return f"{'':15}" if gib is None or error is None else f"{gib:7.2f} {error:+7.1%}"


def _print_memory(r: dict[str, Any]) -> None:
    print("Memory (GiB per GPU)")
    print("error = estimate / published - 1; main: 0f7499d; r36: r36-sizing 5485ec0; "
          "A asserted, H held out")
    print(f"{'point':72} {'layout':16} {'published':>9} {'main':>7} {'error':>7} "
          f"{'r36':>7} {'error':>7} {'now':>7} {'error':>7}  AH")
    for m in r["memory"]:
        layout = f"{m['layout']} x{m['gpu_count']}"
        flags = ("A" if m["asserted"] else "-") + ("H" if m["held_out"] else "-")
        print(f"{m['point']:72} {layout:16} {m['published_gib']:9.2f} "
              f"{_stage(m['before_gib'], m['before_error'])} "
              f"{_stage(m['prev_gib'], m['prev_error'])} "
              f"{m['estimate_gib']:7.2f} {m['error']:+7.1%}  {flags}")
    _print_summary(r["memory_summary"])
    print("\nSigned error of the asserted points per layout/method, of the sharded ones fitted\n"
          "and held out, and of the points not asserted (mean, most over, most under):")
    for name, g in r["memory_groups"].items():
        stages = "  ".join(f"{label} {g[key]['mean_error']:+7.1%} {g[key]['max_over']:+7.1%} "
                           f"{g[key]['max_under']:+7.1%}"
                           for label, key in (("main", "before"), ("r36", "prev"),
                                              ("now", "after")))
        print(f"  {name:24} {g['after']['points']:3} points  {stages}")


def main() -> None:
    r = results()
    if "--json" in sys.argv[1:]:
        print(json.dumps(r, indent=2))
        return
    _print_memory(r)
    print(f"\nTime (training tokens/s; error on hours, band ±{r['time_band']:.0%})")
    print(f"{'point':64} {'GPU':14} {'orch tok/s':>10} {'published':>10} {'error':>7}  asserted")
    for t in r["time"]:
        print(f"{t['point']:64} {t['gpu']:14} {t['estimate_tokens_per_s']:10,.0f} "
              f"{t['published_tokens_per_s']:10,.0f} {t['error']:+7.1%}  "
              f"{'yes' if t['asserted'] else 'no'}")
    _print_summary(r["time_summary"])


if __name__ == "__main__":
    main()
