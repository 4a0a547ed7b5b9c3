"""The parallel run's grouping (tests/conftest.py ONE_WORKER_MODULES) names real modules."""

from __future__ import annotations

from pathlib import Path

from conftest import ONE_WORKER_MODULES

ROOT = Path(__file__).resolve().parent.parent


def test_one_worker_modules_exist_and_share_a_module_fixture() -> None:
    for name in sorted(ONE_WORKER_MODULES):
        path = ROOT / name
        # The scheduler matches node ids, which start with this path: a renamed module would
        # silently go back to one fixture build per worker.
        assert path.is_file(), f"tests/conftest.py ONE_WORKER_MODULES: no {name}; fix or drop it"
        assert '@pytest.fixture(scope="module")' in path.read_text(), (
            f"tests/conftest.py ONE_WORKER_MODULES: {name} has no module-scoped fixture to "
            "share; drop it from the set")
