"""`orch servers add|list|check|trust|remove`: the monthly servers you rent.

`add` proves the server before the first job (orchestrator/cli/serverprobe.py): it connects with
orch's key, shows and pins the host key, reports GPUs, driver/CUDA, Docker/toolkit and free
NVMe, and refuses a server it cannot reach or use (exit 3, nothing recorded). `check`
re-runs the probe with the pinned key and clears (or sets) a failed GPU check; `trust`
re-pins a host key that changed, after the user confirmed the new fingerprint.
"""


import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.common import (
    EXIT_INVALID,
    EXIT_NO_FIT,
    EXIT_NOT_FOUND,
    JsonFlag,
    fail,
    money,
    open_db,
    print_json,
)
from orchestrator.cli.tables import table
from orchestrator.core.utc import iso_z
from orchestrator.records.store import StoreError, from_micros
from playbooks import ssh
from providers import catalog

if TYPE_CHECKING:
    from orchestrator.cli.serverprobe import ServerFacts
    from orchestrator.core.servercheck import ServerVerdict
    from orchestrator.records.store import Server, Store

EXIT_UNUSABLE = EXIT_NO_FIT  # README: 3 = nothing can run the job here (server unusable)
# The model `orch servers check` asks the Hub for (the quickstart's: public, no token needed).
DEFAULT_CHECK_MODEL = "Qwen/Qwen2.5-0.5B"
# No server rents for a billion dollars a month; beyond this a typo is likelier.
MAX_MONTHLY = Decimal(10) ** 9

servers_app = typer.Typer(help="The monthly dedicated servers you rent.", no_args_is_help=True)
NameArg = Annotated[str, typer.Argument(help="The server's name.")]


def register(app: typer.Typer) -> None:
    """Add the `servers` command group to `app`."""
    app.add_typer(servers_app, name="servers")


# --- add -------------------------------------------------------------------------------------


