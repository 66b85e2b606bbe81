"""A skip fails the run unless tests/support/skips.py lists it (tests/conftest.py), and the tests that
start processes fail, never skip, when PostgreSQL or Redis cannot be reached (tests/support/stack.py).
Each case runs a probe module in a pytest of its own, under a conftest that is tests/conftest.py's hooks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import pytest

from tests.support.stack import requires_services


def test_skipped_for_no_listed_reason():
    pytest.skip("chromium is not installed")


@pytest.mark.skipif(True, reason="PostgreSQL's plans")
def test_skipped_as_postgresql_only():
    pass


@requires_services(13)
def test_needing_the_services():
    pass


def test_plain():
    pass
"""


def outcomes(tmp_path: Path, **env: str) -> dict[str, str]:
    """test name -> passed / failure / error / skipped of the probe module (its JUnit report), and
    "output": what pytest printed."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403 - its hooks\n")
    report = tmp_path / "report.xml"
    args = ["-c", os.devnull, "--rootdir", str(tmp_path), "-p", "no:cacheprovider", f"--junitxml={report}"]
    done = subprocess.run(  # noqa: S603 - this interpreter, our own arguments
        [sys.executable, "-m", "pytest", *args, "-q", str(probe)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.exists(), done.stdout + done.stderr
    found = {"output": done.stdout + done.stderr}
    for case in ElementTree.parse(report).iter("testcase"):  # noqa: S314 - our own pytest wrote it
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[case.get("name")] = kinds[0] if kinds else "passed"
    return found


@pytest.mark.timeout(120)
def test_on_postgresql_every_skip_fails_and_unreachable_services_fail(tmp_path):
    found = outcomes(
        tmp_path,
        DJANGO_SETTINGS_MODULE="exchange.settings.test",
        STACK_REDIS_SERVER="redis://127.0.0.1:1",  # nothing listens there (the test's own storage stays up)
        SERVICES_WAIT_SECONDS="0",
    )
    assert found["test_plain"] == "passed", found["output"]
    assert found["test_skipped_for_no_listed_reason"] == "failure", found["output"]
    assert found["test_skipped_as_postgresql_only"] == "error", found["output"]  # at setup: skipif
    assert found["test_needing_the_services"] == "error", found["output"]
    assert "unexpected skip (chromium is not installed)" in found["output"]
    assert "PostgreSQL/Redis not reachable" in found["output"]


@pytest.mark.timeout(120)
def test_on_sqlite_only_the_listed_postgresql_only_skips_pass(tmp_path):
    found = outcomes(tmp_path, DJANGO_SETTINGS_MODULE="exchange.settings.test_sqlite")
    assert found["test_plain"] == "passed", found["output"]
    assert found["test_skipped_as_postgresql_only"] == "skipped", found["output"]
    assert found["test_skipped_for_no_listed_reason"] == "failure", found["output"]
