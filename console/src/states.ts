export const STATES = ["Pending", "Running", "Pausing", "Paused", "Resuming", "Stopping",
  "Terminated", "Failed"];

import { h } from "./dom";

export function stateBadge(state: string): HTMLElement {
  return h("span", { class: `badge state-${state.toLowerCase()}` }, state);
}
