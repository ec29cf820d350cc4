"""The web console driven in a real headless browser (Debian's chromium through Playwright)
against a real ``sandlot serve``: sign in, create a sandbox, run ``echo hi`` in its terminal,
upload and download a file, pause and resume it, kill it.

Screenshots of each page go to ``$SANDLOT_TEST_OUTPUT/console`` (default ``test-output/``);
with ``SANDLOT_CONSOLE_DOCS=1`` they also replace the set committed under ``docs/console/``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.conftest import SandlotServer

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
OUTPUT = Path(os.environ.get("SANDLOT_TEST_OUTPUT", REPO / "test-output")) / "console"
DOCS = REPO / "docs" / "console"
TIMEOUT_MS = 60_000

sync_api = pytest.importorskip("playwright.sync_api")
axe_sync = pytest.importorskip("axe_playwright_python.sync_playwright")
AXE = axe_sync.Axe()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/install-deps.sh installs it)")
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: the tests run as root, where chromium's own sandbox cannot start.
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                               args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def shot(page: object, name: str) -> None:
    """Screenshot the page, and check it with axe-core (no moderate or worse violation)."""
    results = AXE.run(page)
    bad = [f"{v['id']} ({v['impact']}): {v['help']} at "
           f"{[n['target'] for n in v['nodes']][:3]}"
           for v in results.response["violations"]
           if v["impact"] in ("moderate", "serious", "critical")]
    assert not bad, f"{name}: accessibility violations: {bad}"
    OUTPUT.mkdir(parents=True, exist_ok=True)
    path = OUTPUT / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    if os.environ.get("SANDLOT_CONSOLE_DOCS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS / path.name)


def terminal_lines(page: object) -> list[str]:
    return page.eval_on_selector_all(  # type: ignore[attr-defined,no-any-return]
        ".xterm-rows > div", "rows => rows.map(r => r.textContent.trim())")


def test_console_end_to_end(sandlot_server: SandlotServer, browser: object,
                            tmp_path: Path) -> None:
    expect = sync_api.expect
    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context(  # type: ignore[attr-defined]
        viewport={"width": 1366, "height": 800}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    api = sandlot_server.client()
    sid = ""
    others: list[str] = []
    # A template builds meanwhile (through the API): the console creates from it later.
    made = api.post("/v1/templates", json={
        "image": "python:3.12", "entrypoint": ["echo built > /workspace/from-template"],
        "metadata": {"name": "console-test"}})
    assert made.status_code == 201, made.text
    template_id = made.json()["templateId"]
    try:
        # Sign in: a wrong key is refused with a message; the right one opens the list.
        page.goto(f"{sandlot_server.url}/console")
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        shot(page, "01-sign-in")
        page.get_by_label("API key").fill("not-the-key")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("not valid")
        page.get_by_label("API key").fill(sandlot_server.api_key)
        page.keyboard.press("Enter")  # the form works from the keyboard
        expect(page.get_by_role("heading", name="Sandboxes")).to_be_visible()
        (cookie,) = [c for c in context.cookies() if c["name"] == "sandlot_console"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        # The cookie alone (no CSRF token) opens nothing.
        r = context.request.get(f"{sandlot_server.url}/v1/sandboxes")
        assert r.status == 401 and r.json()["code"] == "CSRF_CHECK_FAILED"

        # Create from an image with limits, metadata and an egress policy.
        page.get_by_role("link", name="New sandbox").first.click()
        expect(page.get_by_role("heading", name="New sandbox")).to_be_visible()
        page.get_by_label("Image", exact=True).fill("python:3.12")
        page.get_by_label("Memory limit").fill("256Mi")
        page.get_by_label("Metadata").fill("suite=console")
        page.get_by_label("Default action").select_option("deny")
        page.get_by_label("Rules").fill("allow pypi.org")
        shot(page, "02-create")
        page.get_by_role("button", name="Create sandbox").click()
        page.wait_for_url("**/console#/sandbox/**")
        expect(page.locator("main[data-state=Running]")).to_be_visible()
        sid = page.url.split("#/sandbox/")[1].split("/")[0]
        created = api.get(f"/v1/sandboxes/{sid}").json()
        assert created["metadata"] == {"suite": "console"}
        policy = api.get(f"/v1/sandboxes/{sid}/networkpolicy").json()["policy"]
        assert policy == {"defaultAction": "deny",
                          "egress": [{"action": "allow", "target": "pypi.org"}]}
        expect(page.get_by_role("definition").filter(has_text="suite=console")).to_be_visible()
        shot(page, "03-sandbox-overview")

        # Terminal: `echo hi` answered with `hi` on a line of its own.
        page.get_by_role("tab", name="Terminal").click()
        expect(page.get_by_text("Connected: a shell in the sandbox.")).to_be_visible()
        page.get_by_role("application", name="Terminal").click()
        page.keyboard.type("echo hi\n")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.xterm-rows > div')]"
            ".some(r => r.textContent.trim() === 'hi')")
        assert "hi" in terminal_lines(page)
        shot(page, "04-terminal")

        # Files: upload into /tmp, see it in the sandbox, download it back.
        page.get_by_role("tab", name="Files").click()
        expect(page.get_by_text("entries in /tmp")).to_be_visible()
        content = b"uploaded through the console\n"
        page.get_by_label("Upload to this folder").set_input_files(
            files=[{"name": "hello.txt", "mimeType": "text/plain", "buffer": content}])
        page.get_by_role("button", name="Upload", exact=True).click()
        download_button = page.get_by_role("button", name="Download hello.txt")
        expect(download_button).to_be_visible()
        inside = api.get(f"/v1/sandboxes/{sid}/proxy/44772/files/download",
                         params={"path": "/tmp/hello.txt"})
        assert inside.status_code == 200 and inside.content == content
        with page.expect_download() as info:
            download_button.click()
        saved = tmp_path / "downloaded.txt"
        info.value.save_as(saved)
        assert info.value.suggested_filename == "hello.txt"
        assert saved.read_bytes() == content
        shot(page, "05-files")

        # Metrics, egress policy, events and logs.
        page.get_by_role("tab", name="Metrics").click()
        expect(page.get_by_text("core(s); memory")).to_be_visible()
        shot(page, "06-metrics")
        page.get_by_role("tab", name="Network").click()
        expect(page.get_by_text("Default action: deny")).to_be_visible()
        expect(page.get_by_role("rowheader", name="pypi.org")).to_be_visible()
        shot(page, "07-network")
        page.get_by_role("tab", name="Events and logs").click()
        # The diagnostics API's runtime events of this sandbox (state changes among them).
        expect(page.locator("#panel-events-and-logs pre").first).to_contain_text("Running")
        shot(page, "08-events-and-logs")

        # Renew by an hour; snapshot it, then create a second sandbox from that snapshot.
        before = api.get(f"/v1/sandboxes/{sid}").json()["expiresAt"]
        page.get_by_label("Renew by").select_option("3600")
        page.get_by_role("button", name="Renew").click()
        expect(page.locator("#toast")).to_contain_text("Renew: requested.")
        assert api.get(f"/v1/sandboxes/{sid}").json()["expiresAt"] > before
        page.get_by_role("button", name="Snapshot").click()
        expect(page.locator("#toast")).to_contain_text("Snapshot: requested.")
        (snap,) = api.get("/v1/snapshots", params={"sandboxId": sid}).json()["items"]
        deadline = time.monotonic() + 300
        while api.get(f"/v1/snapshots/{snap['id']}").json()["status"]["state"] != "Ready":
            assert time.monotonic() < deadline, "the console's snapshot never became Ready"
            time.sleep(0.2)
        page.goto(f"{sandlot_server.url}/console#/new")
        page.get_by_label("Create from").select_option("snapshot")
        page.get_by_label("Snapshot", exact=True).select_option(snap["id"])
        page.get_by_role("button", name="Create sandbox").click()
        page.wait_for_url(lambda url: "#/sandbox/" in url and sid not in url)
        expect(page.locator("main[data-state=Running]")).to_be_visible()
        second = page.url.split("#/sandbox/")[1].split("/")[0]
        assert second != sid
        others.append(second)
        page.get_by_role("tab", name="Files").click()
        expect(page.get_by_role("button", name="Download hello.txt")).to_be_visible()

        # And from the template, once built.
        deadline = time.monotonic() + 300
        while (status := api.get(f"/v1/templates/{template_id}").json()["status"])[
                "phase"] != "Succeeded":
            assert status["phase"] != "Failed" and time.monotonic() < deadline, status
            time.sleep(0.5)
        page.goto(f"{sandlot_server.url}/console#/new")
        page.get_by_label("Create from").select_option("template")
        page.get_by_label("Template", exact=True).select_option(template_id)
        page.get_by_role("button", name="Create sandbox").click()
        page.wait_for_url(lambda url: "#/sandbox/" in url and second not in url)
        expect(page.locator("main[data-state=Running]")).to_be_visible()
        third = page.url.split("#/sandbox/")[1].split("/")[0]
        others.append(third)
        built = api.get(f"/v1/sandboxes/{third}/proxy/44772/files/download",
                        params={"path": "/workspace/from-template"})
        assert built.status_code == 200 and built.content == b"built\n"

        # The list shows it, and its state filter works.
        page.goto(f"{sandlot_server.url}/console#/?state=Running")
        link = page.get_by_role("link", name=sid)
        expect(link).to_be_visible()
        shot(page, "09-list")
        # The list refreshes itself without taking the keyboard focus away.
        link.focus()
        updated = page.locator("#list-status").inner_text()
        expect(page.locator("#list-status")).not_to_have_text(updated)
        expect(link).to_be_focused()
        page.goto(f"{sandlot_server.url}/console#/?state=Paused")
        expect(page.get_by_text("No sandboxes.")).to_be_visible()
        # Paged: two a page here, and following "Next page" shows every running sandbox.
        page.goto(f"{sandlot_server.url}/console#/?state=Running&pageSize=2")
        expect(page.locator("body[data-ready=list]")).to_be_attached()
        listed: set[str] = set()
        for _ in range(50):
            expect(page.locator("table.list tbody a").first).to_be_visible()
            names = page.locator("table.list tbody a").all_inner_texts()
            assert 1 <= len(names) <= 2, names
            listed.update(names)
            following = page.get_by_role("link", name="Next page")
            if not following.count():
                break
            current = page.locator(".pager [aria-current=page]")
            shown = current.inner_text()
            following.click()
            expect(current).not_to_have_text(shown)
        assert {sid, second, third} <= listed, listed
        expect(page.get_by_role("link", name="Previous page")).to_be_visible()
        expect(page.get_by_label("Per page")).to_have_value("2")

        # Pause and resume, then kill (confirmed in the browser's dialog).
        page.goto(f"{sandlot_server.url}/console#/sandbox/{sid}")
        expect(page.locator("main[data-state=Running]")).to_be_visible()
        # The tabs follow the ARIA tab pattern: arrow keys move between them (and wrap).
        page.get_by_role("tab", name="Overview").focus()
        page.keyboard.press("ArrowLeft")
        expect(page.get_by_role("tab", name="Events and logs")).to_have_attribute(
            "aria-selected", "true")
        expect(page.get_by_role("tab", name="Events and logs")).to_be_focused()
        page.get_by_role("button", name="Pause").click()
        expect(page.locator("main[data-state=Paused]")).to_be_visible()
        assert api.get(f"/v1/sandboxes/{sid}").json()["status"]["state"] == "Paused"
        shot(page, "10-paused")
        page.get_by_role("button", name="Resume").click()
        expect(page.locator("main[data-state=Running]")).to_be_visible()
        page.once("dialog", lambda d: d.accept())
        page.get_by_role("button", name="Kill").click()
        page.wait_for_function(
            "() => ['Terminated', undefined].includes(document.querySelector('main').dataset.state)"
            " || document.querySelector('.state-gone') !== null")
        gone = api.get(f"/v1/sandboxes/{sid}")
        assert gone.status_code == 404 or gone.json()["status"]["state"] == "Terminated"
        sid = ""
    finally:
        for leftover in [sid, *others]:
            if leftover:
                api.delete(f"/v1/sandboxes/{leftover}")
        api.delete(f"/v1/templates/{template_id}")
        api.close()
        context.close()