@servers_app.command("add")
def servers_add(
    name: Annotated[str, typer.Argument(help="A short name for the server.")],
    host: Annotated[str, typer.Option(help="IP address or DNS name for SSH.")],
    gpu: Annotated[str, typer.Option(help="GPU model, e.g. H100 SXM, H200, B200.")],
    monthly: Annotated[str, typer.Option(help="Monthly rent in USD, e.g. 2190.")],
    port: Annotated[int, typer.Option(help="SSH port.")] = 22,
    user: Annotated[str, typer.Option(help="SSH login.")] = "root",
    gpus: Annotated[int, typer.Option(help="Number of GPUs.")] = 1,
    json_out: JsonFlag = False,
) -> None:
    """Check a monthly server you rent over SSH and register it (idle time costs jobs nothing)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        fail(f"NAME {name!r}: use 1-64 letters, digits, '.', '_' or '-'", EXIT_INVALID)
    matches = catalog.resolve_gpu(gpu)
    if len(matches) > 1:
        # A server has one exact model; quoted, as a shell needs a name with a space.
        which = " or ".join(f'--gpu "{m}"' for m in matches)
        fail(f"--gpu {gpu!r} is ambiguous ({len(matches)} models); say which: {which}",
             EXIT_INVALID)
    if not matches:
        known = ", ".join(f'"{g}"' if " " in g else g for g in catalog.gpus())
        fail(f"--gpu {gpu!r} is not a known GPU; use one of: {known}", EXIT_INVALID)
    if not 1 <= gpus <= 8:
        fail(f"--gpus must be 1..8 (got {gpus})", EXIT_INVALID)
    if not 1 <= port <= 65535:
        fail(f"--port must be 1..65535 (got {port})", EXIT_INVALID)
    if not host or any(c.isspace() for c in host) or host.startswith("-"):
        fail(f"--host {host!r}: give an IP address or DNS name", EXIT_INVALID)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9._-]{0,31}", user):
        fail(f"--user {user!r}: give a login name, e.g. root or ubuntu", EXIT_INVALID)
    try:
        price = Decimal(monthly.replace(",", "").lstrip("$"))
    except ArithmeticError:
        fail(f"--monthly {monthly!r}: give the monthly rent in USD, e.g. 2190", EXIT_INVALID)
    if not price.is_finite() or price <= 0 or price >= MAX_MONTHLY:
        fail(f"--monthly must be > 0 and < {MAX_MONTHLY:,} (got {monthly})", EXIT_INVALID)
    if price != price.quantize(Decimal("0.000001")):
        fail(f"--monthly {monthly}: at most 6 decimal places", EXIT_INVALID)
    store = open_db()
    if any(s.name == name for s in store.list_servers()):
        fail(f"server {name!r} already exists; check it with `orch servers check {name}` or "
             f"remove it first with `orch servers remove {name}`", EXIT_INVALID)
    facts = _probe_or_exit(host, port, user, matches[0], gpus, pinned=None, name=name)
    if facts.gpu_error:
        _report(facts, json_out, None)
        fail(f"{name} failed its GPU check: {facts.gpu_error}\nNothing was recorded; fix it "
             "(or give the right --gpu/--gpus) and run `orch servers add` again.",
             EXIT_UNUSABLE)
    try:
        s = store.add_server(name=name, host=host, port=port, user=user, gpu=matches[0],
                             gpu_count=gpus, monthly_price=price)
    except StoreError as exc:
        fail(str(exc), EXIT_INVALID)
    store.set_server_host_key(name, facts.host_key)
    store.record_server_check(name, error=None, facts_json=json.dumps(facts.to_dict()))
    if json_out:
        print_json({**_server_dict(_get(name)), "check": facts.to_dict()})
        return
    _report(facts, False, None)
    typer.echo(f"added {s.name}: {s.gpu} x{s.gpu_count} at {s.user}@{s.host}:{s.port}, "
               f"{money(price)}/month; host key {facts.fingerprint} pinned")


# --- check and trust -------------------------------------------------------------------------


@servers_app.command("check")
def servers_check(
    name: NameArg,
    model: Annotated[str, typer.Option(
        help="The model the host check's Hub download asks for (a job's check asks for its "
             "own base model).")] = DEFAULT_CHECK_MODEL,
    json_out: JsonFlag = False,
) -> None:
    """Check a registered server again (pinned host key): its GPUs, then the host check a
    job runs there (driver, disk, Hub, GPU speed); a passing GPU check clears a failure."""
    s = _get(name)
    facts = _probe_or_exit(s.host, s.port, s.user, s.gpu, s.gpu_count, pinned=s.host_key,
                           name=name)
    store = open_db()
    if s.host_key is None:
        store.set_server_host_key(name, facts.host_key)
    store.record_server_check(name, error=facts.gpu_error,
                              facts_json=json.dumps(facts.to_dict()))
    if facts.gpu_error:
        _report(facts, json_out, {**_server_dict(_get(name), store), "check": facts.to_dict()})
        fail(f"{name} failed its GPU check: {facts.gpu_error}\nJobs will not use it until "
             f"`orch servers check {name}` passes.", EXIT_UNUSABLE)
    verdict = _host_check(store, _get(name), model)
    _report(facts, json_out, {**_server_dict(_get(name), store), "check": facts.to_dict()})
    if verdict.blocking:
        fail(verdict.failure_message(in_job=False), EXIT_UNUSABLE)
    if not json_out:
        for line in _check_lines(name, host_check(store, name)):
            typer.echo(line, nl=False)
        typer.echo(f"{name}: ok; jobs may use it"
                   + (" (slower than planned: above)" if verdict.slow else ""))


def _host_check(store: "Store", s: "Server", model: str) -> "ServerVerdict":
    """Run the engine's host check on `s` and remember it as a job's check would be."""
    import os

    from orchestrator.cli.serverprobe import ProbeError
    from orchestrator.cli.serverprobe import host_check as run_check
    from orchestrator.core import servercheck
    from orchestrator.core.hostmemory import Source
    from orchestrator.engine.runner import ensure_key
    from providers.dedicated.compute import NAME

    key_path, _ = ensure_key()
    assert s.host_key is not None  # pinned by the probe just before
    typer.echo(f"host check of {s.name} (driver, disk, Hub download of {model}, GPU "
               "speed) ...", err=True)
    try:
        report = run_check(s.host, s.port, s.user, key_path, s.host_key, gpu=s.gpu,
                           gpu_count=s.gpu_count, repo=model,
                           hf_token=os.environ.get("HF_TOKEN") or None)
    except ProbeError as exc:
        fail(f"{s.name}: the host check could not run: {exc}", EXIT_UNUSABLE)
    why = "; ".join(f"{c.value}: {r}" for c, r in report.failures.items()) or "passed"
    store.record_host_observation(NAME, s.name, Source.CHECK, failed=not report.passed,
                                  delivered=report.delivered_fraction, why=why,
                                  report_json=report.model_dump_json())
    return servercheck.judge(s.name, report, _docker_image())


def _docker_image() -> str:
    """The trainer image a server's jobs run in (what a matmul fix names)."""
    from playbooks import images, train

    return images.for_host(train.DEFAULT_IMAGE, "docker")


