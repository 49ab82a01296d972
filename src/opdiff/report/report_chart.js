/* opdiff report, part 2 of 4: the chart of error along execution order. */
  function chartSeries() {
    var series = [];
    for (var r = 0; r < ROWS.length; r++) {
      if (field(r, "error") !== null) {
        // The error the verdicts were judged on: relative L2, immune to near-zero elements.
        series.push({ get: function (r) { return num(field(r, "error")); },
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

