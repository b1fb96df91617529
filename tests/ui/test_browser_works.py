"""The browser fixtures work: Debian's Chromium loads a page over HTTP, runs its
JavaScript on a click, and a screenshot of it lands in the test's artifacts."""

from __future__ import annotations

import functools
import http.server
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

INDEX = """<!doctype html>
<html><head><title>plait browser check</title><script src="app.js" defer></script></head>
<body><button id="go">Go</button><p id="status">idle</p></body></html>
"""

APP = """let clicks = 0;
document.getElementById("go").addEventListener("click", () => {
  clicks += 1;
  document.getElementById("status").textContent = `clicked ${clicks}`;
});
"""


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def site(tmp_path: Path) -> Iterator[str]:
    """The base URL of a loopback HTTP server serving INDEX and APP."""
    (tmp_path / "index.html").write_text(INDEX)
    (tmp_path / "app.js").write_text(APP)
    handler = functools.partial(QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_click_runs_the_pages_javascript_and_a_screenshot_is_saved(
    browser_page: Page, site: str, screenshot: Callable[[Page, str], Path]
) -> None:
    browser_page.goto(site)
    expect(browser_page).to_have_title("plait browser check")
    status = browser_page.locator("#status")
    expect(status).to_have_text("idle")

    browser_page.click("#go")
    expect(status).to_have_text("clicked 1")
    browser_page.get_by_role("button", name="Go").click()
    expect(status).to_have_text("clicked 2")

    path = screenshot(browser_page, "after-clicks")
    assert path.is_file()
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    # the IHDR chunk follows the signature: width and height of what was shown
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0 and height > 0
