"""`orch submit --resume-from JOB`: a job its budget stopped is continued by a new job from
the checkpoint it kept, on the simulated cloud through the real CLI, instead of training from
step 0 again (engine/resumefrom.py). The first job is test_budget_cap's: 200 steps of 0.2 s
on an H100 PCIe on-demand, stopped by max_cost $0.006 after its first mirrored checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from test_budget_cap import budget_job
from test_engine import Rig, assert_nothing_left, rig

from orchestrator.core.hostmemory import MoveCase, move_or_stay, policy
from orchestrator.core.planning import make_plan
from orchestrator.core.spec import load_job
from orchestrator.core.specidentity import training_differences
from orchestrator.engine.jobinputs import artifacts_dir, checkpoint_dir, resolved_layout
from orchestrator.engine.resumefrom import ResumePoint
from orchestrator.engine.slowhost import planned_seconds
from orchestrator.records.store import Job
from providers.sim.compute import SimCloud

__all__ = ["rig"]

ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"


def orch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ORCH, *args], capture_output=True, text=True, timeout=120,
                          check=False)


def progress_steps(rig: Rig, job_id: str) -> list[int]:
    return [e.data().step or 0 for e in rig.store.events(job_id) if e.kind == "train.progress"]


def stopped_by_budget(rig: Rig) -> tuple[SimCloud, str, int, Path, Path]:
    """test_budget_cap's job, stopped by its budget: (cloud, job id, the step its kept
    checkpoint holds, that checkpoint, the same job file with max_cost 1)."""
    cloud = rig.cloud(gpus=["H100 PCIe"],
                      host_options={"train_steps": 200, "train_step_seconds": 0.2})
    first = budget_job(rig, "0.006")
    stopped = rig.run(cloud, first)
    assert stopped.status == "failed"
    found = re.search(r"its newest checkpoint \(step (\d+) of 200\) is kept in (\S+) ",
                      stopped.failure_reason or "")
    assert found, stopped.failure_reason
    path = Path(stopped.placement().job_file or "")
    more = path.with_name("more.yml")
    more.write_text(path.read_text().replace("max_cost: 0.006", "max_cost: 1"))
    return cloud, first, int(found[1]), Path(found[2]), more


def test_a_job_its_budget_stopped_is_continued_from_its_checkpoint(rig: Rig) -> None:
    cloud, first, step, kept, more = stopped_by_budget(rig)
    # The same training with a higher budget, continued: planned for what is left.
    out = orch("submit", str(more), "--detach", "--json", "--resume-from", first)
    assert out.returncode == 0, out.stderr
    sent = json.loads(out.stdout)
    # Held to what the checkpoint was written with: one H100 PCIe, single, AdamW.
    pins = {"resources": {"gpu_count": 1, "layout": "single"},
            "training": {"optimizer": "adamw"}}
    assert sent["resume_from"] == {"job": first, "dir": str(kept.parent), "step": step,
                                   "max_steps": 200, "pins": pins}
    recorded = json.loads(rig.store.get_job(sent["job_id"]).spec_json or "{}")
    assert (recorded["resources"]["gpu_count"], recorded["resources"]["layout"],
            recorded["training"]["optimizer"]) == (1, "single", "adamw")
    left = sent["tokens"]["left"]
    assert left == round(sent["tokens"]["total"] * (1 - step / 200))
    fresh = json.loads(orch("submit", str(more), "--dry-run", "--json").stdout)
    assert fresh["tokens"]["left"] == fresh["tokens"]["total"] > left
    assert sent["placement"]["offer_id"] == fresh["placement"]["offer_id"]
    hours = sent["placement"]["est_training_hours"]
    assert hours == pytest.approx(fresh["placement"]["est_training_hours"] * (1 - step / 200),
                                  rel=0.01)
    # (Its cost is the same to the micro-dollar: a few seconds of training on this tiny set.)
    second = sent["job_id"]
    (queued,) = [e for e in rig.store.events(second) if e.kind == "queued"]
    assert f"resumes from {first}'s checkpoint at step {step} of 200" in queued.message

    done = rig.run(cloud, second)
    assert done.status == "succeeded", done.failure_reason
    (restored,) = [e for e in rig.store.events(second) if e.kind == "checkpoint.restored"]
    assert restored.data().step == step and str(kept.parent) in restored.message
    (resumed,) = [e for e in rig.store.events(second) if e.kind == "resume"]
    assert resumed.message.startswith(f"resuming from step {step} ")
    steps = progress_steps(rig, second)
    assert min(steps) >= step and max(steps) == 200, steps  # not from step 0 again
    assert kept.is_dir(), "the first job's checkpoint is left as it was"
    assert_nothing_left(rig, cloud, second)

    # It trained to the end: nothing is left to resume.
    again = orch("submit", str(more), "--dry-run", "--resume-from", second)
    assert again.returncode == 1
    assert f"{second} finished training: its model is in" in again.stderr


def test_resume_from_is_refused_before_anything_is_recorded(rig: Rig) -> None:
    """Unknown job, one still queued, one that kept nothing, another training: each refused
    naming the file, the flag and the fix; no job row is added."""
    path = rig.job_file()
    queued = rig.queue(path)
    jobs = len(rig.store.list_jobs())

    out = orch("submit", str(path), "--dry-run", "--resume-from", "j-nosuch")
    assert out.returncode == 1
    assert out.stderr.startswith(f"error: {path}: --resume-from j-nosuch: no job 'j-nosuch'")

    out = orch("submit", str(path), "--dry-run", "--resume-from", queued)
    assert f"{queued} is queued: resume from it once it has ended" in out.stderr
    assert "cancelling it deletes them" in out.stderr  # no advice that loses the checkpoint

    assert orch("cancel", queued).returncode == 0  # ended, never having run
    out = orch("submit", str(path), "--dry-run", "--resume-from", queued)
    assert out.returncode == 1
    assert (f"{queued} kept no checkpoint on this machine (a cancelled job's checkpoints are "
            "deleted)") in out.stderr, out.stderr

    other = path.with_name("other.yml")
    other.write_text(path.read_text().replace("learning_rate: 2.0e-4", "learning_rate: 1.0e-4")
                     .replace("sequence_len: 1024", "sequence_len: 512"))
    out = orch("submit", str(other), "--dry-run", "--resume-from", queued)
    assert out.returncode == 1
    assert ("training.sequence_len: 1024 -> 512; training.learning_rate: 0.0002 -> 0.0001. "
            "Set these back (only name, eval, " in out.stderr), out.stderr
    assert len(rig.store.list_jobs()) == jobs


@pytest.mark.parametrize(("edit", "differs"), [
    (("max_cost: 0.5", "max_cost: 3"), []),
    (("spot: allowed", "spot: never"), []),
    (("name: quickstart-qwen25-05b", "name: longer"), []),
    (("epochs: 1", "epochs: 1\n  gradient_checkpointing: true"), []),
    (("  spot: allowed", "  spot: allowed\n  headroom: 0.3"), []),
    (("epochs: 1", "epochs: 2"), ["training.epochs: 1.0 -> 2.0"]),
    (("r: 16", "r: 8"), ["lora.r: 16 -> 8"]),
    (("  providers: [sim]", "  providers: [sim]\n  gpu_count: 2"),
     ["resources.gpu_count: null -> 2"]),
])
def test_what_may_change_between_a_job_and_the_one_resuming_it(
        tmp_path: Path, edit: tuple[str, str], differs: list[str]) -> None:
    examples = Path(__file__).resolve().parent.parent / "examples"
    shutil.copytree(examples / "data", tmp_path / "data")
    text = (examples / "quickstart.yml").read_text().replace(
        "  providers: [sim]", "  providers: [sim]\n  max_cost: 0.5")
    (tmp_path / "a.yml").write_text(text)
    (tmp_path / "b.yml").write_text(text.replace(*edit))
    a, b = load_job(tmp_path / "a.yml"), load_job(tmp_path / "b.yml")
    assert training_differences(a.spec, b.spec) == differs


def test_a_kept_checkpoint_gone_before_the_run_fails_it_before_renting(rig: Rig) -> None:
    cloud, first, _, _, more = stopped_by_budget(rig)
    out = orch("submit", str(more), "--detach", "--json", "--resume-from", first)
    assert out.returncode == 0, out.stderr
    second = json.loads(out.stdout)["job_id"]
    shutil.rmtree(artifacts_dir(first))
    job = rig.run(cloud, second)
    assert job.status == "failed"
    assert "which is gone: submit the job file again without --resume-from" in (
        job.failure_reason or ""), job.failure_reason
    assert rig.store.instances_of(second) == []  # nothing was rented


def test_a_kept_checkpoint_that_cannot_be_resumed_is_refused(rig: Rig) -> None:
    """Checked as the trainer checks one (train.prepare_resume): at submit, then on the
    machine. Either way nothing trains from step 0 on a budget sized for the rest."""
    cloud, first, step, kept, more = stopped_by_budget(rig)
    state = (kept / "optimizer.pt").read_bytes()
    (kept / "optimizer.pt").write_bytes(b"")  # a copy cut short: as the host check reads it
    out = orch("submit", str(more), "--dry-run", "--resume-from", first)
    assert out.returncode == 1
    assert (f"{first}'s checkpoint {kept} cannot be resumed from: optimizer state missing; "
            "submit without --resume-from") in out.stderr, out.stderr
    (kept / "optimizer.pt").write_bytes(state)

    out = orch("submit", str(more), "--detach", "--json", "--resume-from", first)
    assert out.returncode == 0, out.stderr
    second = json.loads(out.stdout)["job_id"]
    # Cut after the check (a partial copy): the machine's trainer would start from step 0.
    (kept / "trainer_state.json").write_text("{")
    job = rig.run(cloud, second)
    assert job.status == "failed"
    assert (f"it was to resume from {first}'s checkpoint at step {step}, but the machine's "
            "newest resumable checkpoint is at step 0 (moved aside: ") in (
        job.failure_reason or ""), job.failure_reason
    assert progress_steps(rig, second) == [], "it trained"
    assert_nothing_left(rig, cloud, second)


def test_the_data_changed_since_is_refused(rig: Rig) -> None:
    cloud, first, _, _, more = stopped_by_budget(rig)
    data = more.parent / "data" / "train.jsonl"
    data.write_text(data.read_text() * 2)
    out = orch("submit", str(more), "--dry-run", "--resume-from", first)
    assert out.returncode == 1
    assert f"{first} trained on " in out.stderr and "the data changed" in out.stderr, out.stderr


def test_the_pins_hold_the_plan_to_the_checkpoints_optimizer(tmp_path: Path) -> None:
    """Qwen2.5-7B LoRA at 4096 x 4: on one RTX 3090 auto resolves 8-bit AdamW, on an A100
    AdamW. A checkpoint written on the 3090 holds 8-bit AdamW's state (not AdamW's): the job
    resuming it on `spot: never` (an A100) keeps 8-bit AdamW, in its plan and as the engine
    renders it there (`resolved_layout` over the recorded spec)."""
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "data",
                    tmp_path / "data")
    text = ("name: pin\nbase_model: Qwen/Qwen2.5-7B\nmethod: lora\ntraining: {sequence_len: "
            "4096, micro_batch_size: 4, learning_rate: 1.0e-4}\ndataset: {path: "
            "data/train.jsonl, format: alpaca, tokens: 20000000}\nresources:\n  spot: "
            "allowed\n  providers: [cloud]\n")
    (tmp_path / "a.yml").write_text(text)
    (tmp_path / "b.yml").write_text(text.replace("spot: allowed", "spot: never"))
    a, b = load_job(tmp_path / "a.yml"), load_job(tmp_path / "b.yml")
    strategy, w = resolved_layout(a, "RTX 3090", 1)
    assert (strategy, str(w.optimizer)) == ("single", "adamw_8bit")
    unpinned = make_plan(b).chosen
    assert unpinned.offer.gpu == "A100 80GB"
    assert str(unpinned.estimate.workload.optimizer) == "adamw"

    point = ResumePoint("j-a", tmp_path, 50, 100, {
        "resources": {"gpu_count": 1, "layout": strategy},
        "training": {"optimizer": str(w.optimizer)}})
    held = point.apply(b)
    chosen = make_plan(held).chosen
    assert (chosen.offer.gpu, chosen.offer.gpu_count) == ("A100 80GB", 1)
    assert str(chosen.estimate.workload.optimizer) == "adamw_8bit"
    assert resolved_layout(held, "A100 80GB", 1)[1].optimizer == "adamw_8bit"
    assert held.done == 0.5 and b.done == 0.0


@pytest.mark.parametrize(("done", "moves"), [(0.5, False), (0.0, True)])
def test_a_resumed_job_is_measured_against_its_whole_run(done: float, moves: bool) -> None:
    """The trainer counts the whole run's steps (10,000), the plan of a job resumed at half
    way its half (5,000 s at 1 step/s). A machine at exactly that speed stays: its plan's
    rate is the whole run over the whole run's seconds (`planned_seconds(.., done)`). Read
    without `done`, as before, it looks half as fast as planned and is moved."""
    planned = planned_seconds(5000 / 3600, done)
    assert planned is not None
    case = MoveCase(remaining=5000.0, measured_rate=1.0, planned_rate=10_000 / planned,
                    price_here=Decimal("2"), price_elsewhere=Decimal("2"),
                    setup_elsewhere_s=300.0, redo=0.0, observed_s=600.0)
    assert move_or_stay(case, policy()).move is moves


def test_the_pins_are_the_machine_that_wrote_the_checkpoint_not_the_last_placement(
        rig: Rig) -> None:
    """A job placed again after a preemption can be stopped by its budget before the new
    machine trains: its kept checkpoint is the earlier machine's. The pins come from the
    `checkpoint.mirrored` record of that step, not from the job's last placement (here set
    to two A100s, as `Ledger.placing` records an offer tried)."""
    _, first, step, _, more = stopped_by_budget(rig)
    (mirrored,) = [e.data() for e in rig.store.events(first)
                   if e.kind == "checkpoint.mirrored" and e.data().step == step]
    written = {"resources": {"gpu_count": 1, "layout": "single"},
               "training": {"optimizer": "adamw"}}
    assert mirrored.pins == written
    with rig.store.transaction() as session:
        job = session.get(Job, first)
        assert job is not None
        job.gpu, job.gpu_count = "A100 80GB", 2
    out = orch("submit", str(more), "--dry-run", "--json", "--resume-from", first)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["resume_from"]["pins"] == written
    # A file that sets a pinned field otherwise is refused; `auto` takes the pin.
    two = more.with_name("two.yml")
    two.write_text(more.read_text().replace("  spot: never\n", "  spot: never\n  gpu_count: 2\n"))
    out = orch("submit", str(two), "--dry-run", "--resume-from", first)
    assert out.returncode == 1
    assert "resources.gpu_count: 1 as trained -> 2 in this file" in out.stderr, out.stderr


def test_a_resumed_job_with_its_own_copy_does_not_need_the_first_ones(rig: Rig) -> None:
    """Taken over after it mirrored a checkpoint of its own (a worker's restart): the first
    job's folder may be gone by then; the job resumes from its own copy."""
    cloud, first, step, kept, more = stopped_by_budget(rig)
    out = orch("submit", str(more), "--detach", "--json", "--resume-from", first)
    assert out.returncode == 0, out.stderr
    second = json.loads(out.stdout)["job_id"]
    shutil.copytree(kept, checkpoint_dir(second) / kept.name)  # as its mirror would hold it
    shutil.rmtree(artifacts_dir(first))
    job = rig.run(cloud, second)
    assert job.status == "succeeded", job.failure_reason
    (restored,) = [e for e in rig.store.events(second) if e.kind == "checkpoint.restored"]
    assert restored.data().step == step and "from the local copy" in restored.message
