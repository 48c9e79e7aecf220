// The VS Code side: find Python, start `python -m lsp_server`, restart when the interpreter
// changes (src/lifecycle.ts). Every diagnostic, fix and explanation comes from the server;
// nothing is analysed here.
import { execFile } from "node:child_process";
import * as vscode from "vscode";
import { LanguageClient, LanguageClientOptions, ServerOptions } from "vscode-languageclient/node";
import {
  chooseInterpreter, importStrategy, InterpreterChoice, needsRestart, ServerCommand, serverCommand, serverSettings,
} from "./interpreter";
import { restartOn, ServerLifecycle } from "./lifecycle";

const SECTION = "backwardExplainer";
let output: vscode.LogOutputChannel;
let extensionDirectory: string;
let lifecycle: ServerLifecycle<LanguageClient> | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel("backward-explainer", { log: true });
  extensionDirectory = context.extensionUri.fsPath;
  const servers = new ServerLifecycle(launch, (error) => output.error(`Starting or stopping the server failed: ${error}`));
  lifecycle = servers;
  const python = await pythonExtensionApi();
  context.subscriptions.push(
    output,
    vscode.commands.registerCommand(`${SECTION}.restart`, () => servers.restart()),
    vscode.commands.registerCommand(`${SECTION}.showLogs`, () => output.show()),
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
  const strategy = importStrategy(settings.get("importStrategy"));
  const server = serverCommand(choice, extensionDirectory, strategy, process.env);
  output.info(`Python: ${choice.command.join(" ")} (${choice.source}), ${strategy}`);
  if (!(await hasServer(server))) {
    void offerInstall(choice, strategy);
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
    outputChannel: output,
    initializationOptions: serverSettings((key) => settings.get(key)),
    synchronize: { configurationSection: SECTION },
  };
  const client = new LanguageClient(SECTION, "backward-explainer", serverOptions, clientOptions);
  try {
    await client.start();
    return client;
  } catch (error) {
    output.error(`The server did not start: ${error}`);
    void vscode.window.showErrorMessage("backward-explainer: the language server did not start.", "Show Logs")
      .then((answer) => answer && output.show());
    return undefined;
  }
}

/** Whether the interpreter can import the server (a quick `python -c`, nothing of the workspace). */
function hasServer(server: ServerCommand): Promise<boolean> {
  const prefix = server.args.slice(0, -2); // without "-m lsp_server"
  return new Promise((resolve) => {
    const options = { timeout: 20000, cwd: server.cwd, env: server.env };
    execFile(server.command, [...prefix, "-c", "import lsp_server, pygls"], options, (error) => {
      if (error) {
        output.warn(`${[server.command, ...prefix].join(" ")} cannot import lsp_server: ${error.message}`);
      }
      resolve(!error);
    });
  });
}

async function offerInstall(choice: InterpreterChoice, strategy: string): Promise<void> {
  const install = "Install backward-explainer";
  const problem = strategy === "useBundled"
    ? "cannot run the bundled server (Python 3.10 or newer is needed)"
    : "does not have the package (or Python is missing)";
  const answer = await vscode.window.showErrorMessage(
    `backward-explainer: ${choice.command.join(" ")} ${problem}.`,
    ...(strategy === "useBundled" ? [] : [install]), "Show Logs");
  if (answer === install) {
    const terminal = vscode.window.createTerminal("backward-explainer install");
    terminal.show();
    terminal.sendText([...choice.command, "-m", "pip", "install", "backward-explainer[lsp]"].map(quote).join(" "));
  } else if (answer === "Show Logs") {
    output.show();
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
