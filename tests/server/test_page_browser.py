"""
The web page in a real headless browser: Debian's chromium driven by Playwright, against a live server process.

Steps (a screenshot of each is saved under ``test-artifacts/page/``, or ``$OFFLOAD_TEST_ARTIFACTS/page/``): open the
page with a token, send a message, see the pending approval, approve it, see the final answer, open an offloaded text
result and page through it, open an offloaded image; all of it under the page's Content-Security-Policy, with no
violation reported.

Then the page's defences: it refuses to run injected inline script, another site cannot frame it, and a login link
with another user's token asks before it replaces the stored one.
"""

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from server_processes import ServerProcess, serve
from server_tenants import ACME_TOKEN, GLOBEX_TOKEN, TOKENS

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page

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
# Injected before any page script (through the DevTools protocol, which the policy does not govern).
CSP_WATCH = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.cspViolations.push(`${event.effectiveDirective} ${event.blockedURI}`);
});
"""


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server on a local store, as `offload-haystack serve` runs it."""
    directory = tmp_path_factory.mktemp("page")
    with serve(store=str(directory / "results"), tokens=TOKENS, log=directory / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator["Browser"]:
    """Debian's chromium, headless (xfail where it is missing: nothing was tested then)."""
    if not CHROMIUM.exists():
        pytest.xfail(f"{CHROMIUM} is not installed (.ci/run installs it with apt-get); the page was not tested")
    if sys.platform != "linux":
        pytest.xfail("the page test drives Debian's chromium, which is Linux-only")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def _watched(page: "Page", errors: list[str], console: list[str]) -> "Page":
    """`page`, recording its uncaught errors and console errors, and its policy violations in ``cspViolations``."""
    page.set_default_timeout(TIMEOUT_MS)
    page.add_init_script(CSP_WATCH)
    page.on("pageerror", lambda error: errors.append(str(error)))

    def on_console(message: "ConsoleMessage") -> None:
        if message.type == "error":
            console.append(message.text)

    page.on("console", on_console)
    return page


def _policy_errors(console: list[str]) -> list[str]:
    return [text for text in console if "Content Security Policy" in text or "Refused to" in text]


@pytest.fixture
def screenshots() -> Path:
    """A fresh directory for this run's screenshots."""
    directory = ARTIFACTS / "page"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def test_chat_approve_and_view_results_in_a_real_browser(
    live_server: ServerProcess, browser: "Browser", screenshots: Path
) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1400, "height": 950})
    try:
        errors: list[str] = []
        console: list[str] = []
        page = _watched(context.new_page(), errors, console)

        # 1. Open the page: the token in the URL fragment logs in; the scripted model is labelled as such.
        opened = page.goto(f"{live_server.base_url}/#token={ACME_TOKEN}&session=browser-chat")
        assert opened is not None and "frame-ancestors 'none'" in opened.headers["content-security-policy"]
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
        # Everything above ran under the page's policy, and none of it needed an exception.
        assert page.evaluate("window.cspViolations") == []
        assert _policy_errors(console) == []
    finally:
        context.close()
    assert sorted(path.name for path in screenshots.iterdir()) == [
        "01-opened.png",
        "02-answer-and-results.png",
        "03-approval-pending.png",
        "04-approved-final-answer.png",
        "05-text-result-page-2.png",
        "06-image-result.png",
    ]


def test_the_static_page_runs_only_its_own_script(live_server: ServerProcess, browser: "Browser") -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    try:
        errors: list[str] = []
        console: list[str] = []
        page = _watched(context.new_page(), errors, console)
        opened = page.goto(f"{live_server.base_url}/static/index.html#token={ACME_TOKEN}")
        assert opened is not None
        assert "script-src 'self'" in opened.headers["content-security-policy"]
        assert opened.headers["x-frame-options"] == "DENY"
        # The page works under its policy...
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: acme")
        expect(page.get_by_test_id("model-badge")).to_contain_text("SCRIPTED")
        assert page.evaluate("window.cspViolations") == [] and _policy_errors(console) == []
        # ...and script injected into it (as a stored result's HTML would be, were it ever inserted) does not run.
        page.evaluate(
            """() => {
              const script = document.createElement("script");
              script.textContent = "window.injected = true";
              document.body.appendChild(script);
            }"""
        )
        page.wait_for_function("() => window.cspViolations.length > 0")
        assert page.evaluate("window.injected") is None
        assert page.evaluate("window.cspViolations") == ["script-src-elem inline"]
        assert errors == []
    finally:
        context.close()


