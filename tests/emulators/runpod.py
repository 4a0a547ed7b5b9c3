"""A RunPod REST v2 emulator on real HTTP (127.0.0.1, ephemeral port), for adapter tests.

Follows the shapes in ../shared/reference/provider-apis.md ("RunPod REST v2"): the GPU
catalog, pods with a status progression, `ssh.direct`, RFC 9457 error bodies, `RateLimit`
headers, and injectable faults. Every request is recorded without its Authorization header.

    with RunPodEmulator(api_key="k", gpus=[...]) as emu:
        RunPod("k", base_url=emu.url)

With `hosts=` (a `tests.emulators.hosts.HostBackend`, e.g. `SimHostBackend`) a pod created
with `env.PUBLIC_KEY` also boots a real host authorising that key, and `ssh.direct` reports
that host (with the backend's user) once the pod is RUNNING. `preempt`/`exit_pod` power the
host off; `DELETE` powers it off and forgets the pod. A host that fails to boot leaves the
pod in `ERROR` (the adapter's FAILED).

As on RunPod (real-hosts.md §4; api-reference-v2/openapi.json in runpod/docs):

* the create body is validated like `CreatePodRequest` (unknown fields → 422; `mounts` holds
  at most one of `persistent{size >= 10, path}` / `network[{volumeId, path}]`);
* the pod is a container of its image: no Docker, no systemd; sshd runs only when the image
  honours `PUBLIC_KEY` (`axolotlai/axolotl-cloud*`, `runpod/base`, `runpod/pytorch`); for any
  other image the pod runs and `ssh.direct` names a port where nothing answers;
* those images' entrypoints dump their environment to `/etc/rp_environment`, which a
  non-interactive SSH command does not source; the volume is mounted at its `path` (over
  `/workspace` it hides the image's `/workspace/axolotl*`);
* `GET /catalog/gpus` takes the query parameters of `listGpuTypes`: `include=AVAILABILITY`
  needs `product` (400 without; `product`, `count`, `cloud`, `minCudaVersion`,
  `cudaVersions` without `include` are 400 too), `count` (integer >= 1, default 1) and
  `cloud` (SECURE|COMMUNITY, default SECURE) scope `availability`, `dataCenters` and
  `cudaVersions` to what one pod of that many GPUs can get in that cloud, and a malformed
  value is a 422. `maxCount` is the largest machine's GPU count (a ceiling, never stock): a
  row's free GPUs per cloud are its `_stock` (test-only, never served; default `maxCount`);
* a create whose `gpu.count` that cloud cannot place now (over `_stock` or `maxCount`, or a
  cloud the GPU is not sold in) is a 400 with RunPod's "no capacity" detail: "400 covers
  both 'your request breaks a rule' and 'no capacity' ... only a human-readable `detail`"
  (openapi `createPod` description).
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from .serve import Served

if TYPE_CHECKING:
    from .hosts import HostBackend


@dataclass
class Recorded:
    """One request as the emulator saw it (the Authorization header is left out)."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]
    authorized: bool
    status: int = 0


@dataclass
class Fault:
    """Answer the next `count` matching requests with `status` (RFC 9457 body)."""

    status: int
    count: int = 1
    method: str | None = None
    path: str | None = None  # exact path, or a prefix ending in "/"
    retry_after: str | None = None
    title: str = ""
    detail: str = ""
    # Only for POST /pods: make the pod anyway, then answer with the fault (a lost response).
    create_anyway: bool = False
    reset_s: float = 1.0  # on 429: the `RateLimit` header's t= (seconds to the window reset)

    def matches(self, method: str, path: str) -> bool:
        if self.method and self.method != method:
            return False
        if self.path is None:
            return True
        return path == self.path or (self.path.endswith("/") and path.startswith(self.path))


# Images whose entrypoint starts sshd from PUBLIC_KEY and dumps the environment to
# /etc/rp_environment (axolotl cloud-entrypoint.sh; runpod/containers start.sh).
SSH_IMAGES = re.compile(r"(?:docker\.io/)?"
                        r"(?:axolotlai/axolotl-cloud[a-z-]*|runpod/(?:base|pytorch))[:@].+")
