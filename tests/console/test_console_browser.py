"""The console in a real browser (Debian's chromium through chromedriver, driven by
Selenium) over the real stack: log in, see the binding on the overview, follow it to a dead
letter whose payload holds a script (shown as text, never run), replay it and see it run
once, find a queue item and cancel it, watch the binding's lag fall to 0 as its group
commits, pause the binding and resume it; and a read-only
console that offers no action and refuses one a script posts.

One headless browser for the session. With ``ASYNCTIER_SCREENSHOTS=DIR`` the test saves a
screenshot of each page there (``docs/console`` holds the ones the docs show).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from asynctier.console import ConsoleOptions, create_app
from asynctier.platform.config import Settings
from asynctier.platform.paused import read_paused
from asynctier.queue import QueueStore
from asynctier.queue.items import NewItem
from tests.conftest import service_unavailable
from tests.console.support import TOKEN
from tests.delay_streams.test_dlq import dead_letters, ledger_file, scheduler  # noqa: F401
from tests.funcs import delay as delayfuncs
from tests.funcs import ledger
from tests.funcs.delay import LocalScheduler
from tests.helpers import wait_until
from tests.platform_harness import free_port, produce_json

HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A headless chromium, driven through Debian's chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        service_unavailable("chromium", "install chromium and chromium-driver "
                                        "(scripts/setup.sh does)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.implicitly_wait(10)  # a find waits for the page a click opened
    yield driver
    driver.quit()


@contextmanager
def serving(settings: Settings, read_only: bool = False) -> Iterator[str]:
    """The console over ``settings`` on a free port; yields its base URL."""
    port = free_port()
    app = create_app(settings, ConsoleOptions(listen=f"127.0.0.1:{port}", token=TOKEN,
                                              sample_every_s=0.5, read_only=read_only))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, "the console to serve")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


@pytest.fixture
def console_settings(settings: Settings, scheduler: LocalScheduler,  # noqa: F811
                     postgres: str) -> Settings:
    """The test's services, its local scheduler and its PostgreSQL."""
    return dataclasses.replace(settings, schedulers=(scheduler.address,),
                               queue_shards=(postgres,))


@pytest.fixture
def served(console_settings: Settings) -> Iterator[str]:
    """The console over the test's services; yields its base URL."""
    with serving(console_settings) as base:
        yield base


def _log_in(browser: Any, base: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(base + "/")
    assert browser.current_url.endswith("/login")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()


def _shot(browser: Any, name: str) -> None:
    folder = os.environ.get("ASYNCTIER_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(folder) / f"{name}.png"))


def _text(browser: Any, element_id: str) -> str:
    """The text of an element of the page as it is now ("" while the refresh replaces it)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(browser.find_element(By.ID, element_id).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def commit_to_the_end(settings: Settings, group: str, topic: str) -> None:
    """Commit ``group`` at the end of every partition of ``topic``, as a tailer that drained
    it would."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(settings.kafka_config(**{"group.id": group,
                                                 "enable.auto.commit": False}))
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = [TopicPartition(topic, p, consumer.get_watermark_offsets(
        TopicPartition(topic, p), timeout=10)[1]) for p in parts]
    consumer.commit(offsets=ends, asynchronous=False)
    consumer.close()


def _no_alert(browser: Any) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        browser.switch_to.alert  # noqa: B018 - raises when no script opened one
    except NoAlertPresentException:
        return True
    return False


