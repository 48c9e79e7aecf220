"""Drive VS Code (code-server) in Debian's chromium with Playwright, as a user would: open a buggy
sample, read the Problems panel, apply the quick fix with Ctrl+. and read it again. Prints one
JSON report; saves screenshots into the output folder.

Run with the e2e venv's Python: vscode_drive.py URL FOLDER OUT_DIR SAMPLE_NAME CULPRIT_ROW COLUMN
"""
import json
import sys
import time

from playwright.sync_api import sync_playwright

url, folder, out_dir, sample, row, column = sys.argv[1:7]
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


with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{url}/?folder={folder}", timeout=120000)
    page.wait_for_selector(".monaco-workbench", timeout=120000)
    time.sleep(3)
    open_file(page, sample)
    page.keyboard.press("Control+Shift+M")
    page.wait_for_selector(".markers-panel .monaco-list-row", timeout=120000)
    time.sleep(1)
    report["problems"] = problems(page)
    report["squiggles"] = page.locator(".squiggly-warning, .squiggly-error").count()
    page.screenshot(path=f"{out_dir}/diagnostic.png")

    page.locator(".monaco-editor .view-lines").first.click()
    page.keyboard.press("Control+G")
    time.sleep(0.5)
    page.keyboard.type(f"{row}:{int(column) + 1}")
    page.keyboard.press("Enter")
    time.sleep(0.5)
    page.keyboard.press("Control+.")
    page.wait_for_selector(".action-widget, .context-view", timeout=30000)
    time.sleep(1)
    page.screenshot(path=f"{out_dir}/quick-fix-menu.png")
    page.keyboard.press("Enter")
    deadline = time.time() + 60
    while problems(page) and time.time() < deadline:
        time.sleep(0.5)
    report["text_after_fix"] = page.locator(".monaco-editor .view-lines").first.inner_text()
    report["problems_after_fix"] = problems(page)
    page.screenshot(path=f"{out_dir}/after-fix.png")
    browser.close()
print(json.dumps(report))
