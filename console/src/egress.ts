import { api } from "./api";
import { clear, h, toast } from "./dom";

interface Rule { action: string; target: string }
interface PolicyStatus { mode: string; enforcementMode: string;
  policy: { defaultAction: string; egress: Rule[] } }

/** The sandbox's egress policy: default action and rules, with rules added and removed live. */
export class EgressPanel {
  readonly el: HTMLElement;
  private summary = h("p", {});
  private body = h("tbody");

  constructor(private sandboxId: string) {
    const action = h("select", { id: "rule-action", name: "action" },
      h("option", { value: "allow" }, "allow"), h("option", { value: "deny" }, "deny"));
    const target = h("input", { id: "rule-target", name: "target", required: true,
      placeholder: "pypi.org, *.example.com or 10.0.0.0/8" });
    const add = h("form", { class: "inline", "aria-label": "Add an egress rule" },
      h("label", { for: "rule-action" }, "Action"), action,
      h("label", { for: "rule-target" }, "Target"), target,
      h("button", { type: "submit" }, "Add rule"));
    add.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        await this.apply("PATCH", [{ action: action.value, target: target.value.trim() }]);
        target.value = "";
      } catch (err) {
        toast(`Could not add the rule: ${(err as Error).message}`, "error");
      }
    });
    this.el = h("div", {}, this.summary,
      h("table", { class: "list" }, h("caption", { class: "sr-only" }, "Egress rules"),
        h("thead", {}, h("tr", {}, ...["Action", "Target", ""].map((c) =>
          h("th", { scope: "col" }, c || h("span", { class: "sr-only" }, "Actions"))))),
        this.body),
      add);
  }

  private url(): string {
    return `/v1/sandboxes/${encodeURIComponent(this.sandboxId)}/networkpolicy`;
  }

  private async apply(method: string, body: unknown): Promise<void> {
    this.render(await api<PolicyStatus>(method, this.url(), body));
    toast("Egress policy updated.");
  }

  async load(): Promise<void> {
    try {
      this.render(await api<PolicyStatus>("GET", this.url()));
    } catch (err) {
      this.summary.textContent = `Egress policy unavailable: ${(err as Error).message}`;
    }
  }

  private render(s: PolicyStatus): void {
    this.summary.textContent = `Default action: ${s.policy.defaultAction}. Mode: ${s.mode}; ` +
      `enforcement: ${s.enforcementMode}.`;
    clear(this.body, s.policy.egress.map((r) => h("tr", {},
      h("td", {}, r.action), h("th", { scope: "row" }, r.target),
      h("td", {}, h("button", { type: "button", "aria-label": `Remove rule ${r.target}`,
        onclick: () => this.apply("DELETE", [r.target]).catch((err) =>
          toast(`Could not remove the rule: ${err.message}`, "error")) }, "Remove")))));
    if (!s.policy.egress.length) {
      this.body.append(h("tr", {}, h("td", { colspan: 3 }, "No rules: the default applies.")));
    }
  }
}
