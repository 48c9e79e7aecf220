import { strict as assert } from "node:assert";
import { test } from "node:test";
import { needsRestart } from "../src/interpreter";
import { Event, restartOn, ServerLifecycle } from "../src/lifecycle";

/** A fake of vscode.EventEmitter: `event` to subscribe, `fire` to emit. */
class Emitter<T> {
  private listeners = new Set<(value: T) => unknown>();
  readonly event: Event<T> = (listener) => {
    this.listeners.add(listener);
    return { dispose: () => this.listeners.delete(listener) };
  };
  fire(value: T): void {
    this.listeners.forEach((listener) => listener(value));
  }
  get subscribed(): number {
    return this.listeners.size;
  }
}

/** Fake servers that take a while to start and stop, and log what happened in which order. */
function fakeServers(options: { failFirstStart?: boolean; failFirstStop?: boolean } = {}) {
  const log: string[] = [];
  let running = 0;
  let maxRunning = 0;
  let started = 0;
  const tick = () => new Promise((resolve) => setTimeout(resolve, 5));
  const launch = async () => {
    const id = ++started;
    log.push(`start ${id}`);
    await tick();
    if (options.failFirstStart && id === 1) {
      throw new Error("spawn python3 ENOENT");
    }
    running += 1;
    maxRunning = Math.max(maxRunning, running);
    return {
      id,
      stop: async () => {
        log.push(`stop ${id}`);
        await tick();
        running -= 1;
        if (options.failFirstStop && id === 1) {
          throw new Error("Stopping server failed");
        }
      },
    };
  };
  return { log, launch, running: () => running, maxRunning: () => maxRunning };
}

/** The extension's wiring (activate's restartOn) against fake VS Code and Python-extension
 * events, with fake servers. `pythonExtension: false` leaves out the environment event. */
function wired(options: { pythonExtension?: boolean } = {}) {
  const servers = fakeServers();
  const lifecycle = new ServerLifecycle(servers.launch, (error) => assert.fail(String(error)));
  const fakes = {
    configuration: new Emitter<{ affectsConfiguration(section: string): boolean }>(),
    trust: new Emitter<void>(),
    environment: new Emitter<unknown>(),
  };
  const restarts: Promise<void>[] = [];
  const subscriptions = restartOn({
    configurationChanged: fakes.configuration.event,
    trustGranted: fakes.trust.event,
    environmentChanged: options.pythonExtension === false ? undefined : fakes.environment.event,
  }, needsRestart, () => restarts.push(lifecycle.restart()));
  return { servers, lifecycle, fakes, subscriptions, restarted: () => Promise.all(restarts) };
}

test("an environment change from the Python extension restarts the server with the new interpreter", async () => {
  const { servers, lifecycle, fakes, restarted } = wired();
  await lifecycle.start();
  fakes.environment.fire({ id: "/envs/new/bin/python", path: "/envs/new/bin/python" });
  await restarted();
  assert.deepEqual(servers.log, ["start 1", "stop 1", "start 2"]);
  assert.equal(lifecycle.server?.id, 2);
  assert.equal(servers.running(), 1);
});

test("a burst of environment changes leaves one server, never two at once", async () => {
  const { servers, lifecycle, fakes, restarted } = wired();
  const starting = lifecycle.start();
  for (let i = 0; i < 5; i++) {
    fakes.environment.fire({ path: `/envs/${i}/bin/python` });
  }
  await starting;
  fakes.environment.fire({ path: "/envs/last/bin/python" }); // while the merged restart runs
  await restarted();
  assert.equal(servers.maxRunning(), 1);
  assert.equal(servers.running(), 1);
  // The five changes during start-up merge into one restart; the one after it needs its own.
  assert.deepEqual(servers.log, ["start 1", "stop 1", "start 2", "stop 2", "start 3"]);
});

test("only interpreter settings and granted trust restart; other settings reach the server live", async () => {
  const { servers, lifecycle, fakes, restarted } = wired({ pythonExtension: false });
  assert.equal(fakes.environment.subscribed, 0); // no Python extension: nothing to listen to
  await lifecycle.start();
  fakes.configuration.fire({ affectsConfiguration: (s) => s === "backwardExplainer.severity" || s === "backwardExplainer" });
  await restarted();
  assert.deepEqual(servers.log, ["start 1"]);
  fakes.configuration.fire({ affectsConfiguration: (s) => s.startsWith("backwardExplainer") });
  fakes.trust.fire();
  await restarted();
  assert.deepEqual(servers.log, ["start 1", "stop 1", "start 2"]); // two triggers, one merged restart
});

test("a server that fails to start is reported, and the next restart still works", async () => {
  const servers = fakeServers({ failFirstStart: true });
  const reported: string[] = [];
  const lifecycle = new ServerLifecycle(servers.launch, (error) => reported.push(String(error)));
  await lifecycle.start();
  assert.deepEqual(reported, ["Error: spawn python3 ENOENT"]);
  const afterFailure = lifecycle.server;
  await lifecycle.restart();
  assert.equal(afterFailure, undefined);
  assert.equal(lifecycle.server?.id, 2);
  await lifecycle.stop();
  assert.equal(servers.running(), 0);
  assert.deepEqual(servers.log, ["start 1", "start 2", "stop 2"]);
});

test("a server that fails to stop is reported, and the restart still starts a new one", async () => {
  // vscode-languageclient rejects stop() when the server answers `shutdown` with an error.
  const servers = fakeServers({ failFirstStop: true });
  const reported: string[] = [];
  const lifecycle = new ServerLifecycle(servers.launch, (error) => reported.push(String(error)));
  await lifecycle.start();
  await lifecycle.restart();
  assert.deepEqual(reported, ["Error: Stopping server failed"]);
  assert.equal(lifecycle.server?.id, 2);
  assert.deepEqual(servers.log, ["start 1", "stop 1", "start 2"]);
});

test("disposing the subscriptions stops the restarts", async () => {
  const { servers, lifecycle, fakes, subscriptions } = wired();
  await lifecycle.start();
  subscriptions.forEach((s) => s.dispose());
  fakes.environment.fire({});
  await lifecycle.stop();
  assert.deepEqual(servers.log, ["start 1", "stop 1"]);
});
