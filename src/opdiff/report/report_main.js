/* opdiff report, part 4 of 4: draw each part; one that fails says so and the others still draw. */
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
