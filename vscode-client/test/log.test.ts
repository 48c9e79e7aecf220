import { strict as assert } from "node:assert";
import { test } from "node:test";
import { ClientLines, Level } from "../src/log";

function collect(): { lines: ClientLines; written: [Level, string][] } {
  const written: [Level, string][] = [];
  return { lines: new ClientLines((level, message) => written.push([level, message])), written };
}

test("the client's own time and level prefix is stripped; the message goes at its level", () => {
  const { lines, written } = collect();
  lines.appendLine("[Info  - 3:04:05 PM] backward-explainer 0.1.0 started");
  lines.appendLine("[Warn  - 15:04:05] reading runtime findings failed: bad JSON");
  lines.appendLine("[Error - 3:04:06 PM] The server crashed");
  assert.deepEqual(written, [
    ["info", "backward-explainer 0.1.0 started"],
    ["warn", "reading runtime findings failed: bad JSON"],
    ["error", "The server crashed"],
  ]);
});

test("stderr arriving in pieces is logged line by line, at the level of the line before", () => {
  const { lines, written } = collect();
  lines.appendLine("[Error - 3:04:06 PM] Server process exited");
  lines.append("Traceback (most recent call last):\n  File \"x.py\"");
  assert.deepEqual(written.map(([, m]) => m), ["Server process exited", "Traceback (most recent call last):"]);
  lines.append(", line 1\nValueError: boom\n\n");
  assert.deepEqual(written.slice(2), [["error", "  File \"x.py\", line 1"], ["error", "ValueError: boom"]]);
});

test("a line that only looks like a prefix in the middle is left as it is", () => {
  const { lines, written } = collect();
  lines.appendLine("checked [Info - x] twice");
  assert.deepEqual(written, [["info", "checked [Info - x] twice"]]);
});
