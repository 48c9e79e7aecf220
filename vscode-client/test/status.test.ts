import { strict as assert } from "node:assert";
import { test } from "node:test";
import { statusView } from "../src/status";

test("running: which Python, and which copy of the server", () => {
  const bundled = statusView({ kind: "running", python: "/usr/bin/python3", bundled: true }, "backwardExplainer");
  assert.equal(bundled.detail, "/usr/bin/python3, bundled server");
  assert.equal(bundled.severity, "information");
  assert.equal(bundled.command.command, "backwardExplainer.showLogs");
  const own = statusView({ kind: "running", python: ".venv/bin/python", bundled: false }, "backwardExplainer");
  assert.equal(own.detail, ".venv/bin/python, server from the environment");
});

test("starting is busy; stopped is an error whose command restarts", () => {
  assert.equal(statusView({ kind: "starting" }, "s").busy, true);
  const stopped = statusView({ kind: "stopped", reason: "python2 cannot run the language server" }, "s");
  assert.deepEqual([stopped.severity, stopped.text, stopped.detail, stopped.command.command],
    ["error", "backward-explainer: not running", "python2 cannot run the language server", "s.restart"]);
});