CREATE_FIELDS = {"name", "image", "gpu", "cpu", "cloud", "dataCenterIds", "disk", "ports",
                 "env", "mounts", "startSsh", "startJupyter", "templateId", "args", "registry",
                 "globalNetworking"}

TITLES = {400: "Bad Request", 401: "Unauthorized", 402: "Payment Required", 403: "Forbidden",
          404: "Not Found", 422: "Unprocessable Entity", 429: "Too Many Requests",
          500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass
class _Pod:
    doc: dict[str, Any]
    created: float
    gets: int = 0
    ssh: dict[str, Any] | None = None
    frozen: bool = False  # status set by the test (exit/error): no more progression
    host: bool = False  # a machine was booted for it through `hosts`


@dataclass
class RunPodEmulator(Served):
    """The emulator. `running_after_gets` GETs of a pod (or `running_after_s` seconds) take it
    PROVISIONING → STARTING → RUNNING; `ssh.direct` appears when RUNNING with 22/tcp."""

    api_key: str = "test-runpod-key"
    gpus: list[dict[str, Any]] = field(default_factory=list)
    running_after_gets: int = 2
    running_after_s: float | None = None
    ssh_host: str = "127.0.0.1"
    rate_limit: int = 1000  # requests per window, reported in RateLimit headers
    requests: list[Recorded] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    hosts: HostBackend | None = None  # real machines for the pods (see the module doc)

    def __post_init__(self) -> None:
        self._pods: dict[str, _Pod] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    # -- lifecycle ----------------------------------------------------------------------

    METHODS = ("GET", "POST", "DELETE", "PUT", "PATCH")

    def serve(self, h: BaseHTTPRequestHandler) -> None:
        """Record the request, check its key, answer with `handle`'s status and document."""
        parts = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        authorized = h.headers.get("Authorization") == f"Bearer {self.api_key}"
        record = Recorded(
            method=h.command, path=parts.path, query=parse_qs(parts.query), body=body,
            headers={k.lower(): v for k, v in h.headers.items()
                     if k.lower() != "authorization"},
            authorized=authorized,
        )
        with self._lock:
            self.requests.append(record)
            used = len(self.requests)
        raw = self.send_raw(h, parts.path) if authorized else None
        if raw is not None:  # a hostile answer (`answer_next`)
            record.status = raw
            return
        extra: dict[str, str]
        if not authorized:
            status, doc, extra = 401, problem(401, "Unauthorized",
                                              "missing or invalid bearer token"), {}
        else:
            status, doc, extra = self.handle(h.command, parts.path, record.query, body)
        record.status = status
        payload = b"" if doc is None else json.dumps(doc).encode()
        h.send_response(status)
        if doc is not None:
            ctype = "application/problem+json" if status >= 400 else "application/json"
            h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(payload)))
        remaining = max(0, self.rate_limit - used % max(1, self.rate_limit))
        h.send_header("RateLimit-Policy", f'"default";q={self.rate_limit};w=60')
        extra.setdefault("RateLimit", f'"default";r={remaining};t=60')
        for name, value in extra.items():
            h.send_header(name, value)
        h.end_headers()
        if payload:
            h.wfile.write(payload)


    @property
    def url(self) -> str:
        """Base URL, the equivalent of https://api.runpod.io/v2."""
        return f"{self.served_url}/v2"

    # -- test controls ------------------------------------------------------------------

    def fail_next(self, status: int, count: int = 1, *, method: str | None = None,
                  path: str | None = None, retry_after: float | str | None = None,
                  title: str = "", detail: str = "", create_anyway: bool = False,
                  reset_s: float = 1.0) -> None:
        """Answer the next `count` requests (matching method/path) with `status`."""
        with self._lock:
            self.faults.append(Fault(status, count, method, path,
                                     None if retry_after is None else str(retry_after),
                                     title, detail, create_anyway, reset_s))

    def no_capacity_on_create(self, count: int = 1) -> None:
        """The next `count` POST /pods answer 400 "no capacity"."""
        self.fail_next(400, count, method="POST", path="/v2/pods", title="No capacity",
                       detail=NO_CAPACITY)

    def lose_next_create(self, status: int = 500) -> None:
        """The next POST /pods makes the pod but answers `status` (the response is lost)."""
        self.fail_next(status, 1, method="POST", path="/v2/pods", create_anyway=True)

    def add_pod(self, name: str, status: str = "RUNNING", **extra: Any) -> str:
        """Seed a pod (e.g. one that is not orch's); returns its id."""
        with self._lock:
            pod = self._make_pod({"name": name, "gpu": {"id": "NVIDIA GeForce RTX 4090",
                                                         "count": 1}, **extra})
            pod.doc["status"] = status
            pod.frozen = status != "PROVISIONING"
            return str(pod.doc["id"])

    def set_status(self, pod_id: str, status: str) -> None:
        """Force a pod's status (no more automatic progression)."""
        with self._lock:
            pod = self._pods[pod_id]
            pod.doc["status"] = status
            pod.frozen = True
            if status in ("EXITED", "TERMINATED"):
                pod.doc["cost"] = 0

    def exit_pod(self, pod_id: str) -> None:
        """Simulate an unexpected stop: the pod is EXITED, costs 0, loses its SSH endpoint.

        With `hosts`, the pod's host powers off too.
        """
        with self._lock:
            self.set_status(pod_id, "EXITED")
            self._stop_host(self._pods[pod_id])

    def preempt(self, pod_id: str) -> None:
        """Interrupt the pod (host maintenance, reclaimed capacity): RunPod shows it EXITED,
        cost 0, no `ssh.direct`, which the adapter maps to INTERRUPTED; its host powers off."""
        self.exit_pod(pod_id)

    def set_ssh(self, pod_id: str, host: str, port: int, username: str = "root") -> None:
        """The `ssh.direct` endpoint the pod reports once RUNNING."""
        with self._lock:
            self._pods[pod_id].ssh = {"host": host, "port": port, "username": username}

    def pod(self, pod_id: str) -> dict[str, Any]:
        """A copy of the pod's document as the API would show it (without progressing it)."""
        with self._lock:
            return json.loads(json.dumps(self._view(self._pods[pod_id])))

    @property
    def pod_ids(self) -> list[str]:
        """Ids of the pods that exist."""
        with self._lock:
            return list(self._pods)

    def calls(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        """Recorded requests, optionally filtered by method and exact path."""
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method)
                    and (path is None or r.path == path)]

    # -- behaviour ----------------------------------------------------------------------

    def _make_pod(self, body: dict[str, Any]) -> _Pod:
        pod_id = f"pod{next(self._ids):04d}x"
        gpu = dict(body.get("gpu") or {})
        price = self._price(gpu.get("id"), body.get("cloud", "SECURE"))
        count = int(gpu.get("count") or 1)
        doc = {
            "id": pod_id, "name": body.get("name"), "image": body.get("image"),
            "status": "PROVISIONING", "cloud": body.get("cloud", "SECURE"),
            "gpu": {"id": gpu.get("id"), "count": count},
            "cost": float(price * count) if price is not None else 0.0,
            "disk": body.get("disk"), "ports": list(body.get("ports") or []),
            "env": dict(body.get("env") or {}), "mounts": dict(body.get("mounts") or {}),
            "createdAt": time.time(),
        }
        pod = _Pod(doc, time.monotonic(), ssh={"host": self.ssh_host,
                                                 "port": 20000 + len(self._pods),
                                                 "username": "root"})
        self._pods[pod_id] = pod
        self._boot_host(pod)
        return pod

    def _boot_host(self, pod: _Pod) -> None:
        """With `hosts` and a `PUBLIC_KEY`: boot the pod's machine now (SSH shows when RUNNING).

        Only images that honour `PUBLIC_KEY` start sshd: for any other image the pod runs,
        but its published 22/tcp leads to a port where nothing listens.
        """
        key = str(pod.doc["env"].get("PUBLIC_KEY") or "").strip()
        if self.hosts is None or not key:
            return
        image = str(pod.doc.get("image") or "")
        if not SSH_IMAGES.fullmatch(image):
            pod.ssh = {"host": self.ssh_host, "port": _closed_port(), "username": "root"}
            return
        persistent = (pod.doc.get("mounts") or {}).get("persistent") or {}
        mount = persistent.get("path")
        container: dict[str, object] = {
            "container_image": image, "volume_mount": mount, "nvme_mount": mount,
            "persisted_env": ("/etc/rp_environment",)}
        if persistent.get("size"):  # the volume is as large as the create asked (GB)
            container["disk_total_bytes"] = int(persistent["size"]) * 10**9
        try:
            host, port, user = self.hosts.start(str(pod.doc["id"]), key,
                                                str(pod.doc["gpu"]["id"]),
                                                int(pod.doc["gpu"]["count"]), container)
        except Exception:  # noqa: BLE001 - the machine failed: the pod errors
            pod.doc["status"] = "ERROR"
            pod.frozen = True
            return
        pod.host = True
        pod.ssh = {"host": host, "port": port, "username": user}

    def _stop_host(self, pod: _Pod) -> None:
        if self.hosts is not None and pod.host:
            self.hosts.stop(str(pod.doc["id"]))

    def _price(self, gpu_id: Any, cloud: str) -> float | None:
        for row in self.gpus:
            if row.get("id") == gpu_id:
                value = (row.get("price") or {}).get(str(cloud).lower())
                return None if value is None else float(value)
        return None

    def _progress(self, pod: _Pod) -> None:
        if pod.frozen:
            return
        pod.gets += 1
        if self.running_after_s is not None:
            elapsed = time.monotonic() - pod.created
            done, half = elapsed >= self.running_after_s, elapsed >= self.running_after_s / 2
        else:
            done = pod.gets >= self.running_after_gets
            half = pod.gets >= max(1, self.running_after_gets // 2)
        pod.doc["status"] = "RUNNING" if done else "STARTING" if half else "PROVISIONING"

    def _view(self, pod: _Pod) -> dict[str, Any]:
        doc = dict(pod.doc)
        running = doc["status"] == "RUNNING"
        exposed = running and "22/tcp" in doc.get("ports", []) and pod.ssh is not None
        direct = None
        if exposed and pod.ssh is not None:
            direct = {**pod.ssh, "command": f"ssh {pod.ssh['username']}@{pod.ssh['host']} "
                                            f"-p {pod.ssh['port']}"}
        # The proxy carries an interactive shell only (no SFTP, no exec): never usable by orch.
        token = f"{doc['id']}-64411eb2"
        proxy = {"host": "ssh.runpod.io", "port": 22, "username": token,
                 "command": f"ssh {token}@ssh.runpod.io"} if running else None
        doc["ssh"] = {"direct": direct, "proxy": proxy}
        doc["runtime"] = {"uptime": 1, "ports": [
            {"private": 22, "public": direct["port"], "type": "tcp", "ip": direct["host"]},
        ] if direct else []} if running else None
        return doc

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: Any) -> tuple[int, Any, dict[str, str]]:
        """Route one authorized request: (status, JSON body or None, extra headers)."""
        with self._lock:
            for fault in self.faults:
                if fault.count > 0 and fault.matches(method, path):
                    fault.count -= 1
                    if fault.create_anyway and method == "POST" and path == "/v2/pods":
                        self._make_pod(body if isinstance(body, dict) else {})
                    headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                    if fault.status == 429:
                        headers["RateLimit"] = f'"default";r=0;t={fault.reset_s:g}'
                    return fault.status, problem(fault.status, fault.title,
                                                 fault.detail or "injected fault"), headers
            if method == "GET" and path == "/v2/catalog/gpus":
                return self._catalog(query)
            if method == "POST" and path == "/v2/pods":
                return self._create(body)
            if method == "GET" and path == "/v2/pods":
                return 200, {"pods": [self._view(p) for p in self._pods.values()]}, {}
            if path.startswith("/v2/pods/"):
                pod_id = path.removeprefix("/v2/pods/")
                pod = self._pods.get(pod_id)
                if pod is None:
                    return 404, problem(404, "Not Found", f"pod {pod_id} not found"), {}
                if method == "GET":
                    self._progress(pod)
                    return 200, self._view(pod), {}
                if method == "DELETE":
                    del self._pods[pod_id]
                    self._stop_host(pod)
                    return 204, None, {}
            return 404, problem(404, "Not Found", f"no route {method} {path}"), {}

    def _catalog(self, query: dict[str, list[str]]) -> tuple[int, Any, dict[str, str]]:
        """`listGpuTypes`, its query checked as the v2 API checks it (module docstring)."""
        refused = _catalog_query_problem(query)
        if refused is not None:
            return refused[0], problem(refused[0], detail=refused[1]), {}
        with_availability = "include" in query
        minimum = (query.get("minCudaVersion") or [None])[0]
        cloud = (query.get("cloud") or ["SECURE"])[0]
        count = int((query.get("count") or ["1"])[0])
        rows = []
        for stored in self.gpus:
            row = {k: v for k, v in json.loads(json.dumps(stored)).items()
                   if not k.startswith("_")}
            if with_availability:
                # Availability is scoped to the cloud, the count and the CUDA floor.
                placeable = _placeable(stored, cloud, count)
                row["cudaVersions"] = [{**v, "available": v["available"] and placeable}
                                       for v in _cuda_versions(row, minimum)]
                if not any(v["available"] for v in row["cudaVersions"]):
                    row["availability"] = "NONE"
                    row.pop("dataCenters", None)
            else:
                for key in ("cudaVersions", "availability", "dataCenters"):
                    row.pop(key, None)
            rows.append(row)
        return 200, {"gpus": rows}, {}

    def _create(self, body: Any) -> tuple[int, Any, dict[str, str]]:
        if not isinstance(body, dict):
            return 422, problem(422, "Unprocessable Entity", "body must be a JSON object"), {}
        errors = [{"field": f, "message": "required"} for f in ("name", "image", "gpu")
                  if not body.get(f)]
        errors += [{"field": f, "message": "unknown field"} for f in sorted(body)
                   if f not in CREATE_FIELDS]
        mounts = body.get("mounts")
        if mounts is not None:
            if not isinstance(mounts, dict) or set(mounts) - {"persistent", "network"}:
                errors.append({"field": "mounts", "message": "only persistent or network"})
            elif "persistent" in mounts and "network" in mounts:
                return 400, problem(400, "Bad Request",
                                    "mounts.persistent and mounts.network are exclusive"), {}
            else:
                persistent = mounts.get("persistent")
                if persistent is not None and not (
                        isinstance(persistent, dict) and set(persistent) == {"size", "path"}
                        and isinstance(persistent["size"], int) and persistent["size"] >= 10
                        and str(persistent["path"]).startswith("/")):
                    errors.append({"field": "mounts.persistent",
                                   "message": "size (integer >= 10) and path are required"})
        if body.get("cloud", "SECURE") not in ("SECURE", "COMMUNITY"):
            errors.append({"field": "cloud", "message": "must be SECURE or COMMUNITY"})
        if errors:
            return 422, problem(422, "Unprocessable Entity", "validation failed", errors), {}
        gpu_id = (body.get("gpu") or {}).get("id")
        row = next((r for r in self.gpus if r.get("id") == gpu_id), None)
        if row is None:
            return 400, problem(400, "Bad Request", f"unknown GPU type {gpu_id}"), {}
        cloud, count = body.get("cloud", "SECURE"), (body.get("gpu") or {}).get("count", 1)
        if not isinstance(count, int) or count < 1:
            return 422, problem(422, "Unprocessable Entity", "validation failed",
                                [{"field": "gpu.count", "message": "integer >= 1"}]), {}
        if not _placeable(row, cloud, count):
            # maxCount is a ceiling, not stock: this cloud has no machine with that many free.
            return 400, problem(400, "No capacity", NO_CAPACITY), {}
        wanted = (body.get("gpu") or {}).get("minCudaVersion")
        if wanted is not None and not _cuda_versions(row, str(wanted), available_only=True):
            # No free machine of this type has a driver that new: RunPod's "no capacity".
            return 400, problem(400, "No capacity", NO_CAPACITY), {}
        pod = self._make_pod(body)
        return 201, self._view(pod), {}


