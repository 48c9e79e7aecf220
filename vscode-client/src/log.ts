// What reaches the extension's log. Pure logic (no `vscode` import), unit-tested with node's
// test runner; extension.ts hands it the LogOutputChannel's methods.

export type Level = "trace" | "debug" | "info" | "warn" | "error";

const CLIENT_PREFIX = /^\[(Trace|Debug|Info|Warn|Error)\s*- [^\]]*\] ?/;
const LEVELS: Record<string, Level> = { Trace: "trace", Debug: "debug", Info: "info", Warn: "warn", Error: "error" };

/**
 * vscode-languageclient writes its lines (and the server's `window/logMessage`) as
 * `[Info  - 3:04:05 PM] message` into the output channel it is given; a LogOutputChannel stamps
 * every line with its own time and level, so each line showed two. Given to the client as its
 * channel, this strips the client's prefix and logs the message at its level. Lines without a
 * prefix (the server's stderr, which arrives in pieces, or the data under an error) keep the
 * level of the line before them.
 */
export class ClientLines {
  private pending = "";
  private level: Level = "info";

  constructor(private readonly write: (level: Level, message: string) => void) {}

  append(text: string): void {
    const lines = (this.pending + text).split(/\r?\n/);
    this.pending = lines.pop() ?? "";
    lines.forEach((line) => this.emit(line));
  }

  appendLine(line: string): void {
    this.append(`${line}\n`);
  }

  private emit(line: string): void {
    const prefix = CLIENT_PREFIX.exec(line);
    if (prefix) {
      this.level = LEVELS[prefix[1]];
      line = line.slice(prefix[0].length);
    }
    if (line.trim()) {
      this.write(this.level, line);
    }
  }
}
