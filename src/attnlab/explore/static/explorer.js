// attnlab explorer: the views, shared by the page (page.js, over HTTP) and the notebook widget
// (widget.py appends a small anywidget entry point to this file). No numbers are computed here:
// every value drawn comes from the Python session (attnlab/explore/session.py); this file only
// draws it. Hand-written ES module, no build step, no dependencies.

// ---------------------------------------------------------------------------------- transports
// A transport has call(endpoint, payload) -> Promise<json> (rejects with Error(message)) and
// stream(params, onEvent) -> close(), where onEvent receives {type: "token"|"done"|"error", ...}.

export function httpTransport(base) {
  return {
    async call(endpoint, payload) {
      const init = payload === undefined ? {} : {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(payload),
      };
      const response = await fetch(`${base}/api/${endpoint}`, init);
      let data;
      try {
        data = await response.json();
      } catch (err) {
        throw new Error(`The server sent an unreadable answer (HTTP ${response.status}).`);
      }
      if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
      return data;
    },
    stream(params, onEvent) {
      const query = new URLSearchParams();
      for (const [k, v] of Object.entries(params)) {
        if (v !== undefined && v !== null) query.set(k, typeof v === "string" ? v : JSON.stringify(v));
      }
      const source = new EventSource(`${base}/api/stream?${query}`);
      let finished = false;
      const finish = (event) => {
        finished = true;
        source.close();
        onEvent(event);
      };
      source.addEventListener("token", (e) => onEvent(JSON.parse(e.data)));
      source.addEventListener("done", (e) => finish(JSON.parse(e.data)));
      source.addEventListener("error", (e) => {
        if (finished) return;
        if (e.data) finish(JSON.parse(e.data));
        else finish({ type: "error", error: "The connection to the server was lost." });
      });
      return () => { finished = true; source.close(); };
    },
  };
}

