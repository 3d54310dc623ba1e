"""The real-browser test rig itself (issue 15): headless Debian Chromium driven by
selenium against a real uvicorn server in the test's event loop, a click that changes the
DOM through a real HTTP round trip, and a screenshot kept as a test artifact."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from tests import browser
from tests.browser import chromium, serve

PAGE = """<!doctype html>
<html><head><title>pico smoke</title></head>
<body>
  <h1 id="title">pico browser smoke</h1>
  <button id="go" type="button">Ask the server</button>
  <p id="out">not clicked</p>
  <script>
    document.getElementById("go").addEventListener("click", async () => {
      const response = await fetch("/clicks", {method: "POST"});
      const body = await response.json();
      document.getElementById("out").textContent = "clicked " + body.clicks + " time(s)";
    });
  </script>
</body></html>
"""


def _app(clicks: list[str]) -> Starlette:
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    async def click(request: Request) -> JSONResponse:
        clicks.append(request.method)
        return JSONResponse({"clicks": len(clicks)})

    return Starlette(routes=[Route("/", page), Route("/clicks", click, methods=["POST"])])


async def test_a_click_in_headless_chromium_changes_the_page_through_the_server(
    tmp_path: Path,
) -> None:
    clicks: list[str] = []
    async with serve(_app(clicks)) as url, chromium(tmp_path, name="smoke") as page:
        await page.open(url + "/")
        assert await page.text("#out") == "not clicked"
        assert await page.script("return document.title") == "pico smoke"

        await page.click("#go")
        # Check the DOM changed, and only because the server (in this loop) answered.
        await page.wait_for_text("#out", "clicked 1 time(s)")
        assert clicks == ["POST"]
        await page.click("#go")
        await page.wait_for_text("#out", "clicked 2 time(s)")
        assert clicks == ["POST", "POST"]

        shot = await page.screenshot("clicked")
    # Check the artifact: a real PNG, kept after the browser quit.
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.parent == browser.artifacts_dir(tmp_path)


async def test_a_wait_that_never_comes_fails_with_the_page_text_and_a_screenshot(
    tmp_path: Path,
) -> None:
    async with serve(_app([])) as url, chromium(tmp_path, name="expected-timeout") as page:
        await page.open(url + "/")
        with pytest.raises(AssertionError) as caught:
            await page.wait_for_text("#out", "clicked 1", timeout=0.5)
    message = str(caught.value)
    assert "#out showing 'clicked 1'" in message and "not clicked" in message
    assert (browser.artifacts_dir(tmp_path) / "expected-timeout-timeout.png").stat().st_size > 0


def test_missing_browser_skips_locally_and_fails_when_every_backend_is_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.delenv("PICO_REQUIRE_ALL_BACKENDS", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        browser.require_chromium("the smoke test")
    assert "no-chromium is missing" in str(skipped.value)
    assert "apt-get install chromium chromium-driver" in str(skipped.value)

    monkeypatch.setenv("PICO_REQUIRE_ALL_BACKENDS", "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        browser.require_chromium("the smoke test")
    assert "PICO_REQUIRE_ALL_BACKENDS requires every real backend" in str(failed.value)


def test_artifacts_go_to_pico_test_artifacts_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PICO_TEST_ARTIFACTS", raising=False)
    assert browser.artifacts_dir(tmp_path) == tmp_path / "artifacts"
    monkeypatch.setenv("PICO_TEST_ARTIFACTS", str(tmp_path / "ci-artifacts"))
    assert browser.artifacts_dir(tmp_path) == tmp_path / "ci-artifacts"
    assert (tmp_path / "ci-artifacts").is_dir()
