// The decision explorer: reads /debug/* and renders with DOM calls only (textContent, never
// innerHTML), so every name from the cluster is shown as text, whatever it contains.
"use strict";

const REFRESH_MS = 10000;
const SVG = "http://www.w3.org/2000/svg";
let expanded = new Set();  // decision uids whose detail row is open
let chosenFunction = null;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells) {
  const tr = el("tr");
  for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  return tr;
}

async function getJson(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await response.json();
  return { status: response.status, body };
}

function gib(bytes) {
  return (bytes / 2 ** 30).toFixed(2);
}

function fixed(value, digits) {
  return typeof value === "number" ? value.toFixed(digits) : "";
}

function renderDecisions(data) {
  const tbody = document.querySelector("#decisions tbody");
  tbody.replaceChildren();
  document.getElementById("decisions-empty").hidden = data.decisions.length > 0;
  for (const d of data.decisions) {
    const outcome = el("td", d.outcome, "outcome-" + d.outcome);
    const tr = row([
      new Date(d.at * 1000).toLocaleTimeString(), d.pod, d.function || "", d.priority, d.policy,
      outcome, d.best_node || "", d.bound_node || "", d.candidates, el("td", d.trace_id, "mono"),
    ]);
    tr.className = "decision";
    tr.dataset.uid = d.uid;
    tr.addEventListener("click", () => {
      if (expanded.has(d.uid)) expanded.delete(d.uid); else expanded.add(d.uid);
      renderDecisions(data);
    });
    tbody.appendChild(tr);
    if (expanded.has(d.uid)) tbody.appendChild(detailRow(d));
  }
}

function detailRow(d) {
  const td = el("td");
  td.colSpan = 10;
  const terms = Object.keys(d.weights || {});
  if (d.top.length) {
    const table = el("table");
    const head = row(["node", "score", ...terms.map((t) => `${t} (×${fixed(d.weights[t], 2)})`)]);
    head.querySelectorAll("td").forEach((c) => c.replaceWith(el("th", c.textContent)));
    table.appendChild(head);
    for (const c of d.top) table.appendChild(row([c.node, fixed(c.score, 4), ...terms.map((t) => fixed(c.terms[t], 3))]));
    td.appendChild(el("p", "Top candidates (the policy's raw score; each term unweighted):"));
    td.appendChild(table);
  } else {
    td.appendChild(el("p", "No ranking: the pod was filtered only, or no node could run it."));
  }
  const rejected = Object.entries(d.rejections || {});
  if (rejected.length) {
    td.appendChild(el("p", "Filter rejections: " + rejected.map(([k, v]) => `${k}: ${v}`).join(", ")));
    const list = el("ul");
    for (const [node, why] of Object.entries(d.reasons || {})) list.appendChild(el("li", `${node}: ${why}`));
    td.appendChild(list);
  }
  if (d.error) td.appendChild(el("p", "Bind error: " + d.error));
  const tr = row([td]);
  tr.className = "detail";
  return tr;
}

function renderPrewarm(result) {
  const summary = document.getElementById("prewarm-summary");
  const tbody = document.querySelector("#warm tbody");
  tbody.replaceChildren();
  const data = result.body;
  if (result.status !== 200 || !data.enabled) {
    summary.textContent = data.why || data.Error || "prewarming is not available";
    return;
  }
  if (!data.plan) {
    summary.textContent = "No plan yet (the first cycle runs a minute after start).";
    return;
  }
  const mode = data.shadow ? "shadow mode: planned, not applied" : data.leader ? "applied by this replica (leader)" : "planned; the leader applies it";
  const budget = data.plan.budget;
  const idle = budget.target_idle_bytes === null
    ? `${gib(budget.expected_idle_bytes)} GiB expected idle`
    : `${gib(budget.expected_idle_bytes)} of a ${gib(budget.target_idle_bytes)} GiB idle-memory target`;
  summary.textContent = `Minute ${data.plan.minute}: ${data.plan.warm.length} functions warm (${idle}), ${data.plan.pulls.length} pre-pulls, ${data.plan.skipped.length} skipped; ${mode}.`;
  for (const w of data.plan.warm) {
    tbody.appendChild(row([w.function, w.replicas, w.expires_minute, fixed(w.probability, 3),
      fixed(w.benefit_usd, 6), fixed(w.cost_usd, 6), w.pattern, w.paid ? "yes" : "no (free memory)"]));
  }
}

