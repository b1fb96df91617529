"""What the browser fixtures of conftest.py do when things go wrong, each seen from a
pytest run of its own over a copy of that conftest: a failing test leaves a
screenshot, and a missing Chromium is said out loud (a skip on a developer's box, a
failure in CI), never passed over."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
MISSING = "Chromium is not installed: scripts/system-deps installs Debian's chromium package"


def run_pytest(
    tmp_path: Path, test_source: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run pytest over one test module beside a copy of tests/ui/conftest.py."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(HERE / "conftest.py", project / "conftest.py")
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_inner.py").write_text(test_source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider",
         "-c", str(project / "pytest.ini"), "--rootdir", str(project), str(project)],
        capture_output=True, text=True, env=env, timeout=240, check=False,
    )


def clean_env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "PLAIT_CHROMIUM", "PLAIT_TEST_ARTIFACTS")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the inner runs need no plugin
    env.update(changes)
    return env


def path_without_chromium() -> str:
    """$PATH less every folder that holds a Chromium."""
    return os.pathsep.join(
        folder for folder in os.environ.get("PATH", "").split(os.pathsep)
        if not any(os.path.exists(os.path.join(folder, name))
                   for name in ("chromium", "chromium-browser"))
    )


FAILING = """
def test_fails(browser_page):
    browser_page.set_content("<h1>what the page showed</h1>")
    assert browser_page.text_content("h1") == "something else"
"""

NEEDS_BROWSER = """
def test_needs_browser(browser_page):
    browser_page.set_content("<p>x</p>")
"""


def test_a_failing_test_leaves_a_screenshot_of_its_page(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    result = run_pytest(tmp_path, FAILING, clean_env(PLAIT_TEST_ARTIFACTS=str(artifacts)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout
    saved = list(artifacts.glob("*/failure.png"))
    assert len(saved) == 1, result.stdout
    assert saved[0].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert str(saved[0]) in result.stdout  # the failure's report names the file


def test_without_chromium_the_browser_tests_skip_saying_why(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, NEEDS_BROWSER, clean_env(PATH=path_without_chromium()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert MISSING in result.stdout


def test_without_chromium_in_ci_the_browser_tests_fail(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, NEEDS_BROWSER,
                        clean_env(PATH=path_without_chromium(), CI="true"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "skipped" not in result.stdout
    assert MISSING in result.stdout


@pytest.mark.parametrize("kind", ["missing", "not executable"])
def test_a_plait_chromium_that_is_no_executable_is_an_error(tmp_path: Path, kind: str) -> None:
    named = tmp_path / "chromium"
    if kind == "not executable":
        named.write_text("#!/bin/sh\n")
        named.chmod(0o644)
    result = run_pytest(tmp_path, NEEDS_BROWSER, clean_env(PLAIT_CHROMIUM=str(named)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 error" in result.stdout
    assert f"PLAIT_CHROMIUM={named} is not an executable file" in result.stdout
