"""History queries, cost rollups and advise inputs over the orch database.

Read-only and light: everything here reads through `historyread` (sqlite3 on a `mode=ro`
URI on SQLite, no SQLModel/SQLAlchemy import; the store's engine elsewhere) with the same
SQL. Aggregation happens in SQL so 100,000 jobs cost the same Python work as ten; only the
few grouped rows come back. Money stays integer micro-dollars until display (Invariant 7):
durations are summed as integer seconds and priced with Decimal (`orchestrator.core.money`).
`orch sql` lives in `adhocsql`, the readers and time parsing in `historyread`; their names
are re-exported here for the CLI modules that import them from `history`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from orchestrator.core.jobstatus import JOB_STATUSES
from orchestrator.core.money import (
    METERED,
    accrued_micros,
    cheapest_hourly,
    dollars,
    hourly_cost_micros,
    per_gpu_hour,
)
from orchestrator.core.sizing import LAYOUTS, strategy_named
from orchestrator.core.states import EventKind
from orchestrator.records.adhocsql import SqlResult, run_sql, single_statement
from orchestrator.records.columns import event_data
from orchestrator.records.historyread import (
    EngineReader,
    HistoryError,
    QueryError,
    Reader,
    ReadOnlyError,
    SqliteReader,
    open_reader,
    parse_stored,
    parse_when,
    to_text,
)
from providers import catalog

SORT_KEYS: tuple[str, ...] = ("created", "cost", "duration", "status")
TIME_BUCKETS: tuple[str, ...] = ("day", "week", "month")
DIMENSIONS: tuple[str, ...] = ("provider", "gpu", "sweep", "method")


def _seconds(dialect: str, start: str, end: str) -> str:
    """SQL for the whole seconds from `start` to `end` (stored-format time expressions)."""
    if dialect == "sqlite":
        return f"CAST(round((julianday({end}) - julianday({start})) * 86400) AS INTEGER)"
    return (f"CAST(round(EXTRACT(EPOCH FROM (CAST({end} AS timestamptz) - "
            f"CAST({start} AS timestamptz)))) AS BIGINT)")


def _greatest(dialect: str, *args: str) -> str:
    # SQLite's multi-argument max()/min() are its GREATEST/LEAST.
    return f"{'max' if dialect == 'sqlite' else 'GREATEST'}({', '.join(args)})"


def _least(dialect: str, *args: str) -> str:
    return f"{'min' if dialect == 'sqlite' else 'LEAST'}({', '.join(args)})"


def _in(column: str, name: str, values: Sequence[str], params: dict[str, Any]) -> str:
    """`column IN (:name0, :name1, ...)`, binding each value (never formatted into SQL)."""
    keys = []
    for i, v in enumerate(values):
        params[f"{name}{i}"] = v
        keys.append(f":{name}{i}")
    return f"{column} IN ({', '.join(keys)})"


def _like_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# --- history -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """Which jobs: each tuple is "any of these"; empty means no restriction."""

    statuses: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ()  # as planned; old names (fsdp, ...) mean their new ones
    sweep: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    ids: tuple[str, ...] = ()  # these jobs only (a report of one job or one sweep)


@dataclass(frozen=True)
class HistoryRow:
    """One job as `orch history` shows it."""

    id: str
    name: str
    status: str
    method: str
    model: str
    provider: str | None
    gpu: str | None
    gpu_count: int | None
    spot: bool | None
    cost_micros: int
    amortised_micros: int
    duration_s: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # Where each artifact is (the job's last `delivered` event: what, where, location).
    delivered: tuple[dict[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: money as exact decimal strings, times as UTC ISO text."""
        def iso(t: datetime | None) -> str | None:
            return None if t is None else to_text(t)

        return {
            "job_id": self.id, "name": self.name, "status": self.status, "method": self.method,
            "model": self.model, "provider": self.provider, "gpu": self.gpu,
            "gpu_count": self.gpu_count, "spot": self.spot, "cost": str(dollars(self.cost_micros)),
            "amortised": str(dollars(self.amortised_micros)), "duration_s": self.duration_s,
            "created_at": iso(self.created_at), "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at), "delivered": list(self.delivered),
        }


