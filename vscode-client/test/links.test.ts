import { strict as assert } from "node:assert";
import { test } from "node:test";
import { isRulePage, ruleCommandLink, withRuleCommandLinks } from "../src/links";

const PAGE = "file:///home/me/.vscode/extensions/be/bundled/libs/explainer/causes/docs/BX001.md";

test("a rule page's file URL becomes the show-rule command, its URL the one argument", () => {
  const link = ruleCommandLink(PAGE) as string;
  assert.ok(link.startsWith("command:backwardExplainer.showRule?"));
  assert.deepEqual(JSON.parse(decodeURIComponent(link.split("?")[1])), [PAGE]);
});

test("other links are left alone", () => {
  assert.equal(ruleCommandLink("https://pytorch.org/docs/stable/autograd.html"), undefined);
  assert.equal(ruleCommandLink("file:///home/me/project/README.md"), undefined);
});

test("in the hover's Markdown, only rule pages' links change", () => {
  const hover = `**BX001** ...\n\n[BX001 documentation](${PAGE}) · [PyTorch](https://pytorch.org)`;
  const rewritten = withRuleCommandLinks(hover);
  assert.ok(rewritten.includes(`[BX001 documentation](${ruleCommandLink(PAGE)})`));
  assert.ok(rewritten.endsWith("[PyTorch](https://pytorch.org)"));
});

test("the command opens rule pages only", () => {
  assert.equal(isRulePage(PAGE), true);
  assert.equal(isRulePage("file:///etc/passwd"), false);
  assert.equal(isRulePage(["file:///x/BX001.md"]), false);
});