@servers_app.command("trust")
def servers_trust(
    name: NameArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Pin the new key without asking.")]
    = False,
) -> None:
    """Re-pin a server's changed SSH host key, after you confirmed the new fingerprint."""
    s = _get(name)
    try:
        key = ssh.trust_on_first_use(s.host, s.port, timeout=15, deadline=15)
    except ssh.SSHError as exc:
        fail(f"cannot reach {s.host}:{s.port} to read its host key: {exc}", EXIT_UNUSABLE)
    new = ssh.format_host_key(key)
    old = s.host_key
    old_fp = ssh.fingerprint(ssh.parse_host_key(old)) if old else "(none pinned)"
    if old == new:
        typer.echo(f"{name}: the host key is unchanged ({old_fp}); nothing to do")
        return
    typer.echo(f"{name} ({s.host}:{s.port}) presents a different host key:\n"
               f"  pinned:  {old_fp}\n  now:     {ssh.fingerprint(key)}\n"
               "Compare the new fingerprint with the server's own (on its console: "
               "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`). A key that changed "
               "without a reinstall means someone may be intercepting the connection.")
    if not yes and not typer.confirm("Pin the new key?", default=False):
        fail("host key not changed", 1)
    open_db().repin_server_host_key(name, new)
    typer.echo(f"{name}: host key {ssh.fingerprint(key)} pinned")


# --- list and remove -------------------------------------------------------------------------


def _server_dict(s: "Server", store: "Store | None" = None) -> dict[str, Any]:
    return {"name": s.name, "host": s.host, "port": s.port, "user": s.user, "gpu": s.gpu,
            "gpu_count": s.gpu_count, "monthly_price": str(from_micros(s.monthly_price_micros)),
            "status": "failed" if s.check_error else s.status, "check_error": s.check_error,
            "host_key": s.host_key,
            "checked_at": iso_z(s.checked_at)
            if s.checked_at else None,
            "host_check": host_check(store or open_db(), s.name)}


def host_check(store: "Store", name: str) -> dict[str, Any] | None:
    """The last host check the engine ran on server `name` (None: never): when, for which
    job, its outcome (passed, slow, failed), what it found, and why the next is due."""
    from orchestrator.core import servercheck
    from orchestrator.records.store import utcnow
    from orchestrator.records.store.hosts import observation
    from playbooks.hostreport import HostReport
    from providers.dedicated.compute import NAME

    rows = store.host_observations(NAME, [name])
    checks = [r for r in rows if r.source == "check"]
    if not checks:
        return None
    last = checks[-1]
    report = HostReport.model_validate_json(last.report_json) if last.report_json else None
    verdict = servercheck.judge(name, report, _docker_image()) if report is not None else None
    outcome = verdict.outcome if verdict is not None else ("failed" if last.failed
                                                           else "passed")
    return {"at": iso_z(last.at), "job_id": last.job_id, "outcome": outcome,
            "seconds": report.seconds if report is not None else None,
            "findings": [f.to_dict() for f in verdict.findings] if verdict else [],
            "why": last.why,
            "next_due": servercheck.due([observation(r) for r in rows], utcnow())}


@servers_app.command("list")
def servers_list(json_out: JsonFlag = False) -> None:
    """List registered servers (a failed GPU check shows why)."""
    store = open_db()
    rows = [_server_dict(s, store) for s in store.list_servers()]
    if json_out:
        print_json(rows)
        return
    if not rows:
        typer.echo("no servers registered; add one with `orch servers add NAME --host H "
                   "--gpu 'H100 SXM' --monthly 2190`")
        return
    typer.echo(table(
        ["name", "GPU", "n", "ssh", "monthly", "status", "host check"],
        [[r["name"], r["gpu"], r["gpu_count"], f"{r['user']}@{r['host']}:{r['port']}",
          money(r["monthly_price"]), r["status"], _checked_cell(r["host_check"])]
         for r in rows],
        right=[2, 4], drop=[4, 2, 3], states=[5]))
    for r in rows:
        if r["check_error"]:
            typer.echo(f"\n{r['name']} is not used by jobs: {r['check_error']}\n"
                       f"  fix it, then `orch servers check {r['name']}`")
        typer.echo("".join(_check_lines(r["name"], r["host_check"])), nl=False)


def _checked_cell(check: dict[str, Any] | None) -> str:
    if check is None:
        return "never"
    return f"{check['outcome']} {check['at'][:16].replace('T', ' ')}"


