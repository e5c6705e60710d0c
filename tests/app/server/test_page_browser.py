"""
The web page in a real headless browser: Debian's chromium driven by Playwright, against a live server process.

Steps (a screenshot of each is saved under ``test-artifacts/page/``, or ``$OFFLOAD_TEST_ARTIFACTS/page/``): open the
page with a token, send a message, see the pending approval, approve it, see the final answer, open an offloaded text
result and page through it, open an offloaded image; all of it under the page's Content-Security-Policy, with no
violation reported.

Then the page's defences: it refuses to run injected inline script, another site cannot frame it, and a login link
with another user's token asks before it replaces the stored one.

Then a turn's progress, live: with tools that take a while, the page shows each call as an event line while the turn
runs (read from the message POST's server-sent events), before the reply, which then replaces the lines (screenshots
of 390 and 1366 px with the lines showing are copied to /tmp/page-stream-390.png and /tmp/page-stream-1366.png), and
after an approval the resumed run shows the approved call the same way, before the final answer (screenshots copied
to /tmp/page-approve-390.png and /tmp/page-approve-1366.png).

Then a newcomer's first hour: the page fits 360 and 390 px phones and a 1366 px desktop (screenshots of 390 and 1366
are copied to /tmp/page-390.png and /tmp/page-1366.png for review), a login link signs in after a token the server
refused, Esc closes the result viewer, approvals and denials are events in the chat, images a tool made are shown
inline, viewer pages end at line ends, and the chat list switches chats and starts new ones.
"""

import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from server_processes import ServerProcess, serve
from server_tenants import ACME_TOKEN, GLOBEX_TOKEN, TOKENS

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page

pytestmark = pytest.mark.slow  # a server process and Chromium

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
ARTIFACTS = Path(os.environ.get("OFFLOAD_TEST_ARTIFACTS", Path(__file__).resolve().parents[3] / "test-artifacts"))
TIMEOUT_MS = 30_000
# Injected before any page script (through the DevTools protocol, which the policy does not govern).
CSP_WATCH = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.cspViolations.push(`${event.effectiveDirective} ${event.blockedURI}`);
});
"""


@pytest.fixture(scope="module")
def page_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The live server's directory: its store is ``results`` in it."""
    return tmp_path_factory.mktemp("page")


@pytest.fixture(scope="module")
def live_server(page_directory: Path) -> Iterator[ServerProcess]:
    """The server on a local store, as `offload-haystack serve` runs it."""
    with serve(store=str(page_directory / "results"), tokens=TOKENS, log=page_directory / "server.log") as server:
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
        # Pages end at a line's end (see test_viewer_pages_end_where_a_reader_can_follow).
        expect(page.get_by_test_id("viewer-range")).to_contain_text(re.compile(r"bytes 0\u2013(\d+) of"))
        page.get_by_test_id("viewer-next").click()
        expect(page.get_by_test_id("viewer-text")).to_contain_text(re.compile(r"^\[\d+\] Research solar panels"))
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


# The page for a newcomer's first hour: phones and desktops, a chat list, approvals told as events, images inline,
# readable pages in the viewer, the audit trail, and login links that work after a refused token.

RESEARCH = "Research solar panels, dump the invoices table and chart revenue"
INVOICE = "Send an invoice to Initech for 250 EUR"
REVIEW_COPIES = {390: Path("/tmp/page-390.png"), 1366: Path("/tmp/page-1366.png")}  # noqa: S108 - for review


def _signed_in(context: "BrowserContext", errors: list[str], console: list[str], base_url: str, session: str) -> "Page":
    """A page of `context` signed in as acme with `session` open."""
    from playwright.sync_api import expect

    page = _watched(context.new_page(), errors, console)
    page.goto(f"{base_url}/#token={ACME_TOKEN}&session={session}")
    expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: acme")
    expect(page.get_by_test_id("session")).to_have_value(session)
    expect(page.get_by_test_id("message")).to_be_enabled()
    return page


