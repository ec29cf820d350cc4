import { api, Page, Sandbox } from "./api";
import { clear, h, parsePairs, toast } from "./dom";

interface Named { id: string; name?: string; sandboxId?: string }
interface Template { templateId: string; image?: string; status?: { phase?: string };
  metadata?: Record<string, string> }

function field(id: string, label: string, input: HTMLElement, hint?: string): HTMLElement {
  if (hint) input.setAttribute("aria-describedby", `${id}-hint`);
  return h("div", { class: "field" },
    h("label", { for: id }, label), input,
    hint ? h("p", { id: `${id}-hint`, class: "hint" }, hint) : null);
}

/** Create from an image, a template or a snapshot, with limits, metadata and egress policy. */
export function createView(main: HTMLElement): () => void {
  const source = h("select", { id: "source", name: "source" },
    h("option", { value: "image" }, "Image"),
    h("option", { value: "template" }, "Template"),
    h("option", { value: "snapshot" }, "Snapshot"));
  const image = h("input", { id: "image", name: "image", value: "python:3.12" });
  const template = h("select", { id: "template", name: "template" });
  const snapshot = h("select", { id: "snapshot", name: "snapshot" });
  const entrypoint = h("input", { id: "entrypoint", name: "entrypoint",
    value: "tail -f /dev/null" });
  const timeout = h("input", { id: "timeout", name: "timeout", type: "number", min: "60",
    value: "600" });
  const cpu = h("input", { id: "cpu", name: "cpu", value: "500m" });
  const memory = h("input", { id: "memory", name: "memory", value: "512Mi" });
  const env = h("textarea", { id: "env", name: "env", rows: 2 });
  const metadata = h("textarea", { id: "metadata", name: "metadata", rows: 2 });
  const defaultAction = h("select", { id: "egress-default", name: "egress-default" },
    h("option", { value: "" }, "No policy (allow all)"),
    h("option", { value: "deny" }, "Deny by default"),
    h("option", { value: "allow" }, "Allow by default"));
  const rules = h("textarea", { id: "egress-rules", name: "egress-rules", rows: 3,
    placeholder: "allow pypi.org\ndeny *.example.com" });
  const error = h("p", { class: "error", role: "alert" });
  const imageField = field("image", "Image", image, "An image reference, e.g. python:3.12.");
  const templateField = field("template", "Template", template);
  const snapshotField = field("snapshot", "Snapshot", snapshot, "Ready snapshots only.");
  const entryField = field("entrypoint", "Entrypoint", entrypoint,
    "A command line, split on spaces; empty keeps the image's (or template's).");

  function showSource(): void {
    imageField.hidden = source.value !== "image";
    templateField.hidden = source.value !== "template";
    snapshotField.hidden = source.value !== "snapshot";
  }
  source.addEventListener("change", showSource);
  showSource();

  const form = h("form", { class: "card", "aria-labelledby": "create-title" },
    h("h1", { id: "create-title" }, "New sandbox"),
    h("fieldset", {}, h("legend", {}, "Source"),
      field("source", "Create from", source), imageField, templateField, snapshotField,
      entryField),
    h("fieldset", { class: "grid" }, h("legend", {}, "Limits"),
      field("timeout", "Timeout (seconds)", timeout),
      field("cpu", "CPU limit", cpu, "Cores, e.g. 1 or 500m."),
      field("memory", "Memory limit", memory, "e.g. 512Mi or 2Gi.")),
    h("fieldset", {}, h("legend", {}, "Environment and metadata"),
      field("env", "Environment", env, "KEY=value, one a line."),
      field("metadata", "Metadata", metadata, "key=value, one a line.")),
    h("fieldset", {}, h("legend", {}, "Egress policy"),
      field("egress-default", "Default action", defaultAction),
      field("egress-rules", "Rules", rules,
        "One rule a line: allow or deny, then a domain (wildcards like *.example.com) or CIDR.")),
    error,
    h("div", { class: "actions" },
      h("button", { type: "submit", class: "primary" }, "Create sandbox"),
      h("a", { class: "button", href: "#/" }, "Cancel")));

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    error.textContent = "";
    try {
      const body: Record<string, unknown> = {
        timeout: Number(timeout.value),
        resourceLimits: Object.fromEntries(
          [["cpu", cpu.value.trim()], ["memory", memory.value.trim()]].filter(([, v]) => v)),
        env: parsePairs(env.value, "Environment"),
        metadata: parsePairs(metadata.value, "Metadata"),
      };
      if (source.value === "image") body.image = { uri: image.value.trim() };
      if (source.value === "template") body.templateId = template.value;
      if (source.value === "snapshot") body.snapshotId = snapshot.value;
      const words = entrypoint.value.trim().split(/\s+/).filter(Boolean);
      if (words.length) body.entrypoint = words;
      if (defaultAction.value) {
        const egress = rules.value.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => {
          const [action, target, ...rest] = l.split(/\s+/);
          if (!target || rest.length || !["allow", "deny"].includes(action)) {
            throw new Error(`Egress rule "${l}": write "allow <target>" or "deny <target>"`);
          }
          return { action, target };
        });
        body.networkPolicy = { defaultAction: defaultAction.value, egress };
      }
      const created = await api<Sandbox>("POST", "/v1/sandboxes", body);
      toast(`Created ${created.id}`);
      location.hash = `#/sandbox/${encodeURIComponent(created.id)}`;
    } catch (err) {
      error.textContent = `Could not create the sandbox: ${(err as Error).message}`;
    }
  });
  clear(main, form);

  // Templates and snapshots fill their pickers when the server offers them.
  api<Page<Template>>("GET", "/v1/templates?pageSize=200").then((page) => {
    // Only a built template can start a sandbox; the others are listed, disabled, with phase.
    clear(template, page.items.map((t) => {
      const phase = t.status?.phase ?? "?";
      const name = t.metadata?.name ?? t.templateId;
      return h("option", { value: t.templateId, disabled: phase !== "Succeeded" },
        `${name} (${t.image ?? "?"}, ${phase})`);
    }));
    if (!page.items.length) template.append(h("option", { value: "" }, "No templates"));
  }).catch((err) => clear(template, h("option", { value: "" }, `Unavailable: ${err.message}`)));
  api<Page<Named>>("GET", "/v1/snapshots?state=Ready&pageSize=200").then((page) => {
    clear(snapshot, page.items.map((s) =>
      h("option", { value: s.id }, `${s.name ?? s.id} (of ${s.sandboxId ?? "?"})`)));
    if (!page.items.length) snapshot.append(h("option", { value: "" }, "No snapshots"));
  }).catch((err) => clear(snapshot, h("option", { value: "" }, `Unavailable: ${err.message}`)));
  return () => {};
}
