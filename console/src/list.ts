import { api, Page, Sandbox } from "./api";
import { clear, h, toast, when } from "./dom";
import { STATES, stateBadge } from "./states";

const POLL_MS = 2000;

/** The sandbox list: filters in the URL hash (so a filtered view can be bookmarked), refreshed
 *  by polling while the tab is visible. */
export function listView(main: HTMLElement, params: URLSearchParams): () => void {
  const chosen = new Set(params.getAll("state"));
  const metadata = params.get("metadata") ?? "";
  const status = h("p", { class: "hint" }, "Loading…");
  const body = h("tbody");
  const table = h(
    "table",
    { class: "list", "aria-describedby": "list-status" },
    h("caption", { class: "sr-only" }, "Sandboxes"),
    h("thead", {}, h("tr", {},
      ...["Sandbox", "State", "Image", "Created", "Expires", "Metadata"].map((c) =>
        h("th", { scope: "col" }, c)))),
    body,
  );
  status.id = "list-status";
  const meta = h("input", {
    id: "filter-metadata", name: "metadata", value: metadata, placeholder: "team=ml, env=dev",
  });
  const boxes = STATES.map((s) =>
    h("label", { class: "check" },
      h("input", { type: "checkbox", name: "state", value: s, checked: chosen.has(s) }), s));
  const filters = h(
    "form",
    { class: "filters", "aria-label": "Filter sandboxes" },
    h("fieldset", {}, h("legend", {}, "State"), ...boxes),
    h("div", { class: "field" }, h("label", { for: "filter-metadata" }, "Metadata"), meta),
    h("button", { type: "submit" }, "Apply filters"),
  );
  filters.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const box of filters.querySelectorAll<HTMLInputElement>("input[name=state]:checked")) {
      q.append("state", box.value);
    }
    const pairs = meta.value.split(",").map((p) => p.trim()).filter(Boolean).join("&");
    if (pairs) q.set("metadata", pairs);
    location.hash = `#/?${q}`;
  });
  clear(
    main,
    h("div", { class: "titlebar" },
      h("h1", {}, "Sandboxes"),
      h("a", { class: "button primary", href: "#/new" }, "New sandbox")),
    filters,
    status,
    h("div", { class: "scroll" }, table),
  );

  let timer: number | undefined;
  let stopped = false;
  let first = true;
  const query = new URLSearchParams({ pageSize: "200" });
  for (const s of chosen) query.append("state", s);
  if (metadata) query.set("metadata", metadata);

  async function refresh(): Promise<void> {
    try {
      const page = await api<Page<Sandbox>>("GET", `/v1/sandboxes?${query}`);
      if (stopped) return;
      render(page);
      if (first) {
        first = false;
        document.body.dataset.ready = "list";
        performance.mark("sandlot-list-ready");
      }
    } catch (err) {
      if (!stopped) status.textContent = `Could not load sandboxes: ${(err as Error).message}`;
    }
    if (!stopped) timer = window.setTimeout(tick, POLL_MS);
  }
  function tick(): void {
    if (document.hidden) timer = window.setTimeout(tick, POLL_MS);
    else void refresh();
  }
  let shown = "";
  function render(page: Page<Sandbox>): void {
    const total = page.pagination?.totalItems ?? page.items.length;
    const more = total > page.items.length ? ` (showing the first ${page.items.length})` : "";
    status.textContent = `${total} sandbox${total === 1 ? "" : "es"}${more}; ` +
      `updated ${new Date().toLocaleTimeString()}, refreshed every ${POLL_MS / 1000} s.`;
    // Unchanged data leaves the table alone, so a keyboard user's focus stays where it is;
    // a changed table gives the focus back to the same sandbox's link.
    const signature = JSON.stringify(page.items);
    if (signature === shown) return;
    shown = signature;
    const focused = body.contains(document.activeElement)
      ? (document.activeElement as HTMLElement).getAttribute("href") : null;
    const rows = page.items.map((sb) =>
      h("tr", {},
        h("th", { scope: "row" },
          h("a", { href: `#/sandbox/${encodeURIComponent(sb.id)}` }, sb.id)),
        h("td", {}, stateBadge(sb.status.state)),
        h("td", {}, sb.image?.uri ?? "—"),
        h("td", {}, when(sb.createdAt)),
        h("td", {}, when(sb.expiresAt)),
        h("td", { class: "meta" },
          Object.entries(sb.metadata ?? {}).map(([k, v]) => h("code", {}, `${k}=${v}`)))));
    clear(body, rows.length ? rows : h("tr", {}, h("td", { colspan: 6 }, "No sandboxes.")));
    if (focused) body.querySelector<HTMLElement>(`a[href="${CSS.escape(focused)}"]`)?.focus();
  }
  void refresh().catch((err) => toast(String(err), "error"));
  return () => {
    stopped = true;
    window.clearTimeout(timer);
  };
}
