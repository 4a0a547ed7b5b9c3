"""`orch sql`: one read-only query, refused unless it only reads (SQLite and others).

On SQLite the query runs on a `mode=ro` connection with an authorizer that denies every
statement kind but reads, and every function but the allow-listed built-ins (issue 23 §8:
`fts3_tokenizer('simple')` returned a native pointer, `load_extension` loads code); on other
databases in a READ ONLY transaction that is always rolled back. Every query is bounded:
`ORCH_SQL_TIMEOUT_S` seconds (default 30; SQLite: a progress handler interrupts it,
PostgreSQL: `statement_timeout`), `ORCH_SQL_MAX_ROWS` rows (default 10,000) and, on SQLite,
10 MB per string or blob (`SQLITE_LIMIT_LENGTH`), each with a message that says what to do.
Split from `history` (which re-exports `run_sql`, `single_statement`, `SqlResult`).
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.core.settings import settings
from orchestrator.records.historyread import (
    HistoryError,
    QueryError,
    ReadOnlyError,
    _ro_connect,
    sqlite_path,
)

# Statement kinds an ad-hoc query may use: reading tables and views, calling functions and
# recursive CTEs. Everything else (writes, DDL, PRAGMA, ATTACH, transactions) is denied.
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ,
                              sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE})


# The SQL functions a query may call: SQLite's built-in core, date, aggregate, window, math
# and JSON functions (sqlite.org/lang_corefunc.html, lang_datefunc.html, lang_aggfunc.html,
# windowfunctions.html, lang_mathfunc.html, json1.html), less those that reach outside the
# query (load_extension), hand out native pointers (fts3_tokenizer) or allocate at will
# (randomblob, zeroblob). Anything else (an extension's function, a future built-in) is
# refused until it is added here.
ALLOWED_FUNCTIONS = frozenset("""
    abs char coalesce concat concat_ws format glob hex ifnull iif instr length like
    likelihood likely lower ltrim max min nullif octet_length printf quote random replace
    round rtrim sign soundex sqlite_version substr substring trim typeof unhex unicode
    unlikely upper
    date time datetime julianday unixepoch strftime timediff
    avg count group_concat string_agg sum total
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value
    nth_value
    acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log
    log10 log2 mod pi pow power radians sin sinh sqrt tan tanh trunc
    json jsonb json_array json_array_length json_error_position json_extract jsonb_extract
    json_insert json_object json_patch json_pretty json_quote json_remove json_replace
    json_set json_type json_valid json_group_array json_group_object json_each json_tree
    -> ->>
""".split())
MAX_LENGTH = 10_000_000  # bytes per string or blob a query may build (SQLite)


def timeout_s() -> float:
    """Seconds one `orch sql` query may run: ORCH_SQL_TIMEOUT_S, default 30."""
    return settings().sql_timeout_s


def max_rows() -> int:
    """Rows one `orch sql` query may return: ORCH_SQL_MAX_ROWS, default 10,000."""
    return settings().sql_max_rows


class _Authorizer:
    """SQLite's authorizer callback: reads and allow-listed functions only; remembers the
    first function it refused, for the message."""

    def __init__(self) -> None:
        self.denied_function: str | None = None

    def __call__(self, action: int, _a: str | None, name: str | None, _db: str | None,
                 _trigger: str | None) -> int:
        if action == sqlite3.SQLITE_FUNCTION:
            if (name or "").lower() in ALLOWED_FUNCTIONS:
                return sqlite3.SQLITE_OK
            self.denied_function = self.denied_function or name
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _too_many_rows(limit: int) -> QueryError:
    return QueryError(f"the query returns more than {limit:,} rows: add a LIMIT, or "
                      "aggregate (GROUP BY); ORCH_SQL_MAX_ROWS raises the bound")


def _too_slow(limit: float) -> QueryError:
    return QueryError(f"the query ran longer than {limit:g}s and was stopped: narrow it (a "
                      "WHERE on an indexed column, a LIMIT, a recursive CTE that ends); "
                      "ORCH_SQL_TIMEOUT_S raises the bound")


def single_statement(sql: str) -> str:
    """`sql` without trailing semicolons; ReadOnlyError if it holds more than one statement.

    A small scanner that skips quoted text and comments. Conservative: a `;` inside a
    PostgreSQL dollar-quoted string is taken as a separator (refused, never run).
    """
    i, n, end = 0, len(sql), None
    while i < n:
        c = sql[i]
        if c in "'\"`":
            close = sql.find(c, i + 1)
            while close != -1 and sql[close + 1:close + 2] == c:  # doubled quote = escape
                close = sql.find(c, close + 2)
            i = n if close == -1 else close + 1
        elif sql.startswith("--", i):
            nl = sql.find("\n", i)
            i = n if nl == -1 else nl + 1
        elif sql.startswith("/*", i):
            close = sql.find("*/", i + 2)
            i = n if close == -1 else close + 2
        elif c == ";":
            end = i if end is None else end
            i += 1
        else:
            if end is not None and not c.isspace():
                raise ReadOnlyError("orch sql runs one statement at a time; remove everything "
                                    "after the first `;` (or run each query separately)")
            i += 1
    stripped = (sql if end is None else sql[:end]).strip()
    if not stripped:
        raise ReadOnlyError('orch sql needs a query, e.g. orch sql "SELECT count(*) FROM job"')
    return stripped


@dataclass(frozen=True)
class SqlResult:
    """Column names and rows of an ad-hoc query."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


