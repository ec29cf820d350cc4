import { api, execd, request } from "./api";
import { clear, h, toast, when } from "./dom";

interface Entry { path: string; type: string; size: number; modified_at: string; mode: number }

function parent(path: string): string {
  const trimmed = path.replace(/\/+$/, "");
  const cut = trimmed.lastIndexOf("/");
  return cut <= 0 ? "/" : trimmed.slice(0, cut);
}

function join(dir: string, name: string): string {
  return `${dir.replace(/\/+$/, "")}/${name}`;
}

/** A directory browser over execd's files API: list, open folders, download, upload. */
export class FilesPanel {
  readonly el: HTMLElement;
  private dir = "/tmp";
  private pathInput: HTMLInputElement;
  private body = h("tbody");
  private status = h("p", { class: "hint" });
  private fileInput: HTMLInputElement;

  constructor(private sandboxId: string) {
    this.pathInput = h("input", { id: "files-path", name: "path", value: this.dir });
    this.fileInput = h("input", { id: "files-upload", type: "file", multiple: true });
    const go = h("form", { class: "inline", "aria-label": "Folder" },
      h("label", { for: "files-path" }, "Folder"), this.pathInput,
      h("button", { type: "submit" }, "Open"),
      h("button", { type: "button", onclick: () => this.load(parent(this.dir)) }, "Up"));
    go.addEventListener("submit", (ev) => {
      ev.preventDefault();
      void this.load(this.pathInput.value.trim() || "/");
    });
    const upload = h("form", { class: "inline", "aria-label": "Upload" },
      h("label", { for: "files-upload" }, "Upload to this folder"), this.fileInput,
      h("button", { type: "submit" }, "Upload"));
    upload.addEventListener("submit", (ev) => {
      ev.preventDefault();
      void this.upload();
    });
    this.el = h("div", {}, go, upload, this.status,
      h("div", { class: "scroll" }, h("table", { class: "list" },
        h("caption", { class: "sr-only" }, "Folder contents"),
        h("thead", {}, h("tr", {},
          ...["Name", "Type", "Size", "Modified", "Mode", ""].map((c) =>
            h("th", { scope: "col" }, c || h("span", { class: "sr-only" }, "Actions"))))),
        this.body)));
  }

  async load(dir = this.dir): Promise<void> {
    this.status.textContent = `Loading ${dir}…`;
    try {
      const q = new URLSearchParams({ path: dir, depth: "1" });
      const entries = await api<Entry[]>("GET", execd(this.sandboxId, `/directories/list?${q}`));
      this.dir = dir;
      this.pathInput.value = dir;
      entries.sort((a, b) => Number(b.type === "directory") - Number(a.type === "directory")
        || a.path.localeCompare(b.path));
      clear(this.body, entries.map((e) => this.row(e)));
      if (!entries.length) this.body.append(h("tr", {}, h("td", { colspan: 6 }, "Empty folder.")));
      this.status.textContent = `${entries.length} entries in ${dir}.`;
    } catch (err) {
      this.status.textContent = `Could not list ${dir}: ${(err as Error).message}`;
    }
  }

  private row(e: Entry): HTMLElement {
    const name = e.path.slice(e.path.lastIndexOf("/") + 1);
    const label = e.type === "directory"
      ? h("button", { type: "button", class: "link", onclick: () => this.load(e.path) }, `${name}/`)
      : h("span", {}, name);
    const action = e.type === "file"
      ? h("button", { type: "button", "aria-label": `Download ${name}`,
          onclick: () => this.download(e.path, name) }, "Download")
      : null;
    return h("tr", {}, h("th", { scope: "row" }, label), h("td", {}, e.type),
      h("td", {}, e.type === "file" ? String(e.size) : ""), h("td", {}, when(e.modified_at)),
      h("td", {}, String(e.mode)), h("td", {}, action));
  }

  private async download(path: string, name: string): Promise<void> {
    try {
      const resp = await request("GET",
        execd(this.sandboxId, `/files/download?${new URLSearchParams({ path })}`));
      const url = URL.createObjectURL(await resp.blob());
      const a = h("a", { href: url, download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (err) {
      toast(`Download failed: ${(err as Error).message}`, "error");
    }
  }

  private async upload(): Promise<void> {
    const files = Array.from(this.fileInput.files ?? []);
    if (!files.length) {
      toast("Choose a file to upload first.", "error");
      return;
    }
    const form = new FormData();
    for (const file of files) {
      const meta = JSON.stringify({ path: join(this.dir, file.name), mode: 644 });
      form.append("metadata", new Blob([meta], { type: "application/json" }), "metadata");
      form.append("file", file, file.name);
    }
    try {
      await request("POST", execd(this.sandboxId, "/files/upload"), form);
      toast(`Uploaded ${files.map((f) => f.name).join(", ")} to ${this.dir}`);
      this.fileInput.value = "";
      await this.load();
    } catch (err) {
      toast(`Upload failed: ${(err as Error).message}`, "error");
    }
  }
}