@pytest.mark.parametrize("path", ["/static/index.html", "/"])
def test_no_page_can_frame_the_page(live_server: ServerProcess, browser: "Browser", path: str) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        # A framing page, served by the browser itself. It is on the server's own origin because Chromium blocks a
        # routed page of another origin from framing a loopback address anyway (private network access), which would
        # prove nothing; frame-ancestors 'none' refuses every parent, this origin's included. The control frame, an
        # API response without the page's headers, shows the framing itself works.
        framer = (
            f'<!doctype html><title>framer</title><iframe id="framed" src="{path}"></iframe>'
            '<iframe id="control" src="/api/health"></iframe>'
        )
        page.route(
            f"{live_server.base_url}/framer.html", lambda route: route.fulfill(body=framer, content_type="text/html")
        )
        page.goto(f"{live_server.base_url}/framer.html", wait_until="load")  # "load" waits for the frames too
        assert page.frame_locator("#framed").get_by_test_id("model-badge").count() == 0
        assert page.frame_locator("#control").locator("body").inner_text().startswith('{"status":"ok"')
        assert sorted(frame.url for frame in page.frames) == sorted(
            [
                f"{live_server.base_url}/framer.html",
                f"{live_server.base_url}/api/health",
                "chrome-error://chromewebdata/",
            ]
        )
    finally:
        context.close()


def test_a_login_link_asks_before_replacing_a_stored_token(live_server: ServerProcess, browser: "Browser") -> None:
    from playwright.sync_api import expect

    context = browser.new_context()  # one profile: its tabs share the stored token
    errors: list[str] = []
    console: list[str] = []
    stored = "() => localStorage.getItem('offload-token')"
    try:
        # No token stored: a link signs in, as it always did.
        page = _watched(context.new_page(), errors, console)
        page.goto(f"{live_server.base_url}/#token={ACME_TOKEN}")
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: acme")
        expect(page.get_by_test_id("switch-user")).to_be_hidden()
        page.close()

        # Another user's link: the page asks, and stays signed in as the stored user until "Switch".
        page = _watched(context.new_page(), errors, console)
        page.goto(f"{live_server.base_url}/#token={GLOBEX_TOKEN}&session=linked-chat")
        prompt = page.get_by_role("alertdialog")
        expect(prompt).to_be_visible()
        expect(prompt).to_contain_text("This link signs you in as another user: switch?")
        expect(page.get_by_test_id("switch-user-detail")).to_have_text("The link is for tenant globex.")
        expect(page.get_by_test_id("switch-user-keep")).to_be_focused()  # the safe answer is the default
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: acme")
        assert GLOBEX_TOKEN not in page.url
        assert page.evaluate(stored) == ACME_TOKEN
        assert page.get_by_test_id("session").input_value() == "chat-1"
        page.get_by_role("button", name="Switch").click()
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: globex")
        expect(prompt).to_be_hidden()
        assert page.evaluate(stored) == GLOBEX_TOKEN
        assert page.get_by_test_id("session").input_value() == "linked-chat"

        # A link with the stored token: nothing to ask.
        page = _watched(context.new_page(), errors, console)
        page.goto(f"{live_server.base_url}/#token={GLOBEX_TOKEN}")
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: globex")
        expect(page.get_by_test_id("switch-user")).to_be_hidden()

        # A link followed inside the open page (only the fragment changes): asked too; "Keep" keeps.
        page.evaluate(f"() => {{ location.hash = 'token={ACME_TOKEN}'; }}")
        expect(page.get_by_role("alertdialog")).to_be_visible()
        expect(page.get_by_test_id("switch-user-detail")).to_have_text("The link is for tenant acme.")
        assert ACME_TOKEN not in page.url
        page.get_by_role("button", name="Keep").click()
        expect(page.get_by_role("alertdialog")).to_be_hidden()
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: globex")
        assert page.evaluate(stored) == GLOBEX_TOKEN

        # Escape answers "Keep" as well.
        page = _watched(context.new_page(), errors, console)
        page.goto(f"{live_server.base_url}/#token={ACME_TOKEN}")
        expect(page.get_by_role("alertdialog")).to_be_visible()
        page.keyboard.press("Escape")
        expect(page.get_by_role("alertdialog")).to_be_hidden()
        assert page.evaluate(stored) == GLOBEX_TOKEN
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()
