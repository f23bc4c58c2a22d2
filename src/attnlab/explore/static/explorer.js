// attnlab explorer: the views, shared by the page (page.js, over HTTP) and the notebook widget
// (widget.py appends a small anywidget entry point to this file). No numbers are computed here:
// every value drawn comes from the Python session (attnlab/explore/session.py); this file only
// draws it. Hand-written ES module, no build step, no dependencies.
//
// Maps are drawn on <canvas> (one pixel per cell in an offscreen image, scaled up), so 1,024 x
// 1,024 weights draw in milliseconds; hover reads the cell from the array. Long maps arrive packed
// (session.py: probes.pack, base64 float32/float16/uint8) and are read by unpack() below.

// ---------------------------------------------------------------------------------- transports
// A transport has call(endpoint, payload) -> Promise<json> (rejects with Error(message)) and
// stream(params, onEvent) -> close(), where onEvent receives {type: "token"|"done"|"stopped"|
// "error", ...}; close() stops the server-side work too.

export function httpTransport(base) {
  return {
    async call(endpoint, payload) {
      const init = payload === undefined ? {} : {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(payload),
      };
      let response;
      try {
        response = await fetch(`${base}/api/${endpoint}`, init);
      } catch (err) {
        throw new Error("The explorer server does not answer: is `attnlab explore` still running?");
      }
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
      const url = `${base}/api/stream?${query}`;
      const source = new EventSource(url);
      let finished = false, started = false;
      const finish = (event) => {
        finished = true;
        source.close();
        onEvent(event);
      };
      const lost = { type: "error", error: "The connection to the server was lost." };
      source.addEventListener("token", (e) => { started = true; onEvent(JSON.parse(e.data)); });
      for (const kind of ["done", "stopped"]) source.addEventListener(kind, (e) => finish(JSON.parse(e.data)));
      source.addEventListener("error", (e) => {
        if (finished) return;
        if (e.data) { finish(JSON.parse(e.data)); return; }
        finished = true;
        source.close();
        if (started) { onEvent(lost); return; }
        // refused before it began: EventSource hides the body, so ask once more for the message
        // (and hang up at once should the request be accepted this time)
        const ask = new AbortController();
        fetch(url, { signal: ask.signal }).then(async (r) => {
          if (r.ok) { ask.abort(); onEvent(lost); return; }
          const message = (await r.json().catch(() => ({}))).error;
          onEvent(message ? { type: "error", error: message } : lost);
        }, () => onEvent(lost));
      });
      return () => { finished = true; source.close(); }; // the server stops at its next step
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
// Maps colour their cells through 1,024-step tables of these (no allocation per cell).
const STEPS = 1024;
const WEIGHT_LUT = new Uint8Array(3 * (STEPS + 1));
const SIGNED_LUT = new Uint8Array(3 * (2 * STEPS + 1));
function fillLuts() {
  for (let k = 0; k <= STEPS; k++) WEIGHT_LUT.set(weightRGB(k / STEPS), 3 * k);
  for (let k = -STEPS; k <= STEPS; k++) SIGNED_LUT.set(signedRGB(k / STEPS, 1), 3 * (k + STEPS));
}
function weightRGB(w) {
  const t = Math.max(0, Math.min(1, w));
  return [Math.round(255 - 225 * t), Math.round(255 - 160 * t), Math.round(255 - 50 * t)];
}
function signedRGB(v, span) {
  const t = span > 0 ? Math.max(-1, Math.min(1, v / span)) : 0;
  if (t >= 0) return [Math.round(255 - 40 * t), Math.round(255 - 170 * t), Math.round(255 - 170 * t)];
  return [Math.round(255 + 170 * t), Math.round(255 + 120 * t), Math.round(255 + 30 * t)];
}
fillLuts();
export function weightColor(w) {
  const [r, g, b] = weightRGB(w);
  return `rgb(${r},${g},${b})`;
}
function fmt(v) {
  if (typeof v !== "number") return String(v);
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a >= 1e4 || a < 1e-3 ? v.toExponential(3) : v.toFixed(a >= 100 ? 2 : 4);
}
const exact = (v) => +(+v).toPrecision(7); // what hover shows and tests read
const keyOf = (x) => `${x.site}:${x.layer}:${x.head}`;

// Packed arrays (session.py probes.pack): base64 little-endian float32 / float16 / uint8.
let HALF = null;
function halfTable() {
  if (HALF) return HALF;
  HALF = new Float32Array(65536);
  for (let x = 0; x < 65536; x++) {
    const s = x & 0x8000 ? -1 : 1, e = (x >> 10) & 0x1f, f = x & 0x3ff;
    HALF[x] = e === 0 ? s * f * 2 ** -24 : e === 31 ? (f ? NaN : s * Infinity) : s * (1 + f / 1024) * 2 ** (e - 15);
  }
  return HALF;
}
function bytesOf(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}
export function unpack(packed) {
  if (Array.isArray(packed)) { // JSON lists (positions): flatten
    const rows = packed.length, cols = rows ? packed[0].length : 0;
    const out = new Float32Array(rows * cols);
    packed.forEach((r, i) => out.set(r, i * cols));
    return { values: out, shape: [rows, cols] };
  }
  const bytes = bytesOf(packed.data);
  let values;
  if (packed.dtype === "f32") values = new Float32Array(bytes.buffer);
  else if (packed.dtype === "f16") {
    const half = new Uint16Array(bytes.buffer), table = halfTable();
    values = new Float32Array(half.length);
    for (let i = 0; i < half.length; i++) values[i] = table[half[i]];
  } else values = Float32Array.from(bytes);
  if (packed.layout === "tril") { // a causal map: row i sent its keys 0..i only
    const [T, S] = packed.shape, full = new Float32Array(T * S);
    let k = 0;
    for (let i = 0; i < T; i++) for (let j = 0; j <= Math.min(i, S - 1); j++) full[i * S + j] = values[k++];
    values = full;
  }
  return { values, shape: packed.shape, dtype: packed.dtype };
}

function download(name, blob) {
  const a = h("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// ---------------------------------------------------------------------------- the canvas map
// mapView({values (Float32Array, row-major T x S), rows, cols (labels)}, options) -> a <div>
// with the map on a canvas (axes labelled where they fit), a colour legend, zoom and export
// buttons. div.axMatrix = {values, rows, cols, shape} is the accessor tests and tools read.
const MAX_CANVAS = 16000;

function mapView(m, { id, signed = false, span = null, cell = 26, fit = 760, highlight = null,
  describe, legend = "", name = "map", tooltip, onPick = null, stretch = !signed } = {}) {
  const T = m.rows.length, S = m.cols.length, values = m.values;
  if (signed && span === null) {
    span = 0;
    for (let i = 0; i < values.length; i++) span = Math.max(span, Math.abs(values[i]));
  }
  const box = h("div", { class: "ax-map", id, "data-shape": `${T},${S}` });
  box.axMatrix = { values, rows: m.rows, cols: m.cols, shape: [T, S], span };
  // One pixel per cell, coloured once; drawn scaled with smoothing off.
  const image = document.createElement("canvas");
  image.width = Math.max(S, 1);
  image.height = Math.max(T, 1);
  const ictx = image.getContext("2d");
  // weights are coloured on 0..1, or each row on 0..its own maximum ("rows": a diffuse head of a
  // long input, whose weights are all near 1/S, would be white on 0..1)
  let byRow = false;
  const colour = () => {
    const pixels = ictx.createImageData(image.width, image.height);
    for (let i = 0; i < T; i++) {
      let top1 = 1;
      if (byRow) {
        top1 = 0;
        for (let j = 0; j < S; j++) top1 = Math.max(top1, values[i * S + j]);
        top1 = top1 > 0 ? top1 : 1;
      }
      const px = pixels.data, lut = signed ? SIGNED_LUT : WEIGHT_LUT;
      const scale = signed ? (span > 0 ? STEPS / span : 0) : STEPS / top1, offset = signed ? STEPS : 0;
      const hi = signed ? 2 * STEPS : STEPS;
      for (let k = i * S; k < (i + 1) * S; k++) {
        let q = Math.round(values[k] * scale) + offset;
        q = q < 0 ? 0 : q > hi ? hi : q;
        px[4 * k] = lut[3 * q]; px[4 * k + 1] = lut[3 * q + 1]; px[4 * k + 2] = lut[3 * q + 2]; px[4 * k + 3] = 255;
      }
    }
    ictx.putImageData(pixels, 0, 0);
  };
  colour();

  const canvas = h("canvas", { class: "ax-map-canvas" });
  const overlay = h("canvas", { class: "ax-map-overlay" });
  const scroller = h("div", { class: "ax-map-scroll" }, h("div", { class: "ax-map-stack" }, canvas, overlay));
  const longest = (labels) => labels.reduce((a, t) => Math.max(a, String(t).length), 0);
  // where labels may be thinned out (more than 11 of them), each shown label carries its index
  const indexed = (n) => (n > 11 ? String(n - 1).length + 2 : 0); // "599:b"
  const left = Math.min(110, 8 + 7 * Math.max(longest(m.rows), indexed(T)));
  const top = Math.min(80, 8 + 7 * Math.max(longest(m.cols), indexed(S)));
  // cells as big as `cell`, small enough that the map fits `fit` pixels (never under 1 pixel:
  // a 1,024-key map is 1,024 pixels wide and scrolls; zoom changes the size)
  let size = Math.max(1, Math.min(cell, Math.floor(fit / Math.max(S, 1)), Math.floor((1.5 * fit) / Math.max(T, 1))));

  function draw() {
    canvas.width = overlay.width = left + S * size;
    canvas.height = overlay.height = top + T * size;
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(image, left, top, S * size, T * size);
    if (size >= 6) { // cell borders when cells are big enough to see them
      ctx.strokeStyle = "rgba(255,255,255,0.9)";
      ctx.lineWidth = 1;
      ctx.beginPath();
      for (let j = 0; j <= S; j++) { ctx.moveTo(left + j * size + 0.5, top); ctx.lineTo(left + j * size + 0.5, top + T * size); }
      for (let i = 0; i <= T; i++) { ctx.moveTo(left, top + i * size + 0.5); ctx.lineTo(left + S * size, top + i * size + 0.5); }
      ctx.stroke();
    }
    ctx.fillStyle = "#1d2330";
    ctx.font = `${Math.min(12, Math.max(9, size - 2))}px ui-monospace, monospace`;
    const every = Math.max(1, Math.ceil(11 / size));
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    const label = (labels, k, n) => (every > 1 ? `${k}:${labels[k]}` : String(labels[k])).slice(0, n);
    for (let i = 0; i < T; i += every) ctx.fillText(label(m.rows, i, 14), left - 3, top + (i + 0.5) * size);
    ctx.save();
    ctx.textAlign = "left";
    for (let j = 0; j < S; j += every) {
      ctx.save();
      ctx.translate(left + (j + 0.5) * size, top - 3);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(label(m.cols, j, 10), 0, 0);
      ctx.restore();
    }
    ctx.restore();
    if (highlight) {
      ctx.strokeStyle = "#e08a00";
      ctx.lineWidth = 2;
      ctx.strokeRect(left + highlight[0] * size + 1, top + 1, (highlight[1] - highlight[0]) * size - 2, T * size - 2);
    }
    box.dataset.cell = String(size);
    box.dataset.scale = box.dataset.scale || "fixed";
  }
  draw();

  const hoverCtx = () => overlay.getContext("2d");
  overlay.addEventListener("mousemove", (e) => {
    const rect = overlay.getBoundingClientRect();
    const j = Math.floor((e.clientX - rect.left - left) / size), i = Math.floor((e.clientY - rect.top - top) / size);
    const ctx = hoverCtx();
    ctx.clearRect(0, 0, overlay.width, overlay.height);
    if (i < 0 || j < 0 || i >= T || j >= S) { tooltip.hide(); return; }
    const v = exact(values[i * S + j]);
    box.dataset.hoverRow = String(i);
    box.dataset.hoverCol = String(j);
    box.dataset.hoverValue = String(v);
    ctx.strokeStyle = "#e08a00";
    ctx.lineWidth = 2;
    ctx.strokeRect(left + j * size - 1, top + i * size - 1, size + 2, size + 2);
    tooltip.show(e, describe(i, j, v));
  });
  if (onPick) {
    overlay.addEventListener("click", (e) => {
      const rect = overlay.getBoundingClientRect();
      const j = Math.floor((e.clientX - rect.left - left) / size), i = Math.floor((e.clientY - rect.top - top) / size);
      if (i >= 0 && j >= 0 && i < T && j < S) onPick(i, j);
    });
  }
  overlay.addEventListener("mouseleave", () => { hoverCtx().clearRect(0, 0, overlay.width, overlay.height); tooltip.hide(); });

  const zoom = (f) => { size = Math.max(1, Math.min(48, Math.round(size * f) || 1, Math.floor(MAX_CANVAS / Math.max(S, T)))); draw(); };
  const svgOf = () => {
    const w = left + S * size, hgt = top + T * size;
    if (T * S > 65536) { // too many cells for one element each: the drawn map, embedded
      return `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${hgt}"><image href="${canvas.toDataURL("image/png")}" width="${w}" height="${hgt}"/></svg>`;
    }
    const parts = [];
    for (let i = 0; i < T; i++) for (let j = 0; j < S; j++) {
      const [r, g, b] = signed ? signedRGB(values[i * S + j], span) : weightRGB(values[i * S + j]);
      parts.push(`<rect x="${left + j * size}" y="${top + i * size}" width="${size}" height="${size}" fill="rgb(${r},${g},${b})"><title>${exact(values[i * S + j])}</title></rect>`);
    }
    return `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${hgt}">${parts.join("")}</svg>`;
  };
  const tools = h("div", { class: "ax-map-tools" },
    h("button", { type: "button", class: "ax-zoom-out", title: "smaller cells", onclick: () => zoom(0.5) }, "−"),
    h("button", { type: "button", class: "ax-zoom-in", title: "bigger cells", onclick: () => zoom(2) }, "+"),
    h("button", { type: "button", class: "ax-export-png", onclick: () => canvas.toBlob((b) => download(`${name}.png`, b)) }, "PNG"),
    h("button", { type: "button", class: "ax-export-svg", onclick: () => download(`${name}.svg`, new Blob([svgOf()], { type: "image/svg+xml" })) }, "SVG"),
    h("button", { type: "button", class: "ax-export-json", onclick: () => download(`${name}.json`, new Blob([JSON.stringify({
      name, rows: m.rows, cols: m.cols, values: Array.from({ length: T }, (_, i) => Array.from(values.subarray(i * S, (i + 1) * S))),
    })], { type: "application/json" })) }, "JSON"),
    !stretch ? null : h("button", { type: "button", class: "ax-stretch", title: "colour each row on 0..its largest weight, or all on 0..1", onclick: (e) => {
      byRow = !byRow;
      e.target.textContent = byRow ? "0–1" : "rows";
      box.dataset.scale = byRow ? "rows" : "fixed";
      colour();
      draw();
      const note = byRow ? `each row scaled to its largest weight · ${legend}` : legend;
      tools.querySelector(".ax-legend").replaceWith(legendBar(false, 1, note, byRow ? "row max" : "1"));
    } }, "rows"),
    legendBar(signed, span, legend));
  box.axExport = { svg: svgOf, png: () => canvas.toDataURL("image/png") };
  box.axCellAt = (i, j) => ({ x: left + (j + 0.5) * size, y: top + (i + 0.5) * size }); // on the overlay
  if (highlight) box.dataset.highlight = `${highlight[0]},${highlight[1]}`;
  box.append(tools, scroller);
  return box;
}

// A colour legend: the gradient with its end values and what the colour means.
function legendBar(signed, span, note, top1 = "1") {
  const c = h("canvas", { width: 120, height: 10, class: "ax-legend-bar" });
  const ctx = c.getContext("2d");
  for (let x = 0; x < 120; x++) {
    const t = x / 119;
    const [r, g, b] = signed ? signedRGB((2 * t - 1) * span, span) : weightRGB(t);
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(x, 0, 1, 10);
  }
  const lo = signed ? fmt(-span) : "0", hi = signed ? fmt(span) : top1;
  return h("span", { class: "ax-legend" }, h("span", { text: lo }), c, h("span", { text: hi }),
    note ? h("span", { class: "ax-small", text: ` ${note}` }) : null);
}

// ------------------------------------------------------------------------------ the explorer
export function mountExplorer(root, transport, initial = {}) {
  const state = {
    info: null, selected: null, ablate: new Map(), busy: 0, streaming: false, closeStream: null,
    overview: null, headData: null,
  };
  root.classList.add("attnlab-explorer");
  root.dataset.busy = "0";
  root.replaceChildren();

  const errorBox = h("div", { id: "ax-error", class: "ax-error", role: "alert", hidden: true });
  const tooltipBox = h("div", { class: "ax-tooltip", hidden: true });
  const tooltip = {
    show(event, text) {
      tooltipBox.textContent = text;
      tooltipBox.hidden = false;
      tooltipBox.style.left = `${event.clientX + 12}px`;
      tooltipBox.style.top = `${event.clientY + 12}px`;
    },
    hide() { tooltipBox.hidden = true; },
  };
  const busyBox = h("span", { id: "ax-busy", class: "ax-busy", hidden: true, role: "status" });
  const header = h("header", { class: "ax-header" }, h("h1", { text: "attnlab attention explorer" }), busyBox);
  const textInput = h("textarea", { id: "ax-text", rows: 2, spellcheck: "false" });
  const sourceInput = h("textarea", { id: "ax-source", rows: 2, spellcheck: "false" });
  const runButton = h("button", { id: "ax-run", type: "button" }, "Show attention");
  const sourceRow = h("label", { class: "ax-field", hidden: true }, h("span", { text: "Source" }), sourceInput);
  const textLabel = h("span", { text: "Input" });
  const exampleNote = h("p", { id: "ax-example-note", class: "ax-small", hidden: true });
  const linkNote = h("p", { id: "ax-link-note", class: "ax-small ax-warn", role: "status", hidden: true });
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
  const seed = num("ax-seed", 0, { min: 0, step: 1 });
  const pace = num("ax-pace", 0, { min: 0, max: 2000, step: 10 });
  const streamButton = h("button", { id: "ax-continue", type: "button" }, "Continue");
  const stopButton = h("button", { id: "ax-stop", type: "button", disabled: true }, "Stop");

  const section = (id, title, equation, ...body) => h("section", { class: "ax-section", id },
    h("h2", { text: title }), equation ? h("p", { class: "ax-eq", text: equation }) : null, ...body);
  const labelled = (text, input) => h("label", { class: "ax-inline" }, h("span", { text }), input);

  const samplingControls = h("div", { class: "ax-controls" }, labelled("temperature", temperature),
    labelled("top-k", topK), labelled("top-p", topP));
  const continuation = h("div", {}, h("h3", { text: "Continuation" }), h("div", { class: "ax-controls" }, labelled("strategy", strategy),
    labelled("new tokens", maxNew), labelled("beams", beams), labelled("seed", seed),
    labelled("pace ms", pace), streamButton, stopButton), streamOut);
  const outputTitle = h("h2", { text: "Next token" });
  const outputEquation = h("p", { class: "ax-eq",
    text: "p(w_t | w_<t) = softmax(z / τ), then top-k / top-p (003 'Decoding'; attnlab.generate)" });
  const outputSection = h("section", { class: "ax-section", id: "ax-sec-next" },
    outputTitle, outputEquation, samplingControls, nextBox, continuation);
  const ablateSection = section("ax-sec-ablate", "Heads on and off", "click to switch off: head_h ← 0 in concat(head_1..head_H) W^O (004 eq. 13); every view shows the result",
    ablateBox);

  root.append(header, errorBox, linkNote,
    section("ax-sec-input", "Input", null,
      sourceRow, h("label", { class: "ax-field" }, textLabel, textInput),
      h("div", { class: "ax-controls" }, runButton, h("span", { class: "ax-small", text: "Enter runs · Shift+Enter adds a new line" })),
      exampleNote, h("h3", { text: "Tokens, as the tokenizer cut them" }), tokensBox),
    section("ax-sec-model", "Model view: every layer × head",
      "A = softmax(Q Kᵀ / √d_k + mask) per head (004 eq. 9, 13); click a map to open it", modelView),
    section("ax-sec-head", "Head view",
      "row i: how query token i distributes its attention over the keys j (each row sums to 1)",
      headControls, headView),
    section("ax-sec-walk", "One head, step by step", null, walkView),
    section("ax-sec-positions", "Positions", null, posView),
    outputSection, ablateSection, tooltipBox);

  textInput.value = initial.text || "";
  sourceInput.value = initial.source || "";
  // the sampling settings of a link (the page keeps them in the address, as below)
  const SAMPLING = { strategy, temperature, top_k: topK, top_p: topP }; // initial.sampling may hold more
  const defaults = Object.fromEntries(Object.entries(SAMPLING).map(([k, box]) => [k, box.value]));
  for (const [key, box] of Object.entries(SAMPLING)) {
    if (initial.sampling && initial.sampling[key] != null) box.value = initial.sampling[key];
  }
  for (const k of initial.ablate || []) state.ablate.set(keyOf(k), k);

  // A head of the link (site:layer:head) that this model has; the others are dropped, named.
  function headExists(sites, x) {
    const site = sites.find((s) => s.name === x.site && s.name !== "alignment");
    return Boolean(site) && Number.isInteger(x.layer) && Number.isInteger(x.head)
      && x.layer >= 0 && x.layer < site.layers && x.head >= 0 && x.head < site.heads;
  }
  function dropUnknownHeads(sites) {
    const dropped = [];
    for (const [k, x] of [...state.ablate]) {
      if (!headExists(sites, x)) { state.ablate.delete(k); dropped.push(`ablate=${k}`); }
    }
    if (dropped.length) syncUrl();
    return dropped;
  }

  // --------------------------------------------------------------------------- plumbing
  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = false;
  }
  function clearError() {
    errorBox.hidden = true;
    errorBox.textContent = "";
  }
  function showBusy() {
    root.dataset.busy = String(state.busy);
    root.dataset.streaming = state.streaming ? "true" : "false";
    const waiting = state.streaming && state.busy > 0;
    busyBox.hidden = !(state.busy > 0 || state.streaming);
    busyBox.textContent = waiting ? "waiting for the continuation (Stop it to see this view now)…"
      : state.streaming ? "generating…" : "computing…";
  }
  async function call(endpoint, payload) {
    state.busy += 1;
    showBusy();
    try {
      return await transport.call(endpoint, payload);
    } finally {
      state.busy -= 1;
      showBusy();
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
  function syncUrl() {
    if (!initial.syncUrl) return;
    const q = new URLSearchParams();
    q.set("text", textInput.value);
    if (state.info && state.info.seq2seq) q.set("source", sourceInput.value);
    if (state.selected) q.set("head", keyOf(state.selected));
    if (state.ablate.size) q.set("ablate", [...state.ablate.keys()].join(","));
    for (const [key, box] of Object.entries(SAMPLING)) if (box.value !== defaults[key]) q.set(key, box.value);
    history.replaceState(null, "", `?${q}`);
  }

  // --------------------------------------------------------------------------- views
  function drawTokens(tokens) {
    tokensBox.replaceChildren();
    for (const [side, t] of Object.entries(tokens)) {
      const row = h("div", { class: "ax-token-row", "data-side": side },
        h("span", { class: "ax-side", text: side === "target" ? (state.info.seq2seq ? "target" : "input") : side }),
        h("span", { class: "ax-small", text: `${t.ids.length} tokens` }));
      const shown = t.tokens.slice(0, 400);
      shown.forEach((tok, i) => row.append(
        h("span", { class: "ax-token", title: `id ${t.ids[i]}`, "data-id": t.ids[i] }, tok)));
      if (t.tokens.length > shown.length) row.append(h("span", { class: "ax-small", text: `… ${t.tokens.length - shown.length} more` }));
      tokensBox.append(row);
      if (t.unknown && t.unknown.length) {
        tokensBox.append(h("p", { class: "ax-small ax-warn ax-unknown", "data-side": side,
          text: `Not in the tokenizer's vocabulary, so read as <unk> (a token the model rarely saw): ${
            t.unknown.slice(0, 10).map((c) => JSON.stringify(c)).join(", ")}${t.unknown.length > 10 ? ` and ${t.unknown.length - 10} more` : ""}.` }));
      }
    }
  }

  function thumbnail(bytes, offset, t, s, scale) {
    const big = Math.max(t, s), w = Math.max(4, Math.round(64 * s / big)), hgt = Math.max(4, Math.round(64 * t / big));
    const canvas = h("canvas", { width: s, height: t, class: "ax-thumb", style: `width:${w}px;height:${hgt}px`,
      "data-scale": scale });
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(s, t);
    for (let k = 0; k < t * s; k++) {
      const [r, g, b] = weightRGB(bytes[offset + k] / 255);
      img.data[4 * k] = r; img.data[4 * k + 1] = g; img.data[4 * k + 2] = b; img.data[4 * k + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    const values = new Float32Array(t * s);
    for (let k = 0; k < t * s; k++) values[k] = (bytes[offset + k] / 255) * scale;
    canvas.axMatrix = { values, shape: [t, s] }; // what the thumbnail shows, for tests and tools
    return canvas;
  }

  function drawModelView() { keepFocus(modelView, drawModelGrid); }
  function drawModelGrid() {
    modelView.replaceChildren(h("p", { class: "ax-small" }, legendBar(false, 1,
      "each thumbnail scaled to its own largest weight, written under it, so diffuse heads stay visible; long inputs are block averages",
      "its max")));
    for (const site of state.info.sites) {
      const data = state.overview.sites[site.name];
      if (!data) continue;
      const thumbs = data.thumbs, [, t, s] = thumbs.shape, bytes = bytesOf(thumbs.data);
      const grid = h("div", { class: "ax-grid", style: `grid-template-columns: 4em repeat(${site.heads}, max-content)` },
        h("span", {}), ...Array.from({ length: site.heads }, (_, j) => h("span", { class: "ax-axis", text: `head ${j}` })));
      for (let l = 0; l < site.layers; l++) {
        grid.append(h("span", { class: "ax-axis", text: `layer ${l}` }));
        for (let hd = 0; hd < site.heads; hd++) {
          const n = l * site.heads + hd, head = { site: site.name, layer: l, head: hd };
          const classes = ["ax-cell"];
          if (state.ablate.has(keyOf(head))) classes.push("ax-off");
          grid.append(h("button", {
            type: "button", class: classes.join(" "), "data-site": site.name, "data-layer": l, "data-head": hd,
            title: `${site.label}: layer ${l}, head ${hd} (largest weight ${fmt(thumbs.scales[n])})`,
            onclick: () => select(head),
          }, thumbnail(bytes, n * t * s, t, s, thumbs.scales[n]),
            h("span", { class: "ax-thumb-max", text: `max ${thumbs.scales[n].toPrecision(2)}` })));
        }
      }
      modelView.append(h("h3", { text: site.label }), grid);
    }
    markSelected();
  }
  function markSelected() { // switching head changes two outlines, not the whole grid
    for (const b of modelView.querySelectorAll("button.ax-selected")) b.classList.remove("ax-selected");
    const sel = state.selected;
    if (!sel) return;
    const b = modelView.querySelector(`button[data-site='${sel.site}'][data-layer='${sel.layer}'][data-head='${sel.head}']`);
    if (b) b.classList.add("ax-selected");
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
    keepFocus(headControls, () => headControls.replaceChildren(
      labelled("attention", siteSel), labelled("layer", layerSel), labelled("head", headSel)));
  }

  // bertviz-style lines: query i (left) to key j (right), width and opacity ∝ A_ij; on canvas.
  function linesView(m) {
    const T = m.rows.length, S = m.cols.length, n = Math.max(T, S);
    const rowH = Math.max(2, Math.min(22, Math.floor(900 / n))), width = 360;
    const left = 110, right = width - 110;
    const canvas = h("canvas", { id: "ax-lines", class: "ax-lines", width, height: n * rowH + 10 });
    canvas.axMatrix = { ...m, shape: [T, S] };
    const ctx = canvas.getContext("2d");
    const y = (i) => i * rowH + rowH / 2 + 4;
    function draw(focus) {
      ctx.clearRect(0, 0, canvas.width, canvas.height);
      let drawn = 0;
      for (let i = 0; i < T; i++) {
        if (focus !== null && i !== focus) continue;
        for (let j = 0; j < S; j++) {
          const w = m.values[i * S + j];
          if (w < (T * S > 4096 ? 0.01 : 0.002)) continue; // invisible anyway
          ctx.strokeStyle = `rgba(31,95,191,${Math.min(1, w)})`;
          ctx.lineWidth = 1 + 5 * w;
          ctx.beginPath(); ctx.moveTo(left, y(i)); ctx.lineTo(right, y(j)); ctx.stroke();
          drawn += 1;
        }
      }
      canvas.dataset.drawn = String(drawn);
      if (rowH >= 9) {
        ctx.fillStyle = "#1d2330";
        ctx.font = "12px ui-monospace, monospace";
        ctx.textBaseline = "middle";
        ctx.textAlign = "right";
        m.rows.forEach((t, i) => ctx.fillText(String(t).slice(0, 14), left - 6, y(i)));
        ctx.textAlign = "left";
        m.cols.forEach((t, j) => ctx.fillText(String(t).slice(0, 14), right + 6, y(j)));
      }
    }
    draw(null);
    canvas.addEventListener("mousemove", (e) => {
      const r = canvas.getBoundingClientRect(), k = canvas.width / r.width; // narrow windows shrink it
      const x = (e.clientX - r.left) * k, i = Math.floor(((e.clientY - r.top) * k - 4) / rowH);
      const focus = x < left && i >= 0 && i < T ? i : null;
      if (canvas.dataset.focus !== String(focus)) { canvas.dataset.focus = String(focus); draw(focus); }
    });
    canvas.addEventListener("mouseleave", () => { canvas.dataset.focus = "null"; draw(null); });
    return canvas;
  }

  function drawHeadView() {
    const d = state.headData;
    const { values } = unpack(d.weights);
    const m = { values, rows: d.rows, cols: d.cols };
    const describe = (i, j, v) => `query ${d.rows[i]} (row ${i}) → key ${d.cols[j]} (column ${j}): ${v}`;
    const precision = d.weights.dtype === "f16" ? " · values sent as float16 at this length (3 digits)" : "";
    const neuronBox = h("div", { id: "ax-neuron", class: "ax-neuron" });
    headView.replaceChildren(
      h("div", {}, mapView(m, { id: "ax-heatmap", describe, tooltip, name: `attention-${keyOf(d.head)}`,
        legend: `attention weight A_ij${precision}; click a cell for its neuron view`,
        onPick: d.head.site === "alignment" ? null : (i, j) => guarded(() => drawNeuron(neuronBox, i, j)) }), neuronBox),
      h("div", {}, h("p", { class: "ax-small", text: "lines: width and opacity ∝ attention weight; hover a query token" }),
        linesView(m)));
    headView.dataset.head = keyOf(d.head);
    // the neuron view opens on the last query's strongest key
    const T = d.rows.length, S = d.cols.length;
    let best = 0;
    for (let j = 1; j < S; j++) if (values[(T - 1) * S + j] > values[(T - 1) * S + best]) best = j;
    if (d.head.site !== "alignment") guarded(() => drawNeuron(neuronBox, T - 1, best));
  }

  // bertviz's neuron view: q_i, k_j and q_i ∘ k_j (its sum is the score), then scale, softmax.
  async function drawNeuron(box, i, j) {
    const sel = state.selected;
    const d = await latest("neuron", "neuron", request({ ...sel, query: i, key: j, ablate: ablateList() }));
    if (!d) return;
    const dk = d.q.length, values = new Float32Array(3 * dk);
    values.set(d.q, 0); values.set(d.k, dk); values.set(d.product, 2 * dk);
    const rot = d.rotated ? " (rotated by RoPE)" : "";
    box.dataset.query = String(d.query);
    box.dataset.key = String(d.key);
    box.replaceChildren(
      h("h3", { text: `Neuron view: query ${d.query} "${d.query_token}" → key ${d.key} "${d.key_token}"` }),
      mapView({ values, rows: [`q_${d.query}`, `k_${d.key}`, "q∘k"], cols: Array.from({ length: dk }, (_, c) => `d${c}`) }, {
        id: "ax-neuron-map", signed: true, cell: 22, fit: 500, tooltip, name: `neuron-${d.query}-${d.key}`,
        legend: `value (red +, blue −)${rot}`, describe: (r, c, v) => `${["q", "k", "q∘k"][r]}[${c}] = ${v}`,
      }),
      h("p", { class: "ax-eq", id: "ax-neuron-sum",
        text: `Σ q∘k = q·k = ${fmt(d.score)}; scaled = ${d.scaled_equation} = ${fmt(d.scaled)} → softmax over row ${d.query} → A = ${fmt(d.weight)}` }));
  }

  async function drawHead() {
    const sel = state.selected;
    const data = await latest("head", "head", request({ ...sel, ablate: ablateList() }));
    if (!data) return;
    state.headData = data;
    drawHeadView();
    drawHeadControls();
    markSelected();
    syncUrl();
  }

  async function drawWalkthrough() {
    const sel = state.selected;
    const data = await latest("walkthrough", "walkthrough", request({ ...sel, ablate: ablateList(), compact: true }));
    if (!data) return;
    walkView.replaceChildren();
    walkView.dataset.head = keyOf(data.head);
    walkView.dataset.ablate = JSON.stringify(data.ablated);
    if (data.module) walkView.append(h("p", { class: "ax-small", text: `module ${data.module}` }));
    const steps = data.steps.map((s) => ({ ...s, m: s.shape.length ? unpack(s.values) : null }));
    // Q Kᵀ and its scaled version share one colour scale, so the scaling step shows.
    let shared = 0;
    for (const s of steps) if (["scores", "scaled"].includes(s.key)) for (const v of s.m.values) shared = Math.max(shared, Math.abs(v));
    for (const step of steps) {
      const card = h("div", { class: "ax-step", "data-step": step.key },
        h("h3", { text: step.title }), h("p", { class: "ax-eq", text: step.equation }),
        h("p", { class: "ax-note", text: step.note }),
        step.shape.length ? h("p", { class: "ax-small", text: `shape ${step.shape.join(" × ")}` }) : null);
      if (step.m) {
        const weights = ["A", "mask", "alpha"].includes(step.key);
        const both = ["scores", "scaled"].includes(step.key);
        card.append(mapView({ values: step.m.values, rows: step.rows, cols: step.cols }, {
          id: `ax-step-${step.key}`, signed: !weights, span: both ? shared : null, cell: 18, fit: 500,
          highlight: step.highlight || null, tooltip, name: `step-${step.key}`,
          legend: both ? "shared scale for Q Kᵀ and scaled: the scaling shrinks every value by 1/√d_k"
            : step.key === "mask" ? "1 = may attend, 0 = may not" : weights ? "weight" : "value (red +, blue −)",
          stretch: weights && step.key !== "mask", // a 0/1 mask has no row scale to stretch
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
        const m = unpack(v.values);
        const cols = v.cols;
        const rows = v.tokens.map((t, i) => `${i}: ${t}`);
        card.append(mapView({ values: m.values, rows, cols }, {
          id: `ax-pos-${v.side}`, signed: true, cell: 14, tooltip, name: `positions-${v.side}`, legend: "value (red +, blue −)",
          describe: (i, j, x) => `position ${i}, ${cols[j]}: ${x}`,
        }));
      }
      posView.append(card);
    }
  }

  function candidatesTable(candidates, labels, id, ablated) {
    const table = h("table", { class: "ax-next", id, "data-ablate": JSON.stringify(ablated) },
      h("tr", {}, h("th", { text: labels ? "class" : "token" }), h("th", { text: "id" }),
        h("th", { text: labels ? "p(c | x)" : "p = softmax(z)" }),
        labels ? null : h("th", { text: "p after τ, top-k, top-p" })));
    const bar = (p, cls) => h("span", { class: cls, style: `width:${Math.round(120 * p)}px` });
    for (const c of candidates) {
      table.append(h("tr", { "data-id": c.id },
        h("td", { class: "ax-token-cell", text: c.token }), h("td", { text: c.id }),
        h("td", { "data-p": c.p }, bar(c.p, "ax-bar"), ` ${fmt(c.p)}`),
        h("td", { "data-p-sample": c.p_sample, hidden: labels }, bar(c.p_sample, "ax-bar ax-bar2"), ` ${fmt(c.p_sample)}`)));
    }
    return table;
  }

  // A number box's value, or an error naming it: an empty (or unreadable) box is not 0, and a
  // whole-number box takes no fraction and nothing JSON cannot carry exactly (2^53 and beyond).
  function valueOf(input, label, whole = false) {
    const v = input.value.trim() === "" ? NaN : Number(input.value);
    if (!Number.isFinite(v)) throw new Error(`${label}: give a number (the box is empty or holds no number).`);
    if (whole && !Number.isSafeInteger(v)) throw new Error(`${label} must be a whole number below 2^53, got ${input.value}.`);
    return v;
  }
  const sampling = () => ({
    temperature: valueOf(temperature, "temperature"), top_k: valueOf(topK, "top-k", true),
    top_p: valueOf(topP, "top-p"),
  });

  async function drawNext() {
    const data = await latest("next", "next", request({ ...sampling(), ablate: ablateList() }));
    if (!data) return;
    const output = state.info.output;
    if (output === "masks") {
      nextBox.replaceChildren(...data.masks.map((mk, k) => h("div", { class: "ax-mask", "data-position": mk.position },
        h("h4", { text: `mask ${k + 1} (position ${mk.position})` }),
        candidatesTable(mk.candidates, false, k === 0 ? "ax-next-table" : `ax-next-table-${k}`, data.ablated))));
      return;
    }
    nextBox.replaceChildren(candidatesTable(data.candidates, output === "labels", "ax-next-table", data.ablated));
  }

  // Rebuilding a box must not drop a keyboard user's focus to <body>: refocus the element that
  // plays the same part in the new contents (the same id, or the same site/layer/head).
  function keepFocus(box, rebuild) {
    const was = document.activeElement;
    let key = null;
    if (was && box.contains(was)) {
      const d = was.dataset || {};
      key = was.id ? `#${was.id}` : d.site !== undefined
        ? `${was.tagName.toLowerCase()}[data-site='${d.site}'][data-layer='${d.layer}'][data-head='${d.head}']` : null;
    }
    rebuild();
    const again = key && box.querySelector(key);
    if (again) again.focus();
  }

  function drawAblation() { keepFocus(ablateBox, drawAblationGrid); }
  function drawAblationGrid() {
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
      let tokens;
      try {
        tokens = await call("tokens", request());
      } catch (err) { // the input cannot be read: no view may go on showing the previous one
        for (const view of [tokensBox, modelView, headView, walkView, posView, nextBox]) view.replaceChildren();
        state.overview = null;
        throw err;
      }
      drawTokens(tokens);
      const first = state.info.sites[0];
      if (first && !state.selected) state.selected = { site: first.name, layer: 0, head: 0 };
      let failure = null;
      if (state.selected) { // the head view first: one forward pass (fused attention) + one module
        try {
          await drawHead(); // the server checks the head exists
        } catch (err) {
          state.selected = null;
          failure = err;
        }
      }
      const overview = await latest("overview", "overview", request({ ablate: ablateList() }));
      if (!overview) return;
      state.overview = overview;
      drawModelView();
      const work = [drawPositions()];
      if (state.selected) work.push(drawWalkthrough());
      if (state.info.output) work.push(drawNext());
      for (const r of await Promise.allSettled(work)) if (r.status === "rejected" && !failure) failure = r.reason;
      syncUrl();
      if (failure) throw failure;
    });
  }

  async function select(head) {
    const previous = state.selected;
    state.selected = head;
    await guarded(async () => {
      clearError();
      try {
        await drawHead(); // the head view first; the walkthrough follows
      } catch (err) {
        state.selected = previous;
        throw err;
      }
      await drawWalkthrough();
    });
  }

  async function toggleHead(head) {
    const k = keyOf(head);
    if (state.ablate.has(k)) state.ablate.delete(k);
    else state.ablate.set(k, head);
    drawAblation();
    await guarded(async () => {
      clearError();
      const work = [];
      if (state.info.output) work.push(drawNext());
      const overview = await latest("overview", "overview", request({ ablate: ablateList() }));
      if (overview) {
        state.overview = overview;
        drawModelView();
      }
      if (state.selected) {
        await drawHead();
        await drawWalkthrough();
      }
      for (const r of await Promise.allSettled(work)) if (r.status === "rejected") throw r.reason;
      syncUrl();
    });
  }

  function endStream(status) {
    state.streaming = false;
    state.closeStream = null;
    stopButton.disabled = true;
    streamOut.dataset.state = status;
    showBusy();
  }

  function startStream() {
    if (state.closeStream) state.closeStream();
    clearError();
    streamOut.replaceChildren();
    streamOut.dataset.state = "streaming";
    let params;
    try { // read every box before anything starts: a bad one is named, not a lost connection
      params = request({
        strategy: strategy.value, max_new_tokens: valueOf(maxNew, "new tokens", true), ...sampling(),
        beams: valueOf(beams, "beams", true), seed: valueOf(seed, "seed", true),
        pace_ms: valueOf(pace, "pace ms"), ablate: ablateList(),
      });
    } catch (err) {
      streamOut.dataset.state = "error";
      showError(err.message);
      return;
    }
    streamOut.append(h("p", { class: "ax-small", id: "ax-stream-from", text: state.info.seq2seq
      ? `continues from <bos> for the source ${JSON.stringify(params.source)} (the target prefix is not used)`
      : `continues ${JSON.stringify(params.text)}` }));
    let count = 0;
    stopButton.disabled = false;
    state.streaming = true;
    showBusy();
    state.closeStream = transport.stream(params, (event) => {
      if (event.type === "token") {
        count += 1;
        streamOut.append(h("span", { class: "ax-token ax-new", "data-id": event.id, "data-index": count - 1,
          "data-t": performance.now().toFixed(1) }, event.token));
        streamOut.dataset.count = String(count);
      } else if (event.type === "done") {
        endStream("done");
        streamOut.append(h("p", { class: "ax-small", id: "ax-stream-text", text: `text: ${JSON.stringify(event.text)}` }));
      } else if (event.type === "stopped") {
        endStream("stopped");
      } else {
        endStream("error");
        showError(event.error);
      }
    });
  }

  // --------------------------------------------------------------------------- start
  runButton.addEventListener("click", run);
  for (const input of [textInput, sourceInput]) {
    input.addEventListener("keydown", (e) => { // Enter runs; Shift+Enter is a new line
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); run(); }
    });
    input.addEventListener("input", () => { exampleNote.hidden = true; }); // no longer the example
  }
  streamButton.addEventListener("click", startStream);
  stopButton.addEventListener("click", () => {
    if (state.closeStream) state.closeStream();
    endStream("stopped");
  });
  for (const input of [temperature, topK, topP]) {
    input.addEventListener("change", () => guarded(async () => { clearError(); await drawNext(); syncUrl(); }));
  }
  strategy.addEventListener("change", syncUrl);
  guarded(async () => {
    state.info = await call("info");
    const info = state.info;
    header.append(h("p", { class: "ax-model", id: "ax-model" },
      `${info.name} · ${info.kind} · ${info.sites.map((s) => `${s.label} ${s.layers}×${s.heads}`).join(", ") || "no attention"}`));
    sourceRow.hidden = !info.seq2seq;
    textLabel.textContent = info.seq2seq ? "Target prefix (decoder input after <bos>)" : "Input";
    outputSection.hidden = !info.output;
    ablateSection.hidden = !info.sites.some((s) => s.name !== "alignment");
    continuation.hidden = !info.generative;
    samplingControls.hidden = info.output !== "tokens";
    if (info.output === "labels") {
      outputTitle.textContent = "Prediction";
      outputEquation.textContent = "p(c | x) = softmax(W pool(h) + b) over the classes (003 'Encoder-only Models')";
    } else if (info.output === "masks") {
      outputTitle.textContent = "Masked tokens";
      outputEquation.textContent = "p(w_i | text) = softmax(logits_i) at every [MASK] position i (BERT's masked LM; attnlab generate fills them the same way)";
    }
    const dropped = dropUnknownHeads(info.sites);
    drawAblation();
    if (initial.head) {
      const [site, layer, head] = String(initial.head).split(":");
      const chosen = { site, layer: +layer, head: +head };
      if (headExists(info.sites, chosen)) state.selected = chosen;
      else dropped.push(`head=${initial.head}`);
    }
    if (dropped.length) { // a link from another model, or edited by hand: keep what fits
      linkNote.textContent = `Ignored from the link: ${dropped.join(", ")} (this model has ${
        info.sites.map((s) => `${s.name} layers 0-${s.layers - 1} × heads 0-${s.heads - 1}`).join(", ")}).`;
      linkNote.hidden = false;
    }
    if (!textInput.value && !sourceInput.value && info.example) { // first contact: an example
      textInput.value = info.example.text;
      sourceInput.value = info.example.source;
      exampleNote.textContent = `Example input${info.example.note ? `: ${info.example.note}` : ""}`;
      exampleNote.hidden = false;
    }
    root.dataset.ready = "true";
    if (textInput.value || (info.seq2seq && sourceInput.value)) await run();
  });
  return { run, select, toggleHead, startStream, state };
}
