/* opdiff report, part 3 of 4: the module tree, the table of every tensor, a row's details. */

  /* ---------- module tree ---------- */
  function renderTree() {
    var host = $("tree");
    if (!TREE.length) { $("tree-card").hidden = true; return; }
    var kids = TREE.map(function () { return []; }), roots = [];
    TREE.forEach(function (n, i) { if (n.parent >= 0) kids[n.parent].push(i); else roots.push(i); });
    var rowsOf = {};
    function nodeLine(i) {
      var n = TREE[i], line = el("div", "node");
      line.dataset.node = i;
      var tw = el("span", "tw", kids[i].length ? "\u25b8" : "");
      line.appendChild(tw);
      line.appendChild(el("span", "dot sev-" + n.severity));
      line.appendChild(el("span", "nm", S[n.label]));
      if (S[n["class"]]) line.appendChild(el("span", "cls", S[n["class"]]));
      if (n.culprit === 2) line.appendChild(el("span", "tag", "culprit"));
      var c = [];
      if (n.error) c.push(fmtCount(n.error) + " error");
      if (n.warning) c.push(fmtCount(n.warning) + " warning");
      if (n.unmatched) c.push(fmtCount(n.unmatched) + " unmatched");
      c.push(fmtCount(n.pass) + " pass");
      line.appendChild(el("span", "ct", c.join(" \u00b7 ")));
      [["fwd", n.forward, "forward"], ["bwd", n.backward, "backward"]].forEach(function (ph) {
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
      line.title = nodePath(i) + " \u2014 worst verdict: " + SEV_NAME[n.severity] + " (click to show its tensors)";
      return line;
    }
    function depth(i) { var d = 0; for (var p = TREE[i].parent; p >= 0; p = TREE[p].parent) d++; return d; }
    // Open at first: the top two levels, the way to the culprit, and chains of single children.
    function startsOpen(i) {
      var d = depth(i);
      return d <= 1 || TREE[i].culprit > 0 || (kids[i].length === 1 && d < 12);
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
    var rowH = 27, view = new Int32Array(0), matched = view, selected = -1;
    var state = { verdict: "all", phase: "all", query: "", node: -1, sort: -1, dir: 1 };
    var lowerNames = null;
    var tableMetrics = ["Cosine", "MaxRelativeErr", "MaxAbsErr", "RelEuclideanDistance", "RMSE"]
      .filter(function (m) { return metricIndex(m) >= 0; }).slice(0, 3);
    var short = { Cosine: "Cosine", MaxRelativeErr: "MaxRelErr", MaxAbsErr: "MaxAbsErr",
                  RelEuclideanDistance: "RelEuclid", RMSE: "RMSE" };
    var regions = regionGroups();
    var cols = [
      { label: "#", w: 62, num: true, key: opIndex, text: function (r) { return String(opIndex(r)); } },
      { label: "Tensor", w: 0, key: displayName, text: displayName, cls: "nm" },
      { label: "Phase", w: 78, key: phaseOf, text: phaseOf },
      { label: "dtype", title: "dtype, target / golden", w: 132, key: dtypeText, text: dtypeText },
      { label: "Shape", w: 112, key: shapeOf, text: shapeOf }
    ];
    if ((D.pairs || []).length) {   // several step/rank pairs: say where each row is from
      var at = function (name) { return function (r) { var v = field(r, name); return v === null ? "" : String(v); }; };
      var atKey = function (name) { return function (r) { return field(r, name); }; };
      cols.splice(1, 0, { label: "Step", w: 52, num: true, key: atKey("step"), text: at("step"), cls: "step" },
                        { label: "Rank", w: 52, num: true, key: atKey("rank"), text: at("rank"), cls: "rank" });
    }
    tableMetrics.forEach(function (m) {
      var mi = metricIndex(m);
      // First click shows the worst first: lowest cosine, highest error.
      cols.push({ label: short[m], title: m, w: 96, num: true, metric: m, firstDir: m === "Cosine" ? 1 : -1,
                  key: function (r) { return metricAt(r, mi); },
                  text: function (r) { return fmtMetric(m, metricAt(r, mi)); } });
    });
    cols.push({ label: "Result", w: 86, key: function (r) { return -severity(r); }, text: resultOf, cls: "res" });
    cols.push({ label: "Source", w: 168, key: function (r) { var s = stackOf(r)[0]; return s ? basename(s.file) + ":" + s.line : null; }, source: true });

    /* Regions: the rows of one region (both sides' ops) are one collapsible group, at the place of
       its first row; the culprit's region starts open. The view holds row indices, and -1 - g for
       the header of group g. While a column sorts the table, rows are not grouped. */
    function regionGroups() {
      var groupOf = null, groups = [], byLabel = {};
      for (var r = 0; r < ROWS.length; r++) {
        var lab = field(r, "region");
        if (lab === null) continue;
        if (!groupOf) { groupOf = new Int32Array(ROWS.length); groupOf.fill(-1); }
        var g = byLabel[lab];
        if (g === undefined) {
          g = byLabel[lab] = groups.length;
          groups.push({ label: S[lab], sev: 0, culprit: false, open: false, size: 0, target: [], golden: [] });
        }
        var grp = groups[g], side = field(r, "target_name") !== null ? grp.target : grp.golden;
        var op = opName(r).replace(/\.\d+\.(forward|backward)$/, "");
        if (side.indexOf(op) < 0) side.push(op);
        grp.sev = Math.max(grp.sev, severity(r));
        if (culpritSet[r]) grp.culprit = grp.open = true;
        grp.size++;
        groupOf[r] = g;
      }
      groups.forEach(function (grp) { if (grp.culprit) grp.sev = 3; });   // the region is the local error
      return { of: groupOf, list: groups };
    }
    function groupTitle(grp) {
      var m = /^(region \d+)(?: in (.*))?$/.exec(grp.label);
      var head = m && m[2] ? "region in " + m[2] : grp.label;
      return head + ": target " + (grp.target.join(", ") || "(no ops)") + "; golden " + (grp.golden.join(", ") || "(no ops)");
    }
    function filtering() { return state.verdict !== "all" || state.phase !== "all" || !!state.query || state.node >= 0; }
    function layout(openMatched) {
      var of = regions.of;
      if (!of || state.sort >= 0) { view = matched; return; }
      var n = matched.length, members = regions.list.map(function () { return []; }), k, r, g;
      for (k = 0; k < n; k++) { g = of[matched[k]]; if (g >= 0) members[g].push(matched[k]); }
      members.forEach(function (m, i) { regions.list[i].shown = m.length; if (openMatched && m.length) regions.list[i].open = true; });
      var out = [], placed = new Uint8Array(members.length);
      for (k = 0; k < n; k++) {
        r = matched[k]; g = of[r];
        if (g < 0) { out.push(r); continue; }
        if (placed[g]) continue;
        placed[g] = 1;
        out.push(-1 - g);
        if (regions.list[g].open) Array.prototype.push.apply(out, members[g]);
      }
      view = Int32Array.from(out);
    }
    function toggleGroup(g) {
      regions.list[g].open = !regions.list[g].open;
      layout(false);
      renderRows();
      var tr = tbody.querySelector('tr.grp[data-group="' + g + '"]');
      if (tr) tr.focus();
    }
    function groupRow(g) {
      var grp = regions.list[g], sev = SEV_NAME[grp.sev];
      var tr = el("tr", "grp v-" + sev + (grp.culprit ? " culprit" : ""));
      tr.dataset.group = g;
      tr.tabIndex = 0;
      tr.setAttribute("aria-expanded", String(grp.open));
      var td = el("td", "grp-cell"), title = groupTitle(grp);
      td.colSpan = cols.length;
      td.appendChild(el("span", "tw", grp.open ? "\u25be " : "\u25b8 "));
      td.appendChild(el("span", "grp-name", title));
      td.appendChild(el("span", "grp-sev sev-" + sev, " worst: " + sev));
      if (grp.culprit) td.appendChild(el("span", "tag", "culprit"));
      td.appendChild(el("span", "ct", " \u00b7 " + (grp.shown < grp.size ? fmtCount(grp.shown) + " of " : "") + fmtCount(grp.size) + " tensors"));
      td.title = title + " \u2014 the runs execute different ops here, judged as one; worst verdict " + sev +
        (grp.culprit ? "; the first divergence" : "") + " (click, Enter or Space to " + (grp.open ? "collapse" : "expand") + ")";
      tr.appendChild(td);
      return tr;
    }

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
      var lo = state.node, hi = state.node >= 0 ? TREE[state.node].end : 0;
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
      view = matched = out.subarray(0, n);
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
        matched = view;
      }
      layout(filtering());   // a filter that reaches into a group shows it open
    }

    function cell(tr, c, r) {
      var td = el("td", (c.num ? "num " : "") + (c.cls || ""));
      if (c.source) {
        var st = stackOf(r)[0];
        if (st) {
          var b = el("button", "link", basename(st.file) + ":" + st.line);
          b.type = "button";
          b.title = st.file + ":" + st.line + (st["function"] ? " in " + st["function"] : "") + " \u2014 click for the stack";
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
          td.title = reasonOf(r) === null ? text : reasonOf(r);
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
        var r = view[i];
        if (r < 0) { frag.appendChild(groupRow(-1 - r)); continue; }
        var tr = el("tr", "r v-" + resultOf(r) + (culpritSet[r] ? " culprit" : "") + (r === selected ? " sel" : "") +
                    (regions.of && regions.of[r] >= 0 && state.sort < 0 ? " in-grp" : ""));
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

    function showCount() {
      shown.textContent = fmtCount(matched.length) + " of " + fmtCount(ROWS.length) + " tensors" +
        (regions.of && state.sort >= 0 ? " (regions ungrouped while sorted)" : "");
    }

    function refresh(resetScroll) {
      compute();
      renderHead();
      showCount();
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
      var head = ev.target.closest ? ev.target.closest("tr.grp") : null;
      if (head) { toggleGroup(Number(head.dataset.group)); return; }
      var tr = ev.target.closest ? ev.target.closest("tr.r") : null;
      if (tr) select(Number(tr.dataset.row), false);
    });
    tbody.addEventListener("keydown", function (ev) {
      var head = ev.target.closest ? ev.target.closest("tr.grp") : null;
      if (!head || (ev.key !== "Enter" && ev.key !== " ")) return;
      ev.preventDefault();
      toggleGroup(Number(head.dataset.group));
    });

    function select(r, toStack) {
      selected = r;
      renderRows();
      details.show(r, toStack);
    }

    function jumpTo(r, open) {
      var g = regions.of ? regions.of[r] : -1;
      if (g >= 0 && !regions.list[g].open) { regions.list[g].open = true; layout(false); }   // inside a closed group
      var pos = Array.prototype.indexOf.call(view, r);
      if (pos < 0) {   // filtered out: clear the filters that hide it
        state.verdict = "all"; state.phase = "all"; state.query = ""; state.node = -1;
        $("filter-verdict").value = "all"; $("filter-phase").value = "all"; $("filter-name").value = "";
        chip.hidden = true;
        compute(); renderHead();
        showCount();
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
      var mode = str(field(r, "mode"));
      [phaseOf(r), kindOf(r), roleOf(r), mode].forEach(function (x) { if (x) { meta.appendChild(document.createTextNode(" ")); meta.appendChild(el("span", "pill phase", x)); } });
      var bits = ["op #" + opIndex(r) + " " + opName(r)];
      if (nodeOf(r) >= 0) bits.push("module " + nodePath(nodeOf(r)));
      if (field(r, "step") !== null) bits.push("step " + field(r, "step"));
      if (field(r, "rank") !== null) bits.push("rank " + field(r, "rank"));
      if (field(r, "region") !== null) bits.push(str(field(r, "region")) + " (the runs execute different ops here)");
      meta.appendChild(document.createTextNode("  " + bits.join(" \u00b7 ")));
      box.appendChild(meta);
      var reason = reasonOf(r);
      if (reason !== null) box.appendChild(el("p", "reason", reason));
      var cols = el("div", "cols");
      var m = el("div");
      m.appendChild(el("h3", null, "Metrics"));
      var mrows = [];
      METRICS.forEach(function (name, i) { var v = metricAt(r, i); if (v !== null) mrows.push([name, fmtMetric(name, v)]); });
      [["error", "relative error (verdict)"], ["scale_error", "scale error"]].forEach(function (f) {
        var v = field(r, f[0]);
        if (v !== null) mrows.push([f[1], fmt(v)]);
      });
      m.appendChild(mrows.length ? kvTable(["metric", "value"], mrows) : el("p", "muted", "No metrics (unmatched or not comparable)."));
      cols.appendChild(m);
      var s = el("div");
      s.appendChild(el("h3", null, "Statistics"));
      var ts = field(r, "target_stats"), gs = field(r, "golden_stats");
      var srows = [["dtype", str(field(r, "target_dtype")) || "", str(field(r, "golden_dtype")) || ""],
                   ["shape", shapeText(field(r, "target_shape")), shapeText(field(r, "golden_shape"))]];
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
        fr.appendChild(el("div", "loc", (f.file || "?") + ":" + (f.line === null ? "?" : f.line) + (f["function"] ? "  in " + f["function"] : "")));
        if (f.code) fr.appendChild(el("code", null, f.code));
        st.appendChild(fr);
      });
      box.appendChild(st);
      box.hidden = false;
      (toStack ? st : box).scrollIntoView({ block: "nearest" });
    }
    return { show: show };
  })();

