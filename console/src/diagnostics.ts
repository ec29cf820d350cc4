import { api } from "./api";
import { clear, h } from "./dom";

interface Diagnostic { content?: string; contentUrl?: string; truncated: boolean;
  warnings?: string[] }

/** Events and logs from the diagnostics API (diagnostic-api.yml) where the server offers it. */
export class DiagnosticsPanel {
  readonly el: HTMLElement;
  private events = h("div", {});
  private logs = h("div", {});

  constructor(private sandboxId: string) {
    this.el = h("div", {},
      h("div", { class: "actions" },
        h("button", { type: "button", onclick: () => void this.load() }, "Refresh")),
      h("h2", {}, "Events"), this.events, h("h2", {}, "Logs"), this.logs);
  }

  private async one(kind: string, scope: string, box: HTMLElement): Promise<void> {
    const path = `/v1/sandboxes/${encodeURIComponent(this.sandboxId)}/diagnostics/${kind}` +
      `?scope=${scope}`;
    try {
      const d = await api<Diagnostic>("GET", path);
      clear(box,
        (d.warnings ?? []).map((w) => h("p", { class: "hint" }, `Warning: ${w}`)),
        d.truncated ? h("p", { class: "hint" }, "Truncated by the server.") : null,
        d.content !== undefined
          ? h("pre", { class: "log", tabindex: 0, "aria-label": `${kind} text` },
              d.content || "(empty)")
          : h("a", { href: d.contentUrl ?? "#" }, "Download"));
    } catch (err) {
      clear(box, h("p", { class: "hint" }, `Not available: ${(err as Error).message}`));
    }
  }

  async load(): Promise<void> {
    await Promise.all([this.one("events", "runtime", this.events),
      this.one("logs", "container", this.logs)]);
  }
}
