"""Drive VS Code (code-server) in Debian's chromium with Playwright, as a user would. Prints one
JSON report; saves screenshots into the output folder. Run with the e2e venv's Python:

    vscode_drive.py fix URL FOLDER OUT_DIR SAMPLE_NAME CULPRIT_ROW COLUMN NOTEBOOK_NAME
        open a buggy sample, read the Problems panel, apply the quick fix with Ctrl+. and read
        it again; then the same in a notebook's cell.
    vscode_drive.py output URL FOLDER OUT_DIR NOTEBOOK_NAME
        open a notebook saved with an explained error and report, from the notebook's output
        webview, the outputs' text, the explanation's marked lines and the contrast of every
        piece of its text.
    vscode_drive.py hover URL FOLDER OUT_DIR SAMPLE_NAME ROW COLUMN SHOT
        open a sample whose error a run explained, wait for its problem to say it was confirmed
        when it ran, hover its culprit with the keyboard (Ctrl+K Ctrl+I) and report the hover's
        text, its code block's lines, the editor's theme and the contrast of every piece of its
        text; the screenshot is SHOT.
    vscode_drive.py trust URL FOLDER OUT_DIR SAMPLE_NAME MARKER
        answer "No" to the workspace-trust prompt, open the sample and read its problem, and
        whether MARKER (written by the workspace's own interpreter) exists; then trust the
        folder and read both again.
"""
import json
import os
import sys
import time

from contrast import text_contrasts
from pictures import decoded
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

report = {}
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def problems(page) -> list[str]:
    return page.locator(".markers-panel .monaco-list-row").all_inner_texts()


def open_file(page, name: str) -> None:
    page.keyboard.press("Control+P")
    time.sleep(1)
    page.keyboard.type(name)
    time.sleep(1.5)
    page.keyboard.press("Enter")
    time.sleep(2)


def quick_fix(page, out_dir: str, shot: str) -> None:
    """Ctrl+. at the cursor, a screenshot of the menu, Enter on its first (preferred) fix."""
    page.keyboard.press("Control+.")
    page.locator(".action-widget").first.wait_for(state="visible", timeout=30000)
    time.sleep(1)
    page.screenshot(path=f"{out_dir}/{shot}")
    page.keyboard.press("Enter")


def go_to(page, row, column) -> None:
    """Put the cursor at ROW and 0-based COLUMN of the open editor, with Go to Line (Ctrl+G)."""
    page.locator(".monaco-editor .view-lines").first.click()
    page.keyboard.press("Control+G")
    time.sleep(0.5)
    page.keyboard.type(f"{row}:{int(column) + 1}")
    page.keyboard.press("Enter")
    time.sleep(0.5)


def wait_until_no_problems(page) -> None:
    deadline = time.time() + 60
    while problems(page) and time.time() < deadline:
        time.sleep(0.5)


def open_workbench(playwright, url: str, folder: str):
    browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{url}/?folder={folder}", timeout=120000)
    page.wait_for_selector(".monaco-workbench", timeout=120000)
    return browser, page


def show_problems(page, out_dir: str) -> list[str]:
    """The Problems panel's rows, once it has one. When none comes, the error carries the
    extension's log and the screenshot no-problems.png, which say whether the server started."""
    page.keyboard.press("Control+Shift+M")
    try:
        page.wait_for_selector(".markers-panel .monaco-list-row", timeout=120000)
    except PlaywrightTimeout:
        page.screenshot(path=f"{out_dir}/no-problems.png")
        log = "\n".join(log_lines(page, out_dir)[-40:])
        raise RuntimeError(f"no row in the Problems panel after 120 s; the extension's log:\n{log}") from None
    time.sleep(1)
    return problems(page)


def language_status(page, out_dir: str) -> str:
    """The text of the language status hover (the `{}` beside the language in the status bar)."""
    page.locator("[id='status.languageStatus']").click()
    hover = page.locator(".monaco-hover", has_text="backward-explainer").first
    hover.wait_for(timeout=30000)
    time.sleep(0.5)
    page.screenshot(path=f"{out_dir}/language-status.png")
    text = hover.inner_text()
    page.keyboard.press("Escape")
    return text