def _send(page: "Page", text: str) -> None:
    """Send `text` and wait until the page has shown the turn's outcome."""
    from playwright.sync_api import expect

    page.get_by_test_id("message").fill(text)
    page.get_by_test_id("send").click()
    expect(page.get_by_test_id("message")).to_have_value("")
    expect(page.get_by_test_id("send")).to_be_enabled()
    expect(page.get_by_test_id("status")).to_contain_text("Turn")


def _store_of(server: ServerProcess) -> str:
    arguments = list(server.process.args)
    return str(arguments[arguments.index("--store") + 1])


def _in_view(page: "Page", test_id: str) -> bool:
    box = page.get_by_test_id(test_id).bounding_box()
    viewport = page.viewport_size
    assert box is not None and viewport is not None
    return (
        box["x"] >= 0
        and box["y"] >= 0
        and box["x"] + box["width"] <= viewport["width"]
        and (box["y"] + box["height"] <= viewport["height"])
    )


@pytest.mark.parametrize(("width", "height"), [(390, 844), (360, 740), (1366, 768)])
def test_the_page_fits_phones_and_desktops(
    live_server: ServerProcess, browser: "Browser", tmp_path: Path, width: int, height: int
) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": width, "height": height})
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, live_server.base_url, f"fit-{width}")
        _send(page, RESEARCH)  # long lines, long references and an image
        _send(page, INVOICE)  # an approval waits, in the side panel
        expect(page.get_by_test_id("approval")).to_have_count(1)
        page.evaluate("() => window.scrollTo(0, 0)")
        # Nothing runs off the side of the window...
        assert page.evaluate("() => document.scrollingElement.scrollWidth <= window.innerWidth"), page.evaluate(
            "() => [document.scrollingElement.scrollWidth, window.innerWidth]"
        )
        # ...and the message box and its button are on screen, the page scrolled to its top.
        for test_id in ("message", "send"):
            expect(page.get_by_test_id(test_id)).to_be_visible()
            assert _in_view(page, test_id), test_id
        expect(page.get_by_test_id("thumbnail")).to_have_count(1)
        transcript = page.get_by_test_id("transcript").bounding_box()
        chats = page.get_by_test_id("chats").bounding_box()
        side = page.get_by_test_id("approvals").bounding_box()
        assert transcript is not None and chats is not None and side is not None
        if width < 760:
            # One column: the chat takes the width (not one letter per line); the chats above it, the panels below.
            assert transcript["width"] >= width - 40
            assert chats["y"] < transcript["y"] < side["y"]
            bubble = page.get_by_test_id("msg-user").first.bounding_box()
            assert bubble is not None and bubble["width"] > 200
        else:
            # Three columns side by side, the chat the widest.
            assert chats["x"] + chats["width"] < transcript["x"] < transcript["x"] + transcript["width"] < side["x"]
            assert transcript["width"] > 600
        screenshot = tmp_path / f"page-{width}.png"
        page.screenshot(path=screenshot)
        if width in REVIEW_COPIES:
            shutil.copy(screenshot, REVIEW_COPIES[width])
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()


def test_a_login_link_signs_in_after_a_token_the_server_refused(live_server: ServerProcess, browser: "Browser") -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    errors: list[str] = []
    console: list[str] = []
    try:
        # A token from an earlier run of the server is stored; the server refuses it now.
        page = _watched(context.new_page(), errors, console)
        page.goto(live_server.base_url)
        page.evaluate("() => localStorage.setItem('offload-token', 'a-token-from-last-week-0123456789')")
        page.reload()
        expect(page.locator("#login-error")).to_have_text("Unknown token.")
        expect(page.get_by_test_id("tenant-badge")).to_be_hidden()
        # The new link, opened in the same tab: it signs in, without asking to replace a token that signs nobody in.
        page.evaluate(f"() => {{ location.hash = 'token={ACME_TOKEN}&session=after-refusal'; }}")
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: acme")
        expect(page.get_by_test_id("session")).to_have_value("after-refusal")
        expect(page.get_by_test_id("switch-user")).to_be_hidden()
        expect(page.locator("#login-error")).to_have_text("")
        assert page.evaluate("() => localStorage.getItem('offload-token')") == ACME_TOKEN
        assert ACME_TOKEN not in page.url

        # A refused token typed by hand, then a link in the same tab: the link signs in too.
        page.evaluate("() => localStorage.clear()")
        page.reload()
        page.get_by_test_id("token").fill("typed-wrong-0123456789abcdef")
        page.get_by_test_id("connect").click()
        expect(page.locator("#login-error")).to_have_text("Unknown token.")
        expect(page.get_by_test_id("tenant-badge")).to_be_hidden()
        expect(page.get_by_test_id("message")).to_be_disabled()
        page.evaluate(f"() => {{ location.hash = 'token={GLOBEX_TOKEN}'; }}")
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: globex")
        expect(page.get_by_test_id("switch-user")).to_be_hidden()

        # A fresh tab opened from a link while a refused token is stored (the tabs share it): signed in at once too.
        page.evaluate("() => localStorage.setItem('offload-token', 'a-token-from-last-week-0123456789')")
        page = _watched(context.new_page(), errors, console)
        page.goto(f"{live_server.base_url}/#token={ACME_TOKEN}")
        expect(page.get_by_test_id("tenant-badge")).to_have_text("tenant: acme")
        expect(page.get_by_test_id("switch-user")).to_be_hidden()
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()


