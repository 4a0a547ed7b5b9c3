"""`orch report`: a self-contained HTML file, opened in a real headless browser (Debian's
chromium, installed by scripts/install) with the network cut off.

The history is real: a two-run sweep trained on the simulated cloud (real sshd on loopback)
by `orch worker`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orchfork
import pytest
from termutil import ROOT

SWEEP = """\
name: qs-lr
base: {base}
grid:
  training.learning_rate: [1.0e-4, 3.0e-4]
objective: {{metric: eval.exact_match, goal: max}}
"""

# Records script errors, failed loads (capture phase sees <script src>/<img> failures) and
# console.error, then writes them into the page, where --dump-dom shows them.
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) {
  window.__errors.push(String(e.message || (e.target && (e.target.src || e.target.href)) ||
                              'error'));
}, true);
(function () { var ce = console.error; console.error = function () {
  window.__errors.push(Array.prototype.join.call(arguments, ' ')); ce.apply(console, arguments);
}; })();
window.addEventListener('load', function () { setTimeout(function () {
  var p = document.createElement('pre'); p.id = 'orch-errors';
  p.textContent = JSON.stringify(window.__errors); document.body.appendChild(p);
}, 300); });
</script>"""


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Debian's chromium is needed for this test: run scripts/install"
    return exe


def browser(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    # Headless, as root in a container (no sandbox), and with every host name unresolvable:
    # a page that needed the network would fail to load its parts.
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=10000", *extra, url],
        capture_output=True, text=True, timeout=180, check=True)


