// Inlined at the top of the page (a classic script, before the rest is parsed): a signed-in
// list view's API call starts at once, in parallel with parsing and running the console's
// script, which takes the response over (api.ts, takePrefetched).
import { isListRoute, listPath, parseHash } from "./listquery";

const csrf = document.querySelector<HTMLMetaElement>('meta[name="sandlot-csrf"]')?.content;
const [path, params] = parseHash(location.hash);
if (csrf && isListRoute(path)) {
  const url = listPath(params);
  window.sandlotPrefetch = {
    path: url,
    response: fetch(url, { headers: { "X-Sandlot-CSRF": csrf }, credentials: "same-origin" }),
  };
}
