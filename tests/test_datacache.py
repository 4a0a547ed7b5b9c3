"""The shipped YAML data read through its compiled cache (providers/datacache.py): the same data
as the YAML says, an edited file read afresh, nothing written where bytecode is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from providers import datacache

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for pkg in ("orchestrator", "providers", "playbooks")
                 for p in (ROOT / pkg).rglob("*.yaml") if "__pycache__" not in p.parts)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches are written, as in a process that writes bytecode."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)


def test_every_shipped_file_is_cached_and_reads_back_as_its_yaml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(SHIPPED) >= 15  # the catalogs, GPU specs, model shapes, thresholds, sim market
    copies = {}
    for path in SHIPPED:
        copy = tmp_path / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(path.read_bytes())
        copies[copy] = yaml.load(path.read_text(), Loader=yaml.SafeLoader)  # noqa: S506 - safe
    done = datacache.compile_all([tmp_path])
    assert sorted(done) == sorted(copies)
    parsed = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda *a, **k: parsed.append(a) or real(*a, **k))
    for copy, want in copies.items():
        assert datacache.cache_path(copy).is_file(), copy
        assert datacache.read_yaml(copy) == want, copy
    assert parsed == []  # every one from its cache


def test_a_cache_is_taken_only_while_the_file_is_unchanged(tmp_path: Path, writes: None) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("gpus: {A100: 1.10}\n")
    assert datacache.read_yaml(path) == {"gpus": {"A100": 1.10}}
    cache = datacache.cache_path(path)
    assert cache.is_file()
    # Edited (same size, a later time): the new text counts, and the cache follows it.
    path.write_text("gpus: {A100: 2.20}\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert datacache.read_yaml(path) == {"gpus": {"A100": 2.20}}
    # Another length, even with the same time: read afresh.
    stamp = path.stat().st_mtime_ns
    path.write_text("gpus: {A100: 3.3}\n")
    os.utime(path, ns=(stamp, stamp))
    assert datacache.read_yaml(path) == {"gpus": {"A100": 3.3}}


def test_a_broken_or_foreign_cache_is_ignored(tmp_path: Path, writes: None) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("- H100\n")
    cache = datacache.cache_path(path)
    cache.parent.mkdir()
    for junk in (b"", b"\x00\x01garbage", b"\xe9"):
        cache.write_bytes(junk)
        assert datacache.read_yaml(path) == ["H100"]
    assert datacache.read_yaml(path) == ["H100"]  # rewritten whole by the read before


def test_nothing_is_written_where_bytecode_is_not(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    path = tmp_path / "models.yaml"
    path.write_text("models: []\n")
    assert datacache.read_yaml(path) == {"models": []}
    assert not datacache.cache_path(path).exists()
    # ...but a cache written at install is still taken there.
    datacache.compile_all([tmp_path])
    path_text = path.read_text()
    assert datacache.read_yaml(path) == {"models": []} and path.read_text() == path_text


def test_data_marshal_cannot_carry_is_parsed_each_time(tmp_path: Path, writes: None) -> None:
    path = tmp_path / "dated.yaml"
    path.write_text("date: 2026-12-06\n")  # YAML makes this a datetime.date
    first = datacache.read_yaml(path)
    assert str(first["date"]) == "2026-12-06"
    assert not datacache.cache_path(path).exists()
    assert datacache.read_yaml(path) == first


def test_an_unwritable_folder_is_no_error(tmp_path: Path, writes: None) -> None:
    path = tmp_path / "disks.yaml"
    path.write_text("runpod: {}\n")
    (tmp_path / "__pycache__").write_text("a file where the folder would be")
    assert datacache.read_yaml(path) == {"runpod": {}}


def test_the_install_step_caches_what_orch_plan_reads(tmp_path: Path) -> None:
    """`python -m providers.datacache` (scripts/install) under a cache prefix: every shipped
    file gets its cache there, and a plan then parses none of them."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, "-m", "providers.datacache", "orchestrator", "providers",
                    "playbooks"], cwd=ROOT, env=env, check=True)
    cached = sorted((tmp_path / "pyc").rglob("*.marshal"))
    assert len(cached) == len(SHIPPED)
    probe = (
        "import sys, yaml\n"
        "calls = []\n"
        "real = yaml.load\n"
        "yaml.load = lambda *a, **k: calls.append(1) or real(*a, **k)\n"
        "sys.argv = ['orch', 'plan', 'examples/qlora-8b.yml']\n"
        "from orchestrator.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('parsed', len(calls), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    assert "Chosen:" in done.stdout
    assert "parsed 0" in done.stderr, done.stderr
