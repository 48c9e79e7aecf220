"""The contrast of every piece of text under an element, as the browser renders it (WCAG 2:
(L1 + 0.05) / (L2 + 0.05) of the text's colour over its background). Shared by the Playwright
drivers; folded <details> are opened first, so what a click would show is measured too."""

# The text colour is composited over the element's background, which is every translucent
# background of its ancestors composited down to the first opaque one (or, where none is, the
# page's: VS Code's notebook webview is transparent over the editor). Colours are read through a
# canvas, so any CSS colour syntax the browser computes reads the same.
_MEASURE = """
(root) => {
  root.querySelectorAll('details').forEach(d => { d.open = true; });
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 1;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  const parse = css => {
    ctx.clearRect(0, 0, 1, 1);
    ctx.fillStyle = 'rgba(0, 0, 0, 0)';
    ctx.fillStyle = css;
    ctx.fillRect(0, 0, 1, 1);
    const d = ctx.getImageData(0, 0, 1, 1).data;
    return [d[0], d[1], d[2], d[3] / 255];
  };
  const over = (top, bottom) => [0, 1, 2].map(i => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const luminance = c => {
    const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const page = () => {
    const style = getComputedStyle(document.documentElement);
    for (const name of ['--vscode-notebook-outputContainerBackgroundColor', '--vscode-notebook-editorBackground',
                        '--vscode-editor-background', '--jp-layout-color0']) {
      const value = style.getPropertyValue(name).trim();
      if (value && parse(value)[3] > 0) return over(parse(value), [255, 255, 255, 1]);
    }
    return [255, 255, 255, 1];
  };
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let base = layers.length && layers[layers.length - 1][3] >= 1 ? layers.pop() : page();
    while (layers.length) base = over(layers.pop(), base);
    return base;
  };
  const seen = new Set();
  const results = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const el = node.parentElement;
    if (!node.textContent.trim() || seen.has(el)) continue;
    seen.add(el);
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    const bg = background(el);
    const fg = over(parse(getComputedStyle(el).color), bg);
    const [light, dark] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
    results.push({text: node.textContent.trim().slice(0, 48), ratio: (light + 0.05) / (dark + 0.05),
                  color: fg.slice(0, 3).map(Math.round), background: bg.slice(0, 3).map(Math.round)});
  }
  return results;
}
"""


def text_contrasts(locator) -> list[dict]:
    """[{text, ratio, color, background}] for each element with text under `locator`."""
    return locator.evaluate(_MEASURE)
