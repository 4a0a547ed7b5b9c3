"""Where a machine's server paths live: asked of the provider, never probed on the host.

Simulated machines (`sim`, the emulators' hosts) keep the server's filesystem under a
directory and their provider says where (`providers.base.HostPathMapping`); real providers
have no such capability and their paths are used as they are. The engine used to probe every
host for a simulator variable (`SIMHOST_ROOT`), i.e. ran test code on users' servers.
"""

from __future__ import annotations

from pathlib import Path

from test_engine import Rig, rig  # noqa: F401 - the fixture

from providers.base import HostPathMapping, Instance, InstanceState, host_root
from providers.dedicated.compute import Dedicated
from providers.runpod.compute import RunPod
from providers.vastai.compute import VastAI


def _instance(provider: str, instance_id: str) -> Instance:
    return Instance(provider=provider, instance_id=instance_id, state=InstanceState.RUNNING,
                    label="orch-j1", ssh_host="127.0.0.1", ssh_port=22)


def test_real_providers_map_no_paths(rig: Rig) -> None:  # noqa: F811
    for provider in (VastAI("k", base_url="http://127.0.0.1:9/api/v0"),
                     RunPod("k", base_url="http://127.0.0.1:9/v2"), Dedicated(rig.store)):
        assert not isinstance(provider, HostPathMapping), provider
        assert host_root(provider, _instance(provider.name, "1")) == ""


def test_engine_asks_sim_for_the_root_and_runs_no_probe(rig: Rig) -> None:  # noqa: F811
    cloud = rig.cloud(keep_disks=True)
    assert isinstance(cloud, HostPathMapping)
    job_id = rig.queue(rig.job_file())
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    (row,) = rig.store.instances_of(job_id)
    host_dir = rig.tmp / "sim" / "terminated" / str(row.provider_instance_id)
    log = (host_dir / "state" / "ssh_commands.log").read_bytes().decode()
    assert log, "the job ran commands on the host"
    assert "SIMHOST" not in log  # no simulator variable is read on the host
    # The job's files went under the host's root, where sim says its server's `/` is.
    assert any(Path(host_dir, "root").rglob("*.safetensors"))
