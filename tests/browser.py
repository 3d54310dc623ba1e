"""A real browser for the tests (issue 15): headless Debian Chromium driven by selenium,
and a real uvicorn server for an ASGI app in the test's own event loop.

Nothing downloads a browser: the driver is Debian's ``chromium-driver``
(/usr/bin/chromedriver) and the browser Debian's ``chromium`` (/usr/bin/chromium);
``.ci/run`` installs both when they are missing. Without them a test skips, naming the
packages; under ``PICO_REQUIRE_ALL_BACKENDS`` (CI) it fails instead, like PostgreSQL.

Selenium blocks, so every call of ``Page`` runs in a thread (``asyncio.to_thread``) while
the server — and the harness it serves — keep running in the test's loop::

    async with serve(app) as url, chromium(tmp_path) as page:
        await page.open(url)
        await page.click("#go")
        await page.wait_for_text("#out", "clicked")
        await page.screenshot("clicked")
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Headless, no sandbox (CI runs as root in a container), and nothing that phones home:
#: no QUIC, no first-run, background networking, component updates or sync.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)
#: Seconds a wait gives the page: generous, two cores are shared by a whole team.
WAIT_SECONDS = 20.0

T = TypeVar("T")


def require_chromium(what: str) -> None:
    """Skip (locally) or fail (under ``PICO_REQUIRE_ALL_BACKENDS``) when Debian's
    ``chromium``/``chromium-driver`` or selenium are not installed."""
    import pytest

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[dev]')")
    if not missing:
        return
    message = (
        f"{what} needs a real browser but {', '.join(missing)} is missing; install Debian's "
        "packages: apt-get install chromium chromium-driver (.ci/run does)"
    )
    if os.environ.get("PICO_REQUIRE_ALL_BACKENDS"):
        pytest.fail(message + ", and PICO_REQUIRE_ALL_BACKENDS requires every real backend")
    pytest.skip(message)


def artifacts_dir(tmp_path: Path) -> Path:
    """Where a test's screenshots go: ``$PICO_TEST_ARTIFACTS`` (CI keeps it) if set, else
    the test's own ``tmp_path``."""
    root = os.environ.get("PICO_TEST_ARTIFACTS")
    where = Path(root) if root else tmp_path / "artifacts"
    where.mkdir(parents=True, exist_ok=True)
    return where


