// Where a rule's documentation link leads. Pure logic (no `vscode` import), unit-tested with
// node's test runner.
//
// The server links each diagnostic (and its hover) to the rule's page as a file URL into the
// installed package (`…/explainer/causes/docs/BX001.md`): right for any editor, but VS Code opens
// a file URL as an editable tab of raw Markdown from the extension's own folder. Both the
// Problems panel and the hover open links with commands allowed, so the extension turns the link
// into its "show rule" command, which opens the rendered, read-only preview.

export const SHOW_RULE = "backwardExplainer.showRule";

const RULE_PAGE = /^file:\/\/[^\s)]*\/BX\d{3}\.md$/;

/** Whether a URL is a rule's page (what the command agrees to open; any other is refused). */
export function isRulePage(target: unknown): target is string {
  return typeof target === "string" && RULE_PAGE.test(target);
}

/** The command link for a rule page's file URL, or undefined for any other link. */
export function ruleCommandLink(target: string): string | undefined {
  return isRulePage(target) ? `command:${SHOW_RULE}?${encodeURIComponent(JSON.stringify([target]))}` : undefined;
}

/** Markdown with every `](file:///…/BXnnn.md)` link target turned into its command link. */
export function withRuleCommandLinks(markdown: string): string {
  return markdown.replace(/\]\((file:\/\/[^\s)]*\/BX\d{3}\.md)\)/g, (whole, target: string) => `](${ruleCommandLink(target)})`);
}