def test_log_in_follow_a_dead_letter_replay_it_and_cancel_a_queue_item(
        browser: Any, served: str, settings: Settings, scheduler: LocalScheduler,  # noqa: F811
        ledger_file: Path, queue_store: QueueStore, queue_namespace: str,  # noqa: F811
        unique_topic: Any) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    topic = unique_topic(partitions=2, name=f"{settings.prefix}.src")  # the binding's
    dead_letters(settings, "orders", [{"id": 7, "always_fail": True, "note": HOSTILE}])
    scheduler.functions["orders"] = delayfuncs.fixed
    find = browser.find_element

    _log_in(browser, served)
    row = '[data-binding="orders"]'

    def dead_letters_link() -> str:
        """The row's dead-letter link once it counts the one dead letter."""
        try:
            links = browser.find_elements(By.CSS_SELECTOR, f"{row} td.dead a")
            return str(links[0].get_attribute("href")) if links and links[0].text == "1" \
                else ""
        except StaleElementReferenceException:  # the live refresh replaced the table
            return ""

    link = wait_until(dead_letters_link, 30, "the overview to show binding orders with "
                      "its dead letter (it refreshes every 3 s)")
    _shot(browser, "overview")

    browser.get(link)
    find(By.CSS_SELECTOR, '[data-offset="0"] a').click()
    assert HOSTILE in find(By.ID, "value").text and _no_alert(browser)
    _shot(browser, "dead-letter")
    find(By.ID, "replay").click()
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, '[data-state="done"]'), 30,
               "the replay to finish on the jobs page")
    assert [(c.id, c.attempt) for c in ledger.read(ledger_file)] == [(7, 1)]
    _shot(browser, "replays")

    queue_store.enqueue(queue_namespace, [NewItem("jobs", b'{"n": 1}', id="x1")])
    browser.get(f"{served}/queue?namespace={queue_namespace}")
    find(By.ID, "find-topic").send_keys("jobs")
    find(By.ID, "find-id").send_keys("x1")
    find(By.ID, "find-button").click()
    _shot(browser, "queue-item")
    find(By.ID, "cancel").click()
    browser.switch_to.alert.accept()  # "Delete this item?"
    assert "cancelled item" in find(By.ID, "done").text
    assert queue_store.get(queue_namespace, "jobs", "x1") is None

    # the binding page's lag: 10 records, then none once its group committed them
    produce_json(settings, topic, [{"id": i} for i in range(10)])
    browser.get(f"{served}/bindings/orders")
    wait_until(lambda: _text(browser, "lag") == "10", 30, "the binding page to show lag 10")
    commit_to_the_end(settings, settings.names.group("orders"), topic)
    wait_until(lambda: _text(browser, "lag") == "0", 30,
               "the binding page to show the lag fall to 0 (it refreshes every 3 s)")
    _shot(browser, "binding")

    # pause the binding from its page, and resume it
    browser.get(f"{served}/bindings/orders")
    find(By.ID, "pause").click()
    browser.switch_to.alert.accept()  # "Pause orders? ..."
    assert "Paused" in find(By.ID, "paused").text and set(read_paused(settings)) == {"orders"}
    find(By.ID, "resume").click()
    assert find(By.ID, "pause") and read_paused(settings) == {}


def test_read_only_offers_no_action_and_refuses_a_forged_one(
        browser: Any, console_settings: Settings) -> None:
    from selenium.webdriver.common.by import By

    dead_letters(console_settings, "orders", [{"id": 1}])
    with serving(console_settings, read_only=True) as base:
        _log_in(browser, base)
        assert browser.find_element(By.ID, "read-only")
        browser.implicitly_wait(0)  # what is looked for here must be absent: no waiting
        try:
            for page in ("/dlq/orders", "/dlq/orders/0", "/tenants"):
                browser.get(base + page)
                assert not browser.find_elements(  # logging out is the one form left
                    By.CSS_SELECTOR, "form[method=post]:not([action='/logout'])"), page

            def binding_page() -> bool:
                browser.get(base + "/bindings/orders")
                return "Binding orders" in browser.page_source

            wait_until(binding_page, 30, "the binding page (the console reads every 0.5 s)")
            assert not browser.find_elements(By.ID, "pause")
            # a forged action, posted by a script in the logged-in page: refused by the server
            status = browser.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "fetch('/bindings/orders/pause', {method: 'POST', body: new URLSearchParams("
                "{csrf: 'forged'})}).then(r => done(r.status));")
            assert status == 403 and read_paused(console_settings) == {}
        finally:
            browser.implicitly_wait(10)
