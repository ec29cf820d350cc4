import { api, Sandbox } from "./api";
import { DiagnosticsPanel } from "./diagnostics";
import { clear, h, toast, when } from "./dom";
import { EgressPanel } from "./egress";
import { FilesPanel } from "./files";
import { MetricsPanel } from "./metrics";
import { stateBadge } from "./states";
import { TerminalPanel } from "./terminal";

const POLL_MS = 2000;
const TABS = ["Overview", "Terminal", "Files", "Metrics", "Network", "Events and logs"] as const;
type Tab = (typeof TABS)[number];

function slug(tab: Tab): string {
  return tab.toLowerCase().replace(/\s+/g, "-");
}

/** One sandbox: status, lifecycle actions, and a tab per way of looking into it. */
export function sandboxView(main: HTMLElement, id: string, initialTab: string): () => void {
  const base = `/v1/sandboxes/${encodeURIComponent(id)}`;
  const badge = h("span", {});
  const overview = h("dl", { class: "facts" });
  // The terminal (xterm.js) and the charts (uPlot) load with their tab: the list and the
  // sandbox page come up without them.
  const termHost = h("div", {});
  const metricsHost = h("div", {});
  let terminal: TerminalPanel | null = null;
  let metrics: MetricsPanel | null = null;
  const files = new FilesPanel(id);
  const egress = new EgressPanel(id);
  const diagnostics = new DiagnosticsPanel(id);
  const panels: Record<Tab, HTMLElement> = {
    Overview: overview, Terminal: termHost, Files: files.el, Metrics: metricsHost,
    Network: egress.el, "Events and logs": diagnostics.el,
  };
  let current: Sandbox | null = null;
  let stopped = false;
  let timer: number | undefined;

  const renewSelect = h("select", { id: "renew-by", "aria-label": "Renew by" },
    h("option", { value: "600" }, "10 minutes"), h("option", { value: "3600" }, "1 hour"),
    h("option", { value: "86400" }, "1 day"));
  const act = (label: string, run: () => Promise<unknown>, cls = ""): HTMLButtonElement =>
    h("button", { type: "button", class: cls, onclick: async () => {
      try {
        await run();
        toast(`${label}: requested.`);
        await refresh();
      } catch (err) {
        toast(`${label} failed: ${(err as Error).message}`, "error");
      }
    } }, label);
  const pause = act("Pause", () => api("POST", `${base}/pause`));
  const resume = act("Resume", () => api("POST", `${base}/resume`));
  const renew = act("Renew", () => api("POST", `${base}/renew-expiration`, {
    expiresAt: new Date(Date.now() + Number(renewSelect.value) * 1000).toISOString() }));
  const snapshot = act("Snapshot", async () => {
    const snap = await api<{ id: string }>("POST", `${base}/snapshots`,
      { name: `${id.slice(0, 8)}-${Date.now()}` });
    toast(`Snapshot ${snap.id} started.`);
  });
  const kill = act("Kill", async () => {
    if (!window.confirm(`Kill sandbox ${id}? Its processes and files are deleted.`)) {
      throw new Error("cancelled");
    }
    await api("DELETE", base);
  }, "danger");

  const tabButtons = TABS.map((tab, i) => h("button", {
    type: "button", role: "tab", id: `tab-${slug(tab)}`, "aria-controls": `panel-${slug(tab)}`,
    tabindex: i === 0 ? 0 : -1, onclick: () => select(tab, true),
  }, tab));
  const tabPanels = TABS.map((tab) => h("section", {
    role: "tabpanel", id: `panel-${slug(tab)}`, "aria-labelledby": `tab-${slug(tab)}`,
    tabindex: 0, hidden: true }, panels[tab]));
  const tablist = h("div", { role: "tablist", "aria-label": "Sandbox views" }, tabButtons);
  tablist.addEventListener("keydown", (ev) => {
    const i = tabButtons.indexOf(document.activeElement as HTMLButtonElement);
    if (i < 0) return;
    const step = ev.key === "ArrowRight" ? 1 : ev.key === "ArrowLeft" ? -1 : 0;
    if (!step) return;
    ev.preventDefault();
    const next = TABS[(i + step + TABS.length) % TABS.length];
    select(next, true);
    tabButtons[TABS.indexOf(next)].focus();
  });

  function select(tab: Tab, updateHash: boolean): void {
    TABS.forEach((t, i) => {
      const on = t === tab;
      tabButtons[i].setAttribute("aria-selected", String(on));
      tabButtons[i].tabIndex = on ? 0 : -1;
      tabPanels[i].hidden = !on;
    });
    if (updateHash) history.replaceState(null, "", `#/sandbox/${encodeURIComponent(id)}/${slug(tab)}`);
    if (tab === "Metrics") void openMetrics();
    else metrics?.stop();
    if (tab === "Terminal") void openTerminal();
    if (tab === "Files") void files.load();
    if (tab === "Network") void egress.load();
    if (tab === "Events and logs") void diagnostics.load();
  }

  async function openTerminal(): Promise<void> {
    if (!terminal) {
      if (stopped) return;
      terminal = new TerminalPanel(id);
      termHost.append(terminal.el);
    }
    await terminal.open();
  }

  async function openMetrics(): Promise<void> {
    if (!metrics) {
      if (stopped) return;
      metrics = new MetricsPanel(id);
      metricsHost.append(metrics.el);
    }
    metrics.start();
  }

  function render(sb: Sandbox): void {
    current = sb;
    const state = sb.status.state;
    clear(badge, stateBadge(state));
    main.dataset.state = state;
    pause.disabled = state !== "Running";
    resume.disabled = state !== "Paused";
    renew.disabled = snapshot.disabled = !["Running", "Paused"].includes(state);
    kill.disabled = state === "Terminated";
    const facts: [string, string][] = [
      ["State", `${state}${sb.status.reason ? ` (${sb.status.reason})` : ""}`],
      ["Message", sb.status.message ?? "—"],
      ["Image", sb.image?.uri ?? "—"],
      ["Entrypoint", (sb.entrypoint ?? []).join(" ") || "—"],
      ["Created", when(sb.createdAt)],
      ["Expires", when(sb.expiresAt)],
      ["Limits", Object.entries(sb.resourceLimits ?? {}).map(([k, v]) => `${k} ${v}`).join(", ") || "—"],
      ["Metadata", Object.entries(sb.metadata ?? {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"],
    ];
    clear(overview, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  async function refresh(): Promise<void> {
    try {
      const sb = await api<Sandbox>("GET", base);
      if (!stopped) render(sb);
    } catch (err) {
      if (stopped) return;
      clear(badge, stateBadge("Gone"));
      overview.replaceChildren(h("p", {}, `This sandbox cannot be shown: ${(err as Error).message}`));
      for (const b of [pause, resume, renew, snapshot, kill]) b.disabled = true;
    }
  }
  async function poll(): Promise<void> {
    if (!document.hidden) await refresh();
    if (!stopped) timer = window.setTimeout(() => void poll(), POLL_MS);
  }

  clear(main,
    h("p", {}, h("a", { href: "#/" }, "← All sandboxes")),
    h("div", { class: "titlebar" }, h("h1", {}, "Sandbox ", h("code", {}, id)), badge),
    h("div", { class: "toolbar", role: "toolbar", "aria-label": "Lifecycle" },
      pause, resume, h("label", { for: "renew-by", class: "sr-only" }, "Renew by"), renewSelect,
      renew, snapshot, kill),
    tablist, ...tabPanels);
  const wanted = TABS.find((t) => slug(t) === initialTab) ?? "Overview";
  void poll().then(() => {
    if (!stopped && current) {
      select(wanted, false);
      main.dataset.ready = "sandbox";
    }
  });
  return () => {
    stopped = true;
    window.clearTimeout(timer);
    terminal?.close();
    metrics?.close();
  };
}
