#!/usr/bin/env python3
"""Print the statistics of the published spot traces that orch's numbers are matched to.

The traces are Wu et al.'s ("Can't Be Late", NSDI '24): github.com/skypilot-org/spot-traces.
Each JSON file is `{"metadata": {"gap_seconds": N}, "data": [...]}`, one sample per N seconds,
a sample > 0 meaning spot could be had (the repository's README: "the number of available
instances at a specific tick"). This prints, per file and for the groups orch uses (the
simulated cloud's regimes in providers/sim/spot_regimes.yaml and the preemption prior in
orchestrator/core/data/preemption_prior.yaml), what `providers.spottrace.summarize` measures,
and the same of traces generated from each regime, side by side.

    git clone https://github.com/skypilot-org/spot-traces /tmp/spot-traces
    .venv/bin/python scripts/spot_trace_stats.py /tmp/spot-traces
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from providers import spottrace  # noqa: E402
from providers.sim import spotmarket  # noqa: E402

V100_2MO = "availability/1-node/aws-02-15-2023"
GROUPS = {
    "prior: 9 zones, V100, 45 days": [f"{V100_2MO}/{z}_v100_1.json" for z in (
        "us-east-1a", "us-east-1c", "us-east-1d", "us-east-1f", "us-east-2a", "us-east-2b",
        "us-west-2a", "us-west-2b", "us-west-2c")],
}
HEAD = ("hours avail rate/h life_mean life_med wait_mean wait_med win_p25 win_p50 win_p75")


def load(path: Path) -> spottrace.SpotTrace:
    data = json.loads(path.read_text())
    return spottrace.from_samples(data["data"], float(data["metadata"]["gap_seconds"]))


def row(name: str, s: spottrace.TraceStats) -> str:
    return (f"{name:48s} {s.hours:7.0f} {s.availability:5.3f} {s.preemptions_per_hour:6.3f} "
            f"{s.lifetime_mean_h:9.2f} {s.lifetime_median_h:8.2f} {s.wait_mean_h:9.2f} "
            f"{s.wait_median_h:8.2f} {s.window_p25:7.2f} {s.window_p50:7.2f} {s.window_p75:7.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a clone of skypilot-org/spot-traces")
    parser.add_argument("--generated-hours", type=float, default=5000.0)
    args = parser.parse_args()
    root: Path = args.checkout
    print(f"{'':48s} {HEAD}")
    for path in sorted(root.glob("*/1-node/*/*.json")):
        print(row(str(path.relative_to(root)), spottrace.summarize([load(path)])))
    groups = dict(GROUPS)
    for name, regime in spotmarket.regimes().items():
        groups[f"{name}: {regime.modelled_on}"] = list(regime.files)
    for name, files in groups.items():
        print(row(name[:48], spottrace.summarize([load(root / f) for f in files])))
    for name, regime in spotmarket.regimes().items():
        traces = [spottrace.generate(regime.regime, seed, args.generated_hours)
                  for seed in range(3)]
        print(row(f"generated {name} (3 seeds)", spottrace.summarize(traces)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
