// The list view's API request, from the URL hash: shared by the list view and boot.ts (which
// sends it while the page is still being parsed).

export const PAGE_SIZE = 100; // the default; ?pageSize= in the hash picks another (1-200)
export const MAX_PAGE_SIZE = 200; // the API's limit

/** The hash's route and query: "#/?state=Running&page=2" -> ["/", params]. */
export function parseHash(hash: string): [string, URLSearchParams] {
  const [path, query = ""] = (hash.replace(/^#/, "") || "/").split("?");
  return [path, new URLSearchParams(query)];
}

export function isListRoute(path: string): boolean {
  return path.split("/").filter(Boolean).length === 0;
}

export function pageOf(params: URLSearchParams): number {
  return Math.max(1, Math.floor(Number(params.get("page"))) || 1);
}

export function pageSizeOf(params: URLSearchParams): number {
  const asked = Math.floor(Number(params.get("pageSize")));
  return asked >= 1 ? Math.min(asked, MAX_PAGE_SIZE) : PAGE_SIZE;
}

/** GET /v1/sandboxes for the list's filters (states, metadata) and page. */
export function listPath(params: URLSearchParams): string {
  const query = new URLSearchParams({ page: String(pageOf(params)), pageSize: String(pageSizeOf(params)) });
  for (const s of params.getAll("state")) query.append("state", s);
  const metadata = params.get("metadata");
  if (metadata) query.set("metadata", metadata);
  return `/v1/sandboxes?${query}`;
}