class Page:
    """One headless Chromium window; every method runs selenium in a thread."""

    def __init__(self, driver: Any, artifacts: Path, prefix: str) -> None:
        self.driver = driver  # selenium.webdriver.Chrome; blocking: use it in a thread
        self.artifacts = artifacts
        self.prefix = prefix

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        """Run a blocking selenium call in a thread, so the event loop keeps serving."""
        return await asyncio.to_thread(call, *args)

    async def open(self, url: str) -> None:
        await self.run(self.driver.get, url)

    async def click(self, css: str) -> None:
        """Click the element matching ``css`` once it is displayed and enabled."""

        def click() -> None:
            def clicked(driver: Any) -> bool:
                # Find and click in one attempt: a page that re-renders replaces the
                # element, and the wait retries on a stale or missing one.
                element = driver.find_element(*_css(css))
                if not (element.is_displayed() and element.is_enabled()):
                    return False
                element.click()
                return True

            self._wait(clicked, f"{css} clickable")

        await self.run(click)

    async def text(self, css: str) -> str:
        """The text of the element matching ``css`` (waiting until one exists)."""

        def text() -> str:
            # A one-tuple is truthy even for an empty text, so the wait ends once it exists.
            (found,) = self._wait(lambda d: (d.find_element(*_css(css)).text,), css)
            return str(found)

        return await self.run(text)

    async def select(self, css: str, *, value: str | None = None, text: str | None = None) -> None:
        """Pick an option of the ``<select>`` matching ``css`` (waiting for the option)."""

        def pick() -> None:
            from selenium.webdriver.support.ui import Select

            def ready(driver: Any) -> Any:
                options = driver.find_elements(*_css(css + " option"))
                for option in options:
                    if (value is not None and option.get_attribute("value") == value) or (
                        text is not None and text in option.text
                    ):
                        return driver.find_element(*_css(css))
                return False

            element = self._wait(ready, f"{css} offering {value or text!r}")
            choice = Select(element)
            if value is not None:
                choice.select_by_value(value)
            else:
                for option in choice.options:
                    if text is not None and text in option.text:
                        choice.select_by_visible_text(option.text)
                        break

        await self.run(pick)

    async def wait_for_text(self, css: str, text: str, *, timeout: float = WAIT_SECONDS) -> str:
        """Wait until the element matching ``css`` shows ``text``; its whole text."""

        def wait() -> str:
            def shown(driver: Any) -> Any:
                for element in driver.find_elements(*_css(css)):
                    if text in element.text:
                        return str(element.text)
                return False

            return str(self._wait(shown, f"{css} showing {text!r}", timeout))

        return await self.run(wait)

    async def wait_for(
        self, css: str, *, timeout: float = WAIT_SECONDS, visible: bool = True
    ) -> None:
        """Wait until an element matches ``css`` (and is displayed, unless told not to)."""

        def wait() -> None:
            from selenium.webdriver.support import expected_conditions as ec

            condition = (
                ec.visibility_of_element_located(_css(css))
                if visible
                else ec.presence_of_element_located(_css(css))
            )
            self._wait(condition, f"{css} {'shown' if visible else 'present'}", timeout)

        await self.run(wait)

    async def count(self, css: str) -> int:
        def count() -> int:
            return len(self.driver.find_elements(*_css(css)))

        return await self.run(count)

    async def script(self, source: str, *args: Any) -> Any:
        return await self.run(self.driver.execute_script, source, *args)

    async def screenshot(self, name: str) -> Path:
        """Save the window as ``<artifacts>/<test>-<name>.png``, print and return the path."""
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.prefix}-{name}")
        path = self.artifacts / f"{safe}.png"
        saved = await self.run(self.driver.save_screenshot, str(path))
        assert saved and path.stat().st_size > 0, f"no screenshot written to {path}"
        print(f"screenshot: {path}")
        return path

    def _wait(self, condition: Any, what: str, timeout: float = WAIT_SECONDS) -> Any:
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
            TimeoutException,
        )
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            wait = WebDriverWait(
                self.driver,
                timeout,
                poll_frequency=0.05,
                # The page re-renders lists as commits land: retry, never fail, on an
                # element replaced or not yet there.
                ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
            )
            return wait.until(condition)
        except TimeoutException:
            # Save what the page showed: the failure's best evidence.
            shot = self.artifacts / f"{self.prefix}-timeout.png"
            self.driver.save_screenshot(str(shot))
            body = self.driver.find_element(*_css("body")).text
            raise AssertionError(
                f"waited {timeout}s for {what}; screenshot {shot}; page text:\n{body[:2000]}"
            ) from None


def _css(css: str) -> tuple[str, str]:
    from selenium.webdriver.common.by import By

    return (By.CSS_SELECTOR, css)


def _start_chromium(profile: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    # Both paths are given, so selenium's manager never looks for (or downloads) anything.
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_SECONDS)
    return driver


@contextlib.asynccontextmanager
async def chromium(tmp_path: Path, *, name: str | None = None) -> AsyncIterator[Page]:
    """A fresh headless Chromium (its own profile in a temporary directory), quit on exit.

    Skips or fails through ``require_chromium`` when the browser is not installed.
    ``name`` prefixes the screenshots (default: the test's tmp directory name).
    """
    require_chromium("this test")
    profile = Path(tempfile.mkdtemp(prefix="pico-chromium-", dir=tmp_path))
    driver = await asyncio.to_thread(_start_chromium, profile)
    try:
        yield Page(driver, artifacts_dir(tmp_path), name or tmp_path.name)
    finally:
        await asyncio.to_thread(driver.quit)
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.asynccontextmanager
async def serve(app: Any, *, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve the ASGI ``app`` with a real uvicorn server on a free loopback port, as a task
    of the running event loop (so the app and a harness opened by the test share one loop);
    yields the base URL (``http://127.0.0.1:PORT``) once the server listens."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))  # the kernel picks the port: no race with another test's server
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="auto", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # raises the server's start-up error
                raise AssertionError("uvicorn stopped before it started listening")
            await asyncio.sleep(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        done, _ = await asyncio.wait({task}, timeout=10)
        if not done:  # a streaming response that outlived its grace: stop waiting for it
            server.force_exit = True
        await task
        sock.close()
