"""Debian's chromium, headless, driven by selenium through Debian's chromedriver, for the web console's
tests (`make test` installs both: chromium, chromium-driver). A test module takes the ``browser`` fixture
with ``pytest_plugins = ["browserkit"]``, and ``screenshot(name)`` to keep what the page showed."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: Where the tests keep their screenshots.
ARTIFACTS = Path(__file__).resolve().parent.parent / "build" / "test-artifacts" / "console"
#: The flags a headless chromium needs on a closed, shared machine (no sandbox as root, no GPU, no
#: background calls home).
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,1400")


@contextmanager
def headless_chromium(profile: Path) -> Iterator[Any]:
    """A browser with a fresh profile in ``profile``, quit on the way out."""
    assert shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER), "make test installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshot(browser: Any) -> Callable[[str], None]:
    """``screenshot(name)``: the browser's page now, kept as a test artifact under ARTIFACTS."""
    def take(name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))

    return take


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with headless_chromium(tmp_path_factory.mktemp("chromium")) as driver:
        yield driver