def test_escape_closes_the_result_viewer(live_server: ServerProcess, browser: "Browser") -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, live_server.base_url, "escape")
        _send(page, "Research solar panels")
        opener = page.get_by_test_id("view-result").first
        opener.click()
        expect(page.get_by_test_id("viewer")).to_be_visible()
        expect(page.get_by_test_id("viewer-text")).to_contain_text("Research solar panels")
        page.keyboard.press("Escape")
        expect(page.get_by_test_id("viewer")).to_be_hidden()
        expect(opener).to_be_focused()  # back where the reader was
        # A modal dialog, for assistive technology too; Escape works whatever has the focus inside it.
        opener.click()
        expect(
            page.get_by_role("dialog", name=page.get_by_test_id("view-result").first.get_attribute("title"))
        ).to_be_visible()
        page.get_by_test_id("viewer-next").focus()
        page.keyboard.press("Escape")
        expect(page.get_by_role("dialog")).to_be_hidden()
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()


def test_approvals_and_denials_are_events_in_the_chat(
    live_server: ServerProcess, browser: "Browser", tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1366, "height": 900})
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, live_server.base_url, "approval-events")
        transcript = page.get_by_test_id("transcript")

        # The durable stop: a waiting event naming the call, not an assistant bubble "Approval required: <ids>".
        _send(page, INVOICE)
        waiting = page.get_by_test_id("event-waiting")
        expect(waiting).to_contain_text("Waiting for approval: send_invoice with customer=Initech, amount=250")
        expect(page.get_by_test_id("msg-assistant").filter(has_text="Approval required")).to_have_count(0)
        waiting.get_by_test_id("review-approvals").click()
        expect(page.get_by_test_id("approve")).to_be_focused()

        # An edited approval: one event with the arguments as they ran, and no "YOU" bubble holding a Python dict.
        page.get_by_test_id("approval-arguments").fill('{"customer": "Initech", "amount": 50}')
        page.get_by_test_id("approve").click()
        expect(transcript).to_contain_text("sent to Initech for 50 EUR")
        expect(page.get_by_test_id("event-approved")).to_have_text(
            "✓Approved send_invoice with customer=Initech, amount=50 (edited)"
        )
        expect(page.get_by_test_id("msg-user")).to_have_count(1)
        expect(transcript).not_to_contain_text("were updated by the user")
        expect(page.get_by_test_id("event-waiting")).to_have_count(0)

        # A denial: "Denied send_invoice: <reason>", not the raw text the model was given.
        _send(page, "Send an invoice to Globex for 9 EUR")
        page.get_by_test_id("approval-reason").fill("over budget")
        page.get_by_test_id("deny").click()
        expect(page.get_by_test_id("event-denied")).to_have_text("✕Denied send_invoice: over budget")
        expect(page.get_by_test_id("msg-tool").filter(has_text="rejected by the user")).to_have_count(0)
        expect(page.get_by_test_id("msg-assistant").last).to_contain_text("scripted summary")
        page.screenshot(path=tmp_path / "approval-events.png")

        # The audit trail, in its collapsible panel: every step of both approvals.
        expect(page.get_by_test_id("audit")).to_be_hidden()
        page.get_by_test_id("audit-panel").locator("summary").click()
        events = page.get_by_test_id("audit-event")
        expect(events).to_have_count(8)
        expect(events.nth(0)).to_contain_text("requested")
        expect(events.nth(1)).to_contain_text("approved send_invoice (edited)")
        expect(events.nth(3)).to_contain_text("send_invoice ran")
        expect(events.nth(5)).to_contain_text("denied send_invoice: over budget")
        expect(events.nth(5)).to_contain_text("by acme/")
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()


