// The VS Code side: find Python, start `python -m lsp_server`, restart when the interpreter
// changes (src/lifecycle.ts). Every diagnostic, fix and explanation comes from the server;
// nothing is analysed here.
import { execFile } from "node:child_process";
import { readdirSync } from "node:fs";
import * as vscode from "vscode";
import { LanguageClient, LanguageClientOptions, ServerOptions, State } from "vscode-languageclient/node";
import {
  chooseInterpreter, importStrategy, installCommand, InterpreterChoice, needsRestart, ServerCommand, serverCommand,
  serverSettings, strategiesToTry,
} from "./interpreter";
import { restartOn, ServerLifecycle } from "./lifecycle";
import { isRulePage, SHOW_RULE, ruleCommandLink, withRuleCommandLinks } from "./links";
import { ClientLines } from "./log";
import { ServerState, statusView } from "./status";

const SECTION = "backwardExplainer";
let output: vscode.LogOutputChannel;
let extensionDirectory: string;
let lifecycle: ServerLifecycle<LanguageClient> | undefined;
let memory: vscode.Memento;
let status: vscode.LanguageStatusItem;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel("backward-explainer", { log: true });
  status = vscode.languages.createLanguageStatusItem(`${SECTION}.server`, { language: "python" });
  status.name = "backward-explainer";
  extensionDirectory = context.extensionUri.fsPath;
  memory = context.globalState;
  const servers = new ServerLifecycle(launch, (error) => output.error(`Starting or stopping the server failed: ${error}`));
  lifecycle = servers;
  const python = await pythonExtensionApi();
  context.subscriptions.push(
    output,
    status,
    vscode.commands.registerCommand(`${SECTION}.restart`, () => servers.restart()),
    vscode.commands.registerCommand(`${SECTION}.showLogs`, () => output.show()),
    vscode.commands.registerCommand(SHOW_RULE, (page: unknown) =>
      // Only a rule's page: a command link elsewhere must not open any file it names.
      isRulePage(page) ? vscode.commands.executeCommand("markdown.showPreview", vscode.Uri.parse(page)) : undefined),
    ...restartOn({
      configurationChanged: vscode.workspace.onDidChangeConfiguration,
      trustGranted: vscode.workspace.onDidGrantWorkspaceTrust,
      environmentChanged: python?.environments.onDidChangeActiveEnvironmentPath,
    }, needsRestart, () => servers.restart()),
  );
  await servers.start();
}

export async function deactivate(): Promise<void> {
  await lifecycle?.stop();
}

/** A started client for the chosen interpreter, or undefined (the user has been told why). */
async function launch(): Promise<LanguageClient | undefined> {
  showStatus({ kind: "starting" });
  const settings = vscode.workspace.getConfiguration(SECTION);
  const choice = await chooseInterpreter(
    settings.inspect<string[]>("interpreter") ?? {},
    vscode.workspace.isTrusted,
    activeInterpreter,
  );
  if (choice.ignoredUntrusted) {
    output.warn(`Restricted mode: the workspace's interpreter ${JSON.stringify(choice.ignoredUntrusted)} is not used.`);
  }
  if (choice.pythonExtensionError) {
    output.warn(`The Python extension's interpreter is not used: ${choice.pythonExtensionError}`);
  }
  const chosen = importStrategy(settings.get("importStrategy"));
  let server: ServerCommand | undefined;
  let bundled = false;
  for (const strategy of strategiesToTry(chosen)) {
    const candidate = serverCommand(choice, extensionDirectory, strategy, process.env);
    if (await hasServer(candidate)) {
      server = candidate;
      bundled = strategy === "useBundled";
      output.info(`Python: ${choice.command.join(" ")} (${choice.source}), ${strategy}`);
      if (strategy !== chosen) {
        void sayBundledIsUsed(choice);
      }
      break;
    }
  }
  if (!server) {
    showStatus({ kind: "stopped", reason: `${choice.command.join(" ")} cannot run the language server` });
    void sayPythonCannotRunIt(choice);
    return undefined;
  }
  const { command, args, cwd, env } = server;
  const serverOptions: ServerOptions = { command, args, options: { cwd, env } };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [
      { scheme: "file", language: "python" },
      { scheme: "untitled", language: "python" },
      { scheme: "vscode-notebook-cell", language: "python" },
      { notebook: "jupyter-notebook", language: "python" },
    ],
    outputChannel: clientChannel(),
    middleware: {
      handleDiagnostics: (uri, diagnostics, next) => next(uri, diagnostics.map(withRuleCommand)),
      provideHover: async (document, position, token, next) => {
        const hover = await next(document, position, token);
        if (hover) {
          hover.contents = hover.contents.map((part) => part instanceof vscode.MarkdownString ? trustedForRules(part) : part);
        }
        return hover;
      },
    },
    initializationOptions: serverSettings((key) => settings.get(key)),
    synchronize: { configurationSection: SECTION },
  };
  const client = new LanguageClient(SECTION, "backward-explainer", serverOptions, clientOptions);
  const running: ServerState = { kind: "running", python: choice.command.join(" "), bundled };
  client.onDidChangeState(({ newState }) => {
    if (newState === State.Running) {
      showStatus(running);
    } else if (newState === State.Stopped) {
      showStatus({ kind: "stopped", reason: "the server stopped (see the logs)" });
    }
  });
  try {
    await client.start();
    return client;
  } catch (error) {
    showStatus({ kind: "stopped", reason: "the server did not start (see the logs)" });
    output.error(`The server did not start: ${error}`);
    void vscode.window.showErrorMessage("backward-explainer: the language server did not start.", "Show Logs")
      .then((answer) => answer && output.show());
    return undefined;
  }
}

