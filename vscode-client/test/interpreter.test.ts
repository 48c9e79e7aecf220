import { strict as assert } from "node:assert";
import { test } from "node:test";
import {
  chooseInterpreter, importStrategy, installCommand, needsRestart, serverCommand, serverSettings, strategiesToTry,
} from "../src/interpreter";

/** The Python extension's answer, counting how often it was asked. */
function pythonExtension(answer: string | undefined | Error) {
  const asked = { count: 0 };
  const ask = async () => {
    asked.count += 1;
    if (answer instanceof Error) {
      throw answer;
    }
    return answer;
  };
  return { ask, asked };
}

test("the setting wins, then the Python extension, then python3", async () => {
  assert.deepEqual((await chooseInterpreter({ globalValue: ["/opt/py/bin/python"] }, true, pythonExtension("/env/bin/python").ask)).command, ["/opt/py/bin/python"]);
  assert.deepEqual(await chooseInterpreter({}, true, pythonExtension("/env/bin/python").ask), { command: ["/env/bin/python"], source: "python-extension" });
  assert.deepEqual(await chooseInterpreter({}, true, pythonExtension(undefined).ask), { command: ["python3"], source: "default", ignoredUntrusted: undefined });
});

test("the Python extension is asked only when its answer would be used", async () => {
  const python = pythonExtension("/env/bin/python");
  await chooseInterpreter({ globalValue: ["/opt/py/bin/python"] }, true, python.ask);
  await chooseInterpreter({ workspaceValue: ["/ws/python"] }, true, python.ask);
  assert.equal(python.asked.count, 0);
});

test("a folder value beats the workspace and user values when the workspace is trusted", async () => {
  const choice = await chooseInterpreter(
    { globalValue: ["/user/python"], workspaceValue: ["/ws/python"], workspaceFolderValue: ["/folder/python"] }, true, pythonExtension(undefined).ask);
  assert.deepEqual(choice.command, ["/folder/python"]);
});

test("in a restricted workspace an interpreter set by the workspace is never used", async () => {
  const evil = { workspaceValue: ["./evil-binary"] };
  assert.deepEqual(await chooseInterpreter(evil, false, pythonExtension(undefined).ask), { command: ["python3"], source: "default", ignoredUntrusted: ["./evil-binary"] });
  const withUser = await chooseInterpreter({ ...evil, globalValue: ["/user/python"] }, false, pythonExtension("/env/python").ask);
  assert.deepEqual(withUser.command, ["/user/python"]);
  assert.deepEqual(withUser.ignoredUntrusted, ["./evil-binary"]);
  assert.deepEqual((await chooseInterpreter({ workspaceFolderValue: ["./x"] }, false, pythonExtension(undefined).ask)).command, ["python3"]);
});

test("in a restricted workspace the Python extension is not asked: its environment may be the workspace's .venv", async () => {
  const python = pythonExtension("/cloned-repo/.venv/bin/python");
  assert.deepEqual(await chooseInterpreter({}, false, python.ask), { command: ["python3"], source: "default", ignoredUntrusted: undefined });
  assert.equal(python.asked.count, 0);
});

test("a Python extension that fails (it refuses to resolve environments when untrusted) falls back to python3", async () => {
  const python = pythonExtension(new Error("Not allowed to resolve environment in an untrusted workspace"));
  assert.deepEqual(await chooseInterpreter({}, true, python.ask), {
    command: ["python3"], source: "default",
    pythonExtensionError: "Error: Not allowed to resolve environment in an untrusted workspace" });
});

test("malformed interpreter values are skipped", async () => {
  assert.deepEqual((await chooseInterpreter({ globalValue: [] }, true, pythonExtension(undefined).ask)).command, ["python3"]);
  assert.deepEqual((await chooseInterpreter({ globalValue: [""] as string[] }, true, pythonExtension("/env/python").ask)).command, ["/env/python"]);
  assert.deepEqual((await chooseInterpreter({ globalValue: "python" as unknown as string[] }, true, pythonExtension(undefined).ask)).command, ["python3"]);
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

test("the server runs from the extension's folder, never the workspace, with the chosen interpreter", async () => {
  const choice = await chooseInterpreter({ globalValue: ["/usr/bin/env", "python3"] }, true, pythonExtension(undefined).ask);
  const server = serverCommand(choice, "/ext/backward-explainer", "fromEnvironment", { PATH: "/usr/bin" });
  assert.deepEqual(server, {
    command: "/usr/bin/env", args: ["python3", "-m", "lsp_server"], cwd: "/ext/backward-explainer", env: { PATH: "/usr/bin" } });
});

test("useBundled puts the bundled libraries first on PYTHONPATH, before the user's", async () => {
  const choice = await chooseInterpreter({}, true, pythonExtension("/env/bin/python").ask);
  assert.equal(serverCommand(choice, "/ext", "useBundled", {}).env.PYTHONPATH, "/ext/bundled/libs");
  assert.equal(serverCommand(choice, "/ext", "useBundled", { PYTHONPATH: "/mine" }).env.PYTHONPATH,
    process.platform === "win32" ? "/ext/bundled/libs;/mine" : "/ext/bundled/libs:/mine");
  assert.equal(serverCommand(choice, "/ext", "fromEnvironment", { PYTHONPATH: "/mine" }).env.PYTHONPATH, "/mine");
  assert.equal(importStrategy("useBundled"), "useBundled");
  assert.equal(importStrategy("bogus"), "fromEnvironment");
  assert.equal(importStrategy(undefined), "fromEnvironment");
});

test("fromEnvironment falls back to the bundled server; useBundled uses it alone", () => {
  assert.deepEqual(strategiesToTry("fromEnvironment"), ["fromEnvironment", "useBundled"]);
  assert.deepEqual(strategiesToTry("useBundled"), ["useBundled"]);
  assert.deepEqual(strategiesToTry(importStrategy(undefined)), ["fromEnvironment", "useBundled"]);
});

test("installing means the extension's own wheel, never a name no index has", () => {
  const command = installCommand({ command: ["/env/bin/python"], source: "setting" }, "/ext/bundled/wheels/backward_explainer-0.1.0-py3-none-any.whl");
  assert.deepEqual(command, ["/env/bin/python", "-m", "pip", "install", "/ext/bundled/wheels/backward_explainer-0.1.0-py3-none-any.whl"]);
  assert.ok(!command.some((part) => part.includes("backward-explainer[")));
});
