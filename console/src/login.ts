import { signIn } from "./api";
import { clear, h } from "./dom";

export function loginView(main: HTMLElement): () => void {
  const error = h("p", { id: "login-error", class: "error", role: "alert" });
  const key = h("input", {
    id: "api-key", type: "password", name: "api-key", autocomplete: "current-password",
    required: true, "aria-describedby": "login-help login-error",
  });
  const form = h(
    "form",
    { class: "card narrow", "aria-labelledby": "login-title" },
    h("h1", { id: "login-title" }, "Sign in"),
    h("label", { for: "api-key" }, "API key"),
    key,
    h("p", { id: "login-help", class: "hint" },
      "The server's API key (api_key in its config). It stays on the server: the browser ",
      "keeps only a session cookie."),
    error,
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    error.textContent = "";
    try {
      await signIn(key.value);
      location.hash = "#/";
    } catch (err) {
      error.textContent = `Sign-in failed: ${(err as Error).message}`;
      key.focus();
    }
  });
  clear(main, form);
  key.focus();
  return () => {};
}
