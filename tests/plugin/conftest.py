"""Fixtures the plugin tests share: headless Chromium (Debian's, driven by playwright)."""

from __future__ import annotations

import os

import pytest
from test_plugin_server import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: browser tests need Debian's chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
