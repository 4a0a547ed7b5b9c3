"""System commands: `apt-get`, `dpkg-query`, `nvidia-ctk`, `systemctl`, `service`, `curl`, `gpg`.

The NVIDIA Container Toolkit install follows the real sequence: the four packages are only
found after the NVIDIA apt list (signed-by a dearmored keyring) is in place and `apt-get
update` ran (any other package too: a fresh image's lists are empty); they depend on each
other at equal versions, so pinning one leaves the others at the newest version and apt
refuses, as real apt does.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
import re
import sys
from functools import partial
from pathlib import Path

from . import docker
from .common import Host, SimError, is_within, refresh_bin, require_root, say, write_atomic

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any

TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
_DEPENDS = {
    "nvidia-container-toolkit": ("nvidia-container-toolkit-base", "libnvidia-container-tools"),
    "libnvidia-container-tools": ("libnvidia-container1",),
}
_NVIDIA_REPO = "nvidia.github.io/libnvidia-container/stable/deb"
GPGKEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
LIST_URL = "https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list"
_KEY_PACKET = b"\x99\x01\x0dsimhost NVIDIA CORPORATION OpenPGP key <cudatools@nvidia.com>"
_ARMORED_KEY = (
    "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n"
    + base64.encodebytes(_KEY_PACKET).decode()
    + "=sim0\n-----END PGP PUBLIC KEY BLOCK-----\n"
)
_LIST_TEXT = (
    "deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
    "#deb https://nvidia.github.io/libnvidia-container/experimental/deb/$(ARCH) /\n"
)


# --- apt ---------------------------------------------------------------------------------------


def _nvidia_list_lines(host: Host) -> list[str]:
    sources = host.path("/etc/apt/sources.list.d")
    lines: list[str] = []
    if sources.is_dir():
        for entry in sorted(sources.glob("*.list")):
            for line in entry.read_text().splitlines():
                if line.strip().startswith("deb ") and _NVIDIA_REPO in line:
                    lines.append(line.strip())
    return lines


def _keyring_ok(host: Host, line: str) -> bool:
    match = re.search(r"\[([^\]]*)\]", line)
    options = dict(
        item.split("=", 1) for item in (match.group(1).split() if match else []) if "=" in item
    )
    keyring = options.get("signed-by")
    if not keyring:
        return False
    path = Path(keyring) if is_within(keyring, host.dir) else host.path(keyring)
    try:
        data = path.read_bytes()
    except OSError:
        return False
    # A .gpg keyring must be binary (dearmored); apt ignores an armored file named .gpg.
    return not (path.suffix == ".gpg" and data.startswith(b"-----BEGIN"))


def _apt_update(host: Host) -> int:
    say("Hit:1 http://archive.ubuntu.com/ubuntu noble InRelease")
    lines = _nvidia_list_lines(host)
    nvidia = False
    if lines:
        if all(_keyring_ok(host, line) for line in lines):
            say("Get:2 https://nvidia.github.io/libnvidia-container/stable/deb/amd64  InRelease")
            nvidia = True
        else:
            with host.lock():
                host.write_json("apt_lists.json", {"nvidia": False})
            say(
                "W: GPG error: https://nvidia.github.io/libnvidia-container/stable/deb/amd64  "
                "InRelease: The following signatures couldn't be verified because the public "
                "key is not available: NO_PUBKEY DDCAE044F796ECB0",
                "E: The repository 'https://nvidia.github.io/libnvidia-container/stable/deb/amd64"
                "  InRelease' is not signed.",
                err=True,
            )
            return 100
    with host.lock():
        host.write_json("apt_lists.json", {"nvidia": nvidia})
    say("Reading package lists... Done")
    host.event("apt-update", nvidia=nvidia)
    return 0


def _version_key(version: str) -> list[int]:
    return [int(p) for p in re.findall(r"\d+", version)]


def apt_get(host: Host, argv: list[str]) -> int:
    """`apt-get update`, `apt-get install [-y] PKG[=VER]...`, `apt-get remove|purge PKG...`."""
    args = [a for a in argv if a not in ("-q", "-qq", "--quiet", "--no-install-recommends")]
    yes = False
    allow_downgrades = False
    words: list[str] = []
    while args:
        arg = args.pop(0)
        if arg in ("-y", "--yes", "--assume-yes"):
            yes = True
        elif arg == "--allow-downgrades":
            allow_downgrades = True
        elif arg == "-o":
            args.pop(0)
        elif arg.startswith("-"):
            continue
        else:
            words.append(arg)
    if not words:
        raise SimError("E: Invalid operation", 100)
    verb, names = words[0], words[1:]
    if verb in ("update", "install", "remove", "purge"):
        # What apt prints to a non-root user (it needs the dpkg or lists lock).
        what = ("directory /var/lib/apt/lists/" if verb == "update"
                else "the administration directory (/var/lib/dpkg/)")
        lock = "/var/lib/apt/lists/lock" if verb == "update" else "/var/lib/dpkg/lock-frontend"
        require_root(host, f"E: Could not open lock file {lock} - open (13: Permission "
                     f"denied)\nE: Unable to lock {what}, are you root?", 100)
    if verb == "update":
        return _apt_update(host)
    if verb in ("remove", "purge"):
        with host.lock():
            packages = host.packages()
            for name in names:
                if packages.pop(name, None) is not None:
                    say(f"Removing {name} ...")
            host.write_json("packages.json", packages)
        refresh_bin(host)
        return 0
    if verb != "install":
        raise SimError(f"E: Invalid operation {verb}", 100)
    return _apt_install(host, names, yes=yes, allow_downgrades=allow_downgrades)


def _apt_install(host: Host, names: list[str], *, yes: bool, allow_downgrades: bool) -> int:
    versions: list[str] = list(host.options["toolkit_versions"])
    candidate = max(versions, key=_version_key)
    say("Reading package lists...", "Building dependency tree...", "Reading state information...")
    with host.lock():
        packages = host.packages()
        repo = bool(host.read_json("apt_lists.json", {}).get("nvidia"))
        requested: dict[str, str] = {}
        for item in names:
            name, _, version = item.partition("=")
            if name in TOOLKIT_PACKAGES:
                if not repo:
                    raise SimError(f"E: Unable to locate package {name}", 100)
                if version and version not in versions:
                    raise SimError(f"E: Version '{version}' for '{name}' was not found", 100)
                requested[name] = version or candidate
            elif name not in packages and host.read_json("apt_lists.json", None) is None:
                # A fresh image's package lists are empty until `apt-get update`.
                raise SimError(f"E: Unable to locate package {name}", 100)
            else:
                requested[name] = version or packages.get(name, "sim-1")
        plan = dict(requested)
        extra: list[str] = []
        todo = list(plan)
        while todo:
            name = todo.pop()
            for dep in _DEPENDS.get(name, ()):
                need = plan[name]
                chosen = plan.get(dep) or (
                    packages[dep] if packages.get(dep) == need else candidate
                )
                if chosen != need:
                    raise SimError(
                        "Some packages could not be installed.\n"
                        "The following packages have unmet dependencies:\n"
                        f" {name} : Depends: {dep} (= {need}) but {chosen} is to be installed\n"
                        "E: Unable to correct problems, you have held broken packages.",
                        100,
                    )
                if dep not in plan:
                    plan[dep] = chosen
                    todo.append(dep)
                    if packages.get(dep) != chosen:
                        extra.append(dep)
        changes = {n: v for n, v in plan.items() if packages.get(n) != v}
        downgrades = [
            n
            for n, v in changes.items()
            if n in packages and _version_key(v) < _version_key(packages[n])
        ]
        if downgrades and not allow_downgrades:
            raise SimError(
                "E: Packages were downgraded and -y was used without --allow-downgrades.", 100
            )
        if extra and not yes:
            say("The following additional packages will be installed:", "  " + " ".join(extra))
            say("Do you want to continue? [Y/n] Abort.")
            return 1
        for name, version in plan.items():
            if name not in changes:
                say(f"{name} is already the newest version ({version}).")
        for name, version in changes.items():
            say(f"Setting up {name} ({version}) ...")
            packages[name] = version
        host.write_json("packages.json", packages)
    say(f"0 upgraded, {len(changes)} newly installed, 0 to remove and 0 not upgraded.")
    if changes:
        host.event("apt-install", packages=changes)
        if any(n in TOOLKIT_PACKAGES for n in changes):
            # Package scripts reload systemd; with the systemd cgroup driver this is the trap
            # that breaks running GPU containers (recorded, see README).
            host.event("daemon-reload", reason="apt-install")
    refresh_bin(host)
    return 0


def _field(fields: dict[str, str], match: re.Match[str]) -> str:
    return fields.get(match.group(1), "")


def dpkg_query(host: Host, argv: list[str]) -> int:
    """`dpkg-query -W [-f=FORMAT] PKG...` and `dpkg-query -s PKG`."""
    fmt = "${binary:Package}\t${Version}\n"
    names: list[str] = []
    show_status = False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-W", "--show"):
            continue
        if arg in ("-s", "--status"):
            show_status = True
        elif arg in ("-f", "--showformat"):
            fmt = args.pop(0)
        elif arg.startswith(("-f=", "--showformat=")):
            fmt = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise SimError(f"dpkg-query: unknown option {arg}", 2)
        else:
            names.append(arg)
    packages = host.packages()
    missing = False
    for pattern in names or ["*"]:
        matches = sorted(n for n in packages if fnmatch.fnmatchcase(n, pattern))
        if not matches:
            say(f"dpkg-query: no packages found matching {pattern}", err=True)
            missing = True
            continue
        for name in matches:
            fields = {
                "Package": name,
                "binary:Package": name,
                "Version": packages[name],
                "Status": "install ok installed",
                "db:Status-Abbrev": "ii ",
                "db:Status-Status": "installed",
                "Architecture": "amd64",
            }
            if show_status:
                say(
                    f"Package: {name}", "Status: install ok installed", f"Version: {packages[name]}"
                )
                continue
            text = fmt.replace("\\n", "\n").replace("\\t", "\t")
            text = re.sub(r"\$\{([^}]+)\}", partial(_field, fields), text)
            sys.stdout.write(text)
    sys.stdout.flush()
    return 1 if missing else 0


# --- nvidia-ctk ------------------------------------------------------------------------------


def nvidia_ctk(host: Host, argv: list[str]) -> int:
    """`nvidia-ctk --version` and `nvidia-ctk runtime configure --runtime=docker`."""
    version = host.packages().get("nvidia-container-toolkit-base", "")
    if argv[:1] in (["--version"], ["-v"], ["version"]):
        say(
            f"NVIDIA Container Toolkit CLI version {version.split('-')[0]}",
            "commit: 5bca6d2e9c4dd9e2b0a1f0b2f6d0c0d6a1f0c9e1",
        )
        return 0
    if argv[:2] != ["runtime", "configure"]:
        raise SimError(f"simhost: `nvidia-ctk {' '.join(argv)}` is not simulated", 1)
    require_root(host, "ERRO[0000] unable to flush config: unable to open "
                 "/etc/docker/daemon.json for writing: open /etc/docker/daemon.json: "
                 "permission denied", 1)
    runtime = "docker"
    config = "/etc/docker/daemon.json"
    default = False
    args = argv[2:]
    while args:
        arg = args.pop(0)
        if arg.startswith("--runtime"):
            runtime = arg.split("=", 1)[1] if "=" in arg else args.pop(0)
        elif arg.startswith("--config"):
            config = arg.split("=", 1)[1] if "=" in arg else args.pop(0)
        elif arg == "--set-as-default":
            default = True
        else:
            raise SimError(f"Incorrect Usage: flag provided but not defined: {arg}", 1)
    if runtime != "docker":
        raise SimError(f"simhost: runtime {runtime!r} is not simulated (docker only)", 1)
    path = host.writable(host.path(config))
    try:
        current = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
    except json.JSONDecodeError as exc:
        raise SimError(f"unable to load config: {exc}", 1) from None
    current.setdefault("runtimes", {})["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
    if default:
        current["default-runtime"] = "nvidia"
    write_atomic(path, json.dumps(current, indent=4))
    host.event("nvidia-ctk-configure", config=str(path))
    say(
        f"INFO[0000] Wrote updated config to {config}",
        "INFO[0000] It is recommended that docker daemon be restarted.",
        err=True,
    )
    return 0


# --- systemd / sysvinit ------------------------------------------------------------------------


def _no_systemd() -> SimError:
    return SimError(
        "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
        "Failed to connect to bus: Host is down",
        1,
    )


def _docker_unit(host: Host, verb: str) -> int:
    if not host.options["has_docker"]:
        raise SimError(f"Failed to {verb} docker.service: Unit docker.service not found.", 5)
    if verb in ("restart", "try-restart", "reload", "reload-or-restart", "force-reload"):
        return docker.restart_daemon(host, reason=verb)
    if verb == "start":
        return 0 if docker.daemon_state(host)["running"] else docker.restart_daemon(host, "start")
    if verb == "stop":
        docker.stop_daemon(host)
        return 0
    running = docker.daemon_state(host)["running"]
    if verb == "is-active":
        say("active" if running else "inactive")
        return 0 if running else 3
    if verb == "is-enabled":
        say("enabled")
        return 0
    if verb in ("enable", "disable"):
        return 0
    if verb == "status":
        say(
            "● docker.service - Docker Application Container Engine",
            f"     Active: {'active (running)' if running else 'inactive (dead)'}",
        )
        return 0 if running else 3
    raise SimError(f"Unknown command verb {verb}.", 1)


def systemctl(host: Host, argv: list[str]) -> int:
    """`systemctl restart|start|stop|is-active|status|daemon-reload [docker]` (systemd hosts)."""
    if not host.options["has_systemd"]:
        raise _no_systemd()
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        raise SimError("simhost: systemctl needs a verb", 1)
    verb, units = words[0], [u.removesuffix(".service") for u in words[1:]]
    if verb not in ("is-active", "status"):
        unit = (units or ["daemon"])[0]
        require_root(host, f"Failed to {verb} {unit}.service: Interactive authentication "
                     "required.\nSee system logs and 'systemctl status "
                     f"{unit}.service' for details.", 1)
    if verb == "daemon-reload":
        host.event("daemon-reload", reason="systemctl")
        return 0
    code = 0
    for unit in units:
        if unit in ("docker", "docker.socket"):
            code = max(code, _docker_unit(host, verb))
        elif unit in ("ssh", "sshd", "cron", "containerd", "nvidia-persistenced"):
            if verb == "is-active":
                say("active")
        else:
            raise SimError(f"Failed to {verb} {unit}.service: Unit {unit}.service not found.", 5)
    return code


def service(host: Host, argv: list[str]) -> int:
    """`service docker restart|start|stop|status` (hosts without systemd)."""
    if len(argv) < 2:
        raise SimError("Usage: service < option > | --status-all | [ service_name [ command ]]", 1)
    unit, verb = argv[0], argv[1]
    if unit != "docker":
        raise SimError(f"{unit}: unrecognized service", 1)
    if verb != "status":
        require_root(host, f" * {verb.capitalize()}ing Docker: docker: permission denied", 1)
    return _docker_unit(host, verb)


# --- curl / gpg --------------------------------------------------------------------------------


def _curl_headers(value: str, headers: dict[str, str]) -> None:
    """`-H 'Name: value'`, or `-H @FILE` / `-H @-` (stdin): one header a line (curl 7.55+)."""
    if value.startswith("@"):
        source = value[1:]
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        lines = text.splitlines()
    else:
        lines = [value]
    for line in lines:
        key, _, found = line.partition(":")
        if key.strip():
            headers[key.strip()] = found.strip()


def _curl_args(argv: list[str]) -> dict[str, Any]:
    """curl's options as the stand-in reads them (unknown ones: curl's exit 2)."""
    opts: dict[str, Any] = {"fail": False, "silent": False, "show_error": False, "output": None,
                            "write_out": None, "method": None, "data": None, "headers": {},
                            "timeout": 30.0, "url": None}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if re.fullmatch(r"-[fsSLk]+", arg):
            opts["fail"] |= "f" in arg
            opts["silent"] |= "s" in arg
            opts["show_error"] |= "S" in arg
        elif arg in ("--fail", "--fail-with-body"):
            opts["fail"] = True
        elif arg in ("--silent", "--show-error", "--location", "--insecure", "--compressed"):
            opts["silent"] |= arg == "--silent"
            opts["show_error"] |= arg == "--show-error"
        elif arg in ("-o", "--output"):
            opts["output"] = args.pop(0)
        elif arg in ("-w", "--write-out"):
            opts["write_out"] = args.pop(0)
        elif arg in ("-X", "--request"):
            opts["method"] = args.pop(0)
        elif arg in ("-H", "--header"):
            _curl_headers(args.pop(0), opts["headers"])
        elif arg in ("-r", "--range"):
            opts["headers"]["Range"] = f"bytes={args.pop(0)}"
        elif arg in ("-d", "--data", "--data-raw", "--data-binary"):
            opts["data"] = args.pop(0).encode()
        elif arg in ("-m", "--max-time", "--connect-timeout"):
            opts["timeout"] = float(args.pop(0))
        elif arg in ("--retry", "--retry-delay", "--retry-max-time"):
            args.pop(0)
        elif arg.startswith("-"):
            raise SimError(f"curl: option {arg}: is unknown", 2)
        else:
            opts["url"] = arg
    if opts["url"] is None:
        raise SimError("curl: no URL specified!", 2)
    return opts


def _write_out(template: str, values: dict[str, str]) -> str:
    out = template.replace("\\n", "\n")
    for name, value in values.items():
        out = out.replace("%{" + name + "}", value)
    return out


def curl(host: Host, argv: list[str]) -> int:
    """The NVIDIA key and list URLs, huggingface.co's file URLs (standins/hub.py), real HTTP
    to 127.0.0.1/localhost, nothing else. `-w` knows http_code, size_download, time_total and
    speed_download, and is written on a failed transfer too (http_code 000), as curl does."""
    import time

    from . import hub

    opts = _curl_args(argv)
    url: str = opts["url"]
    host.event("curl", url=url)
    started = time.monotonic()
    stats = {"http_code": "000", "size_download": "0"}

    def finish(code: int, text: str = "") -> int:
        elapsed = max(time.monotonic() - started, 1e-6)
        size = int(stats["size_download"])
        stats.update(time_total=f"{elapsed:.6f}", speed_download=str(int(size / elapsed)))
        if opts["write_out"]:
            sys.stdout.write(_write_out(opts["write_out"], stats))
            sys.stdout.flush()
        if code and (opts["show_error"] or not opts["silent"]):
            say(f"curl: ({code}) {text}", err=True)
        return code

    status, body, size = 200, b"", None
    if url == GPGKEY_URL:
        body = _ARMORED_KEY.encode()
    elif url == LIST_URL:
        body = _LIST_TEXT.encode()
    elif hub.is_hub(url):
        if host.options.get("hub_unreachable"):
            return finish(6, f"Could not resolve host: {hub.HUB_HOST}")
        answer = hub.get(host, url, opts["headers"], opts["timeout"])
        status, body, size = answer.status, answer.body, answer.size
        if answer.received is not None:
            stats.update(http_code=str(status), size_download=str(answer.received))
            return finish(28, f"Operation timed out after {int(opts['timeout'] * 1000)} "
                          f"milliseconds with {answer.received} out of {size} bytes received")
    elif re.match(r"https?://(127\.0\.0\.1|localhost)[:/]", url):
        import urllib.error
        import urllib.request

        if host.options.get("hub_unreachable") and "/resolve/" in url:
            port = re.search(r":(\d+)", url.split("//", 1)[1])
            return finish(7, f"Failed to connect to 127.0.0.1 port {port.group(1) if port else 80}"
                          " after 0 ms: Couldn't connect to server")
        request = urllib.request.Request(url, data=opts["data"], method=opts["method"],
                                         headers=opts["headers"])
        try:
            with urllib.request.urlopen(request, timeout=opts["timeout"]) as response:  # noqa: S310
                status, body = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            port = re.search(r":(\d+)", url.split("//", 1)[1])
            return finish(7, f"Failed to connect to port {port.group(1) if port else 80}: {exc}")
    elif url.startswith("https://nvidia.github.io/"):
        status, body = 404, b"Not Found"
    else:
        hostname = re.sub(r"^\w+://", "", url).split("/")[0]
        return finish(6, f"Could not resolve host: {hostname}")
    stats.update(http_code=str(status), size_download=str(len(body) if size is None else size))
    if opts["fail"] and status >= 400:
        stats["size_download"] = "0"
        return finish(22, f"The requested URL returned error: {status}")
    output = opts["output"]
    if output == "/dev/null":
        pass
    elif output is not None and output != "-":
        write_atomic(host.writable(output), body)
    else:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    return finish(0)


def gpg(host: Host, argv: list[str]) -> int:
    """`gpg [--batch] [--yes] --dearmor [-o FILE] [FILE]` (reads stdin without FILE)."""
    output: str | None = None
    yes = dearmor = False
    inputs: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--dearmor" or arg == "--enarmor":
            dearmor = arg == "--dearmor"
        elif arg in ("-o", "--output"):
            output = args.pop(0)
        elif arg == "--yes":
            yes = True
        elif arg in ("--batch", "--no-tty", "--quiet", "-q"):
            continue
        elif arg.startswith("-"):
            raise SimError(f"simhost: gpg {arg} is not simulated", 2)
        else:
            inputs.append(arg)
    if not dearmor:
        raise SimError("simhost: only `gpg --dearmor` is simulated", 2)
    raw = Path(inputs[0]).read_bytes() if inputs else sys.stdin.buffer.read()
    text = raw.decode(errors="replace")
    if "-----BEGIN PGP" not in text:
        raise SimError("gpg: no valid OpenPGP data found.", 2)
    body = [
        line
        for line in text.split("-----BEGIN PGP PUBLIC KEY BLOCK-----", 1)[1].splitlines()
        if line and not line.startswith(("=", "-----")) and ":" not in line
    ]
    packet = base64.b64decode("".join(body))
    if output is None or output == "-":
        sys.stdout.buffer.write(packet)
        sys.stdout.flush()
        return 0
    target = host.writable(output)
    if target.exists() and not yes:
        raise SimError(
            f"File '{output}' exists. Overwrite? (y/N) gpg: cannot open '/dev/tty': "
            "No such device or address",
            2,
        )
    write_atomic(target, packet)
    return 0


def sudo(host: Host, argv: list[str]) -> int:
    """`sudo [-n] CMD...`: runs CMD as root for a root or passwordless-sudo login."""
    args = list(argv)
    while args and args[0].startswith("-"):
        args.pop(0)  # -n (never prompt): orch always passes it
    if not args:
        raise SimError("usage: sudo -n command [args...]", 1)
    if host.options.get("login", "root") == "user":
        raise SimError("sudo: a password is required", 1)
    env = {**os.environ, "SIMHOST_SUDO": "1"}
    try:
        os.execvpe(args[0], args, env)
    except FileNotFoundError:
        raise SimError(f"sudo: {args[0]}: command not found", 1) from None


def id_cmd(host: Host, argv: list[str]) -> int:
    """`id -u` / `id -un`: the login's uid and name (0/root for a root login)."""
    root = host.options.get("login", "root") == "root" or os.environ.get("SIMHOST_SUDO") == "1"
    if argv == ["-u"]:
        say("0" if root else "1000")
    elif argv in (["-un"], ["-nu"]):
        say("root" if root else "orch")
    else:
        say("uid=0(root) gid=0(root) groups=0(root)" if root
            else "uid=1000(orch) gid=1000(orch) groups=1000(orch),27(sudo),999(docker)")
    return 0
