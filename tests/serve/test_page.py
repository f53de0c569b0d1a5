"""The chat page at / in headless Chromium (Playwright): it streams the answer, shades tokens by how they were
produced and shows the speed. Opt in: ``make test-page`` (needs playwright and Debian's chromium)."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from decoctl import Generator

from .conftest import API_KEY, Live

pytestmark = pytest.mark.page
sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Any:
    if not shutil.which(CHROMIUM):
        pytest.skip("no chromium (apt-get install -y chromium)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


def ask(browser: Any, live: Live, text: str, *, mode: str, controller: str, options: str = "") -> Any:
    page = browser.new_page()
    page.goto(live.url + "/")
    page.fill("#key", API_KEY)
    page.dispatch_event("#key", "change")
    page.wait_for_selector(f"#controller option[value='{controller}']", state="attached")
    page.select_option("#mode", mode)
    page.select_option("#controller", controller)
    page.fill("#options", options)
    page.fill("#max", "120")
    page.fill("#text", text)
    page.click("#send")
    page.wait_for_selector(".turn[data-done]")
    return page


def test_the_page_streams_a_greedy_chat_answer(browser: Any, live: Live) -> None:
    page = ask(browser, live, "def fibonacci(n):", mode="chat", controller="greedy")
    answer = page.locator(".turn pre").nth(1).inner_text()
    expected = Generator({"target": str(live.folder)}, "greedy").chat(
        [{"role": "user", "content": "def fibonacci(n):"}], max_new_tokens=120
    )
    assert answer == expected.text
    stats = page.locator(".turn .stats").nth(1).inner_text()
    assert "tokens/s" in stats and "tokens per target forward" in stats
    assert page.locator(".turn pre span.target").count() > 0
    assert page.locator(".turn pre span.draft").count() == 0  # greedy drafts nothing


def test_the_page_shades_drafted_tokens_of_prompt_lookup(browser: Any, live: Live) -> None:
    options = '{"drafter": "prompt-lookup"}'
    page = ask(browser, live, "def f(x):", mode="complete", controller="speculative", options=options)
    stats = page.locator(".turn .stats").nth(1).inner_text()
    drafted = int(stats.split(" drafted")[0].rsplit("· ", 1)[1])
    assert (page.locator(".turn pre span.draft").count() > 0) == (drafted > 0)
    answer = page.locator(".turn pre").nth(1).inner_text()
    assert answer == Generator({"target": str(live.folder)}, "greedy").generate("def f(x):", max_new_tokens=120).text
