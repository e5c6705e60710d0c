"""
The web page in a real headless browser: Debian's chromium driven by Playwright, against a live server process.

Steps (a screenshot of each is saved under ``test-artifacts/page/``, or ``$OFFLOAD_TEST_ARTIFACTS/page/``): open the
page with a token, send a message, see the pending approval, approve it, see the final answer, open an offloaded text
result and page through it, open an offloaded image.
"""

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_processes import ServerProcess, serve
from server_tenants import ACME_TOKEN, TOKENS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("OFFLOAD_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server on a local store, as `offload-haystack serve` runs it."""
    directory = tmp_path_factory.mktemp("page")
    with serve(store=str(directory / "results"), tokens=TOKENS, log=directory / "server.log") as server:
        yield server


@pytest.fixture
def screenshots() -> Path:
    """A fresh directory for this run's screenshots."""
    directory = ARTIFACTS / "page"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def test_chat_approve_and_view_results_in_a_real_browser(live_server: ServerProcess, screenshots: Path) -> None:
    if not CHROMIUM.exists():
        pytest.xfail(f"{CHROMIUM} is not installed (.ci/run installs it with apt-get); the page was not tested")
    if sys.platform != "linux":
        pytest.xfail("the page test drives Debian's chromium, which is Linux-only")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 950})
            page.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))

            # 1. Open the page: the token in the URL fragment logs in; the scripted model is labelled as such.
            page.goto(f"{live_server.base_url}/#token={ACME_TOKEN}&session=browser-chat")
            expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: acme")
            expect(page.get_by_test_id("model-badge")).to_contain_text("SCRIPTED")
            assert ACME_TOKEN not in page.url  # the page drops the token from the address bar
            page.screenshot(path=screenshots / "01-opened.png")

            # 2. Send a message: the answer arrives and the offloaded results are listed.
            page.get_by_test_id("message").fill("Research solar panels, dump the invoices table and chart revenue")
            page.get_by_test_id("send").click()
            expect(page.get_by_test_id("msg-assistant").last).to_contain_text("scripted summary")
            expect(page.get_by_test_id("result")).to_have_count(4)
            page.screenshot(path=screenshots / "02-answer-and-results.png")

            # 3. Ask for an invoice: the run stops and the approval appears, with its arguments editable.
            page.get_by_test_id("message").fill("Send an invoice to Initech for 250 EUR")
            page.get_by_test_id("send").click()
            approval = page.get_by_test_id("approval")
            expect(approval).to_have_count(1)
            expect(approval).to_contain_text("send_invoice")
            expect(page.get_by_test_id("approval-arguments")).to_have_value(
                '{\n  "customer": "Initech",\n  "amount": 250\n}'
            )
            page.screenshot(path=screenshots / "03-approval-pending.png")

            # 4. Approve it: the conversation resumes and the final answer names the invoice that was sent.
            page.get_by_test_id("approve").click()
            expect(page.get_by_test_id("approval")).to_have_count(0)
            expect(page.get_by_test_id("transcript")).to_contain_text("sent to Initech for 250 EUR")
            page.screenshot(path=screenshots / "04-approved-final-answer.png")

            # 5. Open an offloaded text result from the conversation and page through it.
            page.get_by_test_id("open-offloaded").first.click()
            viewer = page.get_by_test_id("viewer")
            expect(viewer).to_be_visible()
            expect(page.get_by_test_id("viewer-text")).to_contain_text("[1] Research solar panels")
            expect(page.get_by_test_id("viewer-range")).to_contain_text("bytes 0\u20134096 of")
            page.get_by_test_id("viewer-next").click()
            expect(page.get_by_test_id("viewer-range")).to_contain_text("bytes 4096\u20138192 of")
            page.screenshot(path=screenshots / "05-text-result-page-2.png")
            page.get_by_title("Close").click()

            # 6. Open the chart: an image, shown as an image.
            image_row = page.get_by_test_id("result").filter(has_text="image")
            image_row.get_by_test_id("view-result").click()
            image = page.get_by_test_id("viewer-image")
            expect(image).to_be_visible()
            page.wait_for_function("() => document.getElementById('viewer-image').naturalWidth > 0")
            assert image.evaluate("node => [node.naturalWidth, node.naturalHeight]") == [360, 180]
            page.screenshot(path=screenshots / "06-image-result.png")
            assert errors == []
        finally:
            browser.close()
    assert sorted(path.name for path in screenshots.iterdir()) == [
        "01-opened.png",
        "02-answer-and-results.png",
        "03-approval-pending.png",
        "04-approved-final-answer.png",
        "05-text-result-page-2.png",
        "06-image-result.png",
    ]
