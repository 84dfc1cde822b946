"""Headless Chromium driven by selenium, for the tests of heapscope's pages.

:func:`chromium` starts the browser every page test uses (a private
profile, no network chatter, the console log kept) and skips the test with the reason when
selenium, chromium or chromedriver is missing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def _find(path: str, name: str) -> str | None:
    if os.access(path, os.X_OK):
        return path
    return shutil.which(name)


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A selenium driver of headless Chromium; skips when something is not installed."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium not installed: pip install selenium (dev extras)")
    browser = _find(CHROMIUM, "chromium")
    if browser is None:
        pytest.skip("chromium not found: apt-get install chromium")
    chromedriver = _find(CHROMEDRIVER, "chromedriver")
    if chromedriver is None:
        pytest.skip("chromedriver not found: apt-get install chromium-driver")
    profile = tempfile.mkdtemp(prefix="heapscope-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in ("--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                 f"--window-size={width},{height}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(chromedriver), options=opts)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver: Any) -> list[Any]:
    """What the page logged as errors since the last call."""
    return [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "ERROR")]


def screenshot(driver: Any, name: str) -> Path:
    """Save the window as ``artifacts/NAME``."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    return path
