import { strict as assert } from "node:assert";
import { test } from "node:test";
import { chooseInterpreter, importStrategy, needsRestart, serverCommand, serverSettings } from "../src/interpreter";

test("the setting wins, then the Python extension, then python3", () => {
  assert.deepEqual(chooseInterpreter({ globalValue: ["/opt/py/bin/python"] }, true, "/env/bin/python").command, ["/opt/py/bin/python"]);
  assert.deepEqual(chooseInterpreter({}, true, "/env/bin/python"), { command: ["/env/bin/python"], source: "python-extension", ignoredUntrusted: undefined });
  assert.deepEqual(chooseInterpreter({}, true, undefined), { command: ["python3"], source: "default", ignoredUntrusted: undefined });
});

test("a folder value beats the workspace and user values when the workspace is trusted", () => {
  const choice = chooseInterpreter(
    { globalValue: ["/user/python"], workspaceValue: ["/ws/python"], workspaceFolderValue: ["/folder/python"] }, true, undefined);
  assert.deepEqual(choice.command, ["/folder/python"]);
});

test("in a restricted workspace an interpreter set by the workspace is never used", () => {
  const evil = { workspaceValue: ["./evil-binary"] };
  assert.deepEqual(chooseInterpreter(evil, false, undefined), { command: ["python3"], source: "default", ignoredUntrusted: ["./evil-binary"] });
  const withUser = chooseInterpreter({ ...evil, globalValue: ["/user/python"] }, false, "/env/python");
  assert.deepEqual(withUser.command, ["/user/python"]);
  assert.deepEqual(withUser.ignoredUntrusted, ["./evil-binary"]);
  assert.deepEqual(chooseInterpreter({ workspaceFolderValue: ["./x"] }, false, "/env/python").command, ["/env/python"]);
});

test("malformed interpreter values are skipped", () => {
  assert.deepEqual(chooseInterpreter({ globalValue: [] }, true, undefined).command, ["python3"]);
  assert.deepEqual(chooseInterpreter({ globalValue: [""] as string[] }, true, "/env/python").command, ["/env/python"]);
  assert.deepEqual(chooseInterpreter({ globalValue: "python" as unknown as string[] }, true, undefined).command, ["python3"]);
});

test("server settings get defaults for missing or malformed values", () => {
  const values: Record<string, unknown> = { enable: false, select: ["BX001", 3], severity: "loud" };
  assert.deepEqual(serverSettings((key) => values[key]), { enable: false, select: ["BX001"], ignore: [], severity: "warning" });
  assert.deepEqual(serverSettings(() => undefined), { enable: true, select: [], ignore: [], severity: "warning" });
});

test("only the interpreter and import strategy need a restart", () => {
  assert.equal(needsRestart((s) => s === "backwardExplainer.interpreter"), true);
  assert.equal(needsRestart((s) => s === "backwardExplainer.importStrategy"), true);
  assert.equal(needsRestart((s) => s === "backwardExplainer.severity"), false);
});

test("the server runs from the extension's folder, never the workspace, with the chosen interpreter", () => {
  const choice = chooseInterpreter({ globalValue: ["/usr/bin/env", "python3"] }, true, undefined);
  const server = serverCommand(choice, "/ext/backward-explainer", "fromEnvironment", { PATH: "/usr/bin" });
  assert.deepEqual(server, {
    command: "/usr/bin/env", args: ["python3", "-m", "lsp_server"], cwd: "/ext/backward-explainer", env: { PATH: "/usr/bin" } });
});

test("useBundled puts the bundled libraries first on PYTHONPATH, before the user's", () => {
  const choice = chooseInterpreter({}, true, "/env/bin/python");
  assert.equal(serverCommand(choice, "/ext", "useBundled", {}).env.PYTHONPATH, "/ext/bundled/libs");
  assert.equal(serverCommand(choice, "/ext", "useBundled", { PYTHONPATH: "/mine" }).env.PYTHONPATH,
    process.platform === "win32" ? "/ext/bundled/libs;/mine" : "/ext/bundled/libs:/mine");
  assert.equal(serverCommand(choice, "/ext", "fromEnvironment", { PYTHONPATH: "/mine" }).env.PYTHONPATH, "/mine");
  assert.equal(importStrategy("useBundled"), "useBundled");
  assert.equal(importStrategy("bogus"), "fromEnvironment");
  assert.equal(importStrategy(undefined), "fromEnvironment");
});