def _refusal(sql: str, detail: str) -> ReadOnlyError:
    verb = sql.split(None, 1)[0].upper() if sql.split() else "?"
    return ReadOnlyError(
        f"orch sql is read-only: only SELECT queries (and WITH ... SELECT) run here; "
        f"this {verb} statement was refused ({detail}). Change data with orch commands "
        "(`orch cancel`, `orch servers remove`, ...)"
    )


# orch's tables and views, for the error of a query that names another
# (tests/test_newcomer_errors.py compares them with a freshly migrated database).
TABLES = ("job", "instance", "event", "metric", "sweep", "server", "price_observation",
          "throughput_observation", "warm_instance", "sweep_rung", "host_observation")
VIEWS = ("v_cost_per_month_provider", "v_best_run_per_sweep", "v_gpu_hours_per_model",
         "v_interruptions_per_provider")
WHAT_IS_THERE = (f"orch's tables: {', '.join(TABLES)}; views: {', '.join(VIEWS)} "
                 "(their columns: docs/schema.md)")


def _unknown_table(msg: str) -> str:
    """`msg`, plus what orch's database holds when the query named a table it lacks."""
    if "no such table" in msg or ("relation" in msg and "does not exist" in msg):
        return f"{msg}; {WHAT_IS_THERE}"
    return msg


def run_sql(url: str, sql: str) -> SqlResult:
    """Run one read-only query against the database at `url`.

    SQLite: a `mode=ro` connection with `PRAGMA query_only=ON` and an authorizer that allows
    only reads — three locks, any one of which refuses a write. In WAL mode the query reads
    one consistent snapshot and never blocks a worker's writes.
    """
    query = single_statement(sql)
    path = sqlite_path(url)
    if path is None and not url.startswith("sqlite"):
        return _run_sql_engine(url, query)
    if path is None or not path.exists():
        raise HistoryError(f"no orch database at {path or url} yet; it is created by the first "
                           "`orch submit` (or set ORCH_DB_URL to the database you mean)")
    try:
        con = _ro_connect(path)
    except sqlite3.Error as exc:
        raise HistoryError(f"cannot open {path} read-only: {exc}") from exc
    limit_s, limit_rows = timeout_s(), max_rows()
    try:
        authorizer = _Authorizer()
        con.set_authorizer(authorizer)
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_LENGTH)
        deadline = time.monotonic() + limit_s
        # Called every 10,000 virtual-machine steps; non-zero interrupts the statement.
        con.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            cur = con.execute(query)
            rows = cur.fetchmany(limit_rows + 1)
        except sqlite3.DatabaseError as exc:
            msg = str(exc)
            if msg == "interrupted":
                raise _too_slow(limit_s) from None
            if "not authorized" in msg and (denied := authorizer.denied_function):
                raise QueryError(f"orch sql does not run the function {denied}(): only "
                                 "SQLite's built-in core, date, aggregate, window, math and "
                                 "JSON functions are allowed (`orch sql --help`)") from None
            if any(s in msg for s in ("not authorized", "authorization denied", "readonly",
                                        "read-only")):
                raise _refusal(query, msg) from None
            if "no such table: v_" in msg:
                msg += ("; orch's views arrive with schema 0003: run any orch command that "
                        "opens the database (e.g. `orch jobs`) to upgrade it")
            else:
                msg = _unknown_table(msg)
            # A locked or unreadable database is not the query's fault.
            fault = (HistoryError if any(s in msg for s in ("locked", "busy", "disk", "malformed",
                                                            "unable to open", "table: v_"))
                     else QueryError)
            raise fault(f"query failed: {msg}") from None
        except (sqlite3.ProgrammingError, sqlite3.Warning) as exc:
            raise ReadOnlyError(f"orch sql runs one statement at a time ({exc})") from None
        columns = tuple(c[0] for c in cur.description or ())
        if not columns:
            raise _refusal(query, "it returns no rows")
        if len(rows) > limit_rows:
            raise _too_many_rows(limit_rows)
        return SqlResult(columns, rows)
    finally:
        con.close()


