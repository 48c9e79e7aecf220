// Which Python runs the server, and with what settings. Pure logic (no `vscode` import), so it is
// unit-tested with node's test runner; extension.ts feeds it what VS Code and the Python
// extension report.

/** A setting's value at each level, as `WorkspaceConfiguration.inspect` reports it. */
export interface Inspected<T> {
  globalValue?: T;
  workspaceValue?: T;
  workspaceFolderValue?: T;
}

export interface InterpreterChoice {
  command: string[];
  source: "setting" | "python-extension" | "default";
  /** Set when a workspace-level value was ignored because the workspace is not trusted. */
  ignoredUntrusted?: string[];
  /** Why the Python extension's interpreter was not used, when it was asked and failed. */
  pythonExtensionError?: string;
}

/**
 * The interpreter command, in order: the `backwardExplainer.interpreter` setting, the Python
 * extension's active environment, then `python3`. In a restricted (untrusted) workspace a value
 * that came from the workspace or folder settings is never used, and the Python extension is not
 * asked: its active environment may be a `.venv` inside the workspace (and it refuses to resolve
 * environments there). A cloned repository must not be able to make the editor run a binary of
 * its choosing. `askPythonExtension` is called only when its answer would be used.
 */
export async function chooseInterpreter(
  setting: Inspected<string[]>,
  trusted: boolean,
  askPythonExtension: () => Promise<string | undefined>,
): Promise<InterpreterChoice> {
  const workspaceLevel = setting.workspaceFolderValue ?? setting.workspaceValue;
  const usable = (value: string[] | undefined) => Array.isArray(value) && value.length > 0 && value.every((p) => typeof p === "string" && p.length > 0);
  if (usable(workspaceLevel) && trusted) {
    return { command: workspaceLevel as string[], source: "setting" };
  }
  const ignoredUntrusted = usable(workspaceLevel) ? (workspaceLevel as string[]) : undefined;
  if (usable(setting.globalValue)) {
    return { command: setting.globalValue as string[], source: "setting", ignoredUntrusted };
  }
  if (trusted) {
    try {
      const executable = await askPythonExtension();
      if (executable) {
        return { command: [executable], source: "python-extension" };
      }
    } catch (error) {
      return { command: ["python3"], source: "default", pythonExtensionError: String(error) };
    }
  }
  return { command: ["python3"], source: "default", ignoredUntrusted };
}

export type ImportStrategy = "fromEnvironment" | "useBundled";

export interface ServerCommand {
  command: string;
  args: string[];
  /** Never the workspace: `python -m` puts the working directory first on sys.path, so a cloned
   * repository with its own `lsp_server/` or `pygls.py` would run inside the server. */
  cwd: string;
  env: Record<string, string | undefined>;
}

/**
 * How to run the server with `choice`. `extensionDirectory` is the extension's own folder; with
 * `useBundled`, its `bundled/libs` (the server and its pure-Python dependencies, built by
 * bundle_server.py) go first on PYTHONPATH, so any Python 3.10+ runs it with nothing installed.
 */
export function serverCommand(
  choice: InterpreterChoice,
  extensionDirectory: string,
  strategy: ImportStrategy,
  environment: Record<string, string | undefined>,
): ServerCommand {
  const [command, ...prefix] = choice.command;
  const env = { ...environment };
  if (strategy === "useBundled") {
    const bundled = `${extensionDirectory}/bundled/libs`;
    const separator = process.platform === "win32" ? ";" : ":";
    env.PYTHONPATH = env.PYTHONPATH ? `${bundled}${separator}${env.PYTHONPATH}` : bundled;
  }
  return { command, args: [...prefix, "-m", "lsp_server"], cwd: extensionDirectory, env };
}

export function importStrategy(value: unknown): ImportStrategy {
  return value === "useBundled" ? "useBundled" : "fromEnvironment";
}

/**
 * The strategies to try, in order: `fromEnvironment` falls back to the bundled server when the
 * environment has none (as ruff's extension does), so a bare Python works with the defaults;
 * `useBundled` means the bundled one only.
 */
export function strategiesToTry(chosen: ImportStrategy): ImportStrategy[] {
  return chosen === "fromEnvironment" ? ["fromEnvironment", "useBundled"] : ["useBundled"];
}

/** The command that installs the extension's own wheel into the interpreter (no package index
 * has it yet): for `%load_ext explainer` and `explainer run` there. */
export function installCommand(choice: InterpreterChoice, wheel: string): string[] {
  return [...choice.command, "-m", "pip", "install", wheel];
}

export interface ServerSettings {
  enable: boolean;
  select: string[];
  ignore: string[];
  severity: string;
}

const SEVERITIES = ["error", "warning", "information", "hint"];

/** The settings sent as initializationOptions, with defaults for missing or malformed values. */
export function serverSettings(read: (key: string) => unknown): ServerSettings {
  const list = (value: unknown) => (Array.isArray(value) ? value.filter((v): v is string => typeof v === "string") : []);
  const severity = read("severity");
  return {
    enable: read("enable") !== false,
    select: list(read("select")),
    ignore: list(read("ignore")),
    severity: typeof severity === "string" && SEVERITIES.includes(severity) ? severity : "warning",
  };
}

/** The settings whose change needs a new server process (the rest reach it live). */
export const RESTART_SETTINGS = ["backwardExplainer.interpreter", "backwardExplainer.importStrategy"];

export function needsRestart(affects: (section: string) => boolean): boolean {
  return RESTART_SETTINGS.some((section) => affects(section));
}
