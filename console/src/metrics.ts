import type uPlot from "uplot";

import { api, execd } from "./api";
import { h } from "./dom";
import { loadUplot } from "./vendor";

interface Sample { cpu_count: number; cpu_used_pct: number; mem_total_mib: number;
  mem_used_mib: number; timestamp?: number }

const POINTS = 90;
const POLL_MS = 2000;

/** CPU and memory of the sandbox, sampled from execd's /metrics every 2 s while shown. */
export class MetricsPanel {
  readonly el: HTMLElement;
  private summary = h("p", { role: "status" }, "Waiting for the first sample…");
  private cpuBox = h("div", { class: "chart", role: "img", "aria-label": "CPU use over time" });
  private memBox = h("div", { class: "chart", role: "img", "aria-label": "Memory use over time" });
  private times: number[] = [];
  private cpu: number[] = [];
  private mem: number[] = [];
  private charts: uPlot[] = [];
  private timer: number | undefined;
  private active = false;

  constructor(private sandboxId: string) {
    this.el = h("div", {}, this.summary,
      h("div", { class: "charts" },
        h("figure", {}, h("figcaption", {}, "CPU (% of the sandbox's cores)"), this.cpuBox),
        h("figure", {}, h("figcaption", {}, "Memory (MiB)"), this.memBox)));
  }

  private chart(UPlot: typeof uPlot, box: HTMLElement, label: string, color: string,
    max?: number): uPlot {
    const width = Math.max(280, Math.min(560, box.clientWidth || 480));
    return new UPlot({
      width, height: 180,
      scales: {
        // A fixed window ending at the newest sample, so the first points are not stretched.
        x: { time: true, range: (_u, _min, dataMax) => [dataMax - (POINTS * POLL_MS) / 1000, dataMax] },
        y: { range: (_u, _min, dataMax) => [0, max ?? Math.max(1, dataMax * 1.2)] },
      },
      series: [{}, { label, stroke: color, width: 2, fill: `${color}22` }],
      axes: [{ stroke: "#c9d1d9" }, { stroke: "#c9d1d9" }],
      legend: { show: false },
    }, [this.times, label.startsWith("CPU") ? this.cpu : this.mem], box);
  }

  start(): void {
    if (this.active) return;
    this.active = true;
    void this.poll();
  }

  stop(): void {
    this.active = false;
    window.clearTimeout(this.timer);
  }

  private async poll(): Promise<void> {
    if (!this.active) return;
    try {
      const s = await api<Sample>("GET", execd(this.sandboxId, "/metrics"));
      this.times.push(Date.now() / 1000);
      this.cpu.push(s.cpu_used_pct);
      this.mem.push(s.mem_used_mib);
      for (const series of [this.times, this.cpu, this.mem]) {
        if (series.length > POINTS) series.shift();
      }
      if (!this.charts.length) {
        const { uPlot: UPlot } = await loadUplot();
        if (!this.active || this.charts.length) return;
        this.charts = [this.chart(UPlot, this.cpuBox, "CPU %", "#58a6ff", 100),
          this.chart(UPlot, this.memBox, "Memory MiB", "#3fb950", s.mem_total_mib)];
      } else {
        this.charts[0].setData([this.times, this.cpu]);
        this.charts[1].setData([this.times, this.mem]);
      }
      this.summary.textContent = `CPU ${s.cpu_used_pct.toFixed(1)} % of ${s.cpu_count} ` +
        `core(s); memory ${s.mem_used_mib.toFixed(1)} of ${s.mem_total_mib.toFixed(0)} MiB.`;
    } catch (err) {
      this.summary.textContent = `Metrics unavailable: ${(err as Error).message}`;
    }
    if (this.active) this.timer = window.setTimeout(() => void this.poll(), POLL_MS);
  }

  close(): void {
    this.stop();
    for (const c of this.charts) c.destroy();
  }
}