def log_lines(page, out_dir: str) -> list[str]:
    """The extension's log, opened with its "Show Logs" command."""
    page.keyboard.press("Control+Shift+P")
    time.sleep(1)
    page.keyboard.type("backward-explainer: Show Logs")
    time.sleep(1)
    page.keyboard.press("Enter")
    lines = page.locator(".output-view .view-lines .view-line")
    lines.first.wait_for(timeout=30000)
    time.sleep(1)
    page.screenshot(path=f"{out_dir}/log.png")
    text = [line.replace("\xa0", " ") for line in lines.all_inner_texts()]
    page.keyboard.press("Control+Shift+M")  # back to the Problems panel
    time.sleep(0.5)
    return text


def open_rule_page(page, out_dir: str) -> list[str]:
    """Click the code link (BX001) of the Problems row; the editor tabs' titles once the page
    opens, then back to the sample's tab."""
    page.locator(".markers-panel .monaco-list-row a.monaco-link", has_text="BX001").first.click()
    page.locator(".tabs-container .tab", has_text="BX001").first.wait_for(timeout=30000)
    time.sleep(2)
    page.screenshot(path=f"{out_dir}/rule-page.png")
    tabs = page.locator(".tabs-container .tab").all_inner_texts()
    page.keyboard.press("Control+W")
    time.sleep(0.5)
    return [tab.strip() for tab in tabs]


def fix(url, folder, out_dir, sample, row, column, notebook) -> None:
    with sync_playwright() as playwright:
        browser, page = open_workbench(playwright, url, folder)
        time.sleep(3)
        open_file(page, sample)
        report["problems"] = show_problems(page, out_dir)
        report["squiggles"] = page.locator(".squiggly-warning, .squiggly-error").count()
        page.screenshot(path=f"{out_dir}/diagnostic.png")
        report["language_status"] = language_status(page, out_dir)
        report["log"] = log_lines(page, out_dir)
        report["rule_tabs"] = open_rule_page(page, out_dir)

        go_to(page, row, column)
        quick_fix(page, out_dir, "quick-fix-menu.png")
        wait_until_no_problems(page)
        report["text_after_fix"] = page.locator(".monaco-editor .view-lines").first.inner_text()
        report["problems_after_fix"] = problems(page)
        page.screenshot(path=f"{out_dir}/after-fix.png")

        # The notebook: its cell's problem, then the fix from the Problems row (which puts the
        # cursor in the cell).
        open_file(page, notebook)
        page.locator(".markers-panel .monaco-list-row", has_text="BX001").wait_for(timeout=120000)
        time.sleep(1)
        report["notebook_problems"] = problems(page)
        page.screenshot(path=f"{out_dir}/notebook-diagnostic.png")
        page.locator(".markers-panel .monaco-list-row", has_text="BX001").dblclick()
        time.sleep(1)
        quick_fix(page, out_dir, "notebook-quick-fix-menu.png")
        wait_until_no_problems(page)
        report["notebook_cells_after_fix"] = page.locator(".notebook-editor .cell-editor-container .view-lines") \
            .all_inner_texts()
        report["notebook_problems_after_fix"] = problems(page)
        page.screenshot(path=f"{out_dir}/notebook-after-fix.png")
        browser.close()


