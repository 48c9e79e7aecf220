"""The images under an element as the browser decoded them, for the Playwright drivers: each
one's natural and shown sizes, its alt text, and how many of its pixels have each colour."""

# Read back through a canvas: the explanation's picture is a data: URI, which leaves the canvas
# untainted. A picture that cannot be decoded reads as 0 x 0 with no pixels.
_DECODED = """
async (img) => {
  await img.decode().catch(() => null);
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth;
  canvas.height = img.naturalHeight;
  const colours = {};
  if (canvas.width && canvas.height) {
    const ctx = canvas.getContext('2d', {willReadFrequently: true});
    ctx.drawImage(img, 0, 0);
    const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 0; i < data.length; i += 4) {
      const hex = '#' + [0, 1, 2].map(k => data[i + k].toString(16).padStart(2, '0')).join('');
      colours[hex] = (colours[hex] || 0) + 1;
    }
  }
  const box = img.getBoundingClientRect();
  return {natural: [img.naturalWidth, img.naturalHeight], shown: [box.width, box.height], alt: img.alt,
          colours: colours};
}
"""


def decoded(element) -> list[dict]:
    return [img.evaluate(_DECODED) for img in element.locator("img").all()]
