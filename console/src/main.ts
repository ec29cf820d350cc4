import { signedIn, signOut } from "./api";
import { createView } from "./create";
import { clear, h } from "./dom";
import { listView } from "./list";
import { loginView } from "./login";
import { sandboxView } from "./sandbox";

const main = document.getElementById("main") as HTMLElement;
const nav = document.getElementById("nav") as HTMLElement;
let cleanup: () => void = () => {};

function renderNav(): void {
  if (!signedIn()) {
    clear(nav);
    return;
  }
  clear(nav,
    h("a", { href: "#/" }, "Sandboxes"),
    h("a", { href: "#/new" }, "New sandbox"),
    h("button", { type: "button", class: "link", onclick: async () => {
      await signOut().catch(() => {});
      location.hash = "#/login";
    } }, "Sign out"));
}

/** Hash routes: #/login, #/ (list, ?state=&metadata=), #/new, #/sandbox/<id>[/<tab>]. */
function route(): void {
  cleanup();
  delete main.dataset.ready;
  delete main.dataset.state;
  delete document.body.dataset.ready;
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query = ""] = hash.split("?");
  if (!signedIn() && path !== "/login") {
    location.replace("#/login");
    return;
  }
  renderNav();
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "login") {
    document.title = "Sign in · sandlot";
    cleanup = loginView(main);
  } else if (parts[0] === "new") {
    document.title = "New sandbox · sandlot";
    cleanup = createView(main);
  } else if (parts[0] === "sandbox" && parts[1]) {
    document.title = `${parts[1]} · sandlot`;
    cleanup = sandboxView(main, parts[1], parts[2] ?? "overview");
  } else {
    document.title = "Sandboxes · sandlot";
    cleanup = listView(main, new URLSearchParams(query));
  }
  if (parts[0] === "new" || parts[0] === undefined) main.focus({ preventScroll: true });
}

window.addEventListener("hashchange", route);
route();
