/* opdiff report: draws the page from the JSON block written by opdiff/report/html.py.
   Data reaches the page only through textContent and attribute setters, never innerHTML, so
   names, paths and source code from a dump cannot become markup. */
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("opdiff-data").textContent);
  var S = D.strings, OPS = D.ops, ROWS = D.rows, METRICS = D.metrics, STATS = D.stat_keys;
  var TREE = D.tree || [];
  var SVG = "http://www.w3.org/2000/svg";
  var SEV = { pass: 0, unmatched: 1, warning: 2, error: 3 };
  var SEV_NAME = ["pass", "unmatched", "warning", "error"];
  var SEV_COLOR = ["#43a047", "#9aa1ab", "#e0a100", "#c62828"];
  var culpritRows = D.divergence ? D.divergence.rows : [];
  var culpritSet = {};
  culpritRows.forEach(function (r) { culpritSet[r] = true; });

  /* ---------- small helpers ---------- */
  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function str(i) { return i === null || i === undefined ? null : S[i]; }
  function num(v) {
    if (typeof v === "string") {
      return v === "Infinity" ? Infinity : v === "-Infinity" ? -Infinity : NaN;
    }
    return v === undefined ? null : v;
  }
  function fmt(v) {
    v = num(v);
    if (v === null) return "";
    if (typeof v !== "number") return String(v);
    if (isNaN(v)) return "NaN";
    if (!isFinite(v)) return v > 0 ? "inf" : "-inf";
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (Number.isInteger(v) && a < 1e9) return String(v);
    if (a < 1e-3 || a >= 1e6) return v.toExponential(3);
    return String(parseFloat(v.toPrecision(5)));
  }
  function fmtCosine(v) {
    v = num(v);
    if (typeof v !== "number" || !isFinite(v) || v === 1 || v < 0.999) return fmt(v);
    // Near 1 the information is in the far digits: show enough of them to read 1 - cosine.
    var digits = Math.min(12, Math.max(6, Math.ceil(-Math.log10(1 - v)) + 2));
    return v.toFixed(digits);
  }
  function fmtMetric(name, v) { return name === "Cosine" ? fmtCosine(v) : fmt(v); }
  function fmtCount(n) { return Number(n).toLocaleString("en-US"); }
  function basename(p) { var s = String(p || ""); var i = Math.max(s.lastIndexOf("/"), s.lastIndexOf("\\")); return s.slice(i + 1); }

  /* ---------- row accessors (see build_payload in html.py for the layout) ---------- */
  function opOf(r) { return OPS[ROWS[r][0]]; }
  function opName(r) { return S[OPS[ROWS[r][0]][0]]; }
  function opIndex(r) { return OPS[ROWS[r][0]][1]; }
  function phaseOf(r) { return str(OPS[ROWS[r][0]][2]) || ""; }
  function kindOf(r) { return str(OPS[ROWS[r][0]][3]) || ""; }
  function nodeOf(r) { return OPS[ROWS[r][0]][4]; }
  function decodeName(enc, r) {
    if (enc === null || enc === undefined) return null;
    return typeof enc === "string" ? enc : opName(r) + "." + enc[0];
  }
  function targetName(r) { return decodeName(ROWS[r][1], r); }
  function goldenName(r) { var g = ROWS[r][2]; return g === 1 ? targetName(r) : decodeName(g, r); }
  function displayName(r) { return targetName(r) || goldenName(r) || opName(r); }
  function roleOf(r) { return str(ROWS[r][3]) || ""; }
  function resultOf(r) { return str(ROWS[r][8]) || ""; }
  function severity(r) { var s = SEV[resultOf(r)]; return s === undefined ? 1 : s; }
  function metricAt(r, m) { var a = ROWS[r][12]; return a ? num(a[m]) : null; }
  function shapeText(i) { return i === null || i === undefined ? "" : "[" + D.shapes[i].join(", ") + "]"; }
  function dtypeText(r) {
    var t = str(ROWS[r][4]), g = str(ROWS[r][5]);
    if (t === g) return t || "";
    return (t || "\u2013") + " / " + (g || "\u2013");
  }
  function shapeOf(r) {
    var t = ROWS[r][6], g = ROWS[r][7];
    if (g === t || g === null) return shapeText(t);
    if (t === null) return shapeText(g);
    return shapeText(t) + " / " + shapeText(g);
  }
  function stackOf(r) { var s = ROWS[r][11]; return s === null ? [] : D.stacks[s]; }
  function nodePath(n) {
    var parts = [];
    for (; n >= 0; n = TREE[n][0]) if (TREE[n][0] >= 0) parts.unshift(S[TREE[n][1]]);
    return parts.join(".") || "(model)";
  }
  function metricIndex(name) { return METRICS.indexOf(name); }

  /* ---------- header ---------- */
  function renderHeader() {
    var inner = el("div", "inner");
    inner.appendChild(el("h1", null, D.title || "opdiff"));
    var runs = el("div", "runs");
    runs.appendChild(el("b", null, "target"));
    var t = el("span", "mono", D.target); t.title = D.target || ""; runs.appendChild(t);
    runs.appendChild(el("b", null, "golden"));
    var g = el("span", "mono", D.golden); g.title = D.golden || ""; runs.appendChild(g);
    inner.appendChild(runs);
    var where = [];
    if (D.step !== null && D.step !== undefined) where.push("step " + D.step);
    if (D.rank !== null && D.rank !== undefined) where.push("rank " + D.rank);
    if (where.length) inner.appendChild(el("span", "muted", where.join(" \u00b7 ")));
    var counts = el("div", "counts");
    ["error", "warning", "pass", "unmatched"].forEach(function (k) {
      var n = (D.counts || {})[k];
      if (n === undefined || n === null) return;
      counts.appendChild(el("span", "pill " + k, fmtCount(n) + " " + k));
    });
    inner.appendChild(counts);
    var files = el("div", "files");
    Object.keys(D.files || {}).forEach(function (k) {
      if (k === "html") return;
      var a = el("a", null, D.files[k]);
      a.href = "./" + encodeURIComponent(D.files[k]);
      files.appendChild(a);
    });
    if (files.childNodes.length) inner.appendChild(files);
    $("header").appendChild(inner);
  }

  /* ---------- verdict ---------- */
  function sourceBlock(loc, context) {
    var file = loc[0], line = loc[1], code = loc[2], func = loc[3];
    var box = el("div", "source");
    box.appendChild(el("div", "file", (file || "?") + ":" + (line === null ? "?" : line) +
                                      (func ? "   in " + func : "")));
    var lines = context && context.length ? context : (code ? [[line, code]] : []);
    lines.forEach(function (l) {
      var row = el("div", "ln" + (l[0] === line ? " hit" : ""));
      row.appendChild(el("span", "no", l[0]));
      row.appendChild(el("span", "tx", l[1]));
      box.appendChild(row);
    });
    return box;
  }

  function metricsTable(columns) {
    // columns: [[heading, metrics dict]]; one row per metric present in any of them.
    var names = [];
    columns.forEach(function (c) {
      Object.keys(c[1] || {}).forEach(function (k) {
        if (c[1][k] !== null && names.indexOf(k) < 0) names.push(k);
      });
    });
    var order = METRICS.concat(names.filter(function (n) { return METRICS.indexOf(n) < 0; }));
    names = order.filter(function (n) { return names.indexOf(n) >= 0; });
    var t = el("table", "kv"), head = el("tr");
    head.appendChild(el("th", null, "metric"));
    columns.forEach(function (c) { var th = el("th", null, c[0]); th.style.textAlign = "right"; head.appendChild(th); });
    t.appendChild(head);
    names.forEach(function (n) {
      var tr = el("tr");
      tr.appendChild(el("td", null, n));
      var first = columns[0][1] ? fmtMetric(n, columns[0][1][n]) : "";
      columns.forEach(function (c, i) {
        var v = c[1] ? c[1][n] : null, text = v === undefined ? "" : fmtMetric(n, v);
        // mark the output's metrics that moved away from the input's
        tr.appendChild(el("td", "num" + (c[2] && text !== first ? " bad" : ""), text));
      });
      t.appendChild(tr);
    });
    return names.length ? t : el("p", "muted", "No metrics recorded for this op.");
  }

  function environmentBlock(box) {
    box.appendChild(el("h3", null, "Environment differences"));
    var env = D.environment_diff || [];
    if (!env.length) {
      box.appendChild(el("p", "muted", "None recorded: both runs report the same environment."));
      return;
    }
    var t = el("table", "kv"), head = el("tr");
    ["", "target", "golden"].forEach(function (h) { head.appendChild(el("th", null, h)); });
    t.appendChild(head);
    env.forEach(function (e) {
      var tr = el("tr");
      tr.appendChild(el("td", null, e.key));
      tr.appendChild(el("td", "envval", e.target === null ? "\u2013" : e.target));
      tr.appendChild(el("td", "envval", e.golden === null ? "\u2013" : e.golden));
      t.appendChild(tr);
    });
    box.appendChild(t);
  }

  function pairsBlock(box) {
    var pairs = D.pairs || [];
    if (!pairs.length) return;
    box.appendChild(el("h3", null, "Step / rank pairs"));
    var keys = [];
    pairs.forEach(function (p) { Object.keys(p).forEach(function (k) { if (keys.indexOf(k) < 0) keys.push(k); }); });
    var t = el("table", "kv"), head = el("tr");
    keys.forEach(function (k) { head.appendChild(el("th", null, k)); });
    t.appendChild(head);
    pairs.forEach(function (p) {
      var tr = el("tr");
      keys.forEach(function (k) {
        var v = p[k];
        tr.appendChild(el("td", null, v === null || v === undefined ? "" :
                                      typeof v === "object" ? JSON.stringify(v) : fmt(v)));
      });
      t.appendChild(tr);
    });
    box.appendChild(t);
  }

  function notesBlock(box) {
    // With a culprit, the verdict line only repeats the reason and the source line shown above.
    if (D.verdict && !D.divergence) box.appendChild(el("p", "summary", D.verdict));
    if (!D.notes || !D.notes.length) return;
    var ul = el("ul", "notes");
    D.notes.forEach(function (n) { ul.appendChild(el("li", null, n)); });
    box.appendChild(ul);
  }

  function renderVerdict() {
    var box = $("verdict"), d = D.divergence;
    var grid = el("div", "grid"), left = el("div"), right = el("div");
    grid.appendChild(left); grid.appendChild(right);
    if (!d) {
      box.className = "card clean";
      left.appendChild(el("div", "label", "Verdict"));
      left.appendChild(el("div", "culprit", "No divergence"));
      var c = D.counts || {};
      left.appendChild(el("p", "reason", (c.error ?
        fmtCount(c.error) + " tensors exceed their tolerance, but no op was found whose inputs agree with golden while its outputs do not." :
        "No op was found whose outputs part from golden: every compared tensor is within the tolerance of its dtype.")));
      notesBlock(left);
      environmentBlock(right);
      pairsBlock(right);
      box.appendChild(grid);
      return;
    }
    box.className = "card diverged";
    left.appendChild(el("div", "label", "First divergence"));
    left.appendChild(el("div", "culprit", d.name));
    var meta = el("div", "where");
    if (d.phase) meta.appendChild(el("span", "pill phase", d.phase));
    var bits = [];
    if (d.op) bits.push("op " + d.op);
    if (d.module) bits.push("in " + d.module);
    if (d.step !== null && d.step !== undefined) bits.push("step " + d.step);
    if (d.rank !== null && d.rank !== undefined) bits.push("rank " + d.rank);
    meta.appendChild(document.createTextNode(" " + bits.join(" \u00b7 ")));
    left.appendChild(meta);
    left.appendChild(el("p", "reason", d.reason));
    notesBlock(left);
    if (d.location) {
      left.appendChild(el("h3", null, "Your code"));
      left.appendChild(sourceBlock(d.location, d.context));
    } else {
      left.appendChild(el("p", "muted", "No source line was recorded for this op."));
    }
    if (culpritRows.length) {
      var jump = el("button", "jump", "Show in table");
      jump.type = "button";
      jump.addEventListener("click", function () { table.jumpTo(culpritRows[0], true); });
      left.appendChild(jump);
    }
    right.appendChild(el("h3", null, "Inputs agree, outputs do not"));
    right.appendChild(metricsTable([["worst input", d.input_metrics],
                                    [d.tensor && d.tensor.indexOf(d.name + ".") === 0 ? d.tensor.slice(d.name.length + 1) : "worst output", d.metrics, true]]));
    environmentBlock(right);
    pairsBlock(right);
    box.appendChild(grid);
  }

  /* ---------- chart: error along execution order ---------- */
  function chartSeries() {
    var series = [];
    for (var r = 0; r < ROWS.length; r++) {
      if (ROWS[r][15] !== undefined && ROWS[r][15] !== null) {
        // The error the verdicts were judged on: relative L2, immune to near-zero elements.
        series.push({ get: function (r) { var v = ROWS[r][15]; return v === undefined ? null : num(v); },
                      label: "relative error \u2016t\u2212g\u2016/max(\u2016t\u2016,\u2016g\u2016)", color: "#1d4ed8" });
        break;
      }
    }
    var rel = series.length ? [] : ["RelEuclideanDistance", "MaxRelativeErr", "MeanRelativeErr", "MaxAbsErr"];
    var labels = { RelEuclideanDistance: "relative error \u2016t\u2212g\u2016/\u2016g\u2016",
                   MaxRelativeErr: "max relative error", MeanRelativeErr: "mean relative error",
                   MaxAbsErr: "max absolute error" };
    rel.some(function (name) {
      var m = metricIndex(name);
      if (m < 0) return false;
      series.push({ get: function (r) { return metricAt(r, m); }, label: labels[name], color: "#1d4ed8" });
      return true;
    });
    var cos = metricIndex("Cosine");
    if (cos >= 0) {
      series.push({ get: function (r) { var v = metricAt(r, cos); return v === null ? null : 1 - v; },
                    label: "1 \u2212 cosine", color: "#c2410c" });
    }
    return series;
  }

  function renderChart() {
    var host = $("chart"), series = chartSeries();
    if (!ROWS.length) { host.appendChild(el("p", "muted", "No tensors were compared.")); return; }
    // Per op: worst value of each series over its outputs, worst verdict over all its tensors.
    var lo = Infinity, hi = -Infinity;
    for (var r = 0; r < ROWS.length; r++) { var x = opIndex(r); if (x < lo) lo = x; if (x > hi) hi = x; }
    var W = Math.max(640, host.clientWidth || 1200), H = 300;
    var ml = 58, mr = 18, mt = 26, mb = 58, pw = W - ml - mr, ph = H - mt - mb;
    var nb = Math.max(1, Math.min(hi - lo + 1, Math.floor(pw)));
    var span = hi - lo + 1;
    var B = [];
    for (var b = 0; b < nb; b++) B.push(null);
    function bucketOf(x) { return Math.min(nb - 1, Math.floor((x - lo) * nb / span)); }
    var vmin = Infinity, vmax = -Infinity, bad = false;
    for (r = 0; r < ROWS.length; r++) {
      var bi = bucketOf(opIndex(r)), bk = B[bi];
      if (!bk) bk = B[bi] = { v: series.map(function () { return null; }), sev: 0, op: r, opSev: -1, back: 0, fwd: 0 };
      var sev = severity(r);
      if (sev > bk.sev) bk.sev = sev;
      if (phaseOf(r) === "backward") bk.back++; else bk.fwd++;
      var plotted = roleOf(r) === "output" || kindOf(r) === "param_grad";
      if (!plotted) continue;
      if (sev > bk.opSev) { bk.opSev = sev; bk.op = r; }
      for (var s = 0; s < series.length; s++) {
        var v = series[s].get(r);
        if (v === null) continue;
        if (isNaN(v) || v === Infinity || v === -Infinity) { v = Infinity; bad = true; }
        else if (v < 0) v = 0;
        if (bk.v[s] === null || v > bk.v[s] || isNaN(bk.v[s])) bk.v[s] = v;
        if (v > 0 && isFinite(v)) { if (v < vmin) vmin = v; if (v > vmax) vmax = v; }
      }
    }
    // A series that is zero everywhere (cosine rounded to 1, say) is only a line on the floor.
    var keep = series.map(function (s, si) { return B.some(function (bk) { return bk && bk.v[si] > 0; }); });
    if (keep.some(Boolean)) {
      series = series.filter(function (s, si) { return keep[si]; });
      B.forEach(function (bk) { if (bk) bk.v = bk.v.filter(function (v, si) { return keep[si]; }); });
    }
    var y0 = -8, y1 = 0;
    if (vmin <= vmax) {
      y0 = Math.max(-16, Math.floor(Math.log10(vmin)));
      y1 = Math.max(y0 + 1, Math.ceil(Math.log10(vmax)));
    }
    if (bad) y1 += 1;
    function X(b) { return ml + (b + 0.5) * pw / nb; }
    function Y(v) {
      var l = v === Infinity ? y1 : v <= 0 ? y0 : Math.min(y1, Math.max(y0, Math.log10(v)));
      return mt + ph - (l - y0) / (y1 - y0) * ph;
    }

    var legend = el("div", "legend");
    series.forEach(function (s) {
      var it = el("span"), sw = el("i"); sw.style.borderTopColor = s.color;
      it.appendChild(sw); it.appendChild(document.createTextNode(s.label)); legend.appendChild(it);
    });
    var bw = el("span"), bi2 = el("i", "dash"); bi2.style.borderTopColor = "#59636e";
    bw.appendChild(bi2); bw.appendChild(document.createTextNode("backward (dashed, shaded)")); legend.appendChild(bw);
    var strip = el("span"); strip.appendChild(document.createTextNode("log scale (0 at the bottom) \u00b7 bar under the axis: worst verdict per op"));
    legend.appendChild(strip);
    host.appendChild(legend);

    var svg = sv("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "error per op along execution order", id: "chart-svg" });
    // backward regions
    var runStart = -1;
    for (b = 0; b <= nb; b++) {
      var isBack = b < nb && B[b] && B[b].back > B[b].fwd;
      var isFwd = b < nb && B[b] && !isBack;
      if (isBack && runStart < 0) runStart = b;
      if ((isFwd || b === nb) && runStart >= 0) {
        var x0 = ml + runStart * pw / nb, x1 = ml + b * pw / nb;
        svg.appendChild(sv("rect", { x: x0, y: mt, width: Math.max(1, x1 - x0), height: ph, fill: "#eef1f5", "class": "backward-band" }));
        if (x1 - x0 > 60) svg.appendChild(sv("text", { x: x1 - 4, y: mt + ph - 5, "text-anchor": "end", fill: "#8b949e" }, "backward"));
        runStart = -1;
      }
    }
    // grid and y labels, one per decade (every second one when there are many)
    var step = y1 - y0 > 10 ? 2 : 1;
    for (var e = y0; e <= y1; e += step) {
      var yy = Y(Math.pow(10, e));
      svg.appendChild(sv("line", { x1: ml, x2: ml + pw, y1: yy, y2: yy, stroke: "#e3e7eb" }));
      svg.appendChild(sv("text", { x: ml - 6, y: yy + 4, "text-anchor": "end", fill: "#59636e" }, e === 0 ? "1" : "1e" + e));
    }
    // x ticks in op index
    var nt = Math.min(10, span), tickStep = Math.max(1, Math.ceil(span / nt));
    var mag = Math.pow(10, Math.floor(Math.log10(tickStep)));
    tickStep = Math.ceil(tickStep / mag) * mag;
    for (var t = Math.ceil(lo / tickStep) * tickStep; t <= hi; t += tickStep) {
      var tx = X(bucketOf(t));
      svg.appendChild(sv("line", { x1: tx, x2: tx, y1: mt + ph, y2: mt + ph + 4, stroke: "#8b949e" }));
      svg.appendChild(sv("text", { x: tx, y: mt + ph + 28, "text-anchor": "middle", fill: "#59636e" }, String(t)));
    }
    svg.appendChild(sv("text", { x: ml + pw / 2, y: H - 6, "text-anchor": "middle", fill: "#59636e" }, "op index in execution order"));
    svg.appendChild(sv("line", { x1: ml, x2: ml + pw, y1: mt + ph, y2: mt + ph, stroke: "#8b949e" }));
    // verdict strip under the axis, merged into runs of one colour
    var sy = mt + ph + 6, runS = 0;
    for (b = 1; b <= nb; b++) {
      var prev = B[runS] ? B[runS].sev : -1, cur = b < nb ? (B[b] ? B[b].sev : -1) : -2;
      if (cur !== prev) {
        if (prev >= 0) svg.appendChild(sv("rect", { x: ml + runS * pw / nb, y: sy, width: Math.max(1, (b - runS) * pw / nb), height: 8, fill: SEV_COLOR[prev], "class": "strip-" + SEV_NAME[prev] }));
        runS = b;
      }
    }
    // the curves: one path per series and phase, so backward can be dashed
    series.forEach(function (s, si) {
      var d = { forward: "", backward: "" }, last = null, pts = [];
      for (var b = 0; b < nb; b++) {
        var bk = B[b];
        if (!bk || bk.v[si] === null) continue;
        var ph2 = bk.back > bk.fwd ? "backward" : "forward";
        var px = X(b).toFixed(1), py = Y(bk.v[si]).toFixed(1);
        d[ph2] += (last === ph2 ? "L" : "M") + px + " " + py;
        last = ph2;
        pts.push([px, py]);
      }
      ["forward", "backward"].forEach(function (p) {
        if (!d[p]) return;
        var attrs = { d: d[p], fill: "none", stroke: s.color, "stroke-width": 1.6, "stroke-linejoin": "round", "class": "series series-" + si + " " + p };
        if (p === "backward") attrs["stroke-dasharray"] = "5 3";
        svg.appendChild(sv("path", attrs));
      });
      if (pts.length <= 400) {
        var g = sv("g", { fill: s.color });
        pts.forEach(function (pt) { g.appendChild(sv("circle", { cx: pt[0], cy: pt[1], r: 2.2 })); });
        svg.appendChild(g);
      }
    });
    // the culprit
    if (culpritRows.length) {
      var cb = bucketOf(opIndex(culpritRows[0])), cx = X(cb);
      svg.appendChild(sv("line", { x1: cx, x2: cx, y1: mt - 4, y2: mt + ph + 14, stroke: "#c62828", "stroke-width": 1.5, "stroke-dasharray": "4 3", id: "chart-culprit" }));
      var right = cx > ml + pw * 0.6;
      svg.appendChild(sv("text", { x: right ? cx - 6 : cx + 6, y: mt - 8, "text-anchor": right ? "end" : "start", fill: "#c62828", "font-weight": "700" },
                         "first divergence: " + D.divergence.name));
    }
    // hover and click
    var guide = sv("line", { x1: 0, x2: 0, y1: mt, y2: mt + ph, stroke: "#1f2328", "stroke-opacity": 0.35, visibility: "hidden" });
    svg.appendChild(guide);
    var overlay = sv("rect", { x: ml, y: mt, width: pw, height: ph + 16, fill: "transparent", cursor: "pointer" });
    svg.appendChild(overlay);
    host.appendChild(svg);
    var tip = el("div", "tip"); tip.hidden = true; host.appendChild(tip);
    function bucketAt(ev) {
      var box = svg.getBoundingClientRect(), x = (ev.clientX - box.left) * W / box.width;
      var b = Math.floor((x - ml) * nb / pw);
      // nearest bucket that holds an op
      for (var d = 0; d < nb; d++) {
        if (b - d >= 0 && b - d < nb && B[b - d]) return b - d;
        if (b + d < nb && b + d >= 0 && B[b + d]) return b + d;
      }
      return -1;
    }
    overlay.addEventListener("mousemove", function (ev) {
      var b = bucketAt(ev);
      if (b < 0) return;
      var bk = B[b], gx = X(b);
      guide.setAttribute("x1", gx); guide.setAttribute("x2", gx); guide.setAttribute("visibility", "visible");
      tip.textContent = "";
      tip.appendChild(el("div", "n", "#" + opIndex(bk.op) + "  " + opName(bk.op)));
      var parts = [phaseOf(bk.op), SEV_NAME[bk.sev]];
      series.forEach(function (s, si) { if (bk.v[si] !== null) parts.push(s.label.split(" \u2016")[0] + " " + fmt(bk.v[si])); });
      tip.appendChild(el("div", null, parts.join(" \u00b7 ")));
      tip.hidden = false;
      var hostBox = host.getBoundingClientRect();
      var left = ev.clientX - hostBox.left + 14;
      if (left > hostBox.width - 360) left = Math.max(0, ev.clientX - hostBox.left - 374);
      tip.style.left = left + "px";
      tip.style.top = (ev.clientY - hostBox.top + 12) + "px";
    });
    overlay.addEventListener("mouseleave", function () { tip.hidden = true; guide.setAttribute("visibility", "hidden"); });
    overlay.addEventListener("click", function (ev) { var b = bucketAt(ev); if (b >= 0) table.jumpTo(B[b].op, true); });
  }

  /* ---------- module tree ---------- */
  function renderTree() {
    var host = $("tree");
    if (!TREE.length) { $("tree-card").hidden = true; return; }
    var kids = TREE.map(function () { return []; }), roots = [];
    TREE.forEach(function (n, i) { if (n[0] >= 0) kids[n[0]].push(i); else roots.push(i); });
    var rowsOf = {};
    function nodeLine(i) {
      var n = TREE[i], line = el("div", "node");
      line.dataset.node = i;
      var tw = el("span", "tw", kids[i].length ? "\u25b8" : "");
      line.appendChild(tw);
      line.appendChild(el("span", "dot sev-" + n[3]));
      line.appendChild(el("span", "nm", S[n[1]]));
      if (S[n[2]]) line.appendChild(el("span", "cls", S[n[2]]));
      if (n[9] === 2) line.appendChild(el("span", "tag", "culprit"));
      var c = [];
      if (n[6]) c.push(fmtCount(n[6]) + " error");
      if (n[5]) c.push(fmtCount(n[5]) + " warning");
      if (n[7]) c.push(fmtCount(n[7]) + " unmatched");
      c.push(fmtCount(n[4]) + " pass");
      line.appendChild(el("span", "ct", c.join(" \u00b7 ")));
      [["fwd", n[10], "forward"], ["bwd", n[11], "backward"]].forEach(function (ph) {
        var tag = el("span", "ph", ph[0]);
        if (ph[1] >= 0) {
          tag.appendChild(el("span", "dot sev-" + ph[1]));
          tag.title = ph[2] + ": worst verdict " + SEV_NAME[ph[1]];
        } else {
          tag.className = "ph none";
          tag.title = "no " + ph[2] + " tensors";
        }
        line.appendChild(tag);
      });
      line.title = nodePath(i) + " \u2014 worst verdict: " + SEV_NAME[n[3]] + " (click to show its tensors)";
      return line;
    }
    function depth(i) { var d = 0; for (var p = TREE[i][0]; p >= 0; p = TREE[p][0]) d++; return d; }
    // Open at first: the top two levels, the way to the culprit, and chains of single children.
    function startsOpen(i) {
      var d = depth(i);
      return d <= 1 || TREE[i][9] > 0 || (kids[i].length === 1 && d < 12);
    }
    function build(i, open) {
      var li = el("li"), line = nodeLine(i);
      li.appendChild(line);
      rowsOf[i] = line;
      var ul = null;
      function toggle(show) {
        if (!kids[i].length) return;
        if (show && !ul) {
          ul = el("ul");
          kids[i].forEach(function (k) { ul.appendChild(build(k, startsOpen(k))); });
          li.appendChild(ul);
        }
        if (ul) ul.hidden = !show;
        line.firstChild.textContent = show ? "\u25be" : "\u25b8";
      }
      line.firstChild.addEventListener("click", function (ev) { ev.stopPropagation(); toggle(!ul || ul.hidden); });
      line.addEventListener("click", function () {
        var prev = host.querySelector(".node.selected");
        if (prev) prev.classList.remove("selected");
        line.classList.add("selected");
        table.setNode(i);
      });
      if (open) toggle(true);
      return li;
    }
    var ul = el("ul");
    roots.forEach(function (r) { ul.appendChild(build(r, true)); });
    host.appendChild(ul);
  }

  /* ---------- the table ---------- */
  var table = (function () {
    var scroll = $("table-scroll"), tbl = $("rows"), thead = tbl.tHead, tbody = tbl.tBodies[0];
    var rowH = 27, view = new Int32Array(0), selected = -1;
    var state = { verdict: "all", phase: "all", query: "", node: -1, sort: -1, dir: 1 };
    var lowerNames = null;
    var tableMetrics = ["Cosine", "MaxRelativeErr", "MaxAbsErr", "RelEuclideanDistance", "RMSE"]
      .filter(function (m) { return metricIndex(m) >= 0; }).slice(0, 3);
    var short = { Cosine: "Cosine", MaxRelativeErr: "MaxRelErr", MaxAbsErr: "MaxAbsErr",
                  RelEuclideanDistance: "RelEuclid", RMSE: "RMSE" };
    var cols = [
      { label: "#", w: 62, num: true, key: opIndex, text: function (r) { return String(opIndex(r)); } },
      { label: "Tensor", w: 0, key: displayName, text: displayName, cls: "nm" },
      { label: "Phase", w: 78, key: phaseOf, text: phaseOf },
      { label: "dtype", title: "dtype, target / golden", w: 132, key: dtypeText, text: dtypeText },
      { label: "Shape", w: 112, key: shapeOf, text: shapeOf }
    ];
    tableMetrics.forEach(function (m) {
      var mi = metricIndex(m);
      // First click shows the worst first: lowest cosine, highest error.
      cols.push({ label: short[m], title: m, w: 96, num: true, metric: m, firstDir: m === "Cosine" ? 1 : -1,
                  key: function (r) { return metricAt(r, mi); },
                  text: function (r) { return fmtMetric(m, metricAt(r, mi)); } });
    });
    cols.push({ label: "Result", w: 86, key: function (r) { return -severity(r); }, text: resultOf, cls: "res" });
    cols.push({ label: "Source", w: 168, key: function (r) { var s = stackOf(r)[0]; return s ? basename(s[0]) + ":" + s[1] : null; }, source: true });

    function renderHead() {
      var cg = $("cols");
      cols.forEach(function (c) { var col = el("col"); if (c.w) col.style.width = c.w + "px"; cg.appendChild(col); });
      var tr = el("tr");
      cols.forEach(function (c, i) {
        var th = el("th", c.num ? "num" : null, c.label);
        th.title = (c.title || c.label) + ": click to sort";
        if (state.sort === i) th.appendChild(el("span", "arrow", state.dir > 0 ? " \u25b2" : " \u25bc"));
        th.addEventListener("click", function () {
          var first = c.firstDir || 1;
          if (state.sort === i) { if (state.dir === first) state.dir = -first; else { state.sort = -1; state.dir = 1; } }
          else { state.sort = i; state.dir = first; }
          refresh(true);
        });
        tr.appendChild(th);
      });
      thead.textContent = "";
      thead.appendChild(tr);
    }

    var shown, chip;
    function renderToolbar() {
      var bar = $("toolbar");
      var q = el("input"); q.type = "search"; q.id = "filter-name"; q.placeholder = "Filter by tensor name (e.g. conv2d, layer1.0, backward)";
      q.addEventListener("input", function () { state.query = q.value.trim().toLowerCase(); refresh(true); });
      var v = el("select"); v.id = "filter-verdict"; v.title = "Show only some results";
      [["all", "All results"], ["error", "Errors only"], ["error+warning", "Errors and warnings"], ["warning", "Warnings only"],
       ["unmatched", "Unmatched only"], ["pass", "Pass only"]].forEach(function (o) {
        var opt = el("option", null, o[1]); opt.value = o[0]; v.appendChild(opt);
      });
      v.addEventListener("change", function () { state.verdict = v.value; refresh(true); });
      var p = el("select"); p.id = "filter-phase";
      [["all", "Forward and backward"], ["forward", "Forward only"], ["backward", "Backward only"]].forEach(function (o) {
        var opt = el("option", null, o[1]); opt.value = o[0]; p.appendChild(opt);
      });
      p.addEventListener("change", function () { state.phase = p.value; refresh(true); });
      chip = el("span", "chip"); chip.hidden = true;
      shown = el("span", "shown"); shown.id = "rows-shown";
      [q, v, p, chip, shown].forEach(function (e) { bar.appendChild(e); });
    }

    function compute() {
      var out = new Int32Array(ROWS.length), n = 0, q = state.query;
      if (q && !lowerNames) {
        lowerNames = new Array(ROWS.length);
        for (var i = 0; i < ROWS.length; i++) {
          var t = targetName(i), g = goldenName(i);
          lowerNames[i] = ((t || "") + "\n" + (g && g !== t ? g : "")).toLowerCase();
        }
      }
      var lo = state.node, hi = state.node >= 0 ? TREE[state.node][8] : 0;
      for (var r = 0; r < ROWS.length; r++) {
        var res = resultOf(r);
        if (state.verdict !== "all") {
          if (state.verdict === "error+warning") { if (res !== "error" && res !== "warning") continue; }
          else if (res !== state.verdict) continue;
        }
        if (state.phase !== "all" && phaseOf(r) !== state.phase) continue;
        if (lo >= 0) { var nd = nodeOf(r); if (nd < lo || nd >= hi) continue; }
        if (q && lowerNames[r].indexOf(q) < 0) continue;
        out[n++] = r;
      }
      view = out.subarray(0, n);
      if (state.sort >= 0) {
        var key = cols[state.sort].key, keys = new Array(ROWS.length), dir = state.dir;
        for (var k = 0; k < n; k++) keys[view[k]] = key(view[k]);
        view = Array.prototype.slice.call(view).sort(function (a, b) {
          var x = keys[a], y = keys[b];
          var xm = x === null || x === undefined || (typeof x === "number" && isNaN(x));
          var ym = y === null || y === undefined || (typeof y === "number" && isNaN(y));
          if (xm || ym) return xm === ym ? a - b : xm ? 1 : -1;   // missing values last, either way
          if (x < y) return -dir;
          if (x > y) return dir;
          return a - b;
        });
      }
    }

    function cell(tr, c, r) {
      var td = el("td", (c.num ? "num " : "") + (c.cls || ""));
      if (c.source) {
        var st = stackOf(r)[0];
        if (st) {
          var b = el("button", "link", basename(st[0]) + ":" + st[1]);
          b.type = "button";
          b.title = st[0] + ":" + st[1] + (st[3] ? " in " + st[3] : "") + " \u2014 click for the stack";
          b.addEventListener("click", function (ev) { ev.stopPropagation(); select(r, true); });
          td.appendChild(b);
        }
      } else {
        var text = c.text(r);
        td.textContent = text;
        if (c.label === "Tensor") {
          var g = goldenName(r);
          td.title = text + (g && g !== text ? "\ngolden: " + g : "");
        } else if (c.label === "Result") {
          td.title = ROWS[r][10] === null ? text : S[ROWS[r][10]];
        } else if (text) td.title = text;
      }
      tr.appendChild(td);
    }

    function spacer(h) {
      var tr = el("tr", "spacer"), td = el("td");
      td.colSpan = cols.length; td.style.height = h + "px"; tr.appendChild(td);
      return tr;
    }

    function renderRows() {
      var top = scroll.scrollTop, height = scroll.clientHeight || 560;
      var first = Math.max(0, Math.floor(top / rowH) - 8);
      var last = Math.min(view.length, Math.ceil((top + height) / rowH) + 8);
      var frag = document.createDocumentFragment();
      if (!view.length) {
        var tr0 = el("tr", "empty"), td0 = el("td", null, "No tensor matches these filters.");
        td0.colSpan = cols.length; tr0.appendChild(td0); frag.appendChild(tr0);
      }
      if (first > 0) frag.appendChild(spacer(first * rowH));
      for (var i = first; i < last; i++) {
        var r = view[i], tr = el("tr", "r v-" + resultOf(r) + (culpritSet[r] ? " culprit" : "") + (r === selected ? " sel" : ""));
        tr.dataset.row = r;
        cols.forEach(function (c) { cell(tr, c, r); });
        frag.appendChild(tr);
      }
      if (last < view.length) frag.appendChild(spacer((view.length - last) * rowH));
      tbody.textContent = "";
      tbody.appendChild(frag);
      var sample = tbody.querySelector("tr.r");
      if (sample && sample.offsetHeight && Math.abs(sample.offsetHeight - rowH) > 0.5) {
        rowH = sample.offsetHeight;   // the stylesheet decides; measure once and redo
        renderRows();
      }
    }

    function refresh(resetScroll) {
      compute();
      renderHead();
      shown.textContent = fmtCount(view.length) + " of " + fmtCount(ROWS.length) + " tensors";
      if (resetScroll) scroll.scrollTop = 0;
      renderRows();
    }

    var pending = false;
    scroll.addEventListener("scroll", function () {
      if (pending) return;
      pending = true;
      requestAnimationFrame(function () { pending = false; renderRows(); });
    });
    tbody.addEventListener("click", function (ev) {
      var tr = ev.target.closest ? ev.target.closest("tr.r") : null;
      if (tr) select(Number(tr.dataset.row), false);
    });

    function select(r, toStack) {
      selected = r;
      renderRows();
      details.show(r, toStack);
    }

    function jumpTo(r, open) {
      var pos = Array.prototype.indexOf.call(view, r);
      if (pos < 0) {   // filtered out: clear the filters that hide it
        state.verdict = "all"; state.phase = "all"; state.query = ""; state.node = -1;
        $("filter-verdict").value = "all"; $("filter-phase").value = "all"; $("filter-name").value = "";
        chip.hidden = true;
        compute(); renderHead();
        shown.textContent = fmtCount(view.length) + " of " + fmtCount(ROWS.length) + " tensors";
        pos = Array.prototype.indexOf.call(view, r);
      }
      scroll.scrollTop = Math.max(0, pos * rowH - 2 * rowH);
      $("table-card").scrollIntoView({ block: "start" });
      if (open) select(r, false); else renderRows();
    }

    function setNode(i) {
      state.node = i;
      chip.textContent = "";
      chip.appendChild(document.createTextNode("module " + nodePath(i) + " "));
      var x = el("button", null, "\u2715"); x.type = "button"; x.title = "show all modules";
      x.addEventListener("click", function () {
        chip.hidden = true; state.node = -1;
        var sel = document.querySelector("#tree .node.selected"); if (sel) sel.classList.remove("selected");
        refresh(true);
      });
      chip.appendChild(x);
      chip.hidden = false;
      refresh(true);
    }

    renderToolbar();
    return { refresh: refresh, jumpTo: jumpTo, setNode: setNode, view: function () { return view; } };
  })();

  /* ---------- details of one row ---------- */
  var details = (function () {
    var box = $("details");
    function kvTable(head, rows) {
      var t = el("table", "kv"), tr = el("tr");
      head.forEach(function (h, i) { var th = el("th", null, h); if (i) th.style.textAlign = "right"; tr.appendChild(th); });
      t.appendChild(tr);
      rows.forEach(function (row) {
        var r = el("tr");
        row.forEach(function (v, i) { r.appendChild(el("td", i ? "num" : null, v)); });
        t.appendChild(r);
      });
      return t;
    }
    function show(r, toStack) {
      box.textContent = "";
      var close = el("button", "link close", "close"); close.type = "button";
      close.addEventListener("click", function () { box.hidden = true; });
      box.appendChild(close);
      box.appendChild(el("div", "title", displayName(r)));
      var g = goldenName(r), t = targetName(r);
      if (g !== t) box.appendChild(el("div", "muted mono", g ? "golden: " + g : "only in golden"));
      if (!t) box.appendChild(el("div", "muted", "This tensor exists only in the golden run."));
      var meta = el("div", "where");
      meta.appendChild(el("span", "pill " + resultOf(r), resultOf(r)));
      var mode = ROWS[r][17] === undefined ? null : str(ROWS[r][17]);
      [phaseOf(r), kindOf(r), roleOf(r), mode].forEach(function (x) { if (x) { meta.appendChild(document.createTextNode(" ")); meta.appendChild(el("span", "pill phase", x)); } });
      var bits = ["op #" + opIndex(r) + " " + opName(r)];
      if (nodeOf(r) >= 0) bits.push("module " + nodePath(nodeOf(r)));
      if (ROWS[r][18] !== undefined && ROWS[r][18] !== null) bits.push("step " + ROWS[r][18]);
      if (ROWS[r][19] !== undefined && ROWS[r][19] !== null) bits.push("rank " + ROWS[r][19]);
      meta.appendChild(document.createTextNode("  " + bits.join(" \u00b7 ")));
      box.appendChild(meta);
      var reason = ROWS[r][10];
      if (reason !== null) box.appendChild(el("p", "reason", S[reason]));
      var cols = el("div", "cols");
      var m = el("div");
      m.appendChild(el("h3", null, "Metrics"));
      var mrows = [];
      METRICS.forEach(function (name, i) { var v = metricAt(r, i); if (v !== null) mrows.push([name, fmtMetric(name, v)]); });
      [[15, "relative error (verdict)"], [16, "scale error"]].forEach(function (f) {
        var v = ROWS[r][f[0]];
        if (v !== undefined && v !== null) mrows.push([f[1], fmt(v)]);
      });
      m.appendChild(mrows.length ? kvTable(["metric", "value"], mrows) : el("p", "muted", "No metrics (unmatched or not comparable)."));
      cols.appendChild(m);
      var s = el("div");
      s.appendChild(el("h3", null, "Statistics"));
      var ts = ROWS[r][13], gs = ROWS[r][14];
      var srows = [["dtype", str(ROWS[r][4]) || "", str(ROWS[r][5]) || ""],
                   ["shape", shapeText(ROWS[r][6]), shapeText(ROWS[r][7])]];
      STATS.forEach(function (k, i) { srows.push([k, ts ? fmt(ts[i]) : "", gs ? fmt(gs[i]) : ""]); });
      s.appendChild(kvTable(["", "target", "golden"], srows));
      cols.appendChild(s);
      box.appendChild(cols);
      var st = el("div", "stack");
      st.id = "details-stack";
      st.appendChild(el("h3", null, "Stack (innermost user frame first)"));
      var frames = stackOf(r);
      if (!frames.length) st.appendChild(el("p", "muted", "No stack was recorded for this tensor."));
      frames.forEach(function (f) {
        var fr = el("div", "frame");
        fr.appendChild(el("div", "loc", (f[0] || "?") + ":" + (f[1] === null ? "?" : f[1]) + (f[3] ? "  in " + f[3] : "")));
        if (f[2]) fr.appendChild(el("code", null, f[2]));
        st.appendChild(fr);
      });
      box.appendChild(st);
      box.hidden = false;
      (toStack ? st : box).scrollIntoView({ block: "nearest" });
    }
    return { show: show };
  })();

  function section(name, f) {
    try { f(); } catch (err) {
      console.error("opdiff report: could not draw the " + name + ": " + err);
      var host = $(name === "table" ? "table-card" : name);
      if (host) host.appendChild(el("p", "muted", "This part of the report could not be drawn (" + err + ")."));
    }
  }
  section("header", renderHeader);
  section("verdict", renderVerdict);
  section("chart", renderChart);
  section("tree", renderTree);
  section("table", function () { table.refresh(false); });
  document.documentElement.setAttribute("data-opdiff-ready", String(Math.round(performance.now())));
})();