def test_images_a_tool_made_are_shown_in_the_chat(live_server: ServerProcess, browser: "Browser") -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, live_server.base_url, "images")
        _send(page, "Chart revenue")
        thumbnail = page.get_by_test_id("msg-tool").get_by_test_id("thumbnail")
        expect(thumbnail).to_have_count(1)
        page.wait_for_function("() => document.querySelector('[data-testid=thumbnail] img').naturalWidth > 0")
        image = thumbnail.locator("img")
        assert image.evaluate("node => [node.naturalWidth, node.naturalHeight]") == [360, 180]
        assert image.evaluate("node => node.src").startswith("blob:")
        # The text of the same result still opens in the viewer; the image opens larger there.
        expect(page.get_by_test_id("msg-tool").get_by_test_id("open-offloaded")).to_have_count(1)
        thumbnail.click()
        expect(page.get_by_test_id("viewer-image")).to_be_visible()
        page.wait_for_function("() => document.getElementById('viewer-image').naturalWidth === 360")
        assert errors == [] and page.evaluate("window.cspViolations") == [] and _policy_errors(console) == []
    finally:
        context.close()


def test_viewer_pages_end_where_a_reader_can_follow(live_server: ServerProcess, browser: "Browser") -> None:
    from playwright.sync_api import expect

    from haystack_integrations.offload import FsspecToolResultStore

    context = browser.new_context()
    errors: list[str] = []
    console: list[str] = []
    # One result without a space or a newline in it: its pages must be cut mid-word, and say so.
    store = FsspecToolResultStore(_store_of(live_server)).for_session("acme", "viewer-pages")
    unbroken = store.write(key="token.txt", content="x" * 9000, tool_name="sql_query")
    try:
        page = _signed_in(context, errors, console, live_server.base_url, "viewer-pages")
        _send(page, "Research solar panels")
        row = page.get_by_test_id("result").filter(has_text="web_search")
        row.get_by_test_id("view-result").click()
        text = page.get_by_test_id("viewer-text")
        expect(text).to_contain_text("[1] Research solar panels")
        first = text.text_content() or ""
        # Page 1 ends at a line's end; page 2 starts at the next line, where page 1 stopped.
        assert first.endswith("\n") and 3000 < len(first.encode()) <= 4096
        expect(page.get_by_test_id("viewer-range")).to_have_text(
            re.compile(rf"^bytes 0\u2013{len(first.encode())} of ")
        )
        page.get_by_test_id("viewer-next").click()
        expect(page.get_by_test_id("viewer-range")).to_contain_text(f"bytes {len(first.encode())}\u2013")
        second = text.text_content() or ""
        assert re.match(r"\[\d+\] Research solar panels", second), second[:80]
        expect(page.get_by_test_id("viewer-continued")).to_be_hidden()
        expect(page.get_by_test_id("viewer-continues")).to_be_hidden()
        reference = row.get_by_test_id("view-result").get_attribute("title")
        with live_server.client(ACME_TOKEN) as client:
            whole = client.get(f"/api/sessions/viewer-pages/results/{reference}").text
        assert whole.startswith(first + second)
        page.get_by_test_id("viewer-prev").click()
        expect(text).to_have_text(first)
        page.keyboard.press("Escape")

        # One long word: cut at the page's end, with a marker on both sides of the cut.
        page.get_by_title(unbroken).click()
        expect(page.get_by_test_id("viewer-continues")).to_be_visible()
        expect(page.get_by_test_id("viewer-continued")).to_be_hidden()
        page.get_by_test_id("viewer-next").click()
        expect(page.get_by_test_id("viewer-range")).to_contain_text("bytes 4096\u20138192 of 9000")
        expect(page.get_by_test_id("viewer-continued")).to_be_visible()
        page.get_by_test_id("viewer-next").click()
        expect(page.get_by_test_id("viewer-range")).to_have_text("bytes 8192\u20139000 of 9000")
        expect(page.get_by_test_id("viewer-continues")).to_be_hidden()
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()


