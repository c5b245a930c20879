"""The web page in a real browser: headless Chromium (Debian's, driven by Playwright) loads the page, sends a
prompt, and sees the streamed text with accepted tokens coloured per target forward. A screenshot is kept in
``test-artifacts/`` (or ``$DRAFTTREE_ARTIFACTS``). Skipped only where no Chromium is installed and
``DRAFTTREE_REQUIRE_BROWSER`` is unset (CI sets it, so there a missing browser fails)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from drafttree import SpeculativeModel
from drafttree.server import ServerThread, create_app

PROMPT = ("Add comments to this Python function:\n\ndef area(width, height):\n    result = width * height\n"
          "    return result")
KEY = "browser-key"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    if path is None:
        if os.environ.get("DRAFTTREE_REQUIRE_BROWSER"):
            pytest.fail("DRAFTTREE_REQUIRE_BROWSER is set but no chromium is installed (apt-get install chromium)")
        pytest.skip("no chromium on this machine")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def sm(default_fp32):
    return SpeculativeModel(default_fp32, method="lookup")


def test_web_page_streams_coloured_tokens(browser, sm):
    want = sm.generate(PROMPT, max_new_tokens=48)
    srv = ServerThread(create_app(sm, api_key=KEY)).start()
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(srv.url)
        page.fill("#apikey", KEY)
        page.dispatch_event("#apikey", "change")
        page.wait_for_function("document.querySelectorAll('#method option').length > 0")
        assert "lookup (default)" in page.inner_text("#method")
        page.fill("#prompt", PROMPT)
        page.fill("#temperature", "0")
        page.fill("#max_tokens", "48")
        page.click("#go")
        page.wait_for_function("document.body.dataset.done === '1'", timeout=120_000)
        assert not errors and not page.inner_text("#error").strip()
        spans = page.query_selector_all("#out span.t")
        text = "".join(s.text_content() for s in spans)
        assert text == want.text, "the page shows exactly the generated text"
        assert len(spans) >= 2 and page.query_selector_all("#out span.t.multi"), \
            "prompt lookup accepts several tokens in some forwards: those spans are marked"
        colours = {s.evaluate("e => getComputedStyle(e).backgroundColor") for s in spans}
        assert len(colours) >= 2, "runs of different accepted lengths have different colours"
        assert page.inner_text("#s-fwd").strip().isdigit() and page.inner_text("#s-tau").strip() != "–"
        out = Path(os.environ.get("DRAFTTREE_ARTIFACTS", "test-artifacts"))
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "web-page.png"), full_page=True)
        assert (out / "web-page.png").stat().st_size > 10_000
        page.close()
    finally:
        srv.stop()
