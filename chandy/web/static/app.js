/* chandy dashboard.
 *
 * A single page over chandy's REST API, which answers in Flink's JSON shapes (the same routes
 * Flink's own web UI and CLI use). Plain JavaScript, no build step and no external resources:
 * the page must work on a machine without internet access.
 *
 * The page polls: the jobs overview always, the open job's details, and what its open tab shows.
 * Every API URL is relative to the page, so the dashboard also works behind a path prefix.
 * When the API answers 401 the page asks once for the bearer token and keeps it in
 * sessionStorage (this tab only), sending it as `Authorization: Bearer <token>`.
 */
"use strict";

(() => {
  const TOKEN_KEY = "chandy.rest.token";
  const params = new URLSearchParams(window.location.search);
  const REFRESH_MS = Math.max(200, Number(params.get("refresh")) || 1000);
  const TERMINAL = new Set(["FINISHED", "CANCELED", "FAILED", "SUSPENDED"]);
  // Metrics the graph shows, as Flink names them (task scope, per subtask "<index>.<name>").
  const RATE_METRICS = ["numRecordsInPerSecond", "numRecordsOutPerSecond"];
  const MAX_METRICS = ["backPressuredTimeMsPerSecond", "busyTimeMsPerSecond", "idleTimeMsPerSecond"];
  const WATERMARK_METRICS = ["currentInputWatermark", "currentOutputWatermark"];
  const WANTED_METRICS = [...RATE_METRICS, ...MAX_METRICS, ...WATERMARK_METRICS];
  // Flink's Long.MIN_VALUE / Long.MAX_VALUE watermarks ("no watermark yet" / "end of input").
  const NO_WATERMARK = -9.2e18;
  const END_WATERMARK = 9.2e18;

  const state = {
    jobs: [],
    jobId: null,
    tab: "overview",
    job: null,
    checkpoints: null,
    checkpointConfig: null,
    exceptions: null,
    // vertex id -> {in, out, backpressure ratio, level, busy, watermark}
    vertexMetrics: new Map(),
    // vertex id -> [metric ids] offered by the server (refreshed now and then)
    metricIds: new Map(),
    metricIdsAge: new Map(),
    // checkpoint id -> history entry, kept beyond the server's bounded history for the chart
    chartHistory: new Map(),
    chartJobId: null,
    detailId: null,
    detailStatus: null,
    // the graph's vertex whose subtasks are shown, or null
    vertexId: null,
    rendered: new Map(),
    polling: false,
    pollAgain: false,
    action: null,
  };

  // ---------------------------------------------------------------- helpers

  const $ = (id) => document.getElementById(id);
  const byTestId = (root, id) => root.querySelector(`[data-testid="${id}"]`);
  const SVG_NS = "http://www.w3.org/2000/svg";

  /** An element with attributes and children (strings become text nodes: never innerHTML). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    appendAll(el, children);
    return el;
  }

  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    setAttrs(el, attrs);
    appendAll(el, children);
    return el;
  }

  function setAttrs(el, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "onclick") el.addEventListener("click", value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }

  function appendAll(el, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  /** Re-render only when the data changed, so rows keep their hover and focus between polls. */
  function changed(key, data) {
    const text = JSON.stringify(data);
    if (state.rendered.get(key) === text) return false;
    state.rendered.set(key, text);
    return true;
  }

  function pad(n, width = 2) {
    return String(n).padStart(width, "0");
  }

  function fmtTime(ms, withMillis = false) {
    if (ms === null || ms === undefined || ms < 0) return "–";
    const d = new Date(ms);
    const date = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
    const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    return withMillis ? `${date} ${time}.${pad(d.getMilliseconds(), 3)}` : `${date} ${time}`;
  }

  function fmtClock(ms) {
    const d = new Date(ms);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  function fmtDuration(ms) {
    if (ms === null || ms === undefined || ms < 0 || Number.isNaN(ms)) return "–";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
    const total = Math.floor(ms / 1000);
    const d = Math.floor(total / 86400);
    const hh = Math.floor((total % 86400) / 3600);
    const mm = Math.floor((total % 3600) / 60);
    const ss = total % 60;
    if (d > 0) return `${d}d ${hh}h ${mm}m`;
    if (hh > 0) return `${hh}h ${mm}m ${ss}s`;
    return `${mm}m ${ss}s`;
  }

  function fmtBytes(n) {
    if (n === null || n === undefined || n < 0 || Number.isNaN(n)) return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let value = n;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${units[unit]}`;
  }

  function fmtCount(n) {
    if (n === null || n === undefined || Number.isNaN(n)) return "–";
    if (Math.abs(n) >= 1e9) return `${(n / 1e9).toFixed(2)} G`;
    if (Math.abs(n) >= 1e6) return `${(n / 1e6).toFixed(2)} M`;
    if (Math.abs(n) >= 1e4) return `${(n / 1e3).toFixed(1)} k`;
    return Number.isInteger(n) ? String(n) : n.toFixed(1);
  }

  function fmtRate(n) {
    if (n === null || n === undefined || Number.isNaN(n)) return "–";
    if (Math.abs(n) >= 1e4) return fmtCount(n);
    return Math.abs(n) >= 100 ? Math.round(n).toLocaleString("en-US") : n.toFixed(1).replace(/\.0$/, "");
  }

  function fmtWatermark(w) {
    if (w === null || w === undefined || Number.isNaN(w)) return "–";
    if (w <= NO_WATERMARK) return "no watermark";
    if (w >= END_WATERMARK) return "MAX (end of input)";
    // Event time in epoch milliseconds reads as a time (the date only when it is not today);
    // a small number is shown as it is.
    if (w <= 1e11) return String(w);
    return new Date(w).toDateString() === new Date().toDateString() ? fmtClock(w) : fmtTime(w, true);
  }

  function backpressureLevel(ratio) {
    // Flink's thresholds: up to 10 % OK, up to 50 % LOW, above HIGH.
    if (ratio === null || ratio === undefined || Number.isNaN(ratio)) return null;
    if (ratio <= 0.1) return "ok";
    if (ratio <= 0.5) return "low";
    return "high";
  }

  function badge(text, extraClass) {
    return h("span", { class: `badge ${text} ${extraClass || ""}`.trim() }, text);
  }

  // ---------------------------------------------------------------- API with bearer token

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  let tokenPrompt = null;
  // Where the token lives when sessionStorage is disabled (until the page is reloaded).
  let memoryToken = null;

  function storedToken() {
    try {
      return window.sessionStorage.getItem(TOKEN_KEY);
    } catch (_) {
      return null;
    }
  }

  /** Asks for the token once, however many requests hit the 401 at the same time. */
  function askToken(rejected) {
    if (tokenPrompt) return tokenPrompt;
    tokenPrompt = new Promise((resolve) => {
      const overlay = $("token-overlay");
      const form = $("token-form");
      const input = $("token-input");
      const error = $("token-error");
      error.hidden = !rejected;
      error.textContent = rejected ? "The server rejected that token (401). Try again." : "";
      input.value = "";
      overlay.hidden = false;
      input.focus();
      const submit = (event) => {
        event.preventDefault();
        const token = input.value.trim();
        if (!token) return;
        form.removeEventListener("submit", submit);
        try {
          window.sessionStorage.setItem(TOKEN_KEY, token);
        } catch (_) {
          memoryToken = token;
        }
        overlay.hidden = true;
        tokenPrompt = null;
        resolve(token);
      };
      form.addEventListener("submit", submit);
    });
    return tokenPrompt;
  }

  async function api(path, options = {}) {
    const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
    const token = storedToken() || memoryToken;
    if (token) headers.Authorization = `Bearer ${token}`;
    let body = options.body;
    if (body !== undefined && typeof body !== "string") {
      body = JSON.stringify(body);
      headers["Content-Type"] = "application/json";
    }
    const response = await fetch(new URL(path, document.baseURI), {
      method: options.method || "GET",
      headers,
      body,
      cache: "no-store",
    });
    if (response.status === 401) {
      // A request sent before a new token was entered retries with it, asking nothing.
      const current = storedToken() || memoryToken;
      if (!current || current === token) await askToken(Boolean(token));
      return api(path, options);
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (_) {
        data = { errors: [text] };
      }
    }
    if (!response.ok) {
      const message =
        data && Array.isArray(data.errors) && data.errors.length
          ? data.errors.join("; ")
          : `${response.status} ${response.statusText}`;
      throw new ApiError(response.status, message);
    }
    return data;
  }

  function setConnection(ok, message) {
    const el = $("conn-status");
    el.classList.toggle("ok", ok);
    el.classList.toggle("error", !ok);
    el.querySelector(".text").textContent = message;
  }

  // ---------------------------------------------------------------- routing

  function parseRoute() {
    const match = window.location.hash.match(/^#\/jobs\/([0-9a-zA-Z_-]+)(?:\/(\w+))?/);
    if (!match) return { jobId: null, tab: "overview" };
    return { jobId: match[1], tab: match[2] || "overview" };
  }

  function onRoute() {
    const route = parseRoute();
    if (route.jobId !== state.jobId) {
      state.job = null;
      state.checkpoints = null;
      state.checkpointConfig = null;
      state.exceptions = null;
      state.vertexMetrics.clear();
      state.metricIds.clear();
      state.metricIdsAge.clear();
      state.detailId = null;
      state.vertexId = null;
      state.rendered.clear();
      showActionResult(null);
      $("ckpt-detail").hidden = true;
    }
    state.jobId = route.jobId;
    state.tab = ["overview", "checkpoints", "exceptions"].includes(route.tab) ? route.tab : "overview";
    $("jobs-view").hidden = Boolean(state.jobId);
    $("job-view").hidden = !state.jobId;
    for (const button of document.querySelectorAll(".tabs button")) {
      button.classList.toggle("active", button.dataset.tab === state.tab);
    }
    for (const tab of ["overview", "checkpoints", "exceptions"]) {
      $(`tab-${tab}`).hidden = tab !== state.tab;
    }
    poll();
  }

  // ---------------------------------------------------------------- polling

  async function poll() {
    if (state.polling) {
      // A view changed during a poll: poll again right after it, not a period later.
      state.pollAgain = true;
      return;
    }
    state.polling = true;
    try {
      const overview = await api("jobs/overview");
      state.jobs = (overview && overview.jobs) || [];
      renderJobs();
      if (state.jobId) {
        try {
          await pollJob(state.jobId);
        } catch (error) {
          if (!(error instanceof ApiError) || error.status !== 404) throw error;
          renderMissingJob(state.jobId);
        }
      }
      setConnection(true, `updated ${fmtClock(Date.now())}`);
    } catch (error) {
      setConnection(false, `API unreachable: ${error.message}`);
    } finally {
      state.polling = false;
      if (state.pollAgain) {
        state.pollAgain = false;
        poll();
      }
    }
  }

  /** A job id this driver does not know (a link from another driver, or an old bookmark). */
  function renderMissingJob(jobId) {
    $("job-name").textContent = "Job not found on this driver";
    $("job-status").textContent = "UNKNOWN";
    $("job-status").className = "badge";
    $("job-id").textContent = jobId;
    for (const id of ["btn-savepoint", "btn-stop", "btn-cancel"]) $(id).disabled = true;
  }

  async function pollJob(jobId) {
    const job = await api(`jobs/${jobId}`);
    if (jobId !== state.jobId) return;
    state.job = job;
    const ended = TERMINAL.has(job.state);
    const work = [];
    if (state.tab === "overview" && (!ended || state.vertexMetrics.size === 0)) {
      work.push(pollVertexMetrics(jobId, job));
    }
    if (state.tab === "checkpoints") {
      work.push(
        api(`jobs/${jobId}/checkpoints`)
          .then((data) => {
            state.checkpoints = data;
          })
          .catch((error) => {
            state.checkpoints = { error: error.message };
          }),
      );
    }
    if (!state.checkpointConfig) {
      work.push(
        api(`jobs/${jobId}/checkpoints/config`)
          .then((data) => {
            state.checkpointConfig = data;
          })
          .catch((error) => {
            state.checkpointConfig = { error: error.message };
          }),
      );
    }
    // Exceptions feed the tab's counter, so they are read whatever the tab.
    work.push(
      api(`jobs/${jobId}/exceptions`)
        .then((data) => {
          state.exceptions = data;
        })
        .catch(() => {}),
    );
    await Promise.all(work);
    if (jobId !== state.jobId) return;
    renderJob();
    if (state.tab === "overview") renderGraph();
    if (state.tab === "checkpoints") renderCheckpoints();
    renderCheckpointConfig();
    renderExceptions();
    if (state.detailId !== null && state.detailStatus === "IN_PROGRESS") refreshDetail();
  }

  /** Per-vertex rates, backpressure and watermark, aggregated over the vertex's subtasks. */
  async function pollVertexMetrics(jobId, job) {
    const now = Date.now();
    await Promise.all(
      (job.vertices || []).map(async (vertex) => {
        const base = `jobs/${jobId}/vertices/${vertex.id}`;
        const node = ((job.plan && job.plan.nodes) || []).find((n) => n.id === vertex.id);
        const isSource = node ? (node.inputs || []).length === 0 : job.vertices.indexOf(vertex) === 0;
        let ids = state.metricIds.get(vertex.id);
        if (!ids || ids.length === 0 || now - (state.metricIdsAge.get(vertex.id) || 0) > 10_000) {
          try {
            const listed = await api(`${base}/metrics`);
            ids = (listed || []).map((m) => m.id).filter((id) => wantedMetric(id) !== null);
          } catch (_) {
            ids = [];
          }
          state.metricIds.set(vertex.id, ids);
          state.metricIdsAge.set(vertex.id, now);
        }
        const values = {};
        // subtask index -> {metric name -> value}
        const subtasks = {};
        if (ids.length) {
          try {
            const got = await api(`${base}/metrics?get=${ids.map(encodeURIComponent).join(",")}`);
            for (const metric of got || []) {
              const name = wantedMetric(metric.id);
              if (name === null) continue;
              const value = Number(metric.value);
              (values[name] = values[name] || []).push(value);
              const index = subtaskOf(metric.id);
              if (index !== null) (subtasks[index] = subtasks[index] || {})[name] = value;
            }
          } catch (_) {
            /* keep the vertex without metrics this round */
          }
        }
        const sum = (name) => (values[name] ? values[name].reduce((a, b) => a + b, 0) : null);
        const max = (name) => (values[name] ? Math.max(...values[name]) : null);
        const min = (name) => (values[name] ? Math.min(...values[name]) : null);
        const metrics = {
          in: sum("numRecordsInPerSecond"),
          out: sum("numRecordsOutPerSecond"),
          backpressured: max("backPressuredTimeMsPerSecond"),
          busy: max("busyTimeMsPerSecond"),
          // A source has no input: its watermark is the one it emits (as Flink's UI shows it).
          watermark: isSource ? min("currentOutputWatermark") : min("currentInputWatermark"),
          level: null,
          ratio: null,
          subtasks,
          bpSubtasks: [],
        };
        try {
          const bp = await api(`${base}/backpressure`);
          const level = bp && (bp["backpressure-level"] || bp.backpressureLevel);
          if (level && bp.status !== "deprecated") {
            metrics.level = String(level).toLowerCase();
            const ratios = (bp.subtasks || []).map((st) => Number(st.ratio)).filter((r) => !Number.isNaN(r));
            metrics.ratio = ratios.length ? Math.max(...ratios) : null;
            metrics.bpSubtasks = bp.subtasks || [];
          }
        } catch (_) {
          /* fall back on backPressuredTimeMsPerSecond below */
        }
        if (metrics.ratio === null && metrics.backpressured !== null) metrics.ratio = metrics.backpressured / 1000;
        if (metrics.level === null) metrics.level = backpressureLevel(metrics.ratio);
        state.vertexMetrics.set(vertex.id, metrics);
      }),
    );
  }

  /** The subtask index of a metric id ("3.numRecordsIn" -> 3), or null for a vertex-wide one. */
  function subtaskOf(id) {
    const match = String(id).match(/^(\d+)\./);
    return match ? Number(match[1]) : null;
  }

  /** The Flink metric name an id stands for ("0.numRecordsInPerSecond" or the bare name), or null. */
  function wantedMetric(id) {
    const match = String(id).match(/^(?:\d+\.)?([A-Za-z]+)$/);
    return match && WANTED_METRICS.includes(match[1]) ? match[1] : null;
  }

  // ---------------------------------------------------------------- jobs list

  function renderJobs() {
    const jobs = [...state.jobs].sort((a, b) => (b["start-time"] || 0) - (a["start-time"] || 0));
    if (!changed("jobs", jobs)) return;
    const body = $("jobs-table").querySelector("tbody");
    body.replaceChildren(
      ...jobs.map((job) => {
        const tasks = job.tasks || {};
        const total = tasks.total !== undefined ? tasks.total : "";
        const running = tasks.running !== undefined ? tasks.running : "";
        return h(
          "tr",
          {
            class: "clickable",
            "data-testid": "job-row",
            "data-job-id": job.jid,
            "data-state": job.state,
            onclick: () => {
              window.location.hash = `#/jobs/${job.jid}`;
            },
          },
          h("td", {}, h("a", { href: `#/jobs/${job.jid}`, "data-testid": "job-link" }, job.name || job.jid)),
          h("td", { class: "mono" }, job.jid),
          h("td", {}, h("span", { class: `badge ${job.state}`, "data-testid": "job-row-status" }, job.state)),
          h("td", {}, fmtTime(job["start-time"])),
          h("td", { class: "num" }, fmtDuration(job.duration)),
          h("td", { class: "num" }, total === "" ? "–" : `${running} running / ${total}`),
        );
      }),
    );
    $("jobs-empty").hidden = jobs.length > 0;
  }

  // ---------------------------------------------------------------- job header and actions

  function renderJob() {
    const job = state.job;
    if (!job) return;
    $("job-name").textContent = job.name || job.jid;
    const status = $("job-status");
    status.textContent = job.state;
    status.className = `badge ${job.state}`;
    $("job-id").textContent = job.jid;
    $("job-start").textContent = fmtTime(job["start-time"]);
    const ended = TERMINAL.has(job.state);
    $("job-uptime-label").textContent = ended ? "Duration" : "Uptime";
    $("job-uptime").textContent = fmtDuration(job.duration);
    $("job-restarts").textContent = job.restarts !== undefined ? job.restarts : "–";
    const busy = state.action !== null;
    const running = job.state === "RUNNING";
    $("btn-savepoint").disabled = !running || busy;
    $("btn-stop").disabled = !running || busy;
    $("btn-cancel").disabled = ended || busy;
  }

  function showActionResult(kind, ...content) {
    const el = $("action-result");
    if (kind === null) {
      el.hidden = true;
      el.replaceChildren();
      return;
    }
    el.hidden = false;
    el.className = `action-result ${kind}`;
    el.dataset.state = kind;
    el.replaceChildren(...content);
  }

  /** One line for a failed operation's ``failure-cause`` (Flink's SerializedThrowable JSON). */
  function failureText(operation) {
    const cause = operation && operation["failure-cause"];
    if (!cause) return "unknown failure";
    const shortClass = cause.class ? String(cause.class).split(".").pop() : "";
    if (cause.message) return `${shortClass ? `${shortClass}: ` : ""}${cause.message}`;
    return exceptionMessage(cause["stack-trace"]) || cause.class || "unknown failure";
  }

  /** POSTs a savepoint or stop request, then follows Flink's async operation until it ends. */
  async function runSavepointOperation(kind) {
    const jobId = state.jobId;
    const directory = $("savepoint-dir").value.trim() || null;
    const drain = $("stop-drain").checked;
    const stop = kind === "stop";
    state.action = kind;
    renderJob();
    const what = stop ? `Stop with savepoint${drain ? " (drain)" : ""}` : "Savepoint";
    const started = Date.now();
    try {
      const body = stop
        ? { targetDirectory: directory, drain }
        : { "target-directory": directory, "cancel-job": false };
      const trigger = await api(`jobs/${jobId}/${stop ? "stop" : "savepoints"}`, { method: "POST", body });
      const triggerId = trigger["request-id"];
      for (;;) {
        showActionResult(
          "pending",
          `${what} in progress… ${fmtDuration(Date.now() - started)} (trigger ${triggerId})`,
        );
        const status = await api(`jobs/${jobId}/savepoints/${triggerId}`);
        if (status && status.status && status.status.id === "COMPLETED") {
          const operation = status.operation || {};
          if (operation.location) {
            showActionResult(
              "success",
              stop ? "Job stopped. Savepoint: " : "Savepoint completed: ",
              h("code", { "data-testid": "savepoint-path" }, operation.location),
            );
          } else {
            const reason = failureText(operation);
            // Flink's stop: a failed savepoint leaves the job running (the badge shows it).
            const note = stop && !/keeps running/.test(reason) ? " — the job keeps running." : "";
            showActionResult("error", `${what} failed: `, h("span", { "data-testid": "action-error" }, reason), note);
          }
          break;
        }
        await new Promise((resolve) => setTimeout(resolve, 300));
      }
    } catch (error) {
      showActionResult("error", `${what} failed: `, h("span", { "data-testid": "action-error" }, error.message));
    } finally {
      state.action = null;
      poll();
    }
  }

  let cancelArmedUntil = 0;

  async function cancelJob() {
    const button = $("btn-cancel");
    // Two clicks (no window.confirm, which blocks the page and automation alike).
    if (Date.now() > cancelArmedUntil) {
      cancelArmedUntil = Date.now() + 4000;
      button.textContent = "Confirm cancel";
      button.classList.add("confirm");
      setTimeout(() => {
        button.textContent = "Cancel job";
        button.classList.remove("confirm");
      }, 4000);
      return;
    }
    cancelArmedUntil = 0;
    button.textContent = "Cancel job";
    button.classList.remove("confirm");
    state.action = "cancel";
    renderJob();
    try {
      await api(`jobs/${state.jobId}?mode=cancel`, { method: "PATCH", body: {} });
      showActionResult("success", "Cancellation requested.");
    } catch (error) {
      showActionResult("error", "Cancel failed: ", h("span", { "data-testid": "action-error" }, error.message));
    } finally {
      state.action = null;
      poll();
    }
  }

  // ---------------------------------------------------------------- job graph

  function graphModel(job) {
    const vertices = job.vertices || [];
    const nodes = (job.plan && job.plan.nodes) || [];
    const inputs = new Map();
    for (const node of nodes) {
      inputs.set(
        node.id,
        (node.inputs || []).map((input) => ({ id: input.id, strategy: input.ship_strategy || "" })),
      );
    }
    // Plans without edges (or none at all): a chain in the vertices' order.
    if (nodes.length === 0) {
      vertices.forEach((v, i) => inputs.set(v.id, i > 0 ? [{ id: vertices[i - 1].id, strategy: "" }] : []));
    }
    const depth = new Map();
    const depthOf = (id, seen = new Set()) => {
      if (depth.has(id)) return depth.get(id);
      if (seen.has(id)) return 0;
      seen.add(id);
      const ins = (inputs.get(id) || []).filter((input) => vertices.some((v) => v.id === input.id));
      const d = ins.length ? 1 + Math.max(...ins.map((input) => depthOf(input.id, seen))) : 0;
      depth.set(id, d);
      return d;
    };
    vertices.forEach((v) => depthOf(v.id));
    return { vertices, inputs, depth };
  }

  function renderGraph() {
    const job = state.job;
    if (!job) return;
    const metrics = Object.fromEntries(state.vertexMetrics);
    if (!changed("graph", { v: job.vertices, p: job.plan, m: metrics, selected: state.vertexId })) return;
    const { vertices, inputs, depth } = graphModel(job);
    const W = 250;
    const H = 112;
    const GX = 90;
    const GY = 28;
    const PAD = 16;
    const columns = new Map();
    for (const v of vertices) {
      const d = depth.get(v.id) || 0;
      if (!columns.has(d)) columns.set(d, []);
      columns.get(d).push(v);
    }
    const rows = Math.max(1, ...[...columns.values()].map((c) => c.length));
    const height = PAD * 2 + rows * H + (rows - 1) * GY;
    const width = PAD * 2 + columns.size * W + Math.max(0, columns.size - 1) * GX;
    const position = new Map();
    for (const [d, column] of columns) {
      const offset = (height - (column.length * H + (column.length - 1) * GY)) / 2;
      column.forEach((v, i) => position.set(v.id, { x: PAD + d * (W + GX), y: offset + i * (H + GY) }));
    }
    const svg = s("svg", {
      class: "graph",
      "data-testid": "job-graph",
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": "job graph",
    });
    svg.appendChild(
      s(
        "defs",
        {},
        s(
          "marker",
          { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
          s("path", { d: "M0,0 L10,5 L0,10 z" }),
        ),
      ),
    );
    for (const v of vertices) {
      const to = position.get(v.id);
      for (const input of inputs.get(v.id) || []) {
        const from = position.get(input.id);
        if (!from) continue;
        const x1 = from.x + W;
        const y1 = from.y + H / 2;
        const x2 = to.x - 2;
        const y2 = to.y + H / 2;
        const mx = (x1 + x2) / 2;
        svg.appendChild(
          s("path", {
            class: "edge",
            "data-testid": "graph-edge",
            "data-from": input.id,
            "data-to": v.id,
            d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`,
            "marker-end": "url(#arrow)",
          }),
        );
        if (input.strategy) {
          svg.appendChild(
            s(
              "text",
              { class: "edge-label", x: mx, y: (y1 + y2) / 2 - 5, "text-anchor": "middle" },
              input.strategy,
            ),
          );
        }
      }
    }
    for (const v of vertices) {
      const { x, y } = position.get(v.id);
      const m = state.vertexMetrics.get(v.id) || {};
      const level = m.level || "unknown";
      const name = v.name || v.id;
      const shortName = name.length > 30 ? `${name.slice(0, 29)}…` : name;
      const bpText =
        m.level
          ? `${m.level.toUpperCase()}${m.ratio !== null && m.ratio !== undefined ? ` ${Math.round(m.ratio * 100)}%` : ""}`
          : "–";
      svg.appendChild(
        s(
          "g",
          {
            class: `node ${v.status || ""} bp-${level} ${v.id === state.vertexId ? "selected" : ""}`,
            "data-testid": "vertex",
            "data-vertex-id": v.id,
            "data-vertex-name": name,
            "data-backpressure": level,
            transform: `translate(${x},${y})`,
            onclick: () => selectVertex(v.id),
          },
          s("title", {}, `${name}\n${v.id}`),
          s("rect", { class: "box", width: W, height: H, rx: 6 }),
          s("rect", { class: "bp", width: 5, height: H - 2, x: 1, y: 1, rx: 2 }),
          s("text", { class: "title", x: 14, y: 21 }, shortName),
          s("text", { class: "sub", x: 14, y: 39 }, `parallelism ${v.parallelism} · ${v.status || ""}`),
          s(
            "text",
            { x: 14, y: 60, "data-testid": "vertex-rates" },
            `in ${fmtRate(m.in)}/s  ·  out ${fmtRate(m.out)}/s`,
          ),
          s(
            "text",
            { x: 14, y: 79 },
            "backpressure ",
            s("tspan", { class: `bp-label bp-${level}`, "data-testid": "vertex-backpressure" }, bpText),
            m.busy !== null && m.busy !== undefined ? `  ·  busy ${Math.round(m.busy / 10)}%` : "",
          ),
          s(
            "text",
            { class: "sub", x: 14, y: 98, "data-testid": "vertex-watermark" },
            `watermark ${fmtWatermark(m.watermark)}`,
          ),
        ),
      );
    }
    $("graph-wrap").replaceChildren(svg);
    renderVertexTable(vertices);
    renderVertexDetail();
  }

  function selectVertex(id) {
    state.vertexId = state.vertexId === id ? null : id;
    renderGraph();
  }

  /** One vertex's subtasks side by side: where a skewed key or a slow subtask shows. */
  function renderVertexDetail() {
    const panel = $("vertex-detail");
    const vertex = ((state.job && state.job.vertices) || []).find((v) => v.id === state.vertexId);
    panel.hidden = !vertex;
    if (!vertex) return;
    const m = state.vertexMetrics.get(vertex.id) || { subtasks: {}, bpSubtasks: [] };
    const bp = new Map((m.bpSubtasks || []).map((st) => [st.subtask, st]));
    const percent = (msPerSecond) =>
      msPerSecond === undefined || msPerSecond === null ? "–" : `${Math.round(msPerSecond / 10)}%`;
    $("vertex-detail-title").textContent = `${vertex.name} · ${vertex.parallelism} subtasks`;
    const rows = [];
    for (let index = 0; index < vertex.parallelism; index += 1) {
      const st = (m.subtasks || {})[index] || {};
      const pressure = bp.get(index);
      const ratio = st.backPressuredTimeMsPerSecond === undefined ? null : st.backPressuredTimeMsPerSecond / 1000;
      const level = pressure ? String(pressure["backpressure-level"]).toLowerCase() : backpressureLevel(ratio);
      rows.push(
        h(
          "tr",
          { "data-testid": "vertex-subtask-row", "data-subtask": index },
          h("td", { class: "mono" }, index),
          h("td", { class: "num" }, fmtRate(st.numRecordsInPerSecond)),
          h("td", { class: "num" }, fmtRate(st.numRecordsOutPerSecond)),
          h("td", {}, level ? badge(level) : "–", ` ${percent(st.backPressuredTimeMsPerSecond)}`),
          h("td", { class: "num" }, percent(st.busyTimeMsPerSecond)),
          h("td", { class: "num" }, percent(st.idleTimeMsPerSecond)),
          h("td", {}, fmtWatermark(st.currentInputWatermark)),
          h("td", {}, fmtWatermark(st.currentOutputWatermark)),
        ),
      );
    }
    $("vertex-detail-table").querySelector("tbody").replaceChildren(...rows);
  }

  function renderVertexTable(vertices) {
    $("vertices-table")
      .querySelector("tbody")
      .replaceChildren(
        ...vertices.map((v) => {
          const m = state.vertexMetrics.get(v.id) || {};
          const vm = v.metrics || {};
          return h(
            "tr",
            {
              class: `clickable ${v.id === state.vertexId ? "selected" : ""}`,
              "data-testid": "vertex-row",
              "data-vertex-id": v.id,
              onclick: () => selectVertex(v.id),
            },
            h("td", { class: "wrap-text" }, v.name),
            h("td", {}, badge(v.status || "–")),
            h("td", { class: "num" }, v.parallelism),
            h("td", { class: "num" }, fmtRate(m.in)),
            h("td", { class: "num" }, fmtRate(m.out)),
            h("td", { class: "num" }, fmtCount(vm["read-records"])),
            h("td", { class: "num" }, fmtCount(vm["write-records"])),
            h(
              "td",
              {},
              m.level
                ? badge(m.level, "")
                : "–",
              m.ratio !== null && m.ratio !== undefined ? ` ${Math.round(m.ratio * 100)}%` : "",
            ),
            h("td", { class: "num" }, m.busy !== null && m.busy !== undefined ? `${Math.round(m.busy / 10)}%` : "–"),
            h("td", {}, fmtWatermark(m.watermark)),
          );
        }),
      );
  }

  // ---------------------------------------------------------------- checkpoints

  function vertexName(id) {
    const vertex = ((state.job && state.job.vertices) || []).find((v) => String(v.id) === String(id));
    return vertex ? vertex.name : id;
  }

  function renderCheckpoints() {
    const data = state.checkpoints;
    if (!data) return;
    if (data.error) {
      $("ckpt-history-empty").hidden = false;
      $("ckpt-history-empty").textContent = `Checkpoint statistics unavailable: ${data.error}`;
      return;
    }
    const counts = data.counts || {};
    for (const key of ["total", "in_progress", "completed", "failed", "restored"]) {
      $(`ckpt-count-${key}`).textContent = counts[key] !== undefined ? counts[key] : "–";
    }
    renderLatest(data.latest || {});
    const history = data.history || [];
    if (state.chartJobId !== state.jobId) {
      state.chartHistory.clear();
      state.chartJobId = state.jobId;
    }
    for (const entry of history) state.chartHistory.set(entry.id, entry);
    const ids = [...state.chartHistory.keys()].sort((a, b) => a - b);
    while (ids.length > 60) state.chartHistory.delete(ids.shift());
    renderHistory(history);
    renderChart([...state.chartHistory.values()].sort((a, b) => a.id - b.id));
    renderSummary(data.summary || {});
    renderCheckpointConfig();
  }

  function renderLatest(latest) {
    const box = (testid) => byTestId(document, testid).querySelector(".body");
    const line = (...parts) => h("div", { class: "line" }, ...parts);
    const path = (p) => (p ? h("div", { class: "path", "data-testid": "latest-path" }, p) : null);
    const more = (entry) =>
      h(
        "a",
        {
          href: "#",
          "data-testid": "latest-details",
          onclick: (event) => {
            event.preventDefault();
            openDetail(entry.id, entry.status);
          },
        },
        "details",
      );
    const c = latest.completed;
    if (changed("latest-completed", c)) {
      box("ckpt-latest-completed").replaceChildren(
        c
          ? h(
              "div",
              {},
              line(`#${c.id} · `, fmtTime(c.latest_ack_timestamp), ` · ${fmtDuration(c.end_to_end_duration)} · `, fmtBytes(c.checkpointed_size), " · ", more(c)),
              path(c.external_path),
            )
          : h("span", { class: "empty" }, "none yet"),
      );
    }
    const f = latest.failed;
    if (changed("latest-failed", f)) {
      box("ckpt-latest-failed").replaceChildren(
        f
          ? h(
              "div",
              {},
              line(`#${f.id} · failed `, fmtTime(f.failure_timestamp), " · ", more(f)),
              h("div", { class: "path" }, f.failure_message || ""),
            )
          : h("span", { class: "empty" }, "none"),
      );
    }
    const sp = latest.savepoint;
    if (changed("latest-savepoint", sp)) {
      box("ckpt-latest-savepoint").replaceChildren(
        sp
          ? h(
              "div",
              {},
              line(`#${sp.id} · ${sp.checkpoint_type || "SAVEPOINT"} · `, fmtTime(sp.latest_ack_timestamp), ` · ${fmtBytes(sp.checkpointed_size)} · `, more(sp)),
              path(sp.external_path),
            )
          : h("span", { class: "empty" }, "none"),
      );
    }
    const r = latest.restored;
    if (changed("latest-restored", r)) {
      box("ckpt-latest-restored").replaceChildren(
        r
          ? h(
              "div",
              {},
              line(`#${r.id} · from ${r.is_savepoint ? "savepoint" : "checkpoint"} · `, fmtTime(r.restore_timestamp)),
              path(r.external_path),
            )
          : h("span", { class: "empty" }, "none (fresh start)"),
      );
    }
  }

  function renderHistory(history) {
    $("ckpt-history-empty").hidden = history.length > 0;
    $("ckpt-history-empty").textContent = "No checkpoint triggered yet.";
    $("ckpt-history-note").textContent = history.length ? `(latest ${history.length}, newest first; click a row for subtask details)` : "";
    if (!changed("history", { history, selected: state.detailId })) return;
    $("ckpt-history")
      .querySelector("tbody")
      .replaceChildren(
        ...history.map((c) =>
          h(
            "tr",
            {
              class: `clickable ${c.id === state.detailId ? "selected" : ""}`,
              "data-testid": "ckpt-row",
              "data-checkpoint-id": c.id,
              "data-status": c.status,
              "data-savepoint": c.is_savepoint ? "true" : "false",
              onclick: () => openDetail(c.id, c.status),
            },
            h("td", { class: "num mono" }, c.id),
            h("td", {}, badge(c.status)),
            h(
              "td",
              {},
              c.is_savepoint
                ? h("span", { class: "badge savepoint", "data-testid": "savepoint-mark", title: "savepoint" }, "◆ ", c.checkpoint_type || "SAVEPOINT")
                : (c.checkpoint_type || "CHECKPOINT").toLowerCase().replace(/_/g, " "),
            ),
            h("td", { class: "num", "data-testid": "ckpt-acks" }, `${c.num_acknowledged_subtasks}/${c.num_subtasks}`),
            h("td", {}, fmtTime(c.trigger_timestamp, true)),
            h("td", {}, c.latest_ack_timestamp > 0 ? fmtTime(c.latest_ack_timestamp, true) : "–"),
            h("td", { class: "num" }, fmtDuration(c.end_to_end_duration)),
            h("td", { class: "num" }, fmtBytes(c.checkpointed_size)),
            h("td", { class: "num" }, fmtBytes(c.processed_data)),
          ),
        ),
      );
  }

  function renderChart(entries) {
    if (!changed("chart", entries.map((e) => [e.id, e.status, e.end_to_end_duration, e.checkpointed_size]))) return;
    const W = 560;
    const H = 220;
    const L = 56;
    const R = 60;
    const T = 14;
    const B = 28;
    const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, "data-testid": "ckpt-chart-svg", role: "img" });
    const plotW = W - L - R;
    const plotH = H - T - B;
    svg.appendChild(s("line", { class: "axis", x1: L, y1: T + plotH, x2: L + plotW, y2: T + plotH }));
    if (entries.length === 0) {
      svg.appendChild(s("text", { x: L + plotW / 2, y: T + plotH / 2, "text-anchor": "middle" }, "no checkpoints yet"));
      $("ckpt-chart").replaceChildren(svg);
      return;
    }
    const maxDur = Math.max(1, ...entries.map((e) => e.end_to_end_duration || 0));
    const maxSize = Math.max(1, ...entries.map((e) => e.checkpointed_size || 0));
    const slot = plotW / Math.max(entries.length, 10);
    const barW = Math.max(2, slot * 0.7);
    for (const fraction of [0, 0.5, 1]) {
      const y = T + plotH - fraction * plotH;
      svg.appendChild(s("line", { class: "axis", x1: L, y1: y, x2: L + plotW, y2: y, "stroke-dasharray": fraction ? "2,4" : null }));
      svg.appendChild(s("text", { x: L - 6, y: y + 3, "text-anchor": "end" }, fmtDuration(maxDur * fraction)));
      svg.appendChild(s("text", { x: L + plotW + 6, y: y + 3 }, fmtBytes(Math.round(maxSize * fraction))));
    }
    const points = [];
    entries.forEach((e, i) => {
      const x = L + i * slot + (slot - barW) / 2;
      const barH = Math.max(1, ((e.end_to_end_duration || 0) / maxDur) * plotH);
      const cls = `bar ${e.status} ${e.is_savepoint ? "savepoint" : ""}`;
      svg.appendChild(
        s(
          "rect",
          { class: cls, x, y: T + plotH - barH, width: barW, height: barH, "data-checkpoint-id": e.id },
          s("title", {}, `#${e.id} ${e.status}: ${fmtDuration(e.end_to_end_duration)}, ${fmtBytes(e.checkpointed_size)}`),
        ),
      );
      if (e.status === "COMPLETED") {
        points.push([x + barW / 2, T + plotH - ((e.checkpointed_size || 0) / maxSize) * plotH]);
      }
    });
    if (points.length) {
      svg.appendChild(s("path", { class: "size-line", d: points.map((p, i) => `${i ? "L" : "M"}${p[0]},${p[1]}`).join(" ") }));
      for (const [x, y] of points) svg.appendChild(s("circle", { class: "size-dot", cx: x, cy: y, r: 2.5 }));
    }
    const first = entries[0].id;
    const last = entries[entries.length - 1].id;
    svg.appendChild(s("text", { x: L, y: H - 8 }, `#${first}`));
    svg.appendChild(s("text", { x: L + plotW, y: H - 8, "text-anchor": "end" }, `#${last}`));
    $("ckpt-chart").replaceChildren(svg);
  }

  function renderSummary(summary) {
    if (!changed("summary", summary)) return;
    const rows = [
      ["End-to-end duration", summary.end_to_end_duration, fmtDuration],
      ["Checkpointed size", summary.checkpointed_size, fmtBytes],
      ["Full state size", summary.state_size, fmtBytes],
      ["Processed in-flight data", summary.processed_data, fmtBytes],
      ["Persisted in-flight data", summary.persisted_data, fmtBytes],
    ];
    $("ckpt-summary")
      .querySelector("tbody")
      .replaceChildren(
        ...rows.map(([label, stats, fmt]) =>
          h(
            "tr",
            {},
            h("td", {}, label),
            ...["min", "avg", "p99", "max"].map((k) => h("td", { class: "num" }, stats ? fmt(Math.round(stats[k] || 0)) : "–")),
          ),
        ),
      );
  }

  function renderCheckpointConfig() {
    const config = state.checkpointConfig;
    if (!config || !changed("config", config)) return;
    const list = $("ckpt-config");
    if (config.error) {
      list.replaceChildren(h("dt", {}, "unavailable"), h("dd", {}, config.error));
      return;
    }
    const externalization = config.externalization || {};
    const pairs = [
      ["Mode", config.mode],
      ["Interval", config.interval >= 9e18 ? "disabled" : fmtDuration(config.interval)],
      ["Timeout", fmtDuration(config.timeout)],
      ["Min pause", fmtDuration(config.min_pause)],
      ["Max concurrent", config.max_concurrent],
      ["Tolerable failures", config.tolerable_failed_checkpoints],
      ["Unaligned", config.unaligned_checkpoints],
      ["Aligned checkpoint timeout", config.unaligned_checkpoints ? (config.aligned_checkpoint_timeout > 0 ? fmtDuration(config.aligned_checkpoint_timeout) : "0 (always unaligned)") : "–"],
      [
        "Retained on cancel",
        externalization.enabled ? (externalization.delete_on_cancellation ? "no (deleted)" : "yes") : "no (not externalized)",
      ],
      ["State backend", config.state_backend],
      ["Checkpoint storage", config.checkpoint_storage],
    ];
    // chandy adds the directories to Flink's fields.
    if (config.checkpoint_dir !== undefined) pairs.push(["Checkpoint directory", config.checkpoint_dir]);
    if (config.savepoint_dir !== undefined) pairs.push(["Savepoint directory", config.savepoint_dir]);
    if (config.savepoint_dir) $("savepoint-dir").placeholder = `default: ${config.savepoint_dir}`;
    list.replaceChildren(
      ...pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v === undefined || v === null ? "–" : String(v))]),
    );
  }

  function openDetail(id, status) {
    state.detailId = id;
    state.detailStatus = status;
    state.rendered.delete("history");
    renderCheckpoints();
    $("ckpt-detail").hidden = false;
    $("ckpt-detail-title").textContent = `Checkpoint #${id}`;
    $("ckpt-detail-body").replaceChildren(h("div", { class: "empty" }, "loading…"));
    refreshDetail();
  }

  async function refreshDetail() {
    const id = state.detailId;
    const jobId = state.jobId;
    try {
      const detail = await api(`jobs/${jobId}/checkpoints/details/${id}`);
      const tasks = Object.keys(detail.tasks || {});
      const subtaskDetails = await Promise.all(
        tasks.map((vid) => api(`jobs/${jobId}/checkpoints/details/${id}/subtasks/${vid}`)),
      );
      if (id !== state.detailId || jobId !== state.jobId) return;
      state.detailStatus = detail.status;
      renderDetail(detail, tasks, subtaskDetails);
    } catch (error) {
      if (id !== state.detailId) return;
      state.detailStatus = null;
      $("ckpt-detail-body").replaceChildren(
        h("div", { class: "empty", "data-testid": "ckpt-detail-error" }, `Details of checkpoint #${id} unavailable: ${error.message}`),
      );
    }
  }

  function renderDetail(detail, vertexIds, subtaskDetails) {
    $("ckpt-detail-title").replaceChildren(
      `Checkpoint #${detail.id} `,
      badge(detail.status),
      detail.is_savepoint ? h("span", { class: "badge savepoint" }, detail.checkpoint_type) : "",
      h(
        "span",
        { class: "note" },
        `${detail.num_acknowledged_subtasks}/${detail.num_subtasks} acknowledged · ${fmtDuration(detail.end_to_end_duration)} · ${fmtBytes(detail.checkpointed_size)}`,
      ),
    );
    const sections = vertexIds.map((vid, i) => {
      const task = subtaskDetails[i] || {};
      const subtasks = task.subtasks || [];
      const done = subtasks.filter((st) => st.status === "completed");
      const stat = (pick) => {
        const values = done.map(pick).filter((v) => v !== undefined && v !== null);
        if (!values.length) return ["–", "–", "–"];
        return [Math.min(...values), values.reduce((a, b) => a + b, 0) / values.length, Math.max(...values)];
      };
      const columns = [
        ["end_to_end_duration", (st) => st.end_to_end_duration, fmtDuration],
        ["checkpointed_size", (st) => st.checkpointed_size, fmtBytes],
        ["sync", (st) => st.checkpoint && st.checkpoint.sync, fmtDuration],
        ["async", (st) => st.checkpoint && st.checkpoint.async, fmtDuration],
        ["alignment", (st) => st.alignment && st.alignment.duration, fmtDuration],
        ["processed", (st) => st.alignment && st.alignment.processed, fmtBytes],
        ["persisted", (st) => st.alignment && st.alignment.persisted, fmtBytes],
        ["start_delay", (st) => st.start_delay, fmtDuration],
      ];
      const summaryRow = (label, index) =>
        h(
          "tr",
          { class: "summary-row" },
          h("td", {}, label),
          h("td", {}, ""),
          h("td", {}, ""),
          ...columns.map(([, pick, fmt]) => {
            const value = stat(pick)[index];
            return h("td", { class: "num" }, typeof value === "number" ? fmt(Math.round(value)) : value);
          }),
          h("td", {}, ""),
        );
      return h(
        "div",
        { class: "vertex-detail", "data-testid": "ckpt-detail-vertex", "data-vertex-id": vid },
        h(
          "h4",
          {},
          task.name || vertexName(vid),
          h("span", { class: "sub" }, `${task.num_acknowledged_subtasks}/${task.num_subtasks} acknowledged · ${fmtDuration(task.end_to_end_duration)} · ${fmtBytes(task.checkpointed_size)}`),
        ),
        h(
          "table",
          { class: "grid", "data-testid": "subtask-table" },
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              ...[
                "Subtask",
                "Status",
                "Acknowledged",
                "End-to-end",
                "Checkpointed size",
                "Sync duration",
                "Async duration",
                "Alignment duration",
                "Processed in-flight",
                "Persisted in-flight",
                "Start delay",
                "Unaligned",
              ].map((title, k) => h("th", { class: k >= 3 && k <= 10 ? "num" : "" }, title)),
            ),
          ),
          h(
            "tbody",
            {},
            done.length > 1 ? [summaryRow("Minimum", 0), summaryRow("Average", 1), summaryRow("Maximum", 2)] : [],
            subtasks.map((st) =>
              h(
                "tr",
                { "data-testid": "subtask-row", "data-subtask": st.index, "data-status": st.status },
                h("td", { class: "mono" }, st.index),
                h("td", {}, badge(st.status)),
                h("td", {}, st.ack_timestamp ? fmtClock(st.ack_timestamp) : "–"),
                h("td", { class: "num" }, fmtDuration(st.end_to_end_duration)),
                h("td", { class: "num" }, fmtBytes(st.checkpointed_size)),
                h("td", { class: "num", "data-testid": "subtask-sync" }, fmtDuration(st.checkpoint && st.checkpoint.sync)),
                h("td", { class: "num", "data-testid": "subtask-async" }, fmtDuration(st.checkpoint && st.checkpoint.async)),
                h("td", { class: "num", "data-testid": "subtask-alignment" }, fmtDuration(st.alignment && st.alignment.duration)),
                h("td", { class: "num" }, fmtBytes(st.alignment && st.alignment.processed)),
                h("td", { class: "num", "data-testid": "subtask-persisted" }, fmtBytes(st.alignment && st.alignment.persisted)),
                h("td", { class: "num", "data-testid": "subtask-start-delay" }, fmtDuration(st.start_delay)),
                h("td", {}, st.status === "completed" ? (st.unaligned_checkpoint ? "yes" : "no") : "–"),
              ),
            ),
          ),
        ),
      );
    });
    $("ckpt-detail-body").replaceChildren(...sections);
  }

  // ---------------------------------------------------------------- exceptions

  function renderExceptions() {
    const data = state.exceptions;
    if (!data || !changed("exceptions", data)) return;
    const history = (data.exceptionHistory && data.exceptionHistory.entries) || [];
    const entries = history.length
      ? history.map((e) => ({
          name: e.exceptionName,
          trace: e.stacktrace,
          timestamp: e.timestamp,
          where: [e.taskName, e.location || e.endpoint].filter(Boolean).join(" @ "),
        }))
      : data["root-exception"]
        ? [{ name: "root exception", trace: data["root-exception"], timestamp: data.timestamp, where: "" }]
        : [];
    $("exceptions-count").textContent = entries.length ? `(${entries.length})` : "";
    $("exceptions").replaceChildren(
      ...(entries.length
        ? entries.map((e, index) =>
            h(
              "div",
              { class: "exception", "data-testid": "exception" },
              h(
                "div",
                { class: "head" },
                h("span", { class: "name" }, e.name || "exception"),
                h("span", { class: "where" }, fmtTime(e.timestamp, true)),
                h("span", { class: "where" }, e.where),
              ),
              h("div", { class: "message", "data-testid": "exception-message" }, exceptionMessage(e.trace)),
              h("details", { open: index === 0 }, h("summary", {}, "Stack trace"), h("pre", {}, e.trace || "")),
            ),
          )
        : [h("div", { class: "empty", "data-testid": "no-exceptions" }, "No exceptions: the job has not failed.")]),
    );
    // A Python traceback ends with what happened: show its end.
    requestAnimationFrame(() => {
      for (const pre of $("exceptions").querySelectorAll("pre")) pre.scrollTop = pre.scrollHeight;
    });
  }

  /** The line that says what happened: a Python traceback's last, a Java stack trace's first. */
  function exceptionMessage(trace) {
    const lines = String(trace || "")
      .split("\n")
      .map((line) => line.trim())
      .filter(Boolean);
    if (!lines.length) return "";
    const line = lines[0].startsWith("Traceback") ? lines[lines.length - 1] : lines[0];
    const match = line.match(/^([\w.]+\.)(\w+: .*)$/);
    return match ? match[2] : line;
  }

  // ---------------------------------------------------------------- start

  async function loadVersion() {
    try {
      const config = await api("config");
      const version = config && config["flink-version"];
      // chandy reports its own version where Flink reports Flink's.
      if (version) $("version").textContent = /^\d/.test(version) ? `Flink ${version}` : version;
    } catch (_) {
      /* the version label is decoration */
    }
  }

  function start() {
    for (const button of document.querySelectorAll(".tabs button")) {
      button.addEventListener("click", () => {
        if (state.jobId) window.location.hash = `#/jobs/${state.jobId}/${button.dataset.tab}`;
      });
    }
    $("btn-savepoint").addEventListener("click", () => runSavepointOperation("savepoint"));
    $("btn-stop").addEventListener("click", () => runSavepointOperation("stop"));
    $("btn-cancel").addEventListener("click", cancelJob);
    $("vertex-detail-close").addEventListener("click", () => selectVertex(null));
    $("ckpt-detail-close").addEventListener("click", () => {
      state.detailId = null;
      state.rendered.delete("history");
      $("ckpt-detail").hidden = true;
      renderCheckpoints();
    });
    window.addEventListener("hashchange", onRoute);
    onRoute();
    loadVersion();
    // A tab in the background asks the driver nothing; it catches up when shown again.
    setInterval(() => {
      if (!document.hidden) poll();
    }, REFRESH_MS);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) poll();
    });
  }

  start();
})();