def test_the_chat_list_switches_chats_and_starts_new_ones(live_server: ServerProcess, browser: "Browser") -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, live_server.base_url, "list-first")
        _send(page, "Chart revenue")
        items = page.get_by_test_id("session-item")
        expect(items.filter(has_text="list-first")).to_have_count(1)
        expect(items.filter(has_text="list-first")).to_have_attribute("aria-current", "true")
        expect(items.filter(has_text="list-first")).to_contain_text("1 turn")

        # "New chat": a fresh, empty chat, listed (as new) and current.
        page.get_by_test_id("new-chat").click()
        expect(page.get_by_test_id("chat-title")).to_have_text(re.compile(r"^chat-[0-9a-z]+$"))
        fresh = page.get_by_test_id("chat-title").text_content() or ""
        expect(page.get_by_test_id("transcript")).to_have_text("No messages yet.")
        expect(page.get_by_test_id("result")).to_have_count(0)
        expect(items.filter(has_text=fresh)).to_have_attribute("aria-current", "true")
        expect(items.filter(has_text=fresh)).to_contain_text("new")
        _send(page, "Check the logs of billing")
        expect(items.filter(has_text=fresh)).to_contain_text("1 turn")

        # Back to the first chat, from the list: its conversation and results.
        items.filter(has_text="list-first").click()
        expect(page.get_by_test_id("chat-title")).to_have_text("list-first")
        expect(page.get_by_test_id("msg-user")).to_have_text(["youChart revenue"])
        expect(page.get_by_test_id("result")).to_have_count(2)
        assert page.evaluate("() => localStorage.getItem('offload-session')") == "list-first"

        # Another tenant's list holds none of acme's chats.
        other = browser.new_context()
        try:
            theirs = _watched(other.new_page(), errors, console)
            theirs.goto(f"{live_server.base_url}/#token={GLOBEX_TOKEN}&session=globex-own")
            expect(theirs.get_by_test_id("tenant-badge")).to_have_text("tenant: globex")
            expect(theirs.get_by_test_id("session-item")).to_have_count(1)
            expect(theirs.get_by_test_id("session-item")).to_contain_text("globex-own")
        finally:
            other.close()
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()


# A turn's progress, live (server-sent events on the message POST).

