/* opdiff report, part 1 of 4 (html.py joins report.js, report_chart.js, report_table.js and
   report_main.js, in that order, into one function): the data, helpers, header and verdict.
   Data reaches the page only through textContent and attribute setters, never innerHTML, so
   names, paths and source code from a dump cannot become markup.
   Every value is read by its field name: D.fields names the values of a row, an op, a tree node
   and a location (see opdiff/report/payload.py). */
  var D = JSON.parse(document.getElementById("opdiff-data").textContent);
  var S = D.strings, ROWS = D.rows, METRICS = D.metrics, STATS = D.stat_keys;
  // Row field name -> position in a row (rows stay arrays: 100k of them must open quickly).
  var RF = fieldIndex(D.fields.rows);
  // Ops, tree nodes and stack frames are fewer: made objects once.
  var OPS = D.ops.map(function (o) { return named(o, D.fields.ops); });
  var TREE = (D.tree || []).map(function (n) { return named(n, D.fields.tree); });
  var STACKS = D.stacks.map(function (s) { return s.map(locationOf); });
  var SVG = "http://www.w3.org/2000/svg";
  var SEV = { pass: 0, unmatched: 1, warning: 2, error: 3 };
  var SEV_NAME = ["pass", "unmatched", "warning", "error"];
  var SEV_COLOR = ["#43a047", "#9aa1ab", "#e0a100", "#c62828"];
  var culpritRows = D.divergence ? D.divergence.rows : [];
  var culpritSet = {};
  culpritRows.forEach(function (r) { culpritSet[r] = true; });

  function fieldIndex(names) {
    var at = {};
    names.forEach(function (name, i) { at[name] = i; });
    return at;
  }
  function named(values, names) {
    var o = {};
    names.forEach(function (name, i) { o[name] = values[i] === undefined ? null : values[i]; });
    return o;
  }
  function locationOf(values) { return values ? named(values, D.fields.location) : null; }

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

  /* ---------- row accessors ---------- */
  // A row's field; fields left off the end of a short row read null.
  function field(r, name) { var v = ROWS[r][RF[name]]; return v === undefined ? null : v; }
  function opOf(r) { return OPS[ROWS[r][RF.op]]; }
  function opName(r) { return S[opOf(r).name]; }
  function opIndex(r) { return opOf(r).index; }
  function phaseOf(r) { return str(opOf(r).phase) || ""; }
  function kindOf(r) { return str(opOf(r).kind) || ""; }
  function nodeOf(r) { return opOf(r).node; }
  function decodeName(enc, r) {
    if (enc === null || enc === undefined) return null;
    return typeof enc === "string" ? enc : opName(r) + "." + enc[0];   // [tail]: op name + tail
  }
  function targetName(r) { return decodeName(field(r, "target_name"), r); }
  function goldenName(r) {
    var g = field(r, "golden_name");
    return g === 1 ? targetName(r) : decodeName(g, r);     // 1: the same as the target's
  }
  function displayName(r) { return targetName(r) || goldenName(r) || opName(r); }
  function roleOf(r) { return str(field(r, "role")) || ""; }
  function resultOf(r) { return str(field(r, "result")) || ""; }
  function reasonOf(r) { return str(field(r, "reason")); }
  function severity(r) { var s = SEV[resultOf(r)]; return s === undefined ? 1 : s; }
  function metricAt(r, m) { var a = field(r, "metrics"); return a ? num(a[m]) : null; }
  function shapeText(i) { return i === null || i === undefined ? "" : "[" + D.shapes[i].join(", ") + "]"; }
  function dtypeText(r) {
    var t = str(field(r, "target_dtype")), g = str(field(r, "golden_dtype"));
    if (t === g) return t || "";
    return (t || "\u2013") + " / " + (g || "\u2013");
  }
  function shapeOf(r) {
    var t = field(r, "target_shape"), g = field(r, "golden_shape");
    if (g === t || g === null) return shapeText(t);
    if (t === null) return shapeText(g);
    return shapeText(t) + " / " + shapeText(g);
  }
  function stackOf(r) { var s = field(r, "stack"); return s === null ? [] : STACKS[s]; }
  function nodePath(n) {
    var parts = [];
    for (; n >= 0; n = TREE[n].parent) if (TREE[n].parent >= 0) parts.unshift(S[TREE[n].label]);
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
    var file = loc.file, line = loc.line, code = loc.code, func = loc.function;
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

  function pairStatus(p) {
    if (p.incomplete) return "not compared";
    if (p.first_divergence) return "divergence";
    if (p.cut && p.cut.length) return "cut";    // compared up to the cut only: not a pass
    var c = p.counts || {};
    return c.error ? "error" : c.warning ? "warning" : c.unmatched ? "unmatched" : "pass";
  }
  function cutText(p) {
    // a side that ends early (killed, disk full): compared up to that record only
    return (p.cut || []).map(function (c) {
      return " \u00b7 " + c.side + " cut at record " + c.records + " (" + c.why + ")";
    }).join("");
  }
  function countsText(c) {
    return ["pass", "warning", "error", "unmatched"].filter(function (k) { return c && c[k] !== undefined; })
      .map(function (k) { return fmtCount(c[k]) + " " + k; }).join(" \u00b7 ");
  }
  function divName(fd) { return !fd ? "" : typeof fd === "object" ? (fd.name || fd.op || "") : String(fd); }
  function isFirst(p) {
    var d = D.divergence;
    return !!(d && p.first_divergence && d.step === p.step && d.rank === p.rank);
  }

  function pairsGrid(box, pairs) {
    // rank x step: the worst verdict per cell, the first divergence marked.
    var steps = [], ranks = [], cell = {};
    pairs.forEach(function (p) {
      if (steps.indexOf(p.step) < 0) steps.push(p.step);
      if (ranks.indexOf(p.rank) < 0) ranks.push(p.rank);
      cell[p.rank + "/" + p.step] = p;
    });
    var byNum = function (a, b) { return (a === null ? -1 : a) - (b === null ? -1 : b); };
    steps.sort(byNum); ranks.sort(byNum);
    var t = el("table", "kv rankgrid"), head = el("tr");
    head.appendChild(el("th", null, "rank \\ step"));
    steps.forEach(function (s) { head.appendChild(el("th", null, s === null ? "\u2013" : String(s))); });
    t.appendChild(head);
    ranks.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("th", null, r === null ? "\u2013" : String(r)));
      steps.forEach(function (s) {
        var p = cell[r + "/" + s];
        var st = p ? pairStatus(p) : "absent";
        var td = el("td", "gridcell " + st.replace(" ", "-") + (p && isFirst(p) ? " first" : ""),
                    (p && isFirst(p) ? "\u2605 " : "") + st);
        td.title = p ? (divName(p.first_divergence) || countsText(p.counts) ||
                        (p.incomplete ? p.incomplete.side + " " + p.incomplete.why : "")) : "no dump";
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    box.appendChild(t);
  }

  function pairsBlock(box) {
    var pairs = D.pairs || [];
    if (!pairs.length) return;
    box.appendChild(el("h3", null, "Step / rank pairs"));
    // many ranks or steps scroll inside the box instead of running off the page
    var gridWrap = el("div", "scroll-x"), tableWrap = el("div", "scroll-x");
    box.appendChild(gridWrap);
    pairsGrid(gridWrap, pairs);
    var t = el("table", "kv pairs"), head = el("tr");
    ["Step", "Rank", "Result", "Counts", "First divergence", "Target", "Golden"].forEach(function (h) {
      head.appendChild(el("th", null, h));
    });
    t.appendChild(head);
    pairs.forEach(function (p) {
      var tr = el("tr", isFirst(p) ? "first" : null);
      var fd = divName(p.first_divergence);
      [p.step === null || p.step === undefined ? "" : String(p.step),
       p.rank === null || p.rank === undefined ? "" : String(p.rank),
       pairStatus(p),
       p.incomplete ? p.incomplete.side + " " + p.incomplete.why : countsText(p.counts) + cutText(p),
       fd,
       basename(p.target), basename(p.golden)].forEach(function (v, i) {
        var td = el("td", i >= 5 ? "path" : null, v);
        if (i >= 5 && p[i === 5 ? "target" : "golden"]) td.title = String(p[i === 5 ? "target" : "golden"]);
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    tableWrap.appendChild(t);
    box.appendChild(tableWrap);
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
      // never healthier than the verdict's words: inconclusive is not "No divergence"
      var unsure = D.verdict_kind === "inconclusive";
      box.className = "card " + (unsure ? "inconclusive" : "clean");
      left.appendChild(el("div", "label", "Verdict"));
      left.appendChild(el("div", "culprit", unsure ? "Inconclusive" :
        D.verdict_kind === "explained" ? "No op to blame" : "No divergence"));
      var c = D.counts || {};
      left.appendChild(el("p", "reason", unsure ?
        "opdiff cannot tell whether these runs agree: the reason is below. Nothing found among the tensors it could compare does not clear the rest." : (c.error ?
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
      left.appendChild(sourceBlock(locationOf(d.location), d.context));
    } else {
      left.appendChild(el("p", "muted", "No source line was recorded for this op."));
    }
    if (culpritRows.length) {
      var jump = el("button", "jump", "Show in table");
      jump.type = "button";
      jump.addEventListener("click", function () { table.jumpTo(culpritRows[0], true); });
      left.appendChild(jump);
    }
    // where the difference comes from, in words: comparison/origins.py's RULES (payload.py)
    right.appendChild(el("h3", null, d.heading));
    right.appendChild(metricsTable([[d.input_optional ? "worst input (if any)" : "worst input", d.input_metrics],
                                    [d.tensor && d.tensor.indexOf(d.name + ".") === 0 ? d.tensor.slice(d.name.length + 1) : "worst output", d.metrics, true]]));
    environmentBlock(right);
    pairsBlock(right);
    box.appendChild(grid);
  }

