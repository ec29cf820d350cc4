// Loaded on demand by vendor.ts (a chunk of its own).
export { FitAddon } from "@xterm/addon-fit";
export { Terminal } from "@xterm/xterm";
