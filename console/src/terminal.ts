import type { FitAddon } from "@xterm/addon-fit";
import type { Terminal } from "@xterm/xterm";

import { api, execd, wsUrl } from "./api";
import { h } from "./dom";
import { loadXterm } from "./vendor";

const STDIN = 0x00;
const STDOUT = 0x01;
const REPLAY = 0x03;

/** xterm.js on execd's PTY WebSocket (the reference's frame protocol, see execd/pty.py),
 *  reached through the server proxy. */
export class TerminalPanel {
  readonly el: HTMLElement;
  private term: Terminal | null = null;
  private fit: FitAddon | null = null;
  private ws: WebSocket | null = null;
  private session: string | null = null;
  private seen = 0;
  private status: HTMLElement;
  private screen: HTMLElement;
  private closed = false;
  private encoder = new TextEncoder();

  constructor(private sandboxId: string) {
    this.status = h("p", { class: "hint", role: "status" }, "Not connected.");
    this.screen = h("div", { class: "term-box", role: "application",
      "aria-label": "Terminal; Escape then Tab leaves it" });
    // xterm.js draws for sighted users by default; its screen reader mode keeps an accessible
    // copy of the output that assistive technology can read.
    const reader = h("input", { id: "term-reader", type: "checkbox" });
    reader.addEventListener("change", () => {
      if (this.term) this.term.options.screenReaderMode = reader.checked;
    });
    this.el = h("div", {},
      h("div", { class: "inline" }, this.status,
        h("label", { class: "check" }, reader, "Screen reader mode")),
      this.screen);
  }

  async open(): Promise<void> {
    if (this.term) {
      this.fit?.fit();
      this.term.focus();
      return;
    }
    this.status.textContent = "Loading the terminal…";
    const { FitAddon, Terminal } = await loadXterm();
    if (this.term || this.closed) return;
    const fit = new FitAddon();
    this.fit = fit;
    const term = new Terminal({ cursorBlink: true, fontSize: 14, convertEol: false,
      screenReaderMode: false, theme: { background: "#111417" } });
    this.term = term;
    term.loadAddon(fit);
    term.open(this.screen);
    fit.fit();
    // Escape then Tab moves focus out (xterm otherwise keeps Tab for the shell).
    let escaped = false;
    term.attachCustomKeyEventHandler((ev) => {
      if (ev.type !== "keydown") return true;
      if (ev.key === "Tab" && escaped) {
        escaped = false;
        return false;
      }
      escaped = ev.key === "Escape";
      return true;
    });
    term.onData((data) => this.send(data));
    term.onResize(({ cols, rows }) => this.sendJson({ type: "resize", cols, rows }));
    window.addEventListener("resize", this.onWindowResize);
    this.status.textContent = "Starting a shell…";
    try {
      const created = await api<{ session_id: string }>("POST", execd(this.sandboxId, "/pty"),
        { cols: term.cols, rows: term.rows });
      this.session = created.session_id;
      this.connect();
    } catch (err) {
      this.status.textContent = `Could not start a terminal: ${(err as Error).message}`;
    }
    term.focus();
  }

  private onWindowResize = (): void => this.fit?.fit();

  private connect(): void {
    if (!this.session || this.closed) return;
    const path = execd(this.sandboxId, `/pty/${this.session}/ws?since=${this.seen}`);
    const ws = new WebSocket(wsUrl(path));
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onmessage = (ev) => {
      if (typeof ev.data === "string") {
        this.control(JSON.parse(ev.data));
        return;
      }
      const bytes = new Uint8Array(ev.data as ArrayBuffer);
      if (bytes[0] === STDOUT) {
        this.seen += bytes.length - 1;
        this.term?.write(bytes.subarray(1));
      } else if (bytes[0] === REPLAY && bytes.length >= 9) {
        const start = Number(new DataView(bytes.buffer, bytes.byteOffset + 1, 8).getBigUint64(0));
        const data = bytes.subarray(9);
        this.seen = start + data.length;
        this.term?.write(data);
      }
    };
    ws.onclose = (ev) => {
      if (this.closed) return;
      this.status.textContent = ev.code === 1000
        ? "The shell has exited."
        : `Disconnected (${ev.reason || ev.code}).`;
    };
  }

  private control(frame: { type: string; [k: string]: unknown }): void {
    if (frame.type === "connected") {
      this.status.textContent = "Connected: a shell in the sandbox.";
      if (this.term) this.sendJson({ type: "resize", cols: this.term.cols, rows: this.term.rows });
    } else if (frame.type === "exit") {
      this.status.textContent = `The shell exited with code ${frame.exit_code}.`;
    } else if (frame.type === "error") {
      this.status.textContent = `Terminal error: ${frame.error ?? frame.code}`;
    }
  }

  private send(data: string): void {
    if (this.ws?.readyState !== WebSocket.OPEN) return;
    const body = this.encoder.encode(data);
    const frame = new Uint8Array(body.length + 1);
    frame[0] = STDIN;
    frame.set(body, 1);
    this.ws.send(frame);
  }

  private sendJson(frame: object): void {
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(frame));
  }

  close(): void {
    this.closed = true;
    window.removeEventListener("resize", this.onWindowResize);
    this.ws?.close();
    if (this.session) {
      void api("DELETE", execd(this.sandboxId, `/pty/${this.session}`)).catch(() => {});
    }
    this.term?.dispose();
  }
}