/** The diagnostic with its rule link opening the rendered page (src/links.ts). */
function withRuleCommand(diagnostic: vscode.Diagnostic): vscode.Diagnostic {
  const code = diagnostic.code;
  const link = typeof code === "object" ? ruleCommandLink(code.target.toString(true)) : undefined;
  if (typeof code === "object" && link) {
    diagnostic.code = { value: code.value, target: vscode.Uri.parse(link) };
  }
  return diagnostic;
}

function trustedForRules(markdown: vscode.MarkdownString): vscode.MarkdownString {
  const rewritten = new vscode.MarkdownString(withRuleCommandLinks(markdown.value));
  rewritten.isTrusted = { enabledCommands: [SHOW_RULE] };
  rewritten.supportHtml = markdown.supportHtml;
  return rewritten;
}

function showStatus(state: ServerState): void {
  const view = statusView(state, SECTION);
  status.text = view.text;
  status.detail = view.detail;
  status.busy = view.busy;
  status.severity = view.severity === "error" ? vscode.LanguageStatusSeverity.Error : vscode.LanguageStatusSeverity.Information;
  status.command = view.command;
}

/** The channel the language client writes to: its lines go to the log without the client's own
 * time and level prefix, which the log adds itself (src/log.ts). */
function clientChannel(): vscode.OutputChannel {
  const lines = new ClientLines((level, message) => output[level](message));
  return {
    name: output.name,
    append: (text) => lines.append(text),
    appendLine: (line) => lines.appendLine(line),
    replace: (text) => output.replace(text),
    clear: () => output.clear(),
    show: (column?: vscode.ViewColumn | boolean, preserveFocus?: boolean) =>
      output.show(typeof column === "boolean" ? column : preserveFocus),
    hide: () => output.hide(),
    dispose: () => undefined, // the log is the extension's, disposed of with it
  };
}

/** Whether the interpreter can import the server (a quick `python -c`, nothing of the workspace). */
function hasServer(server: ServerCommand): Promise<boolean> {
  const prefix = server.args.slice(0, -2); // without "-m lsp_server"
  return new Promise((resolve) => {
    const options = { timeout: 20000, cwd: server.cwd, env: server.env };
    execFile(server.command, [...prefix, "-c", "import lsp_server, pygls"], options, (error) => {
      if (error) {
        // Expected for an environment without the package (the bundled copy is tried next):
        // information, with the reason Python gave (its last line).
        const reason = error.message.trim().split("\n").pop();
        const where = server.env.PYTHONPATH ? " (bundled)" : "";
        output.info(`${[server.command, ...prefix].join(" ")} cannot import lsp_server${where}: ${reason}`);
      }
      resolve(!error);
    });
  });
}

/** Once per interpreter: the environment has no server, so the bundled one runs; installing the
 * extension's own wheel there also gives `%load_ext explainer` and `explainer run`. */
async function sayBundledIsUsed(choice: InterpreterChoice): Promise<void> {
  const python = choice.command.join(" ");
  output.warn(`${python} has no backward-explainer: the server bundled with the extension runs instead.`);
  const key = `bundledNotice:${python}`;
  if (memory.get(key)) {
    return;
  }
  await memory.update(key, true);
  const wheel = bundledWheel();
  const install = "Install into this environment";
  const answer = await vscode.window.showInformationMessage(
    `backward-explainer: ${python} has no backward-explainer, so the server bundled with the extension checks your code. ` +
    "Install the package there for %load_ext explainer and explainer run.", ...(wheel ? [install] : []), "Show Logs");
  if (answer === install && wheel) {
    const terminal = vscode.window.createTerminal("backward-explainer install");
    terminal.show();
    terminal.sendText(installCommand(choice, wheel).map(quote).join(" "));
  } else if (answer === "Show Logs") {
    output.show();
  }
}

/** Neither the environment nor the bundled copy runs: the interpreter itself is the problem
 * (missing, or older than Python 3.10). No pip command can fix that. */
async function sayPythonCannotRunIt(choice: InterpreterChoice): Promise<void> {
  const answer = await vscode.window.showErrorMessage(
    `backward-explainer: ${choice.command.join(" ")} cannot run the language server (Python 3.10 or newer is needed; ` +
    "set backwardExplainer.interpreter).", "Show Logs");
  if (answer === "Show Logs") {
    output.show();
  }
}

/** The package's wheel shipped in the .vsix (bundle_server.py puts it in bundled/wheels). */
function bundledWheel(): string | undefined {
  try {
    const found = readdirSync(`${extensionDirectory}/bundled/wheels`).filter((name) => name.endsWith(".whl"));
    return found.length === 1 ? `${extensionDirectory}/bundled/wheels/${found[0]}` : undefined;
  } catch {
    return undefined;
  }
}

function quote(part: string): string {
  return /^[\w./\-=\[\]]+$/.test(part) ? part : `"${part.replace(/"/g, '\\"')}"`;
}

async function pythonExtensionApi() {
  try {
    const { PythonExtension } = await import("@vscode/python-extension");
    return await PythonExtension.api();
  } catch {
    return undefined; // the Python extension is optional: the setting or python3 is used instead
  }
}

async function activeInterpreter(): Promise<string | undefined> {
  const api = await pythonExtensionApi();
  if (!api) {
    return undefined;
  }
  const path = api.environments.getActiveEnvironmentPath(vscode.workspace.workspaceFolders?.[0]?.uri);
  const environment = await api.environments.resolveEnvironment(path);
  return environment?.executable.uri?.fsPath;
}