# Statements a read-only query may start with on a server database. The READ ONLY
# transaction is the lock; this list turns utility commands that PostgreSQL would run outside
# it or reject with a syntax error (VACUUM, SET, BEGIN, PRAGMA...) into one clear refusal.
_QUERY_KEYWORDS = ("select", "with", "values", "table", "explain", "show")


def _first_keyword(query: str) -> str:
    text = re.sub(r"(--[^\n]*\n?|/\*.*?\*/|\s|\()+", " ", query, flags=re.S).strip()
    return text.split(" ", 1)[0].lower() if text else ""


def _run_sql_engine(url: str, query: str) -> SqlResult:
    """PostgreSQL and others: one statement in a READ ONLY transaction, always rolled back."""
    # Start-up laziness: SQLAlchemy is imported only on the path that uses it.
    from sqlalchemy.exc import DBAPIError

    # Imported here, not at the top: the store pulls in SQLAlchemy, which SQLite never needs.
    from orchestrator.records.store import StoreError, open_store

    if _first_keyword(query) not in _QUERY_KEYWORDS:
        raise _refusal(query, "only queries (SELECT, WITH, VALUES, TABLE, EXPLAIN, SHOW) run "
                       "on a read-only connection")
    try:
        store = open_store(url)
    except StoreError as exc:
        raise HistoryError(str(exc)) from exc
    limit_s, limit_rows = timeout_s(), max_rows()
    try:
        with store.engine.connect() as conn:
            if store.engine.dialect.name == "postgresql":
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                # LOCAL: for this transaction only (it is always rolled back).
                conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(limit_s * 1000)}")
            try:
                result = conn.exec_driver_sql(query.replace("%", "%%"))
                rows = [tuple(r) for r in result.fetchmany(limit_rows + 1)] \
                    if result.returns_rows else []
            except DBAPIError as exc:
                if "statement timeout" in str(exc.orig):
                    raise _too_slow(limit_s) from None
                if "read-only" in str(exc.orig):
                    raise _refusal(query, str(exc.orig).strip()) from None
                # Start-up laziness: SQLAlchemy is imported only on the path that uses it.
                from sqlalchemy.exc import ProgrammingError

                # Syntax errors, unknown tables and columns are ProgrammingErrors in DB-API.
                fault = QueryError if isinstance(exc, ProgrammingError) else HistoryError
                raise fault(f"query failed: {_unknown_table(str(exc.orig).strip())}"
                            ) from None
            if not result.returns_rows:
                raise _refusal(query, "it returns no rows")
            if len(rows) > limit_rows:
                raise _too_many_rows(limit_rows)
            out = SqlResult(tuple(result.keys()), rows)
            conn.rollback()
            return out
    finally:
        store.close()
