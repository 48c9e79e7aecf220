// What the language status item (the `{}` in the status bar, beside Python) says about the
// server. Pure logic (no `vscode` import), unit-tested with node's test runner.

export type ServerState =
  | { kind: "starting" }
  | { kind: "running"; python: string; bundled: boolean }
  | { kind: "stopped"; reason: string };

export interface StatusView {
  text: string;
  detail: string;
  severity: "information" | "error";
  busy: boolean;
  command: { title: string; command: string };
}

/** The item for a state: what runs (and which copy of the server), or why nothing does. */
export function statusView(state: ServerState, section: string): StatusView {
  const logs = { title: "Show Logs", command: `${section}.showLogs` };
  switch (state.kind) {
    case "starting":
      return { text: "backward-explainer", detail: "starting", severity: "information", busy: true, command: logs };
    case "running":
      return {
        text: "backward-explainer",
        detail: `${state.python}, ${state.bundled ? "bundled server" : "server from the environment"}`,
        severity: "information", busy: false, command: logs,
      };
    case "stopped":
      return {
        text: "backward-explainer: not running", detail: state.reason, severity: "error", busy: false,
        command: { title: "Restart", command: `${section}.restart` },
      };
  }
}