def output(url, folder, out_dir, notebook) -> None:
    with sync_playwright() as playwright:
        browser, page = open_workbench(playwright, url, folder)
        time.sleep(3)
        open_file(page, notebook)
        # The outputs render in the notebook's webview, an iframe inside an iframe.
        deadline = time.time() + 120
        while True:
            frames = [f for f in page.frames if f.locator(".explainer").count()]
            if frames or time.time() > deadline:
                break
            time.sleep(1)
        (frame,) = frames
        explanation = frame.locator(".explainer").first
        # The notebook's list scrolls, not the webview: wheel it until the explanation is near
        # the top, with a notification out of the way.
        clear = page.locator(".notifications-toasts .codicon-notifications-clear")
        if clear.count():
            clear.first.click()
        for _ in range(40):
            box = explanation.bounding_box()
            if box is not None and box["y"] < 200:
                break
            page.mouse.move(800, 500)
            page.mouse.wheel(0, 300)
            time.sleep(0.3)
        time.sleep(1)
        page.screenshot(path=f"{out_dir}/notebook-output.png")
        report["theme"] = page.locator(".monaco-workbench").first.get_attribute("class")
        report["outputs_text"] = frame.locator("body").inner_text()
        lines = explanation.locator("pre").first.inner_text().splitlines()
        report["culprit_line"] = next(line for line in lines if "out, hidden = model" in line)
        report["backward_line"] = next(line for line in lines if "loss.backward()" in line)
        report["contrast"] = text_contrasts(explanation)
        report["pictures"] = decoded(explanation)
        browser.close()


def hover(url, folder, out_dir, sample, row, column, shot) -> None:
    with sync_playwright() as playwright:
        browser, page = open_workbench(playwright, url, folder)
        time.sleep(3)
        open_file(page, sample)
        show_problems(page, out_dir)
        page.locator(".markers-panel .monaco-list-row", has_text="confirmed when it ran").wait_for(timeout=120000)
        page.keyboard.press("Control+J")  # the panel closed, the hover has the editor's height to show in
        time.sleep(0.5)
        go_to(page, row, column)
        page.keyboard.press("Control+K")
        page.keyboard.press("Control+I")
        shown = page.locator(".monaco-hover:visible", has_text="Confirmed when it ran").first
        shown.wait_for(timeout=30000)
        time.sleep(1)
        # The hover is as tall as VS Code lets it be: wheel its picture into view for the shot.
        box = shown.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.wheel(0, 110)
        time.sleep(0.5)
        page.screenshot(path=f"{out_dir}/{shot}")
        report["theme"] = page.locator(".monaco-workbench").first.get_attribute("class")
        report["hover"] = shown.inner_text()
        # A fenced block renders as tokenized source (a <br> between lines), not as <pre>.
        report["code_lines"] = shown.locator(".monaco-tokenized-source").first.inner_text().splitlines()
        report["contrast"] = text_contrasts(shown)
        browser.close()


def trust(url, folder, out_dir, sample, marker) -> None:
    with sync_playwright() as playwright:
        browser, page = open_workbench(playwright, url, folder)
        report["trust_prompt"] = page.locator(".monaco-dialog-box").inner_text(timeout=60000)
        page.locator(".monaco-dialog-box .monaco-button", has_text="No, I don't trust the authors").click()
        time.sleep(2)
        report["status_bar"] = page.locator(".statusbar").inner_text()
        open_file(page, sample)
        report["restricted_problems"] = show_problems(page, out_dir)
        report["restricted_marker"] = os.path.exists(marker)
        page.screenshot(path=f"{out_dir}/restricted-mode.png")

        page.keyboard.press("Control+Shift+P")
        time.sleep(1)
        page.keyboard.type("Manage Workspace Trust")
        time.sleep(1.5)
        page.keyboard.press("Enter")
        page.locator(".workspace-trust-editor .monaco-button", has_text="Trust").first.click(timeout=30000)
        deadline = time.time() + 60
        while not os.path.exists(marker) and time.time() < deadline:
            time.sleep(0.5)
        report["trusted_marker"] = os.path.exists(marker)
        # The server the workspace's interpreter started answers for the sample.
        open_file(page, sample)
        page.locator(".markers-panel .monaco-list-row", has_text="BX001").wait_for(timeout=120000)
        report["trusted_problems"] = problems(page)
        page.screenshot(path=f"{out_dir}/trusted.png")
        browser.close()


if __name__ == "__main__":
    {"fix": fix, "output": output, "hover": hover, "trust": trust}[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(report))
