// Set by boot.ts, taken by api.ts.
interface Window {
  sandlotPrefetch?: { path: string; response: Promise<Response> };
}