function renderFunctionList(data) {
  const select = document.getElementById("function-select");
  const names = data.functions;
  if (select.options.length !== names.length || [...select.options].some((o, i) => o.value !== names[i])) {
    select.replaceChildren(...names.map((name) => {
      const option = el("option", `${name} (${data.patterns[name] || "not forecast yet"})`);
      option.value = name;
      return option;
    }));
  }
  if (!chosenFunction && names.length) chosenFunction = names[0];
  if (chosenFunction) select.value = chosenFunction;
}

function renderChart(data) {
  const detail = document.getElementById("function-detail");
  const chart = document.getElementById("chart");
  const counts = data.counts;
  const forecast = data.forecast ? data.forecast.expected : [];
  const cold = data.observed_cold_starts_s;
  detail.textContent = `${data.function}: ${counts.reduce((a, b) => a + b, 0)} invocations in the last ${data.minutes} minutes; ` +
    `running pods ${data.running_pods}; observed cold starts ${cold.length || "none"}, ` +
    `priced at ${data.cold_start_estimate_s.toFixed(2)} s${cold.length ? " (their median)" : " (the default)"}; ` +
    (data.forecast ? `model ${data.forecast.model}, next ${forecast.length} minutes forecast (red).` : "no forecast yet.");
  const total = counts.length + forecast.length;
  const top = Math.max(1, ...counts, ...forecast);
  const width = 800, height = 240, left = 40, bottom = 20;
  const x = (i) => left + (i / Math.max(total, 1)) * (width - left);
  const y = (v) => (height - bottom) * (1 - v / top);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const barWidth = Math.max((width - left) / Math.max(total, 1) - 1, 1);
  counts.forEach((v, i) => {
    if (!v) return;
    const bar = document.createElementNS(SVG, "rect");
    bar.setAttribute("class", "bar");
    bar.setAttribute("x", x(i)); bar.setAttribute("y", y(v));
    bar.setAttribute("width", barWidth); bar.setAttribute("height", height - bottom - y(v));
    svg.appendChild(bar);
  });
  if (forecast.length) {
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("class", "forecast");
    line.setAttribute("points", forecast.map((v, i) => `${x(counts.length + i)},${y(v)}`).join(" "));
    svg.appendChild(line);
  }
  const axis = document.createElementNS(SVG, "line");
  axis.setAttribute("class", "axis");
  axis.setAttribute("x1", left); axis.setAttribute("x2", width);
  axis.setAttribute("y1", height - bottom); axis.setAttribute("y2", height - bottom);
  svg.appendChild(axis);
  for (const [text, ty] of [[String(top), 12], ["0", height - bottom]]) {
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("class", "axis-label");
    label.setAttribute("x", 2); label.setAttribute("y", ty);
    label.textContent = text;
    svg.appendChild(label);
  }
  const now = document.createElementNS(SVG, "text");
  now.setAttribute("class", "axis-label");
  now.setAttribute("x", x(counts.length)); now.setAttribute("y", height - 4);
  now.textContent = "now";
  svg.appendChild(now);
  chart.replaceChildren(svg);
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const [decisions, prewarm, functions] = await Promise.all([
      getJson("/debug/decisions?limit=50"), getJson("/debug/prewarm"), getJson("/debug/functions"),
    ]);
    renderDecisions(decisions.body);
    renderPrewarm(prewarm);
    renderFunctionList(functions.body);
    if (chosenFunction) {
      const [namespace, service] = chosenFunction.split("/");
      const history = await getJson(`/debug/functions/${encodeURIComponent(namespace)}/${encodeURIComponent(service)}?hours=2`);
      if (history.status === 200) renderChart(history.body);
    }
    const policy = decisions.body.policy;
    status.className = "status";
    status.textContent = `policy ${policy.policy} (${policy.provider})` +
      (policy.degraded ? ` — degraded: ${policy.degraded}` : "") + ` · updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    status.className = "status error";
    status.textContent = "could not reach kdrl: " + error;
  }
}

document.getElementById("function-select").addEventListener("change", (event) => {
  chosenFunction = event.target.value;
  refresh();
});
refresh();
setInterval(refresh, REFRESH_MS);
