"""Fixtures for browser tests: Debian's Chromium, headless, driven by Playwright's sync API.

Playwright's own browser builds are never installed (`playwright install` downloads
them from a CDN); the tests launch the Chromium that scripts/system-deps installs from
Debian, through ``executable_path``.

* ``chromium``: the browser, launched once per session.
* ``browser_page``: a fresh page in a context of its own (cookies, storage) for one
  test; when the test fails, a screenshot of the page is saved as ``failure.png``.
* ``screenshot``: ``screenshot(page, name)`` saves ``name.png`` and returns its path.
* ``artifacts``: the test's own folder for such files, emptied when the test starts:
  ``$PLAIT_TEST_ARTIFACTS/<test id>/`` or ``test-artifacts/<test id>/`` at the repo root.

``PLAIT_CHROMIUM`` names another Chromium binary; otherwise ``chromium`` or
``chromium-browser`` is looked up on the PATH.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from playwright.sync_api import Error as PlaywrightError

MISSING = "Chromium is not installed: scripts/system-deps installs Debian's chromium package"
CHROMIUM_NAMES = ("chromium", "chromium-browser")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """When a test that has a ``browser_page`` fails, save what the page shows then
    (``failure.png``) and name the file in the failure's report."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    page = funcargs.get("browser_page")
    if report.when == "call" and report.failed and page is not None and not page.is_closed():
        try:
            shown = str(funcargs["screenshot"](page, "failure"))
        except PlaywrightError as error:  # a crashed browser must not hide the failure
            shown = f"no screenshot: {error}"
        report.sections.append(("screenshot", shown))
    return report


def find_chromium() -> str | None:
    """The Chromium binary to launch: $PLAIT_CHROMIUM, else the first of
    ``CHROMIUM_NAMES`` on the PATH; None when there is none.

    A $PLAIT_CHROMIUM that names no executable is a mistake to report, not a reason
    to fall back to another browser."""
    named = os.environ.get("PLAIT_CHROMIUM")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            pytest.fail(f"PLAIT_CHROMIUM={named} is not an executable file")
        return named
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def chromium() -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        # CI installs it (.ci/run calls scripts/system-deps): there a missing browser
        # is a broken build, not a test to leave out
        if os.environ.get("CI"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            # Chromium refuses to start as root inside its sandbox (--no-sandbox)
            chromium_sandbox=os.geteuid() != 0,
        )
        yield browser
        browser.close()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    root = os.environ.get("PLAIT_TEST_ARTIFACTS")
    base = Path(root) if root else request.config.rootpath / "test-artifacts"
    folder = base / re.sub(r"[^\w.-]+", "_", request.node.nodeid).strip("_")
    shutil.rmtree(folder, ignore_errors=True)  # only this run's files
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def screenshot(artifacts: Path) -> Callable[[Page, str], Path]:
    def save(page: Page, name: str) -> Path:
        path = artifacts / f"{name}.png"
        page.screenshot(path=path, full_page=True)
        return path

    return save


@pytest.fixture
def browser_page(chromium: Browser, screenshot: Callable[[Page, str], Path]) -> Iterator[Page]:
    # `screenshot` is set up with the page so that a failure can be saved (see
    # pytest_runtest_makereport)
    context = chromium.new_context()
    yield context.new_page()
    context.close()