def _check_lines(name: str, check: dict[str, Any] | None) -> list[str]:
    """What the last host check of `name` found, and its fix (nothing when it passed)."""
    if check is None or not check["findings"]:
        return []
    verb = {"failed": "failed (jobs there fail until it is fixed)",
            "slow": "found it slow (jobs run there, slower than planned)"}[check["outcome"]]
    job = f", job {check['job_id']}" if check["job_id"] else ""
    lines = [f"\n{name}: its last host check ({check['at']}{job}) {verb}:\n"]
    lines += [f"  {f['check']} ({f['severity']}): {f['reason']}\n    fix: {f['fix']}\n"
              for f in check["findings"]]
    return lines


@servers_app.command("remove")
def servers_remove(name: NameArg) -> None:
    """Forget a registered server (nothing on the server is touched)."""
    from orchestrator.records.store import NotFoundError, StoreError

    try:
        open_db().remove_server(name)
    except NotFoundError as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    except StoreError as exc:
        fail(str(exc), EXIT_INVALID)
    typer.echo(f"removed {name}")


# --- helpers ---------------------------------------------------------------------------------


def scrubber() -> Callable[["Server"], list[str]]:
    """For `orch reconcile`: remove the secret files a crashed job left on a kept server."""

    def scrub(server: "Server") -> list[str]:
        from orchestrator.cli.serverprobe import scrub_secrets
        from orchestrator.engine.runner import ensure_key

        key_path, _ = ensure_key()
        assert server.host_key is not None  # reconcile scrubs only servers it pinned
        return scrub_secrets(server.host, server.port, server.user, key_path, server.host_key)

    return scrub


def _get(name: str) -> "Server":
    for s in open_db().list_servers():
        if s.name == name:
            return s
    fail(f"server {name!r} not found; see `orch servers list`", EXIT_NOT_FOUND)


def _probe_or_exit(host: str, port: int, user: str, gpu: str, gpu_count: int, *,
                   pinned: str | None, name: str) -> "ServerFacts":
    from orchestrator.cli.serverprobe import ProbeError, probe
    from orchestrator.engine.runner import ensure_key

    try:
        key_path, public = ensure_key()
    except Exception as exc:  # OSError, CalledProcessError: say it, no traceback
        fail(f"cannot create orch's SSH key: {exc}", 1)
    if pinned is None:
        typer.echo(f"connecting to {user}@{host}:{port} with orch's key {key_path} ...",
                   err=True)
    try:
        return probe(host, port, user, key_path, gpu=gpu, gpu_count=gpu_count, pinned=pinned)
    except ProbeError as exc:
        if exc.kind == "auth":
            pub = key_path.with_name(key_path.name + ".pub")
            fail(f"{exc}. Authorise orch's public key on the server: append the line of "
                 f"{pub} to ~{user}/.ssh/authorized_keys there, e.g.\n"
                 f"  echo '{public}' >> ~{user}/.ssh/authorized_keys\n"
                 f"then run the command again. Nothing was recorded.", EXIT_UNUSABLE)
        if exc.kind == "hostkey":
            fail(f"{exc}\nIf you reinstalled the server, confirm the new key with "
                 f"`orch servers trust {name}`.", EXIT_UNUSABLE)
        fail(f"{exc}. Check the address, port and firewall; nothing was recorded.",
             EXIT_UNUSABLE)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**3:,.0f} GiB"


def _report(facts: "ServerFacts", json_out: bool, payload: dict[str, Any] | None) -> None:
    if json_out:
        if payload is not None:
            print_json(payload)
        return
    gpus = ", ".join(f"{g['name']} ({g['memory_mib']} MiB)" for g in facts.gpus) or "none"
    lines = [f"host key   {facts.fingerprint} ({facts.host_key.split()[0]})",
             f"GPUs       {len(facts.gpus)}x: {gpus}",
             f"driver     {facts.driver or '-'}  CUDA {facts.cuda or '-'}",
             f"docker     {facts.docker or 'not installed'}",
             f"toolkit    {facts.toolkit or 'not installed'}",
             f"model disk {facts.cache_mount or '-'}"
             f"{' (NVMe)' if facts.cache_nvme else ''}, {_gib(facts.cache_free_bytes)} free"]
    lines += [f"note       {n}" for n in facts.notes]
    if facts.gpu_error:
        lines.append(f"GPU check  FAILED: {facts.gpu_error}")
    typer.echo("\n".join(lines))