def gpu_names(value: str) -> list[str]:
    """The stored GPU names a user's spelling may mean (`H100` → both H100 variants)."""
    # Start-up laziness: the catalog is imported only on the path that uses it.
    return sorted({value, *catalog.resolve_gpu(value)})


def _price_of(gpu: str, prices: Mapping[str, Decimal]) -> Decimal | None:
    """The price of a stored GPU name (canonical, or an unambiguous alias) in `prices`."""
    if gpu in prices:
        return prices[gpu]
    return prices.get(catalog.canonical_name(gpu))


def planned_layout(dialect: str) -> str:
    """SQL for the layout a job was planned with (`$.placement.strategy`, docs/schema.md)."""
    if dialect == "sqlite":
        return "json_extract(j.placement_json, '$.placement.strategy')"
    return "(j.placement_json::json #>> '{placement,strategy}')"


def layout_names(values: Sequence[str]) -> list[str]:
    """The stored layout names `--layout` values mean; the names before migration 0007
    (`fsdp`, `fsdp+offload`, `offload`) are taken as what they were renamed to."""
    names = set()
    for v in values:
        try:
            names.add(strategy_named(v).value)
        except ValueError:
            raise HistoryError(f"--layout {v}: use one of {', '.join(LAYOUTS[1:])}") from None
    return sorted(names)


def _where(reader: Reader, f: Filters, params: dict[str, Any]) -> list[str]:
    """WHERE terms on `job j` for the filters (binding every value into `params`)."""
    terms: list[str] = []
    if f.statuses:
        bad = [s for s in f.statuses if s not in JOB_STATUSES]
        if bad:
            raise HistoryError(f"--status {bad[0]}: use one of {', '.join(JOB_STATUSES)}")
        terms.append(_in("j.status", "st", f.statuses, params))
    if f.ids:
        terms.append(_in("j.id", "id", f.ids, params))
    if f.methods:
        terms.append(_in("j.method", "me", f.methods, params))
    if f.providers:
        terms.append(_in("j.provider", "pr", f.providers, params))
    if f.gpus:
        names = sorted({n for g in f.gpus for n in gpu_names(g)})
        terms.append(_in("j.gpu", "gp", names, params))
    if f.layouts:
        terms.append(_in(planned_layout(reader.dialect), "ly", layout_names(f.layouts), params))
    if f.models:
        # The full repo id, or just its name after the org (`Qwen2.5-7B`).
        ors = []
        for i, m in enumerate(f.models):
            params[f"mo{i}"], params[f"ms{i}"] = m, "%/" + _like_escape(m)
            ors.append(f"j.base_model = :mo{i} OR j.base_model LIKE :ms{i} ESCAPE '\\'")
        terms.append("(" + " OR ".join(ors) + ")")
    if f.sweep is not None:
        params["sw"] = f.sweep
        found = reader.rows("SELECT id FROM sweep WHERE id = :sw OR name = :sw", params)
        if not found:
            raise HistoryError(f"--sweep {f.sweep}: no sweep has that name or id; see the "
                               "names with `orch sql \"SELECT id, name FROM sweep\"`")
        terms.append(_in("j.sweep_id", "si", [r[0] for r in found], params))
    if f.since is not None and f.until is not None and f.since >= f.until:
        raise HistoryError(f"--since {to_text(f.since)} is not before --until "
                           f"{to_text(f.until)}: swap them or widen the range")
    if f.since is not None:
        params["since"] = to_text(f.since)
        terms.append("j.created_at >= :since")
    if f.until is not None:
        params["until"] = to_text(f.until)
        terms.append("j.created_at < :until")
    return terms


# More rows than any history holds; beyond it SQLite cannot take the number.
MAX_LIMIT = 1_000_000_000