NO_CAPACITY = ("There are no longer any instances available with the requested "
               "specifications. Please refresh and try again.")
# The CUDA versions a GPU row's machines offer when the test gives none (`cudaVersions`,
# returned with include=AVAILABILITY; api-reference-v2/openapi.json, GpuType).
DEFAULT_CUDA_VERSIONS = [{"version": "13.0", "available": True}]


def _placeable(row: dict[str, Any], cloud: str, count: int) -> bool:
    """Whether one pod of `count` GPUs of `row` can be created in `cloud` now: sold there,
    within `maxCount` (the largest machine) and within `_stock` (free GPUs on one machine)."""
    key = str(cloud).lower()
    ceiling = int((row.get("maxCount") or {}).get(key) or 0)
    stock = (row.get("_stock") or {}).get(key, ceiling)
    return row.get(key) is not False and count <= ceiling and count <= int(stock)


def _catalog_query_problem(query: dict[str, list[str]]) -> tuple[int, str] | None:
    """(status, detail) when `listGpuTypes` refuses the query (openapi parameters
    CatalogIncludeParam, GpuProductFilter, GpuCountFilter, GpuCloudFilter,
    MinCudaVersionFilter, CudaVersionsFilter); None when it is accepted."""
    include = query.get("include")
    if include is not None and include != ["AVAILABILITY"]:
        return 422, "include: the only supported value is AVAILABILITY"
    if include is None:
        scoped = [k for k in ("product", "count", "cloud", "minCudaVersion", "cudaVersions")
                  if k in query]
        if scoped:
            return 400, f"{scoped[0]} is valid only with include=AVAILABILITY"
        return None
    if "product" not in query:
        return 400, "product is required with include=AVAILABILITY"
    products = query["product"][0].split(",")
    if not all(p in ("POD", "CLUSTER", "SERVERLESS") for p in products):
        return 422, "product: must be POD, CLUSTER or SERVERLESS"
    count = (query.get("count") or ["1"])[0]
    if not count.isdigit() or int(count) < 1:
        return 422, "count: must be an integer >= 1"
    if (query.get("cloud") or ["SECURE"])[0] not in ("SECURE", "COMMUNITY"):
        return 422, "cloud: must be SECURE or COMMUNITY"
    if "minCudaVersion" in query and "cudaVersions" in query:
        return 400, "minCudaVersion and cudaVersions are mutually exclusive"
    minimum = (query.get("minCudaVersion") or ["0"])[0]
    if not re.fullmatch(r"\d+(\.\d+)?", minimum):
        return 422, "minCudaVersion: must be major or major.minor"
    return None


def _cuda(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _cuda_versions(row: dict[str, Any], minimum: str | None,
                   available_only: bool = False) -> list[dict[str, Any]]:
    """The row's cudaVersions at or above `minimum` (compared numerically, as RunPod does)."""
    versions = row.get("cudaVersions", DEFAULT_CUDA_VERSIONS)
    return [v for v in versions
            if (minimum is None or _cuda(str(v["version"])) >= _cuda(minimum))
            and (v.get("available") or not available_only)]


def problem(status: int, title: str = "", detail: str = "",
            errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An RFC 9457 problem document."""
    doc: dict[str, Any] = {"title": title or TITLES.get(status, "Error"), "status": status,
                           "detail": detail}
    if errors:
        doc["errors"] = errors
    return doc


def _closed_port() -> int:
    """A loopback port where nothing listens (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