def load(page: Path) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and the errors the page met."""
    probed = page.with_name("probed-" + page.name)
    probed.write_text(page.read_text().replace("<head>", "<head>" + PROBE, 1))
    dom = browser(probed.as_uri(), "--dump-dom").stdout
    found = re.search(r'<pre id="orch-errors">(.*?)</pre>', dom, re.S)
    assert found, "the probe never ran: the page did not load"
    return dom, json.loads(found.group(1).replace("&quot;", '"'))


def chart(dom: str, div_id: str) -> str:
    start = dom.index(f'id="{div_id}"')
    end = dom.find('class="plotly-graph-div"', start + 1)
    return dom[start:end if end > 0 else len(dom)]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("report")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp / "xdg"), "ORCH_SIM_TRAIN_STEPS": "10",
           "ORCH_SIM_STEP_S": "0.2", "ORCH_POLL_S": "0.1"}
    env.pop("ORCH_DB_URL", None)
    sweep = tmp / "sweep.yml"
    sweep.write_text(SWEEP.format(base=ROOT / "examples" / "quickstart.yml"))
    for args in (["sweep", str(sweep)], ["worker", "--once", "-q"]):
        orchfork.run(list(args), env=env, cwd=ROOT, check=True, timeout=300)
    jobs = json.loads(orchfork.run(["jobs", "--json"], env=env, check=True).stdout)
    return {"env": env, "tmp": tmp, "ids": [j["job_id"] for j in jobs]}


def report(history: dict[str, Any], *args: str, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    proc = orchfork.run(["report", *args], env=history["env"], cwd=ROOT, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_the_probe_sees_errors_and_blocked_network(tmp_path: Path) -> None:
    # The harness must be able to fail: a script error and a script from the network.
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><head></head><body><script>nope();</script>"
                   '<script src="https://cdn.plot.ly/plotly-2.35.2.min.js"></script></body>'
                   "</html>")
    _, errors = load(bad)
    assert any("nope" in e for e in errors) and any("cdn.plot.ly" in e for e in errors)


def test_sweep_report_loads_offline_with_charts_that_have_data(history: dict[str, Any]
                                                              ) -> None:
    out = history["tmp"] / "sweep.html"
    proc = report(history, "--sweep", "qs-lr", "-o", str(out))
    assert f"wrote {out}" in proc.stdout and "2 runs" in proc.stdout
    page = out.read_text()
    # Self-contained: nothing fetched from elsewhere.
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", page)
    dom, errors = load(out)
    assert errors == []
    loss = chart(dom, "loss-chart")
    # The sweep's runs overlaid: one line per run, each drawn through several points.
    lines = [d for d in re.findall(r'class="js-line" d="M([^"]+)"', loss) if "L" in d]
    assert len(lines) == 2 and all(d.count("L") >= 2 for d in lines)
    assert all(f"({job_id})" in loss for job_id in history["ids"])
    for div in ("metrics-chart", "cost-chart", "day-chart", "month-chart"):
        bars = re.findall(r'class="point"><path d="M([^"]+)"', chart(dom, div))
        assert bars, div
    assert "eval.exact_match" in chart(dom, "metrics-chart")
    assert "spot savings vs on-demand" in chart(dom, "day-chart")
    # The placement table names where each run ran.
    assert page.count("sim RTX 3090 x1") >= 2


def test_report_of_one_job_and_since(history: dict[str, Any]) -> None:
    job_id = history["ids"][0]
    out = history["tmp"] / "one.html"
    report(history, job_id, "-o", str(out))
    page = out.read_text()
    assert "orch report: " in page and f"({job_id})" in page
    assert history["ids"][1] not in page.split("Cost per day")[0]
    report(history, "--since", "1d", "-o", str(history["tmp"] / "since.html"))


@pytest.mark.parametrize("args,code,text", [
    (["j-000000000000"], 4, "j-000000000000"),
    (["--sweep", "nope"], 4, "--sweep nope: no such sweep (sweeps: qs-lr)"),
    (["--since", "3x"], 2, "--since 3x"),
    (["j-000000000000", "--sweep", "qs-lr"], 2, "give one of ID, --sweep NAME or --since"),
    (["--since", "2000-01-01", "-o", "/nonexistent/dir/r.html"], 1, "cannot write"),
])
def test_report_errors(history: dict[str, Any], args: list[str], code: int, text: str) -> None:
    proc = report(history, *args, check=False)
    assert proc.returncode == code and text in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_without_plotly_the_error_says_how_to_install_it(history: dict[str, Any]) -> None:
    # plotly made unimportable in this process only (as when the extra is not installed).
    code = textwrap.dedent("""
        import sys
        sys.modules["plotly"] = None
        sys.argv = ["orch", "report", "-o", "never.html"]
        from orchestrator.cli.app import main
        main()
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=history["env"], cwd=history["tmp"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "pip install -e '.[report]'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (history["tmp"] / "never.html").exists()


def test_other_commands_never_import_plotly(history: dict[str, Any]) -> None:
    code = textwrap.dedent("""
        import sys
        from orchestrator.cli.app import main
        for args in (["plan", "examples/quickstart.yml"], ["jobs"], ["history"]):
            sys.argv = ["orch", *args]
            try:
                main()
            except SystemExit as exc:
                assert not exc.code, (args, exc.code)
        print("plotly" in sys.modules, file=sys.stderr)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=history["env"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    assert proc.stderr.strip().splitlines()[-1] == "False"


def rollup_table(page: str, heading: str) -> list[dict[str, str]]:
    """The rows of the table under `heading` (e.g. "Cost per day") as header → cell."""
    part = page.split(f"<h2>{heading}</h2>", 1)[1].split("</table>", 1)[0]
    heads = re.findall(r"<th>(.*?)</th>", part)
    rows = re.findall(r"<tr>((?:<td>.*?</td>)+)</tr>", part)
    return [dict(zip(heads, re.findall(r"<td>(.*?)</td>", r), strict=True)) for r in rows]


def test_a_job_or_sweep_report_counts_only_its_own_jobs(history: dict[str, Any]) -> None:
    # One more job outside the sweep, so that "every job in the database" differs from both.
    orchfork.run(["submit", "examples/quickstart.yml"], env=history["env"], cwd=ROOT, check=True,
                 timeout=300)
    for args, jobs in ((["--sweep", "qs-lr"], 2), ([history["ids"][0]], 1)):
        out = history["tmp"] / "scoped.html"
        report(history, *args, "-o", str(out))
        page = out.read_text()
        billed = re.search(r"(\d+) runs?, (\$[0-9.]+) billed", page)
        assert billed and int(billed.group(1)) == jobs
        for heading in ("Cost per day", "Cost per month"):
            rows = rollup_table(page, heading)
            assert sum(int(r["jobs"]) for r in rows) == jobs, (args, heading, rows)
        everything = history["tmp"] / "all.html"
        report(history, "--since", "1d", "-o", str(everything))
        assert sum(int(r["jobs"]) for r in rollup_table(everything.read_text(),
                                                         "Cost per day")) == 3


def test_plotly_cdn_writes_a_small_page_that_loads_plotly_from_its_cdn(
        history: dict[str, Any]) -> None:
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    inline, cdn = history["tmp"] / "inline.html", history["tmp"] / "cdn.html"
    said_inline = report(history, "--sweep", "qs-lr", "-o", str(inline)).stdout
    said_cdn = report(history, "--sweep", "qs-lr", "--plotly", "cdn", "-o", str(cdn)).stdout
    # The default stays offline; each run says how big the file is and what it needs.
    assert re.search(r"\(\d+\.\d MB, 2 runs; opens offline\)", said_inline), said_inline
    size = re.search(r"\((\d+) kB, 2 runs; loads plotly.js from cdn.plot.ly", said_cdn)
    assert size, said_cdn
    assert int(size.group(1)) == round(cdn.stat().st_size / 1e3)
    assert cdn.stat().st_size < 200_000 < 3_000_000 < inline.stat().st_size
    page = cdn.read_text()
    assert get_plotlyjs()[:2000] not in page  # the library is not inside
    tags = re.findall(r"<script[^>]*\ssrc=[^>]*>", page)
    assert len(tags) == 1, tags
    src = re.search(r'src="([^"]+)"', tags[0])
    assert src and src.group(1) == f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"
    # The browser runs the CDN's file only if it is the plotly.js this report was made with.
    digest = base64.b64encode(hashlib.sha256(get_plotlyjs().encode()).digest()).decode()
    assert f'integrity="sha256-{digest}"' in tags[0] and 'crossorigin="anonymous"' in tags[0]
    # With the network cut off the page fails to load exactly that script (not fetched here).
    _, errors = load(cdn)
    assert any("cdn.plot.ly" in e for e in errors), errors
    # The charts' data is in the small file too.
    for div in ("loss-chart", "metrics-chart", "cost-chart", "day-chart", "month-chart"):
        assert f'id="{div}"' in page


def test_plotly_takes_inline_or_cdn_only(history: dict[str, Any]) -> None:
    proc = report(history, "--plotly", "web", "-o", str(history["tmp"] / "x.html"),
                  check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'web' is not one of 'inline', 'cdn'" in proc.stderr, proc.stderr