def history(reader: Reader | None, filters: Filters, *, sort: str = "created",
            descending: bool = True, limit: int | None = 50,
            now: datetime | None = None) -> list[HistoryRow]:
    """The jobs matching `filters`, sorted by `sort`, at most `limit` (None: all)."""
    if sort not in SORT_KEYS:
        raise HistoryError(f"--sort {sort}: use one of {', '.join(SORT_KEYS)}")
    if limit is not None and not 0 <= limit <= MAX_LIMIT:
        raise HistoryError(f"--limit {limit}: give a number from 0 (no limit) to {MAX_LIMIT}")
    if reader is None:
        return []
    now = now or datetime.now(UTC)
    params: dict[str, Any] = {"now": to_text(now)}
    terms = _where(reader, filters, params)
    d = reader.dialect
    duration = (f"CASE WHEN j.started_at IS NULL THEN NULL ELSE "
                f"{_seconds(d, 'j.started_at', 'coalesce(j.finished_at, :now)')} END")
    key = {"created": "created_at", "cost": "cost_micros", "duration": "duration_s",
           "status": "status"}[sort]
    direction = "DESC" if descending else "ASC"
    # Jobs that never started have no duration: last either way, the same on both dialects.
    nulls = "CASE WHEN duration_s IS NULL THEN 1 ELSE 0 END, " if sort == "duration" else ""
    # A derived table, so ORDER BY may use duration_s in an expression: PostgreSQL (unlike
    # SQLite) resolves output-column aliases in ORDER BY only when they stand alone.
    sql = (f"SELECT * FROM (SELECT j.id, j.name, j.status, j.method, j.base_model, j.provider, "
           f"j.gpu, j.gpu_count, j.interruptible, j.cost_micros, j.amortised_micros, {duration} "
           f"AS duration_s, j.created_at, j.started_at, j.finished_at FROM job j"
           + (" WHERE " + " AND ".join(terms) if terms else "")
           + f") h ORDER BY {nulls}{key} {direction}, id {direction}")
    if limit:
        params["limit"] = limit
        sql += " LIMIT :limit"
    out = []
    for r in reader.rows(sql, params):
        created = parse_stored(r[12])
        assert created is not None  # NOT NULL column
        out.append(HistoryRow(
            id=r[0], name=r[1], status=r[2], method=r[3], model=r[4], provider=r[5], gpu=r[6],
            gpu_count=r[7], spot=None if r[8] is None else bool(r[8]),
            cost_micros=int(r[9] or 0), amortised_micros=int(r[10] or 0),
            duration_s=None if r[11] is None else max(0, int(r[11])), created_at=created,
            started_at=parse_stored(r[13]), finished_at=parse_stored(r[14])))
    return _with_deliveries(reader, out)


def _with_deliveries(reader: Reader, rows: list[HistoryRow]) -> list[HistoryRow]:
    """`rows` with where each job's artifacts are: one query for the rows shown (their
    `delivered` events), never a subquery per job of the whole table."""
    if not rows:
        return rows
    params = {f"j{i}": r.id for i, r in enumerate(rows)}
    names = ", ".join(f":{k}" for k in params)
    found: dict[str, tuple[dict[str, str], ...]] = {}
    for job_id, data in reader.rows(f"SELECT job_id, data_json FROM event WHERE kind = "
                                    f":delivered AND job_id IN ({names}) ORDER BY id",
                                    {**params, "delivered": EventKind.DELIVERED.value}):
        found[job_id] = tuple(p.as_stored() for p in event_data(data).places or ())
    return [replace(r, delivered=found[r.id]) if r.id in found else r for r in rows]


# --- cost rollups ------------------------------------------------------------------------


