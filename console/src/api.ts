// The /v1 API as the signed-in browser calls it: the session cookie authenticates, and every
// request carries the session's CSRF token (the server refuses cookie requests without it).

const meta = (name: string): string =>
  document.querySelector<HTMLMetaElement>(`meta[name="${name}"]`)?.content ?? "";

let csrf = meta("sandlot-csrf");
export const execdPort = Number(meta("sandlot-execd-port") || "44772");

export class ApiError extends Error {
  constructor(public status: number, public code: string, message: string) {
    super(message);
  }
}

export function signedIn(): boolean {
  return csrf !== "";
}

async function failure(resp: Response): Promise<ApiError> {
  let code = `HTTP_${resp.status}`;
  let message = resp.statusText || `HTTP ${resp.status}`;
  try {
    const body = await resp.json();
    if (body && typeof body === "object") {
      code = body.code ?? code;
      message = body.message ?? body.detail ?? message;
      if (typeof message !== "string") message = JSON.stringify(message);
    }
  } catch {
    /* not JSON: keep the status line */
  }
  return new ApiError(resp.status, code, message);
}

/** A raw response (for downloads); errors as ApiError; a lost session goes to sign-in. */
export async function request(method: string, path: string, body?: unknown): Promise<Response> {
  const headers: Record<string, string> = { "X-Sandlot-CSRF": csrf };
  let payload: BodyInit | undefined;
  if (body instanceof FormData) {
    payload = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const resp = await fetch(path, { method, headers, body: payload, credentials: "same-origin" });
  return checked(resp);
}

async function checked(resp: Response): Promise<Response> {
  if (!resp.ok) {
    const err = await failure(resp);
    if (resp.status === 401) {
      csrf = "";
      location.hash = "#/login";
    }
    throw err;
  }
  return resp;
}

export async function api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  return decoded<T>(await request(method, path, body));
}

/** GET ``path``, answered by the request boot.ts sent early when it was for this path (once). */
export async function apiGetFirst<T = unknown>(path: string): Promise<T> {
  const early = window.sandlotPrefetch;
  window.sandlotPrefetch = undefined;
  if (early?.path === path) {
    let resp: Response | null = null;
    try {
      resp = await early.response;
    } catch {
      /* a network error: ask again below */
    }
    if (resp) return decoded<T>(await checked(resp));
  }
  return api<T>("GET", path);
}

async function decoded<T>(resp: Response): Promise<T> {
  if (resp.status === 204 || resp.headers.get("content-length") === "0") return undefined as T;
  const type = resp.headers.get("content-type") ?? "";
  return (type.includes("json") ? await resp.json() : await resp.text()) as T;
}

export async function signIn(apiKey: string): Promise<void> {
  const resp = await fetch("/console/api/session", {
    method: "POST",
    headers: { "OPEN-SANDBOX-API-KEY": apiKey },
    credentials: "same-origin",
  });
  if (!resp.ok) throw await failure(resp);
  csrf = (await resp.json()).csrfToken;
}

export async function signOut(): Promise<void> {
  try {
    await request("DELETE", "/console/api/session");
  } finally {
    csrf = "";
  }
}

/** A path on the sandbox's execd, through the server proxy (the server adds execd's token). */
export function execd(sandboxId: string, path: string): string {
  return `/v1/sandboxes/${encodeURIComponent(sandboxId)}/proxy/${execdPort}${path}`;
}

export function wsUrl(path: string): string {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const sep = path.includes("?") ? "&" : "?";
  return `${scheme}://${location.host}${path}${sep}sandlot_csrf=${encodeURIComponent(csrf)}`;
}

export interface Sandbox {
  id: string;
  image?: { uri?: string } | null;
  status: { state: string; reason?: string | null; message?: string | null };
  metadata?: Record<string, string> | null;
  entrypoint?: string[] | null;
  createdAt?: string;
  expiresAt?: string | null;
  resourceLimits?: Record<string, string> | null;
}

export interface Page<T> {
  items: T[];
  pagination?: { page: number; pageSize: number; totalItems: number; totalPages: number };
}
