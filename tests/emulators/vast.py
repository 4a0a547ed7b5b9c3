"""An emulator of the Vast.ai REST API (provider-apis.md, "Vast.ai") on 127.0.0.1.

A real HTTP server (`serve.LoopbackServer`, a background thread) serving the
documented shapes: `POST /bundles/` (operator filters), `PUT /asks/{id}/`,
`GET /instances/` and `GET /instances/{id}/` (`{"instances": {one object}}`), the paginated
`GET /api/v1/instances/` (`select_filters`, `order_by`, `limit`, `after_token` →
`{instances, next_token, total_instances}`), `DELETE /instances/{id}/`, `POST /ssh/`.
It speaks what the official client sends (`vastai` 1.9.1: tests/test_vastai_cli.py runs it
against this emulator): search `type` must be `on-demand`, `bid` or `reserved`; create
accepts the CLI's whole body and its runtypes (`ssh`, `ssh_proxy`, `ssh_direc ssh_proxy`,
the docs' `ssh_direct`, the jupyter ones, `args`), and an `args` instance has no SSH.
Use it as a context manager::

    with VastEmulator(api_key="k") as vast:
        vast.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.30, min_bid=0.18)
        adapter = VastAI("k", base_url=vast.url)

Faults are injected with `fail_next`, `answer_next` (any bytes, of any size, as the answer:
serve.py), `fail_contract`, `remove_offer`, `drop_next_create`,
`stall_next_create` (rent, then answer only after a delay: the client times out first);
`preempt(id)` outbids an instance. Instances boot null → loading → running after
`loading_after`/`running_after` reads of them (or `boot_seconds`). Every request is recorded
in `requests` (method, path, query, body text, JSON, headers without Authorization).

With `hosts=` (a `tests.emulators.hosts.HostBackend`, e.g. `SimHostBackend`) every successful
create also boots a real host authorising the public key found in the `onstart` script (else
the account's latest `POST /ssh/` key); the instance reports that host as `ssh_host`/`ssh_port`
once it is running (direct runtypes also as `public_ipaddr` + `ports["22/tcp"]`). The host is
a container rental (`SimHostOptions.container_image`): no Docker, no systemd, and the image's
environment reaches SSH sessions only if the onstart script persists it
(`env >> /etc/environment`, read at login as pam_env does). `preempt` powers the host off;
`DELETE` powers it off and forgets it. A host that fails to boot leaves the instance `exited`
(the adapter's FAILED).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from .serve import Served

if TYPE_CHECKING:
    from .hosts import HostBackend

AUTH_ERROR = {"success": False, "error": "auth_error", "msg": "Invalid user key"}
RATE_LIMIT_TEXT = "API requests too frequent"
SEARCH_TYPES = ("on-demand", "bid", "reserved")
# Runtypes the CLI sends (vast-cli resolve_runtype) and the docs list; "args" has no SSH.
SSH_RUNTYPES = ("ssh", "ssh_proxy", "ssh_direc ssh_proxy", "ssh_direct",
                "jupyter_proxy ssh_proxy", "jupyter_direc ssh_direc ssh_proxy",
                "jupyter_direct")
RUNTYPES = (*SSH_RUNTYPES, "args")
# `env >> /etc/environment` (or `env | grep _ >> ...`, `printenv >> ...`) in an onstart.
_PERSISTS_ENV = re.compile(r"(?:^|[;&|(\s])(?:env|printenv)\b[^;&]*>>\s*/etc/environment\b")
_SEARCH_CONTROLS = ("order", "limit", "type", "allocated_storage", "disable_bundling")


@dataclass
class Recorded:
    """One request as the emulator saw it (the Authorization header is left out)."""

    method: str
    path: str
    query: str
    body: str
    json: Any
    headers: dict[str, str]
    authorized: bool


@dataclass
class Fault:
    """Answer the next `count` matching requests with this response instead."""

    count: int
    status: int
    body: str
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    method: str | None = None
    path: str | None = None  # prefix

    def matches(self, method: str, path: str) -> bool:
        return ((self.method is None or self.method == method)
                and (self.path is None or path.startswith(self.path)))


_DEFAULT_BODIES: dict[int, tuple[str, str]] = {
    429: (RATE_LIMIT_TEXT, "text/plain"),
    500: (json.dumps({"error": "server_error", "msg": "Internal Server Error"}),
          "application/json"),
    502: ("Bad Gateway", "text/html"),
    503: ("Service Unavailable", "text/plain"),
    402: (json.dumps({"success": False, "error": "insufficient_credit",
                      "msg": "Your account balance is too low"}), "application/json"),
}

_OFFER_DEFAULTS: dict[str, Any] = {
    "dph_base": 0.30, "min_bid": 0.15, "storage_cost": 0.10, "num_gpus": 1,
    "gpu_name": "RTX 4090", "gpu_ram": 24564, "cpu_cores_effective": 16.0, "cpu_ram": 64000,
    "disk_space": 500.0, "geolocation": "US", "reliability": 0.99, "verified": True,
    "rentable": True, "rented": False, "cuda_max_good": 13.0, "machine_id": 0,
    "external": False,
}

_OPS = {
    "eq": lambda a, b: a == b, "neq": lambda a, b: a != b,
    "gt": lambda a, b: a is not None and a > b, "gte": lambda a, b: a is not None and a >= b,
    "lt": lambda a, b: a is not None and a < b, "lte": lambda a, b: a is not None and a <= b,
    "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
    "nin": lambda a, b: a not in b,
}


def _sort_key(fld: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: row.get(fld) or 0


def _coerce(have: Any, want: Any) -> Any:
    """`want` as the type of the field's value: the CLI sends numbers it parsed from a query
    string as strings (`num_gpus=1` → {"eq": "1"}) and Vast compares them as numbers."""
    if isinstance(want, list):
        return [_coerce(have, w) for w in want]
    if isinstance(have, int | float) and not isinstance(have, bool) and isinstance(want, str):
        try:
            return float(want)
        except ValueError:
            return want
    return want


def _matches(row: dict[str, Any], filters: dict[str, Any]) -> bool:
    """Whether `row` passes every `{field: {op: value}}` filter (unknown ops are ignored)."""
    for key, cond in filters.items():
        if not isinstance(cond, dict):
            continue
        for op, want in cond.items():
            have = row.get(key)
            if op in _OPS and not _OPS[op](have, _coerce(have, want)):
                return False
    return True


def _storage_per_hour(offer: dict[str, Any], disk_gb: float) -> Decimal:
    return Decimal(str(disk_gb)) * Decimal(str(offer["storage_cost"])) / Decimal(720)


class VastEmulator(Served):
    """A Vast.ai API on a real loopback HTTP server, with seeded offers and fault injection."""

    def __init__(self, api_key: str = "vast-test-key", *, loading_after: int = 1,
                 running_after: int = 2, boot_seconds: float | None = None,
                 hosts: HostBackend | None = None) -> None:
        self.api_key = api_key
        self.hosts = hosts
        self.loading_after = loading_after
        self.running_after = running_after
        self.boot_seconds = boot_seconds
        self.offers: list[dict[str, Any]] = []
        self.instances: dict[int, dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.ssh_keys: list[str] = []
        self.faults: list[Fault] = []
        self.failing_contracts: set[int] = set()
        self.drop_creates = 0
        self.stall_creates: list[float] = []  # seconds to hold each next create's answer
        self.drips: list[Fault] = []  # answers sent one byte at a time (`drip_next`)
        self.reprices: list[tuple[int, dict[str, Any]]] = []  # applied at the next create
        self.lock = threading.RLock()
        self._next_id = 9001

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL to give the adapter (the `/api/v0` root)."""
        return f"{self.served_url}/api/v0"

    # -- test controls ------------------------------------------------------------------

    def add_offer(self, **fields: Any) -> dict[str, Any]:
        """Seed an offer (defaults: a verified 1× RTX 4090); returns the stored dict."""
        with self.lock:
            offer = {**_OFFER_DEFAULTS, **fields}
            offer.setdefault("id", 100 + len(self.offers))
            if not offer["machine_id"]:
                offer["machine_id"] = 5000 + int(offer["id"])
            if "dph_total" not in fields:
                offer["dph_total"] = float(Decimal(str(offer["dph_base"]))
                                           + _storage_per_hour(offer, 16))
            self.offers.append(offer)
            return offer

    def fail_next(self, count: int, status: int, body: str | dict[str, Any] | None = None, *,
                  content_type: str | None = None, headers: dict[str, str] | None = None,
                  method: str | None = None, path: str | None = None) -> None:
        """The next `count` requests (matching method/path prefix) get `status`.

        Defaults: 429 plain-text "API requests too frequent" without Retry-After; 500 JSON;
        503 plain text; 402 insufficient credit.
        """
        default_body, default_type = _DEFAULT_BODIES.get(
            status, (json.dumps({"error": "error", "msg": f"HTTP {status}"}), "application/json"))
        if isinstance(body, dict):
            text, ctype = json.dumps(body), "application/json"
        else:
            text, ctype = (body if body is not None else default_body), default_type
        with self.lock:
            self.faults.append(Fault(count, status, text, content_type or ctype,
                                     dict(headers or {}), method, path))

    def fail_contract(self, offer_id: int) -> None:
        """The next create on `offer_id` answers `success:false` with a stopped new_contract."""
        with self.lock:
            self.failing_contracts.add(int(offer_id))

    def remove_offer(self, offer_id: int) -> None:
        """Take the offer off the market: creates on it get 404 `no_such_ask`."""
        with self.lock:
            self.offers = [o for o in self.offers if int(o["id"]) != int(offer_id)]

    def drop_next_create(self, count: int = 1) -> None:
        """The next `count` creates rent the instance, then close the connection unanswered."""
        with self.lock:
            self.drop_creates += count

    def stall_next_create(self, seconds: float, count: int = 1) -> None:
        """The next `count` creates rent the instance, then answer only after `seconds`."""
        with self.lock:
            self.stall_creates += [seconds] * count

    def drip_next(self, count: int, interval_s: float, *, method: str | None = None,
                  path: str | None = None) -> None:
        """The next `count` matching answers come one byte every `interval_s` seconds (a
        slow-dripping load balancer: every read gets a byte before a per-read timeout)."""
        with self.lock:
            self.drips.append(Fault(count, 0, "", "", {"interval": str(interval_s)},
                                    method, path))

    def reprice_before_create(self, offer_id: int, **fields: Any) -> None:
        """Change the offer (e.g. its `min_bid`) just before the next create on it is
        judged: the market moved between orch's search and its create."""
        with self.lock:
            self.reprices.append((int(offer_id), fields))

    def preempt(self, instance_id: int | str) -> None:
        """Outbid the instance: cur_state == intended_status == next_state == "stopped".

        With `hosts`, its host powers off too (disks kept, as Vast pauses an outbid instance).
        """
        with self.lock:
            inst = self.instances[int(instance_id)]
            inst.update(actual_status="stopped", cur_state="stopped",
                        intended_status="stopped", next_state="stopped",
                        status_msg="outbid: instance stopped", _pinned=True)
            if self.hosts is not None and inst.get("_endpoint"):
                self.hosts.stop(str(inst["id"]))

    def set_status(self, instance_id: int | str, **fields: Any) -> None:
        """Overwrite status fields (e.g. actual_status="exited"); stops the boot progression."""
        with self.lock:
            self.instances[int(instance_id)].update(fields, _pinned=True)

    def set_ssh(self, instance_id: int | str, host: str, port: int, *,
                direct: bool = False) -> None:
        """Where the instance's SSH listens (ssh_host/ssh_port, or public_ipaddr + ports)."""
        with self.lock:
            inst = self.instances[int(instance_id)]
            if direct:
                inst.update(public_ipaddr=host, ports={"22/tcp": [{"HostPort": str(port)}]})
            else:
                inst.update(ssh_host=host, ssh_port=port)

    def add_instance(self, **fields: Any) -> dict[str, Any]:
        """Put an instance on the account directly (e.g. one not made by orch)."""
        with self.lock:
            inst = self._new_instance(fields.pop("offer", None) or {**_OFFER_DEFAULTS},
                                      fields.pop("label", None), None)
            inst.update(fields)
            return inst

    def requests_to(self, method: str, prefix: str) -> list[Recorded]:
        """The recorded requests with this method whose path starts with `prefix`."""
        return [r for r in self.requests if r.method == method and r.path.startswith(prefix)]

    # -- server side --------------------------------------------------------------------

    def serve(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length).decode("utf-8", "replace") if length else ""
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        auth = h.headers.get("Authorization", "")
        headers = {k: v for k, v in h.headers.items() if k.lower() != "authorization"}
        path = parts.path
        with self.lock:
            self.requests.append(Recorded(h.command, path, parts.query, raw, parsed, headers,
                                          auth == f"Bearer {self.api_key}"))
            fault = next((f for f in self.faults if f.matches(h.command, path)), None)
            if fault is not None:
                fault.count -= 1
                if fault.count <= 0:
                    self.faults.remove(fault)
        if fault is None and self.send_raw(h, path) is not None:  # a hostile answer (`answer_next`)
            return
        if fault is not None:
            self._send(h, fault.status, fault.body, fault.content_type, fault.headers)
            return
        if auth != f"Bearer {self.api_key}":
            self._json(h, 401, AUTH_ERROR)
            return
        if path.startswith("/api/v1/"):
            route = [p for p in path[len("/api/v1"):].split("/") if p]
            with self.lock:
                status, doc = self._route_v1(h.command, route, parse_qs(parts.query))
            self._json(h, status, doc)
            return
        root = "/api/v0"
        if not path.startswith(root + "/"):
            self._json(h, 404, {"error": "not_found", "msg": path})
            return
        route = [p for p in path[len(root):].split("/") if p]
        with self.lock:
            result = self._route(h.command, route, parsed)
            stall = (self.stall_creates.pop(0) if self.stall_creates and h.command == "PUT"
                     and result is not None and result[0] == 200 else 0.0)
        if stall:
            time.sleep(stall)  # a create that hangs: the rental happened, the answer is late
        if result is None:  # drop the connection
            h.close_connection = True
            h.wfile.flush()
            h.connection.shutdown(2)
            return
        status, doc = result
        with self.lock:
            drip = next((d for d in self.drips if d.matches(h.command, path)), None)
            if drip is not None:
                drip.count -= 1
                if drip.count <= 0:
                    self.drips.remove(drip)
        if drip is not None:
            self._drip(h, status, json.dumps(doc).encode(), float(drip.headers["interval"]))
            return
        self._json(h, status, doc)

    @staticmethod
    def _drip(h: BaseHTTPRequestHandler, status: int, data: bytes, interval_s: float) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        try:
            h.wfile.flush()
            for i in range(len(data)):
                time.sleep(interval_s)
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
        except OSError:  # the client gave up: what a real server sees too
            h.close_connection = True

    def _route_v1(self, method: str, route: list[str],
                  query: dict[str, list[str]]) -> tuple[int, Any]:
        """`GET /api/v1/instances/`: the paginated listing (vast-cli `show instances`)."""
        if method != "GET" or route != ["instances"]:
            return 404, {"error": "not_found", "msg": "/".join(route)}
        try:
            select = json.loads(query.get("select_filters", ["{}"])[0])
            order = json.loads(query.get("order_by", ['[{"col": "id", "dir": "asc"}]'])[0])
            limit = int(query.get("limit", ["25"])[0])
            after = int(query.get("after_token", ["0"])[0] or 0)
        except ValueError:
            return 400, {"success": False, "error": "invalid_args",
                         "msg": "select_filters, order_by, limit or after_token is malformed"}
        if not isinstance(select, dict) or not isinstance(order, list) or not 1 <= limit <= 25:
            return 400, {"success": False, "error": "invalid_args",
                         "msg": "limit must be between 1 and 25"}
        rows = [i for i in self.instances.values() if _matches(i, select)]
        for spec in reversed(order):
            col = str(spec.get("col", "id")) if isinstance(spec, dict) else "id"
            desc = isinstance(spec, dict) and spec.get("dir") == "desc"
            rows.sort(key=_sort_key(col), reverse=desc)
        page = rows[after: after + limit]
        more = after + limit < len(rows)
        return 200, {"instances": [self._view(i) for i in page],
                     "next_token": str(after + limit) if more else None,
                     "total_instances": len(rows)}

    def _route(self, method: str, route: list[str], body: Any) -> tuple[int, Any] | None:
        if method == "POST" and route == ["bundles"]:
            query = body if isinstance(body, dict) else {}
            if query.get("type", "on-demand") not in SEARCH_TYPES:
                return 400, {"success": False, "error": "invalid_args",
                             "msg": f"type must be one of {', '.join(SEARCH_TYPES)}"}
            return 200, {"offers": self._search(query)}
        if method == "PUT" and len(route) == 2 and route[0] == "asks":
            return self._create(route[1], body if isinstance(body, dict) else {})
        if method == "GET" and route == ["instances"]:
            return 200, {"instances": [self._view(i) for i in self.instances.values()]}
        if len(route) == 2 and route[0] == "instances":
            try:
                iid = int(route[1])
            except ValueError:
                return 400, {"error": "invalid_args", "msg": "bad instance id"}
            if method == "GET":
                inst = self.instances.get(iid)
                return 200, {"instances": self._view(inst) if inst else None}
            if method == "DELETE":
                gone = self.instances.pop(iid, None)
                if gone is None:
                    return 404, {"success": False, "error": "no_such_instance",
                                 "msg": "Instance not found"}
                if self.hosts is not None and gone.get("_endpoint"):
                    self.hosts.stop(str(iid))
                return 200, {"success": True}
        if method == "GET" and route == ["users", "current"]:  # the CLI asks before commands
            return 200, {"id": 1, "username": "orch-test", "credit": 100.0,
                         "host_agreement_accepted": False}
        if method == "POST" and route == ["ssh"]:
            self.ssh_keys.append(str((body or {}).get("ssh_key", "")))
            return 200, {"success": True}
        return 404, {"error": "not_found", "msg": "/".join(route)}

    def _search(self, q: dict[str, Any]) -> list[dict[str, Any]]:
        rows = []
        filters = {k: v for k, v in q.items() if k not in _SEARCH_CONTROLS}
        for offer in self.offers:
            if not self._rented(offer) and _matches(offer, filters):
                rows.append(dict(offer))
        for fld, direction in reversed(q.get("order") or []):
            rows.sort(key=_sort_key(str(fld)), reverse=(direction == "desc"))
        return rows[: int(q.get("limit") or 64)]

    def _rented(self, offer: dict[str, Any]) -> bool:
        return any(i["_ask"] == offer["id"] for i in self.instances.values())

    def _create(self, ask: str, body: dict[str, Any]) -> tuple[int, Any] | None:
        offer = next((o for o in self.offers if str(o["id"]) == ask), None)
        for moved in [r for r in self.reprices if offer is not None and r[0] == offer["id"]]:
            self.reprices.remove(moved)
            offer.update(moved[1])  # type: ignore[union-attr]
        if offer is None or self._rented(offer):
            return 404, {"success": False, "error": "no_such_ask",
                         "msg": f"Instance type {ask} is no longer available"}
        disk = body.get("disk")
        if not isinstance(disk, int | float) or disk < 8 or not body.get("image"):
            return 400, {"success": False, "error": "invalid_args",
                         "msg": "disk must be >= 8 and image is required"}
        runtype = body.get("runtype", "ssh")
        if body.get("template_hash_id") is None and runtype not in RUNTYPES:
            return 400, {"success": False, "error": "invalid_args",
                         "msg": f"invalid runtype {runtype!r}"}
        if not isinstance(body.get("env", {}), dict):
            return 400, {"success": False, "error": "invalid_args", "msg": "env must be a dict"}
        price = body.get("price")
        if price is not None and Decimal(str(price)) < Decimal(str(offer["min_bid"])):
            return 400, {"success": False, "error": "invalid_price",
                         "msg": f"bid {price} is below the minimum {offer['min_bid']}"}
        inst = self._new_instance(offer, body.get("label"), price, body)
        if int(offer["id"]) in self.failing_contracts:
            self.failing_contracts.discard(int(offer["id"]))
            inst.update(actual_status=None, intended_status="stopped", cur_state="stopped",
                        next_state="stopped", _pinned=True)
            return 200, {"success": False, "new_contract": inst["id"],
                         "error": "instance_stopped", "msg": "Instance could not be started"}
        self._boot_host(inst)
        if self.drop_creates > 0:
            self.drop_creates -= 1
            return None
        return 200, {"success": True, "new_contract": inst["id"]}

    def _public_key(self, inst: dict[str, Any]) -> str | None:
        """The key the instance authorises: onstart's, else the account's latest valid one."""
        from .hosts import public_keys_in

        keys = public_keys_in(inst.get("onstart"))
        if not keys:
            keys = [k for text in self.ssh_keys for k in public_keys_in(text)]
            keys = keys[-1:]
        return keys[0] if keys else None

    def _boot_host(self, inst: dict[str, Any]) -> None:
        """With `hosts`: boot the instance's machine now; its SSH shows once it is running.

        The machine is a container of the instance's image. Vast's SSH runtypes start its
        sshd themselves (any image), but the image's environment reaches SSH sessions only
        when the onstart script wrote it to /etc/environment.
        """
        if self.hosts is None or inst["runtype"] not in SSH_RUNTYPES:
            return  # the args runtype keeps the image's ENTRYPOINT and gives no SSH
        key = self._public_key(inst)
        if key is None:  # nothing to authorise: the instance has no reachable SSH
            return
        persisted = _PERSISTS_ENV.search(str(inst.get("onstart") or ""))
        container = {"container_image": str(inst["image_uuid"]),
                     "persisted_env": ("/etc/environment",) if persisted else ()}
        try:
            host, port, _user = self.hosts.start(str(inst["id"]), key, str(inst["gpu_name"]),
                                                 int(inst["num_gpus"]), container)
        except Exception as exc:  # noqa: BLE001 - the machine failed: the container exits
            inst.update(actual_status="exited", cur_state="stopped", next_state="stopped",
                        status_msg=f"host failed to boot: {exc}"[:300], _pinned=True)
            return
        inst["_endpoint"] = (host, port)

    def _new_instance(self, offer: dict[str, Any], label: str | None, price: Any,
                      body: dict[str, Any] | None = None) -> dict[str, Any]:
        body = body or {}
        disk = body.get("disk", 16)
        base = Decimal(str(price)) if price is not None else Decimal(str(offer["dph_base"]))
        iid = self._next_id
        self._next_id += 1
        inst = {
            "id": iid, "machine_id": offer.get("machine_id"), "label": label,
            "gpu_name": offer["gpu_name"], "num_gpus": offer["num_gpus"],
            "gpu_ram": offer["gpu_ram"], "is_bid": price is not None,
            "dph_total": float(base + _storage_per_hour(offer, disk)),
            "actual_status": None, "intended_status": "running", "cur_state": "stopped",
            "next_state": "running", "status_msg": "", "public_ipaddr": None, "ports": {},
            "ssh_host": None, "ssh_port": None, "image_uuid": body.get("image"),
            "disk_space": disk, "onstart": body.get("onstart"),
            "runtype": body.get("runtype", "ssh"),
            "extra_env": [[k, str(v)] for k, v in (body.get("env") or {}).items()],
            "start_date": time.time(), "_ask": offer.get("id"), "_reads": 0,
            "_created": time.monotonic(), "_pinned": False,
        }
        self.instances[iid] = inst
        return inst

    def _view(self, inst: dict[str, Any]) -> dict[str, Any]:
        """Advance the boot progression one read, and return the public fields."""
        if not inst["_pinned"]:
            inst["_reads"] += 1
            if self.boot_seconds is not None:
                elapsed = time.monotonic() - inst["_created"]
                stage = 2 if elapsed >= self.boot_seconds else (
                    1 if elapsed >= self.boot_seconds / 2 else 0)
            else:
                reads = inst["_reads"]
                stage = 2 if reads > self.running_after else (1 if reads > self.loading_after
                                                              else 0)
            inst["actual_status"] = [None, "loading", "running"][stage]
            inst["cur_state"] = "running" if stage else "stopped"
        endpoint = inst.get("_endpoint")
        if endpoint and inst["actual_status"] == "running" and inst["ssh_host"] is None:
            inst["ssh_host"], inst["ssh_port"] = endpoint  # kept once shown, like Vast
            if "ssh_direc" in str(inst["runtype"]):  # direct: the public port of 22/tcp
                inst["public_ipaddr"] = endpoint[0]
                inst["ports"] = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(endpoint[1])}]}
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    # -- responses ----------------------------------------------------------------------

    def _json(self, h: BaseHTTPRequestHandler, status: int, doc: Any) -> None:
        self._send(h, status, json.dumps(doc), "application/json", {})

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: str, content_type: str,
              headers: dict[str, str]) -> None:
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            h.send_header(key, value)
        h.end_headers()
        h.wfile.write(data)