@dataclass
class CostRow:
    """One group of `orch cost`: a time bucket and/or a dimension value."""

    bucket: str | None
    key: str | None
    jobs: int = 0
    gpu_seconds: int = 0
    cost_micros: int = 0
    amortised_micros: int = 0
    # Spot savings vs the on-demand catalog price; None when no spot hour could be priced.
    savings_micros: int | None = None
    spot_gpu_seconds: int = 0
    unpriced_gpus: set[str] = field(default_factory=set)

    @property
    def gpu_hours(self) -> Decimal:
        """GPU-hours, to 0.01 h."""
        return (Decimal(self.gpu_seconds) / 3600).quantize(Decimal("0.01"))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (money as exact decimal strings)."""
        return {
            "bucket": self.bucket, "key": self.key, "jobs": self.jobs,
            "gpu_hours": str(self.gpu_hours), "gpu_seconds": self.gpu_seconds,
            "cost": str(dollars(self.cost_micros)),
            "amortised": str(dollars(self.amortised_micros)),
            "spot_savings": None if self.savings_micros is None
            else str(dollars(self.savings_micros)),
            "spot_gpu_hours": str((Decimal(self.spot_gpu_seconds) / 3600).quantize(
                Decimal("0.01"))), "spot_gpu_seconds": self.spot_gpu_seconds,
            "spot_unpriced_gpus": sorted(self.unpriced_gpus),
        }


def on_demand_prices() -> dict[str, Decimal]:
    """Cheapest on-demand metered catalog price per GPU-hour, by canonical GPU name."""
    return {gpu: per_gpu_hour(o) for gpu, o in cheapest_hourly(catalog.load().offers).items()
            if not o.interruptible}


def _bucket(day: str, by: str | None) -> str | None:
    if by is None:
        return None
    if by == "day":
        return day
    if by == "month":
        return day[:7]
    year, week, _ = date.fromisoformat(day).isocalendar()
    return f"{year}-W{week:02d}"


def split_by(values: Iterable[str]) -> tuple[str | None, str | None]:
    """`--by` values → (time bucket, dimension): at most one of each."""
    when: str | None = None
    dim: str | None = None
    for raw in values:
        v = raw.strip().lower()
        if v in TIME_BUCKETS:
            if when is not None:
                raise HistoryError(f"--by {when} --by {v}: give at most one of "
                                   f"{', '.join(TIME_BUCKETS)}")
            when = v
        elif v in DIMENSIONS:
            if dim is not None:
                raise HistoryError(f"--by {dim} --by {v}: give at most one of "
                                   f"{', '.join(DIMENSIONS)}")
            dim = v
        else:
            raise HistoryError(f"--by {raw}: use {', '.join(TIME_BUCKETS)} and/or "
                               f"{', '.join(DIMENSIONS)} (e.g. --by month --by provider)")
    return when, dim


def _rollup_sql(reader: Reader, dim: str | None, filters: Filters,
                params: dict[str, Any]) -> tuple[str, str]:
    """The two grouped queries of `cost_rollup`: jobs per (day, key), instances per
    (day, key, GPU, spot); `params` gets their bound values."""
    terms = _where(reader, filters, params)
    where = " WHERE " + " AND ".join(terms) if terms else ""
    dim_sql = {None: "NULL", "provider": "j.provider", "gpu": "j.gpu", "method": "j.method",
               "sweep": "s.name"}[dim]
    join = " LEFT JOIN sweep s ON s.id = j.sweep_id" if dim == "sweep" else ""
    # Grouped by day in SQL (portable substr on the fixed-width text); weeks and months are
    # rolled up here from at most a few hundred rows per year.
    # PostgreSQL refuses a constant in GROUP BY ("non-integer constant"): group by the
    # dimension only when there is one.
    group_dim = "" if dim is None else f", {dim_sql}"
    job_sql = (f"SELECT substr(j.created_at, 1, 10) AS day, {dim_sql} AS k, count(*), "
               f"sum(j.cost_micros), sum(j.amortised_micros) FROM job j{join}{where} "
               f"GROUP BY substr(j.created_at, 1, 10){group_dim}")
    d = reader.dialect
    secs = _greatest(d, "0", _seconds(d, "i.created_at", "coalesce(i.terminated_at, :now)"))
    inst_sql = (
        f"SELECT substr(j.created_at, 1, 10) AS day, {dim_sql} AS k, i.gpu, i.interruptible, "
        f"sum({secs} * i.gpu_count), "
        "sum(CASE WHEN i.terminated_at IS NULL THEN 0 ELSE i.cost_micros END), "
        f"sum(CASE WHEN i.terminated_at IS NULL THEN i.price_per_hour_micros * {secs} "
        f"ELSE 0 END) FROM instance i JOIN job j ON j.id = i.job_id{join}{where} "
        f"GROUP BY substr(j.created_at, 1, 10){group_dim}, i.gpu, i.interruptible")
    return job_sql, inst_sql


def cost_rollup(reader: Reader | None, *, when: str | None, dim: str | None,
                since: datetime | None = None, until: datetime | None = None,
                now: datetime | None = None,
                prices: Mapping[str, Decimal] | None = None,
                ids: Sequence[str] = ()) -> list[CostRow]:
    """Jobs, GPU-hours, cost, amortised rent and spot savings per bucket and/or dimension.

    Jobs fall in the bucket of their `created_at` (UTC; ISO weeks) and under their own
    provider/GPU/sweep/method; GPU-hours come from their instances (until now for those
    still open). Savings are per spot instance: its GPU-hours at the cheapest on-demand
    catalog price of that GPU minus what it was charged (its billed cost once terminated,
    price × elapsed time while open). `ids`: only these jobs (none: every job).
    """
    if when is not None and when not in TIME_BUCKETS:
        raise HistoryError(f"--by {when}: use one of {', '.join(TIME_BUCKETS)}")
    if dim is not None and dim not in DIMENSIONS:
        raise HistoryError(f"--by {dim}: use one of {', '.join(DIMENSIONS)}")
    if reader is None:
        return []
    now = now or datetime.now(UTC)
    prices = on_demand_prices() if prices is None else prices
    params: dict[str, Any] = {"now": to_text(now)}
    job_sql, inst_sql = _rollup_sql(reader, dim, Filters(since=since, until=until,
                                                         ids=tuple(ids)), params)
    groups: dict[tuple[str | None, str | None], CostRow] = {}

    def row(day: str, key: Any) -> CostRow:
        b = _bucket(day, when)
        k = None if key is None else str(key)
        if (b, k) not in groups:
            groups[b, k] = CostRow(b, k)
        return groups[b, k]

    for day, key, jobs, cost, amortised in reader.rows(job_sql, params):
        r = row(day, key)
        r.jobs += int(jobs)
        r.cost_micros += int(cost or 0)
        r.amortised_micros += int(amortised or 0)
    # One catalog look-up per GPU name, not per row: thousands of (day, GPU) rows share a
    # handful of names, and resolving an alias walks the catalog.
    gpu_prices: dict[str, Decimal | None] = {}
    for day, key, gpu, spot, gpu_secs, billed, open_micro_secs in reader.rows(inst_sql, params):
        r = row(day, key)
        gpu_secs = int(gpu_secs or 0)
        r.gpu_seconds += gpu_secs
        if not spot:
            continue
        r.spot_gpu_seconds += gpu_secs
        if gpu not in gpu_prices:
            gpu_prices[gpu] = _price_of(gpu, prices)
        price = gpu_prices[gpu]
        if price is None:
            r.unpriced_gpus.add(gpu)
            continue
        # price × GPU-seconds / 3600 and the open instances' accrued price × seconds / 3600,
        # each rounded once to a micro-dollar.
        would = hourly_cost_micros(price, gpu_secs)
        charged = int(billed or 0) + accrued_micros(int(open_micro_secs or 0))
        r.savings_micros = (r.savings_micros or 0) + would - charged
    return sorted(groups.values(), key=lambda r: (r.bucket or "", -r.cost_micros, r.key or ""))


def total(rows: Sequence[CostRow]) -> CostRow:
    """The sum of `rows` (savings None only when no row had any)."""
    t = CostRow("total", None)
    for r in rows:
        t.jobs += r.jobs
        t.gpu_seconds += r.gpu_seconds
        t.cost_micros += r.cost_micros
        t.amortised_micros += r.amortised_micros
        t.spot_gpu_seconds += r.spot_gpu_seconds
        t.unpriced_gpus |= r.unpriced_gpus
        if r.savings_micros is not None:
            t.savings_micros = (t.savings_micros or 0) + r.savings_micros
    return t



# --- advise inputs -----------------------------------------------------------------------


def _window_seconds(dialect: str) -> str:
    """SQL for the seconds of an instance's life (alias `i`) inside [:since, :now]."""
    start = _greatest(dialect, "i.created_at", ":since")
    end = _least(dialect, "coalesce(i.terminated_at, :now)", ":now")
    return _greatest(dialect, "0", _seconds(dialect, start, end))


