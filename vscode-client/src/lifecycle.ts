// When the server starts, stops and restarts. Pure logic (no `vscode` import): extension.ts hands
// it VS Code's and the Python extension's events, and the unit tests hand it fakes.

/** A VS Code style event: subscribe with a listener, get back something to dispose. */
export type Event<T> = (listener: (event: T) => unknown) => { dispose(): unknown };

export interface Stoppable {
  stop(): Promise<void>;
}

/**
 * One server at a time. Start, stop and restart run one after another, never overlapping: a
 * burst of environment changes (the Python extension fires one per refresh) must not leave two
 * servers publishing into the same Problems panel. Restarts asked for while one is waiting to
 * run are merged into it.
 */
export class ServerLifecycle<Server extends Stoppable> {
  private current: Server | undefined;
  private chain: Promise<void> = Promise.resolve();
  private waitingRestart: Promise<void> | undefined;

  constructor(
    private readonly launch: () => Promise<Server | undefined>,
    private readonly report: (error: unknown) => void,
  ) {}

  get server(): Server | undefined {
    return this.current;
  }

  start(): Promise<void> {
    return this.enqueue(() => this.startNow());
  }

  stop(): Promise<void> {
    return this.enqueue(() => this.stopNow());
  }

  restart(): Promise<void> {
    if (!this.waitingRestart) {
      this.waitingRestart = this.enqueue(async () => {
        this.waitingRestart = undefined; // from here on, a new request needs a new restart
        try {
          await this.stopNow();
        } catch (error) {
          // The old server is forgotten either way; a failed stop must not leave none running.
          this.report(error);
        }
        await this.startNow();
      });
    }
    return this.waitingRestart;
  }

  private enqueue(step: () => Promise<void>): Promise<void> {
    // A failed step is reported and must not wedge the chain for every later request.
    this.chain = this.chain.then(step).catch((error) => this.report(error));
    return this.chain;
  }

  private async startNow(): Promise<void> {
    if (!this.current) {
      this.current = await this.launch();
    }
  }

  private async stopNow(): Promise<void> {
    const running = this.current;
    this.current = undefined;
    if (running) {
      await running.stop();
    }
  }
}

export interface RestartTriggers {
  /** `workspace.onDidChangeConfiguration`; only settings that need a new process count. */
  configurationChanged: Event<{ affectsConfiguration(section: string): boolean }>;
  /** `workspace.onDidGrantWorkspaceTrust`: workspace-level settings may now be used. */
  trustGranted: Event<void>;
  /** The Python extension's `environments.onDidChangeActiveEnvironmentPath`, when installed. */
  environmentChanged?: Event<unknown>;
}

/** Subscribes `restart` to every event that changes which Python should run the server. */
export function restartOn(
  triggers: RestartTriggers,
  needsRestart: (affects: (section: string) => boolean) => boolean,
  restart: () => unknown,
): { dispose(): unknown }[] {
  const subscriptions = [
    triggers.configurationChanged((event) => {
      if (needsRestart((section) => event.affectsConfiguration(section))) {
        restart();
      }
    }),
    triggers.trustGranted(() => restart()),
  ];
  if (triggers.environmentChanged) {
    subscriptions.push(triggers.environmentChanged(() => restart()));
  }
  return subscriptions;
}
