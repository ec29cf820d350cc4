// Bundles the console into src/sandlot/console/static/ (committed; `make console` reruns this).
//
// console.js and console.css are what the list and every other view need; the server inlines
// both into the page, with boot.js (which sends the list's API call while the page is parsed):
// one request for the page, one for the list. xterm.js and uPlot are chunks of their own
// (chunks/vendor-*.js, with vendor-<hash>.css), loaded by the Terminal and Metrics tabs only.
// Chunks are imported by absolute URL (publicPath): the inlined entry has no URL of its own.
import { rmSync } from "node:fs";
import { build } from "esbuild";

const outdir = "../src/sandlot/console/static";
rmSync(outdir, { recursive: true, force: true });
await build({
  entryPoints: { console: "src/main.ts" },
  bundle: true,
  minify: true,
  format: "esm",
  splitting: true,
  chunkNames: "chunks/[name]-[hash]",
  publicPath: "/console/static/",
  target: ["es2020"],
  outdir,
  legalComments: "linked",
  logLevel: "info",
});
await build({
  // Inlined at the top of the page: starts the list's API call before the rest is parsed.
  entryPoints: { boot: "src/boot.ts" },
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  outdir,
  logLevel: "info",
});
await build({
  entryPoints: { console: "src/console.css" },
  bundle: true,
  minify: true,
  outdir,
  logLevel: "info",
});
await build({
  entryPoints: { vendor: "src/vendor.css" },
  entryNames: "[name]-[hash]",
  bundle: true,
  minify: true,
  outdir,
  logLevel: "info",
});
