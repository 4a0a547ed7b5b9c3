"""Sizing accuracy: orch's estimate beside each published point of data/calibration.yaml.

Prints estimate vs measured per point, the error, and the mean and worst absolute error over
the asserted points (and over all). Asserts nothing. Usage: python bench/sizing_accuracy.py
"""

from __future__ import annotations

from orchestrator.core.calibration import points


def main() -> None:
    pts = points()
    print(f"{'point':52} {'kind':11} {'compare':7} {'orch GiB':>9} {'published':>10} "
          f"{'error':>7}  asserted")
    for p in pts:
        print(f"{p.name:52} {p.kind:11} {p.compare:7} {p.estimate_gib():9.2f} "
              f"{p.measured_gib:10.2f} {p.error:+7.1%}  {'yes' if p.asserted else 'no'}")
    for label, group in (("asserted", [p for p in pts if p.asserted]), ("all", pts)):
        errors = [abs(p.error) for p in group]
        print(f"{label:9} points {len(group)}: mean |error| {sum(errors) / len(errors):.1%}, "
              f"worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
