// Bundles the console into src/sandlot/console/static/ (committed; `make console` reruns this).
import { rmSync } from "node:fs";
import { build } from "esbuild";

const outdir = "../src/sandlot/console/static";
rmSync(outdir, { recursive: true, force: true });
await build({
  entryPoints: { console: "src/main.ts" },
  bundle: true,
  minify: true,
  format: "esm",
  splitting: true, // xterm.js and uPlot load with their tabs
  chunkNames: "chunks/[name]-[hash]",
  target: ["es2020"],
  outdir,
  legalComments: "linked",
  logLevel: "info",
});
await build({
  entryPoints: { console: "src/console.css" },
  bundle: true,
  minify: true,
  outdir,
  logLevel: "info",
});