// ------------------------------------------------------------------------------------ helpers
function h(tag, attrs = {}, ...children) {
  const node = tag === "svg" || SVG_TAGS.has(tag)
    ? document.createElementNS("http://www.w3.org/2000/svg", tag)
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
const SVG_TAGS = new Set(["rect", "line", "text", "g", "title"]);

// Sequential colour for weights in [0, 1]; diverging colour for signed values scaled by `span`.
export function weightColor(w) {
  const t = Math.max(0, Math.min(1, w));
  const r = Math.round(255 - 225 * t), g = Math.round(255 - 160 * t), b = Math.round(255 - 50 * t);
  return `rgb(${r},${g},${b})`;
}
function signedColor(v, span) {
  const t = span > 0 ? Math.max(-1, Math.min(1, v / span)) : 0;
  if (t >= 0) return `rgb(${Math.round(255 - 40 * t)},${Math.round(255 - 170 * t)},${Math.round(255 - 170 * t)})`;
  return `rgb(${Math.round(255 + 170 * t)},${Math.round(255 + 120 * t)},${Math.round(255 + 30 * t)})`;
}
function fmt(v) {
  if (typeof v !== "number") return String(v);
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a >= 1e4 || a < 1e-3 ? v.toExponential(3) : v.toFixed(a >= 100 ? 2 : 4);
}
const keyOf = (x) => `${x.site}:${x.layer}:${x.head}`;

// -------------------------------------------------------------------------------- the explorer
export function mountExplorer(root, transport, initial = {}) {
  const state = {
    info: null, attention: null, selected: null, ablate: new Map(), busy: 0, closeStream: null,
  };
  root.classList.add("attnlab-explorer");
  root.dataset.busy = "0";
  root.replaceChildren();

  const errorBox = h("div", { id: "ax-error", class: "ax-error", role: "alert", hidden: true });
  const tooltip = h("div", { class: "ax-tooltip", hidden: true });
  const header = h("header", { class: "ax-header" }, h("h1", { text: "attnlab attention explorer" }));
  const textInput = h("textarea", { id: "ax-text", rows: 2, spellcheck: "false" });
  const sourceInput = h("textarea", { id: "ax-source", rows: 2, spellcheck: "false" });
  const runButton = h("button", { id: "ax-run", type: "button" }, "Show attention");
  const sourceRow = h("label", { class: "ax-field", hidden: true }, h("span", { text: "Source" }), sourceInput);
  const textLabel = h("span", { text: "Input" });
  const tokensBox = h("div", { id: "ax-tokens", class: "ax-tokens" });
  const modelView = h("div", { id: "ax-model-view" });
  const headControls = h("div", { class: "ax-controls" });
  const headView = h("div", { id: "ax-head-view", class: "ax-head-view" });
  const walkView = h("div", { id: "ax-walkthrough" });
  const posView = h("div", { id: "ax-positions" });
  const nextBox = h("div", { id: "ax-next" });
  const ablateBox = h("div", { id: "ax-ablate" });
  const streamOut = h("div", { id: "ax-stream", class: "ax-stream" });

  const num = (id, value, attrs) => h("input", { id, type: "number", value, ...attrs });
  const temperature = num("ax-temperature", 1, { min: 0, max: 5, step: 0.1 });
  const topK = num("ax-top-k", 0, { min: 0, step: 1 });
  const topP = num("ax-top-p", 1, { min: 0.01, max: 1, step: 0.05 });
  const strategy = h("select", { id: "ax-strategy" },
    h("option", { value: "greedy" }, "greedy"), h("option", { value: "sample" }, "sampling"),
    h("option", { value: "beam" }, "beam search"));
  const maxNew = num("ax-max-new", 20, { min: 1, max: 512, step: 1 });
  const beams = num("ax-beams", 4, { min: 2, max: 16, step: 1 });
  const seed = num("ax-seed", 0, { step: 1 });
  const pace = num("ax-pace", 0, { min: 0, max: 2000, step: 10 });
  const streamButton = h("button", { id: "ax-continue", type: "button" }, "Continue");
  const stopButton = h("button", { id: "ax-stop", type: "button", disabled: true }, "Stop");

  const section = (id, title, equation, ...body) => h("section", { class: "ax-section", id },
    h("h2", { text: title }), equation ? h("p", { class: "ax-eq", text: equation }) : null, ...body);
  const labelled = (text, input) => h("label", { class: "ax-inline" }, h("span", { text }), input);

  const samplingControls = h("div", { class: "ax-controls" }, labelled("temperature", temperature),
    labelled("top-k", topK), labelled("top-p", topP));
  const continuation = h("div", {}, h("div", { class: "ax-controls" }, labelled("strategy", strategy),
    labelled("new tokens", maxNew), labelled("beams", beams), labelled("seed", seed),
    labelled("pace ms", pace), streamButton, stopButton), streamOut);
  const outputTitle = h("h2", { text: "Next token and continuation" });
  const outputEquation = h("p", { class: "ax-eq",
    text: "p(w_t | w_<t) = softmax(z / τ), then top-k / top-p (003 'Decoding'; attnlab.generate)" });
  const generativeSection = h("section", { class: "ax-section", id: "ax-sec-next" },
    outputTitle, outputEquation, samplingControls, nextBox,
    h("h3", { text: "Heads (click to switch off: head_h ← 0 in concat(head_1..head_H) W^O, 004 eq. 13)" }),
    ablateBox, continuation);

  root.append(header, errorBox,
    section("ax-sec-input", "Input", null,
      sourceRow, h("label", { class: "ax-field" }, textLabel, textInput), runButton,
      h("h3", { text: "Tokens, as the tokenizer cut them" }), tokensBox),
    section("ax-sec-model", "Model view: every layer × head",
      "A = softmax(Q Kᵀ / √d_k + mask) per head (004 eq. 9, 13); click a map to open it", modelView),
    section("ax-sec-head", "Head view",
      "row i: how query token i distributes its attention over the keys j (each row sums to 1)",
      headControls, headView),
    section("ax-sec-walk", "One head, step by step", null, walkView),
    section("ax-sec-positions", "Positions", null, posView),
    generativeSection, tooltip);

  textInput.value = initial.text || "";
  sourceInput.value = initial.source || "";

  // --------------------------------------------------------------------------- plumbing
  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = false;
  }
  function clearError() {
    errorBox.hidden = true;
    errorBox.textContent = "";
  }
  async function call(endpoint, payload) {
    state.busy += 1;
    root.dataset.busy = String(state.busy);
    try {
      return await transport.call(endpoint, payload);
    } finally {
      state.busy -= 1;
      root.dataset.busy = String(state.busy);
    }
  }
  function request(extra = {}) {
    const payload = { text: textInput.value, ...extra };
    if (state.info && state.info.seq2seq) payload.source = sourceInput.value;
    return payload;
  }
  const ablateList = () => [...state.ablate.values()];
  // Only the newest answer of a view is drawn: an older request that resolves later is dropped.
  const sent = {};
  async function latest(view, endpoint, payload) {
    const ticket = (sent[view] = (sent[view] || 0) + 1);
    const data = await call(endpoint, payload);
    return ticket === sent[view] ? data : null;
  }

  function showTooltip(event, text) {
    tooltip.textContent = text;
    tooltip.hidden = false;
    tooltip.style.left = `${event.clientX + 12}px`;
    tooltip.style.top = `${event.clientY + 12}px`;
  }
  const hideTooltip = () => { tooltip.hidden = true; };

  // --------------------------------------------------------------------------- views
  function drawTokens(tokens) {
    tokensBox.replaceChildren();
    for (const [side, t] of Object.entries(tokens)) {
      const row = h("div", { class: "ax-token-row", "data-side": side },
        h("span", { class: "ax-side", text: side === "target" ? (state.info.seq2seq ? "target" : "input") : side }));
      t.tokens.forEach((tok, i) => row.append(
        h("span", { class: "ax-token", title: `id ${t.ids[i]}`, "data-id": t.ids[i] }, tok)));
      tokensBox.append(row);
    }
  }

  function thumbnail(matrix, size = 64) {
    const canvas = h("canvas", { width: size, height: size, class: "ax-thumb" });
    const ctx = canvas.getContext("2d");
    const rows = matrix.length, cols = matrix[0].length;
    const cw = size / cols, ch = size / rows;
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        ctx.fillStyle = weightColor(matrix[i][j]);
        ctx.fillRect(j * cw, i * ch, Math.ceil(cw), Math.ceil(ch));
      }
    }
    return canvas;
  }

  function drawModelView() {
    modelView.replaceChildren();
    for (const site of state.info.sites) {
      const data = state.attention.sites[site.name];
      if (!data) continue;
      const grid = h("div", { class: "ax-grid", style: `grid-template-columns: 4em repeat(${site.heads}, max-content)` },
        h("span", {}), ...Array.from({ length: site.heads }, (_, j) => h("span", { class: "ax-axis", text: `head ${j}` })));
      data.layers.forEach((layer, l) => {
        grid.append(h("span", { class: "ax-axis", text: `layer ${l}` }));
        layer.forEach((matrix, hd) => {
          const sel = state.selected;
          const cls = sel && sel.site === site.name && sel.layer === l && sel.head === hd ? "ax-cell ax-selected" : "ax-cell";
          const off = state.ablate.has(keyOf({ site: site.name, layer: l, head: hd }));
          grid.append(h("button", {
            type: "button", class: off ? `${cls} ax-off` : cls, "data-site": site.name,
            "data-layer": l, "data-head": hd, title: `${site.label}: layer ${l}, head ${hd}`,
            onclick: () => select({ site: site.name, layer: l, head: hd }),
          }, thumbnail(matrix)));
        });
      });
      modelView.append(h("h3", { text: site.label }), grid);
    }
  }

  function drawHeadControls() {
    const sites = state.info.sites;
    const siteSel = h("select", { id: "ax-site" }, sites.map((s) => h("option", { value: s.name }, s.label)));
    const layerSel = h("select", { id: "ax-layer" });
    const headSel = h("select", { id: "ax-head" });
    const refill = () => {
      const s = sites.find((x) => x.name === siteSel.value);
      layerSel.replaceChildren(...Array.from({ length: s.layers }, (_, i) => h("option", { value: i }, `layer ${i}`)));
      headSel.replaceChildren(...Array.from({ length: s.heads }, (_, i) => h("option", { value: i }, `head ${i}`)));
    };
    siteSel.value = state.selected.site;
    refill();
    layerSel.value = state.selected.layer;
    headSel.value = state.selected.head;
    const onChange = () => select({ site: siteSel.value, layer: +layerSel.value, head: +headSel.value });
    siteSel.addEventListener("change", () => { refill(); onChange(); });
    layerSel.addEventListener("change", onChange);
    headSel.addEventListener("change", onChange);
    headControls.replaceChildren(labelled("attention", siteSel), labelled("layer", layerSel), labelled("head", headSel));
  }

  function heatmap(values, rows, cols, { id, signed = false, cell = 26, maxCols = 64, highlight = null, describe } = {}) {
    const shownCols = Math.min(cols.length, maxCols);
    cell = Math.max(8, Math.min(cell, Math.floor(720 / Math.max(rows.length, shownCols)))); // long inputs fit
    let span = 0;
    if (signed) for (const r of values) for (const v of r) span = Math.max(span, Math.abs(v));
    const table = h("table", { class: "ax-heatmap", id });
    table.append(h("tr", {}, h("th", {}), cols.slice(0, shownCols).map((c, j) => h("th", {
      class: highlight && j >= highlight[0] && j < highlight[1] ? "ax-col ax-hl" : "ax-col",
    }, h("span", { text: c })))));
    values.forEach((row, i) => {
      const tr = h("tr", {}, h("th", { class: "ax-row", text: rows[i] }));
      for (let j = 0; j < shownCols; j++) {
        const v = row[j];
        const td = h("td", {
          "data-row": i, "data-col": j, "data-value": v,
          style: `background:${signed ? signedColor(v, span) : weightColor(v)};width:${cell}px;height:${cell}px`,
          class: highlight && j >= highlight[0] && j < highlight[1] ? "ax-hl" : null,
        });
        td.addEventListener("mouseenter", (e) => showTooltip(e, describe(i, j, v)));
        td.addEventListener("mouseleave", hideTooltip);
        tr.append(td);
      }
      table.append(tr);
    });
    const note = cols.length > shownCols ? h("p", { class: "ax-small", text: `showing ${shownCols} of ${cols.length} columns` }) : null;
    return h("div", { class: "ax-scroll" }, table, note);
  }

  function linesView(matrix, rows, cols) {
    const rowH = 22, width = 360, height = Math.max(rows.length, cols.length) * rowH + 10;
    const svg = h("svg", { class: "ax-lines", id: "ax-lines", width, height, viewBox: `0 0 ${width} ${height}` });
    const left = 110, right = width - 110;
    const lines = [];
    matrix.forEach((row, i) => row.forEach((w, j) => {
      const line = h("line", {
        x1: left, y1: i * rowH + 15, x2: right, y2: j * rowH + 15, "data-row": i, "data-col": j,
        "data-value": w, stroke: "#1f5fbf", "stroke-width": 1 + 5 * w, "stroke-opacity": w,
      });
      line.append(h("title", { text: `${rows[i]} → ${cols[j]}: ${w}` }));
      lines.push(line);
      svg.append(line);
    }));
    const focus = (i) => lines.forEach((ln) => {
      const mine = i === null || +ln.dataset.row === i;
      ln.setAttribute("stroke-opacity", mine ? ln.dataset.value : 0.03);
    });
    rows.forEach((t, i) => svg.append(h("text", {
      x: left - 6, y: i * rowH + 19, "text-anchor": "end", class: "ax-line-token",
      onmouseenter: () => focus(i), onmouseleave: () => focus(null),
    }, t)));
    cols.forEach((t, j) => svg.append(h("text", { x: right + 6, y: j * rowH + 19, class: "ax-line-token" }, t)));
    return svg;
  }

  function drawHeadView() {
    const sel = state.selected;
    const data = state.attention.sites[sel.site];
    const matrix = data.layers[sel.layer][sel.head];
    const describe = (i, j, v) => `query ${data.rows[i]} (row ${i}) → key ${data.cols[j]} (column ${j}): ${v}`;
    headView.replaceChildren(
      heatmap(matrix, data.rows, data.cols, { id: "ax-heatmap", describe }),
      h("div", {}, h("p", { class: "ax-small", text: "lines: width and opacity ∝ attention weight; hover a query token" }),
        linesView(matrix, data.rows, data.cols)));
  }

  async function drawWalkthrough() {
    const sel = state.selected;
    const data = await latest("walkthrough", "walkthrough", request({ site: sel.site, layer: sel.layer, head: sel.head }));
    if (!data) return;
    walkView.replaceChildren();
    if (data.module) walkView.append(h("p", { class: "ax-small", text: `module ${data.module}` }));
    for (const step of data.steps) {
      const card = h("div", { class: "ax-step", "data-step": step.key },
        h("h3", { text: step.title }), h("p", { class: "ax-eq", text: step.equation }),
        h("p", { class: "ax-note", text: step.note }),
        step.shape.length ? h("p", { class: "ax-small", text: `shape ${step.shape.join(" × ")}` }) : null);
      if (step.values.length) {
        const weights = ["A", "mask", "alpha"].includes(step.key);
        card.append(heatmap(step.values, step.rows, step.cols, {
          id: `ax-step-${step.key}`, signed: !weights, cell: 18, highlight: step.highlight || null,
          describe: (i, j, v) => `${step.key}[${step.rows[i]}, ${step.cols[j]}] = ${v}`,
        }));
      }
      walkView.append(card);
    }
  }

  async function drawPositions() {
    const data = await latest("positions", "positions", request());
    if (!data) return;
    posView.replaceChildren();
    for (const v of data.views) {
      const card = h("div", { class: "ax-step", "data-kind": v.kind },
        h("h3", { text: `${v.kind} positions ${v.module ? `(${v.module}, ${v.side})` : ""}` }),
        h("p", { class: "ax-eq", text: v.equation }), h("p", { class: "ax-note", text: v.note }));
      if (v.values.length) {
        const cols = v.cols;
        const rows = v.tokens.map((t, i) => `${i}: ${t}`);
        card.append(heatmap(v.values, rows, cols, {
          id: `ax-pos-${v.side}`, signed: true, cell: 14, describe: (i, j, x) => `position ${i}, ${cols[j]}: ${x}`,
        }));
      }
      posView.append(card);
    }
  }

  async function drawNext() {
    const data = await latest("next", "next", request({
      temperature: +temperature.value, top_k: +topK.value, top_p: +topP.value, ablate: ablateList(),
    }));
    if (!data) return;
    const labels = state.info.output === "labels";
    const table = h("table", { class: "ax-next", id: "ax-next-table", "data-ablate": JSON.stringify(data.ablated) },
      h("tr", {}, h("th", { text: labels ? "class" : "token" }), h("th", { text: "id" }),
        h("th", { text: labels ? "p(c | x)" : "p = softmax(z)" }),
        labels ? null : h("th", { text: "p after τ, top-k, top-p" })));
    const bar = (p, cls) => h("span", { class: cls, style: `width:${Math.round(120 * p)}px` });
    for (const c of data.candidates) {
      table.append(h("tr", { "data-id": c.id },
        h("td", { class: "ax-token-cell", text: c.token }), h("td", { text: c.id }),
        h("td", { "data-p": c.p }, bar(c.p, "ax-bar"), ` ${fmt(c.p)}`),
        h("td", { "data-p-sample": c.p_sample, hidden: labels }, bar(c.p_sample, "ax-bar ax-bar2"), ` ${fmt(c.p_sample)}`)));
    }
    nextBox.replaceChildren(table);
  }

  function drawAblation() {
    ablateBox.replaceChildren();
    for (const site of state.info.sites) {
      if (site.name === "alignment") continue;
      const grid = h("div", { class: "ax-ablate-grid", style: `grid-template-columns: 5em repeat(${site.heads}, 2.4em)` });
      for (let l = 0; l < site.layers; l++) {
        grid.append(h("span", { class: "ax-axis", text: `layer ${l}` }));
        for (let hd = 0; hd < site.heads; hd++) {
          const head = { site: site.name, layer: l, head: hd };
          const off = state.ablate.has(keyOf(head));
          grid.append(h("button", {
            type: "button", class: off ? "ax-toggle ax-off" : "ax-toggle", "aria-pressed": off ? "true" : "false",
            "data-site": site.name, "data-layer": l, "data-head": hd, title: `${site.label} layer ${l} head ${hd}`,
            onclick: () => toggleHead(head),
          }, String(hd)));
        }
      }
      ablateBox.append(h("h4", { text: site.label }), grid);
    }
  }

  // --------------------------------------------------------------------------- actions
  async function guarded(work) {
    try {
      await work();
    } catch (err) {
      showError(err.message || String(err));
    }
  }

  async function run() {
    await guarded(async () => {
      clearError();
      drawTokens(await call("tokens", request()));
      const attention = await latest("attention", "attention", request({ ablate: ablateList() }));
      if (!attention) return;
      state.attention = attention;
      const first = state.info.sites[0];
      if (first && !state.selected) {
        state.selected = { site: first.name, layer: 0, head: 0 };
      }
      const work = [drawPositions()];
      if (state.info.output) work.push(drawNext());
      const settled = Promise.allSettled(work);
      let failure = null;
      if (state.selected) {
        try {
          await drawWalkthrough(); // the server checks the head exists
          drawHead();
        } catch (err) {
          state.selected = null;
          failure = err;
        }
      }
      for (const r of await settled) if (r.status === "rejected" && !failure) failure = r.reason;
      if (failure) throw failure;
    });
  }

  function drawHead() {
    drawModelView();
    drawHeadControls();
    drawHeadView();
  }

  async function select(head) {
    const previous = state.selected;
    state.selected = head;
    await guarded(async () => {
      clearError();
      try {
        await drawWalkthrough();
      } catch (err) {
        state.selected = previous;
        throw err;
      }
      drawHead();
    });
  }

  async function toggleHead(head) {
    const k = keyOf(head);
    if (state.ablate.has(k)) state.ablate.delete(k);
    else state.ablate.set(k, head);
    drawAblation();
    await guarded(async () => {
      clearError();
      await drawNext();
      const attention = await latest("attention", "attention", request({ ablate: ablateList() }));
      if (!attention) return;
      state.attention = attention;
      drawModelView();
      drawHeadView();
    });
  }

  function startStream() {
    if (state.closeStream) state.closeStream();
    clearError();
    streamOut.replaceChildren();
    streamOut.dataset.state = "streaming";
    const params = request({
      strategy: strategy.value, max_new_tokens: +maxNew.value, temperature: +temperature.value,
      top_k: +topK.value, top_p: +topP.value, beams: +beams.value, seed: +seed.value,
      pace_ms: +pace.value, ablate: ablateList(),
    });
    let count = 0;
    stopButton.disabled = false;
    state.closeStream = transport.stream(params, (event) => {
      if (event.type === "token") {
        count += 1;
        streamOut.append(h("span", { class: "ax-token ax-new", "data-id": event.id, "data-index": count - 1,
          "data-t": performance.now().toFixed(1) }, event.token));
        streamOut.dataset.count = String(count);
      } else if (event.type === "done") {
        stopButton.disabled = true;
        streamOut.dataset.state = "done";
        streamOut.append(h("p", { class: "ax-small", id: "ax-stream-text", text: `text: ${JSON.stringify(event.text)}` }));
      } else {
        stopButton.disabled = true;
        streamOut.dataset.state = "error";
        showError(event.error);
      }
    });
  }

  // --------------------------------------------------------------------------- start
  runButton.addEventListener("click", run);
  streamButton.addEventListener("click", startStream);
  stopButton.addEventListener("click", () => {
    if (state.closeStream) state.closeStream();
    state.closeStream = null;
    stopButton.disabled = true;
    streamOut.dataset.state = "stopped";
  });
  for (const input of [temperature, topK, topP]) {
    input.addEventListener("change", () => guarded(async () => { clearError(); await drawNext(); }));
  }
  guarded(async () => {
    state.info = await call("info");
    const info = state.info;
    header.append(h("p", { class: "ax-model", id: "ax-model" },
      `${info.name} · ${info.kind} · ${info.sites.map((s) => `${s.label} ${s.layers}×${s.heads}`).join(", ") || "no attention"}`));
    sourceRow.hidden = !info.seq2seq;
    textLabel.textContent = info.seq2seq ? "Target prefix (decoder input after <bos>)" : "Input";
    generativeSection.hidden = !info.output;
    if (info.output === "labels") {
      outputTitle.textContent = "Prediction";
      outputEquation.textContent = "p(c | x) = softmax(W pool(h) + b) over the classes (003 'Encoder-only Models')";
      samplingControls.hidden = true;
      continuation.hidden = true;
    }
    drawAblation();
    if (initial.head) {
      const [site, layer, head] = String(initial.head).split(":");
      state.selected = { site, layer: +layer, head: +head };
    }
    root.dataset.ready = "true";
    if (textInput.value) await run();
  });
  return { run, select, toggleHead, startStream, state };
}