STREAM_REVIEW_COPIES = {390: Path("/tmp/page-stream-390.png"), 1366: Path("/tmp/page-stream-1366.png")}  # noqa: S108
# What appears in the transcript, in order: progress lines, and the assistant's answer (injected like CSP_WATCH).
APPEARANCES_WATCH = """
window.appearances = [];
new MutationObserver((records) => {
  for (const record of records) for (const node of record.addedNodes) {
    if (!(node instanceof Element)) continue;
    if (node.matches("[data-testid=progress-event]")) window.appearances.push("progress");
    if (node.matches("[data-testid=msg-assistant]")) window.appearances.push("assistant");
  }
}).observe(document, { childList: true, subtree: true });
"""


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server with scripted tools that take 3 s each, so a turn can be watched while it runs."""
    directory = tmp_path_factory.mktemp("page-slow")
    with serve(
        store=str(directory / "results"),
        tokens=TOKENS,
        log=directory / "server.log",
        environment={"OFFLOAD_SERVER_SCRIPTED_TOOL_DELAY": "3"},
    ) as server:
        yield server


@pytest.mark.parametrize(("width", "height"), [(390, 844), (1366, 768)])
def test_a_turns_progress_shows_live_before_the_reply(
    slow_server: ServerProcess, browser: "Browser", tmp_path: Path, width: int, height: int
) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": width, "height": height})
    context.add_init_script(APPEARANCES_WATCH)
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, slow_server.base_url, f"live-{width}")
        page.get_by_test_id("message").fill(RESEARCH)
        page.get_by_test_id("send").click()
        # While the tools run: the message, and one line per call, running, with its arguments; no answer yet.
        expect(page.get_by_test_id("msg-user-sending")).to_contain_text(RESEARCH)
        lines = page.get_by_test_id("progress-event")
        expect(lines).to_have_count(3)
        search = lines.filter(has_text="web_search")
        expect(search).to_be_visible()
        expect(search).to_contain_text("(query=Research solar panels")
        expect(search).to_contain_text("running…")
        expect(lines.filter(has_text="render_chart")).to_contain_text("(metric=revenue) running…")
        expect(page.get_by_test_id("msg-assistant")).to_have_count(0)
        expect(page.get_by_test_id("status")).to_contain_text("The agent is working on turn 1")
        assert page.evaluate("() => document.scrollingElement.scrollWidth <= window.innerWidth")
        screenshot = tmp_path / f"page-stream-{width}.png"
        page.screenshot(path=screenshot)
        shutil.copy(screenshot, STREAM_REVIEW_COPIES[width])

        # The turn ends: the stored conversation replaces the lines; they came first.
        expect(page.get_by_test_id("msg-assistant").last).to_contain_text("scripted summary")
        expect(lines).to_have_count(0)
        expect(page.get_by_test_id("msg-user")).to_have_count(1)
        expect(page.get_by_test_id("status")).to_contain_text("Turn 1 completed; 4 result(s) stored.")
        appearances = page.evaluate("window.appearances")
        assert appearances[:3] == ["progress"] * 3 and "assistant" in appearances, appearances
        assert errors == [] and page.evaluate("window.cspViolations") == [] and _policy_errors(console) == []
    finally:
        context.close()


APPROVE_REVIEW_COPIES = {390: Path("/tmp/page-approve-390.png"), 1366: Path("/tmp/page-approve-1366.png")}  # noqa: S108


@pytest.mark.parametrize(("width", "height"), [(390, 844), (1366, 768)])
def test_an_approved_calls_progress_shows_live_before_the_final_answer(
    slow_server: ServerProcess, browser: "Browser", tmp_path: Path, width: int, height: int
) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": width, "height": height})
    context.add_init_script(APPEARANCES_WATCH)
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, slow_server.base_url, f"approve-live-{width}")
        _send(page, INVOICE)
        expect(page.get_by_test_id("approval")).to_have_count(1)
        page.evaluate("() => { window.appearances = []; }")  # from the click on: what appears, in order
        page.get_by_test_id("approve").click()
        # While the approved call runs (3 s): one line for it, running, with its arguments; no final answer yet.
        lines = page.get_by_test_id("progress-event")
        expect(lines).to_have_count(1)
        expect(lines).to_contain_text("send_invoice(customer=Initech, amount=250) running…")
        expect(lines).to_be_visible()
        expect(page.get_by_test_id("transcript")).not_to_contain_text("sent to Initech")
        expect(page.get_by_test_id("status")).to_contain_text("The agent is working on turn 2")
        expect(page.get_by_test_id("approve")).to_be_disabled()
        assert page.evaluate("() => document.scrollingElement.scrollWidth <= window.innerWidth")
        screenshot = tmp_path / f"page-approve-{width}.png"
        page.screenshot(path=screenshot)
        shutil.copy(screenshot, APPROVE_REVIEW_COPIES[width])

        # The call returns and the model answers: the stored conversation replaces the line, which came first.
        expect(page.get_by_test_id("transcript")).to_contain_text("sent to Initech for 250 EUR")
        expect(lines).to_have_count(0)
        expect(page.get_by_test_id("approval")).to_have_count(0)
        expect(page.get_by_test_id("status")).to_contain_text("Turn 2 completed.")
        appearances = page.evaluate("window.appearances")
        assert appearances[0] == "progress" and "assistant" in appearances, appearances
        assert errors == [] and page.evaluate("window.cspViolations") == [] and _policy_errors(console) == []
    finally:
        context.close()


def test_a_failed_resume_offers_continue_which_runs_the_decided_call(
    live_server: ServerProcess, page_directory: Path, browser: "Browser", monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from playwright.sync_api import expect

    from haystack_integrations.offload import FsspecToolResultStore
    from haystack_integrations.offload.approvals.ledger import ApprovalLedger
    from haystack_integrations.offload.errors import StorageUnavailableError
    from haystack_integrations.offload.sessions import ChatService
    from haystack_integrations.offload.sessions.errors import RunFailedError
    from offload_haystack_app.demo.scripted_model import scripted_generator
    from offload_haystack_app.server import build_agent

    # The live server's store, from this process: a decision whose resume failed before the call ran.
    session = FsspecToolResultStore(str(page_directory / "results")).for_session("acme", "failed-resume")
    service = ChatService(build_agent(scripted_generator()))

    async def unavailable(self: ApprovalLedger, claim: object) -> None:
        raise StorageUnavailableError("injected: the store is unavailable")

    async def decide_and_fail() -> None:
        [request] = (await service.send_message(session, INVOICE)).pending
        monkeypatch.setattr(ApprovalLedger, "claim_step_async", unavailable)
        with pytest.raises(RunFailedError):
            await service.decide(session, request.request_id, approved=True)
        monkeypatch.undo()

    with ThreadPoolExecutor(max_workers=1) as pool:  # Playwright's own loop runs in this thread
        pool.submit(lambda: asyncio.run(decide_and_fail())).result()
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, live_server.base_url, "failed-resume")
        transcript = page.get_by_test_id("transcript")
        expect(transcript).to_contain_text("The last turn failed")
        expect(transcript).not_to_contain_text("sent to Initech")
        page.get_by_test_id("continue").click()
        expect(transcript).to_contain_text("sent to Initech for 250 EUR")
        expect(page.get_by_test_id("continue")).to_have_count(0)
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()


def test_a_decision_whose_answer_failed_before_its_resume_offers_continue(
    live_server: ServerProcess, page_directory: Path, browser: "Browser", monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from playwright.sync_api import expect

    from haystack_integrations.offload import FsspecToolResultStore
    from haystack_integrations.offload.approvals import decisions
    from haystack_integrations.offload.errors import StorageUnavailableError
    from haystack_integrations.offload.sessions import ChatService
    from offload_haystack_app.demo.scripted_model import scripted_generator
    from offload_haystack_app.server import build_agent

    # The decision is recorded, then its audit append gives up: the answer fails before any resume began, and the
    # request no longer waits, so the page has nothing left to decide.
    session = FsspecToolResultStore(str(page_directory / "results")).for_session("acme", "unanswered-decision")
    service = ChatService(build_agent(scripted_generator()))

    async def unavailable(*args: object) -> None:
        raise StorageUnavailableError("injected: the store is unavailable")

    async def decide_and_fail() -> None:
        [request] = (await service.send_message(session, INVOICE)).pending
        monkeypatch.setattr(decisions, "append_audit_async", unavailable)
        with pytest.raises(StorageUnavailableError):
            await service.decide(session, request.request_id, approved=True)
        monkeypatch.undo()

    with ThreadPoolExecutor(max_workers=1) as pool:  # Playwright's own loop runs in this thread
        pool.submit(lambda: asyncio.run(decide_and_fail())).result()
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    errors: list[str] = []
    console: list[str] = []
    try:
        page = _signed_in(context, errors, console, live_server.base_url, "unanswered-decision")
        transcript = page.get_by_test_id("transcript")
        expect(transcript).to_contain_text("decided; not finished")
        expect(page.get_by_test_id("approvals")).to_contain_text("The decided calls have not finished yet")
        expect(page.get_by_test_id("resume")).to_have_count(0)  # not the "requests expired" offer
        page.get_by_test_id("continue").click()
        expect(transcript).to_contain_text("sent to Initech for 250 EUR")
        expect(page.get_by_test_id("continue")).to_have_count(0)
        assert errors == [] and _policy_errors(console) == []
    finally:
        context.close()
