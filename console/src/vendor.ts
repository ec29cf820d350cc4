// The third-party libraries of the sandbox page's Terminal and Metrics tabs, loaded when a tab
// first needs one: the entry script (inlined into the page) stays free of them, so the list and
// the other views never download or parse xterm.js or uPlot. Their stylesheet comes with them.

const meta = (name: string): string =>
  document.querySelector<HTMLMetaElement>(`meta[name="${name}"]`)?.content ?? "";

let styles: Promise<void> | null = null;

/** The vendor stylesheet (xterm.js, uPlot), added once; resolves when it has loaded. */
function vendorStyles(): Promise<void> {
  const href = meta("sandlot-vendor-css");
  if (!href) return Promise.resolve();
  styles ??= new Promise<void>((resolve) => {
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = href;
    link.onload = () => resolve();
    link.onerror = () => resolve(); // unstyled beats unusable
    document.head.append(link);
  });
  return styles;
}

export async function loadXterm(): Promise<typeof import("./vendor-xterm")> {
  const [mod] = await Promise.all([import("./vendor-xterm"), vendorStyles()]);
  return mod;
}

export async function loadUplot(): Promise<typeof import("./vendor-uplot")> {
  const [mod] = await Promise.all([import("./vendor-uplot"), vendorStyles()]);
  return mod;
}
