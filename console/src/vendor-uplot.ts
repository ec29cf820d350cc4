// Loaded on demand by vendor.ts (a chunk of its own).
import uPlot from "uplot";

export { uPlot };
