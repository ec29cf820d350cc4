import { api, apiGetFirst, Page, Sandbox } from "./api";
import { clear, h, toast, when } from "./dom";
import { listPath, pageOf, pageSizeOf } from "./listquery";
import { STATES, stateBadge } from "./states";

const POLL_MS = 2000;

/** The sandbox list: filters and page in the URL hash (so a view can be bookmarked), pages of
 *  PAGE_SIZE with previous/next links, refreshed by polling while the tab is visible. */
export function listView(main: HTMLElement, params: URLSearchParams): () => void {
  const chosen = new Set(params.getAll("state"));
  const metadata = params.get("metadata") ?? "";
  const pageNo = pageOf(params);
  const pageSize = pageSizeOf(params);
  const status = h("p", { class: "hint" }, "Loading…");
  const pager = h("nav", { class: "pager", "aria-label": "Pages of sandboxes" });
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
  const sizes = [...new Set([25, 50, 100, 200, pageSize])].sort((a, b) => a - b);
  const perPage = h("select", { id: "filter-page-size", name: "pageSize" },
    ...sizes.map((n) => h("option", { value: String(n), selected: n === pageSize }, String(n))));
  const filters = h(
    "form",
    { class: "filters", "aria-label": "Filter sandboxes" },
    h("fieldset", {}, h("legend", {}, "State"), ...boxes),
    h("div", { class: "field" }, h("label", { for: "filter-metadata" }, "Metadata"), meta),
    h("div", { class: "field" }, h("label", { for: "filter-page-size" }, "Per page"), perPage),
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
    if (Number(perPage.value) !== 100) q.set("pageSize", perPage.value);
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
    pager,
  );

  let timer: number | undefined;
  let stopped = false;
  let first = true;
  const path = listPath(params);

  async function refresh(): Promise<void> {
    try {
      const page = first ? await apiGetFirst<Page<Sandbox>>(path)
        : await api<Page<Sandbox>>("GET", path);
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
  function pageLink(n: number, label: string, rel: string): HTMLElement {
    const q = new URLSearchParams(params);
    q.set("page", String(n));
    return h("a", { class: "button", href: `#/?${q}`, rel }, label);
  }
  let pagerShown = "";
  function renderPager(current: number, pages: number): void {
    const key = `${current}/${pages}`;
    if (key === pagerShown) return; // keep a focused link in place across refreshes
    pagerShown = key;
    if (pages <= 1) {
      clear(pager);
      return;
    }
    clear(pager,
      current > 1 && pageLink(current - 1, "Previous page", "prev"),
      h("span", { "aria-current": "page" }, `Page ${current} of ${pages}`),
      current < pages && pageLink(current + 1, "Next page", "next"));
  }
  function render(page: Page<Sandbox>): void {
    const total = page.pagination?.totalItems ?? page.items.length;
    const pages = page.pagination?.totalPages ?? 1;
    const from = (pageNo - 1) * pageSize + 1;
    const range = pages > 1 && page.items.length
      ? ` (${from}-${from + page.items.length - 1} on page ${pageNo} of ${pages})` : "";
    status.textContent = `${total} sandbox${total === 1 ? "" : "es"}${range}; ` +
      `updated ${new Date().toLocaleTimeString()}, refreshed every ${POLL_MS / 1000} s.`;
    renderPager(pageNo, pages);
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