def metered_usage(reader: Reader, since: datetime, now: datetime) -> list[tuple[str, int, int]]:
    """Per GPU: (gpu, GPU-seconds, charged micro-dollars) of metered instances in the window.

    Only the part of each instance's life inside [since, now] counts, at the price per hour
    it was rented at.
    """
    d = reader.dialect
    secs = _window_seconds(d)
    params: dict[str, Any] = {"since": to_text(since), "now": to_text(now)}
    billing = _in("i.billing", "bi", METERED, params)
    sql = (f"SELECT i.gpu, sum({secs} * i.gpu_count), sum({secs} * i.price_per_hour_micros) "
           f"FROM instance i WHERE {billing} AND i.created_at < :now AND "
           "(i.terminated_at IS NULL OR i.terminated_at > :since) GROUP BY i.gpu")
    out = []
    for gpu, gpu_secs, micro_secs in reader.rows(sql, params):
        out.append((str(gpu), int(gpu_secs or 0), accrued_micros(int(micro_secs or 0))))
    return out


def server_usage(reader: Reader, since: datetime,
                 now: datetime) -> list[tuple[str, str, int, int, int, int]]:
    """Per registered server: (name, gpu, gpu_count, monthly micros, used s, available s).

    Used = seconds jobs held it inside the window (its `dedicated` instance rows); available
    = the window, or less when the server was registered during it.
    """
    d = reader.dialect
    secs = _window_seconds(d)
    params = {"since": to_text(since), "now": to_text(now)}
    used = dict(reader.rows(
        f"SELECT i.provider_instance_id, sum({secs}) FROM instance i WHERE "
        "i.provider = 'dedicated' AND i.created_at < :now AND "
        "(i.terminated_at IS NULL OR i.terminated_at > :since) "
        "GROUP BY i.provider_instance_id", params))
    avail = _greatest(d, "0", _seconds(d, _greatest(d, "created_at", ":since"), ":now"))
    out = []
    for name, gpu, count, monthly, available in reader.rows(
            f"SELECT name, gpu, gpu_count, monthly_price_micros, {avail} FROM server "
            "ORDER BY name", params):
        used_s = min(int(used.get(name) or 0), int(available))
        out.append((name, gpu, int(count), int(monthly), used_s, int(available)))
    return out


# Re-exported: the CLI modules, exits.py and tests import these from `history`.
__all__ = [
    "DIMENSIONS", "JOB_STATUSES", "SORT_KEYS", "TIME_BUCKETS", "CostRow", "EngineReader",
    "Filters", "HistoryError", "HistoryRow", "QueryError", "ReadOnlyError", "Reader",
    "SqlResult", "SqliteReader", "cost_rollup", "dollars", "gpu_names", "history",
    "metered_usage", "on_demand_prices", "open_reader", "parse_stored", "parse_when", "run_sql",
    "server_usage", "single_statement", "split_by", "to_text", "total",
]
