"""Drive JupyterLab in Debian's chromium with Playwright, as a user would. Prints one JSON report;
saves screenshots into the output folder. Run with the e2e venv's Python:

    jupyterlab_drive.py URL SETTINGS_DIR OUT_DIR NOTEBOOK...
        for each theme (JupyterLab Light, JupyterLab Dark) and each notebook: open it, wait for
        the explained cell's outputs, screenshot them, and report the error output's last line,
        the explanation's marked lines as text, whether they are tinted, the contrast of
        every piece of its text, and the boundary picture as the page decoded it.
"""
import json
import os
import sys
import time

from contrast import text_contrasts
from pictures import decoded
from playwright.sync_api import sync_playwright

ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}


def use_settings(settings_dir: str, theme: str) -> None:
    """The user's settings, as the Settings editor writes them; read by the page when it loads.
    No autosave: opening a notebook in a kernel of another Python changes its metadata, and a
    save would sign it, making the untrusted notebook trusted."""
    for plugin, values in (("apputils-extension/themes", {"theme": theme}),
                           ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
                           ("docmanager-extension/plugin", {"autosave": False})):
        path = os.path.join(settings_dir, "@jupyterlab", f"{plugin}.jupyterlab-settings")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as settings:
            json.dump(values, settings)


def look(page, url: str, notebook: str, out_dir: str, shot: str) -> dict:
    page.goto(f"{url}/lab/tree/{notebook}?reset", timeout=120000)  # ?reset: no tabs left from the last page
    output = page.locator(".jp-OutputArea:visible", has_text="hidden ▶").first
    output.wait_for(timeout=120000)
    time.sleep(2)  # the theme's fonts and the notebook's layout settle
    explanation = output.locator(".jp-OutputArea-output", has_text="hidden ▶").first
    explanation.scroll_into_view_if_needed()
    time.sleep(0.5)
    explanation.screenshot(path=f"{out_dir}/{shot}")
    marked = explanation.locator("pre").first
    lines = marked.inner_text().splitlines()
    culprit = next(line for line in lines if "out, hidden = model" in line)
    tint = marked.locator("span", has_text="out, hidden = model").first.evaluate(
        "e => getComputedStyle(e).backgroundColor")
    return {
        "theme": page.evaluate("document.body.dataset.jpThemeName"),
        "error": output.locator('[data-mime-type="application/vnd.jupyter.stderr"]').first.inner_text()
        .strip().splitlines()[-1],
        "order": output.locator(".jp-OutputArea-output").evaluate_all(
            "nodes => nodes.map(n => n.dataset.mimeType)"),
        "culprit_line": culprit,
        "backward_line": next(line for line in lines if "loss.backward()" in line),
        "culprit_tint": tint,
        "style_blocks": explanation.locator("style").count(),
        "contrast": text_contrasts(explanation),
        "pictures": decoded(explanation),
    }


def main(url, settings_dir, out_dir, *notebooks) -> None:
    report = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for key, theme in THEMES.items():
            use_settings(settings_dir, theme)
            page = browser.new_page(viewport={"width": 1300, "height": 1400})
            for notebook in notebooks:
                name = notebook.removesuffix(".ipynb")
                report[f"{name}/{key}"] = look(page, url, notebook, out_dir, f"{name}-{key}.png")
            page.close()
        browser.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
