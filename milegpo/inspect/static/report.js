/* milegpo inspect: the report's interactions. Drawing is Cytoscape.js's (the state graphs) and
 * uPlot's (the learning curve); this file only turns the inlined data into their inputs and wires
 * clicks to panels. Data: #report-data (run, curve, kept iterations) and one #iteration-<N> block per
 * kept iteration, parsed when it is first opened. */
(function () {
  "use strict";

  const CAP_STEP = 300; // states drawn at first, and added by each "Show more"
  const summary = JSON.parse(document.getElementById("report-data").textContent);
  const methods = summary.methods;
  const views = new Map(); // iteration -> parsed data
  const state = { iteration: null, view: null, group: null, index: null, cap: CAP_STEP, cy: null, trajectory: null,
                  curve: null };

  // ------------------------------------------------------------------ helpers
  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "onclick") node.addEventListener("click", value);
      else if (name === "text") node.textContent = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function num(x, digits = 3) {
    if (x === null || x === undefined) return "–";
    if (typeof x !== "number") return String(x);
    if (Number.isInteger(x)) return String(x);
    return Math.abs(x) >= 1e4 || (Math.abs(x) < 1e-3 && x !== 0) ? x.toExponential(2) : x.toFixed(digits);
  }

  function short(text, n) { return text.length > n ? text.slice(0, n - 1) + "…" : text; }

  // red (0) -> yellow -> green (1)
  function shareColor(share) {
    const s = Math.max(0, Math.min(1, share));
    const r = s < 0.5 ? 215 : Math.round(215 - (s - 0.5) * 2 * 125);
    const g = s < 0.5 ? Math.round(80 + s * 2 * 110) : Math.round(190 - (s - 0.5) * 2 * 30);
    return `rgb(${r},${g},80)`;
  }

  function table(rows) {
    return el("table", {}, ...rows.map(([name, value, title]) =>
      el("tr", {}, el("th", { title }, name), el("td", {}, value))));
  }

  // ---------------------------------------------------------------- the curve
  function drawCurve() {
    const curve = summary.curve;
    const box = $("curve");
    if (!curve.iterations.length) {
      box.append(el("p", { class: "hint", text: "The run has no progress.csv rows yet." }));
      return;
    }
    const included = new Set(summary.included);
    const xs = curve.iterations;
    const palette = ["#8250df", "#bf3989", "#1a7f37", "#9a6700", "#57606a"];
    const series = [{ label: "iteration" }, { label: "train success", stroke: "#0969da", width: 2, spanGaps: true }];
    const data = [xs, curve.train];
    Object.entries(curve.eval).forEach(([split, ys], k) => {
      series.push({ label: `held-out ${split}`, stroke: palette[k % palette.length], width: 2, spanGaps: true });
      data.push(ys);
    });
    const marks = xs.map((x, i) => (included.has(x) ? (curve.train[i] ?? 0) : null));
    series.push({ label: "kept iteration", stroke: "#cf222e", fill: "#ffffff", paths: () => null,
                  points: { show: true, size: 12, width: 2 } });
    data.push(marks);
    const plot = new uPlot({
      width: Math.max(box.clientWidth, 400), height: 220, series,
      scales: { x: { time: false }, y: { range: [0, 1] } },
      axes: [{ label: "iteration", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] },
             { label: "success rate" }],
    }, data, box);
    state.curve = plot;
    plot.over.addEventListener("click", () => {
      const idx = plot.cursor.idx;
      if (idx === null || idx === undefined) return;
      openIteration(nearestIncluded(xs[idx]));
    });
    window.addEventListener("resize", () => plot.setSize({ width: Math.max(box.clientWidth, 400), height: 220 }));
  }

  function nearestIncluded(iteration) {
    return summary.included.reduce((best, i) => (Math.abs(i - iteration) < Math.abs(best - iteration) ? i : best));
  }

  function drawKeptList() {
    const box = $("kept-list");
    const last = summary.kept[summary.kept.length - 1];
    box.append("Kept iterations: ");
    for (const it of summary.kept) {
      const label = it === last ? `${it} (last)` : String(it);
      const usable = summary.included.includes(it);
      box.append(el("button", { type: "button", "data-iteration": it, disabled: !usable,
                                title: usable ? null : "not included in this report",
                                onclick: () => openIteration(it) }, label));
    }
  }

  // --------------------------------------------------------------- iterations
  function iterationView(iteration) {
    if (!views.has(iteration)) {
      views.set(iteration, JSON.parse($("iteration-" + iteration).textContent));
    }
    return views.get(iteration);
  }

  function openIteration(iteration) {
    const view = iterationView(iteration);
    state.iteration = iteration;
    state.view = view;
    for (const button of document.querySelectorAll("#kept-list button")) {
      button.classList.toggle("open", Number(button.dataset.iteration) === iteration);
    }
    $("iteration-title").textContent = `Iteration ${iteration}`;
    const check = view.check;
    const checkText = check.status === "match"
      ? el("span", { class: "good", text: "equal to the run's logged statistics" })
      : check.status === "differ"
        ? el("span", { class: "bad", text: "DIFFERENT from the run's logged statistics",
                       title: JSON.stringify(check.compared) })
        : el("span", { class: "warn", text: "not checked (the run logged no statistics for this iteration)" });
    const summaryLine = $("iteration-summary");
    summaryLine.replaceChildren(
      `${view.steps} steps, ${view.trajectories} trajectories, success ${num(view.success_rate, 2)}, ` +
      `${view.num_timesteps ?? "?"} env steps so far; from ${view.file}. ${view.method} advantages (config from ` +
      `${view.config_source}): `, checkText, ".",
      view.texts ? "" : el("span", { class: "warn", text: " This run kept no observations (older run or several " +
                                                             "processes): state panels show keys only." }));
    const select = $("group-select");
    select.replaceChildren(...view.groups.map((g, k) => el("option", { value: k },
      `task ${g.task}: ${g.successes_total}/${g.trajectories_total} succeeded, ${g.nodes.length} states`)));
    const first = view.groups.findIndex((g) => g.successes_total > 0);
    selectGroup(first >= 0 ? first : 0);
  }

  // ------------------------------------------------------------------ groups
  function prepareGroup(group) {
    if (group.byId) return group;
    group.byId = new Map();
    for (const n of group.nodes) group.byId.set(n.id, n);
    for (const e of group.edges) group.byId.set(e.id, e);
    group.textNodes = new Map(); // observation text -> the states it was seen in
    for (const n of group.nodes) {
      if (n.goal) continue;
      for (const [text] of n.observations) {
        if (!group.textNodes.has(text)) group.textNodes.set(text, []);
        group.textNodes.get(text).push(n.id);
      }
    }
    const rank = (n) => (n.start || n.goal ? 0 : n.milestone || n.trap ? 1 : n.branching ? 2 : 3);
    group.priority = group.nodes.slice().sort((a, b) => rank(a) - rank(b) || b.visits - a.visits)
      .map((n) => n.id);
    return group;
  }

  function selectGroup(index) {
    state.index = index;
    state.group = prepareGroup(state.view.groups[index]);
    state.cap = CAP_STEP;
    state.trajectory = null;
    $("group-select").value = String(index);
    drawTrajectoryList();
    drawGraph();
    $("panel").replaceChildren(el("p", { class: "hint", text: "Click a state, a transition or a trajectory." }));
    $("advantages").replaceChildren();
  }

  function drawnIds() {
    const group = state.group;
    const ids = new Set(group.priority.slice(0, state.cap));
    const t = selectedTrajectory();
    if (t) t.nodes.forEach((id) => ids.add(id));
    return ids;
  }

  function nodeElement(n, hasSuccess) {
    const share = n.visits ? n.successes / n.visits : 0;
    const distance = !hasSuccess ? "" : n.goal ? " goal" : n.reaches_goal ? ` d=${n.distance}` : " d=∞";
    const classes = ["start", "goal", "branching"].filter((c) => n[c]);
    let ring = 1;
    if (n.milestone) { classes.push("milestone"); ring = 2 + 4 * n.milestone.reliability; }
    if (n.trap) { classes.push("trap"); ring = 2 + 3 * n.trap.reliability; }
    return { group: "nodes", classes: classes.join(" "), data: {
      id: n.id, label: n.goal ? "goal" : `${n.start ? "start: " : ""}${short(n.key, 18)}\n${n.visits}${distance}`,
      color: n.goal ? "#d4a72c" : shareColor(share), size: 18 + 5 * Math.sqrt(n.visits), ring } };
  }

  function edgeElement(e) {
    const classes = [e.successes === 0 ? "failonly" : "", e.best ? "best" : ""].filter(Boolean);
    return { group: "edges", classes: classes.join(" "), data: {
      id: e.id, source: e.source, target: e.target, color: shareColor(e.success_rate),
      width: 1 + 1.5 * Math.sqrt(e.trajectories) + (e.best ? 3 : 0) } };
  }

  const STYLE = [
    { selector: "node", style: { "background-color": "data(color)", label: "data(label)", width: "data(size)",
      height: "data(size)", "font-size": 8, "text-valign": "bottom", "text-margin-y": 2, "text-wrap": "wrap",
      "min-zoomed-font-size": 6, "border-width": "data(ring)", "border-color": "#57606a" } },
    { selector: "node.start", style: { shape: "round-rectangle" } },
    { selector: "node.goal", style: { shape: "star" } },
    { selector: "node.branching", style: { shape: "diamond" } },
    { selector: "node.milestone", style: { "border-color": "#1a7f37" } },
    { selector: "node.trap", style: { "border-color": "#cf222e", "border-style": "dashed" } },
    { selector: "edge", style: { "curve-style": "bezier", "target-arrow-shape": "triangle", "arrow-scale": 0.8,
      width: "data(width)", "line-color": "data(color)", "target-arrow-color": "data(color)", opacity: 0.85 } },
    { selector: "edge.failonly", style: { "line-style": "dashed" } },
    { selector: ".faded", style: { opacity: 0.12 } },
    { selector: "node.hl", style: { "underlay-color": "#0969da", "underlay-padding": 7, "underlay-opacity": 0.45,
      "underlay-shape": "ellipse", opacity: 1 } },
    { selector: "edge.hl", style: { "line-color": "#0969da", "target-arrow-color": "#0969da", width: 5,
      opacity: 1, "z-index": 10 } },
  ];

  function drawGraph() {
    const group = state.group;
    const ids = drawnIds();
    const hasSuccess = group.successes_total > 0;
    const elements = group.nodes.filter((n) => ids.has(n.id)).map((n) => nodeElement(n, hasSuccess))
      .concat(group.edges.filter((e) => ids.has(e.source) && ids.has(e.target)).map(edgeElement));
    if (state.cy) state.cy.destroy();
    const roots = group.nodes.filter((n) => n.start && ids.has(n.id)).map((n) => n.id);
    state.cy = cytoscape({
      container: $("graph"), elements, style: STYLE, minZoom: 0.05, maxZoom: 4,
      layout: { name: "breadthfirst", directed: true, roots: roots.length ? roots : undefined, spacingFactor: 1.1,
                animate: false },
    });
    state.cy.on("tap", "node", (event) => showNode(event.target.id()));
    state.cy.on("tap", "edge", (event) => showEdge(event.target.id()));
    const drawn = state.cy.nodes().length;
    $("graph-count").textContent = `${drawn} of ${group.nodes.length} states, ` +
      `${state.cy.edges().length} of ${group.edges.length} transitions drawn`;
    $("show-more").hidden = drawn >= group.nodes.length;
    if (state.trajectory !== null) highlight(selectedTrajectory());
  }

  // ------------------------------------------------------------ trajectories
  function selectedTrajectory() {
    return state.trajectory === null ? null : state.group.trajectories.find((t) => t.id === state.trajectory);
  }

  function drawTrajectoryList() {
    const box = $("trajectories");
    box.replaceChildren(...state.group.trajectories.map((t) => el("div", {
      class: `traj ${t.success ? "success" : "failure"}`, "data-trajectory": t.id,
      onclick: () => selectTrajectory(t.id),
    }, el("span", { class: "mark", text: t.success ? "✓" : "✗" }),
    `#${t.id} ${t.success ? "succeeded" : "failed"}, ${t.actions.length} steps, return ${num(t.outcome, 2)}`)));
  }

  function selectTrajectory(id) {
    state.trajectory = id;
    const t = selectedTrajectory();
    for (const item of document.querySelectorAll("#trajectories .traj")) {
      item.classList.toggle("selected", Number(item.dataset.trajectory) === id);
    }
    if (t.nodes.some((n) => state.cy.getElementById(n).empty())) drawGraph(); // its path is drawn whole
    else highlight(t);
    drawAdvantages(t);
  }

  function highlight(t) {
    const cy = state.cy;
    const path = new Set([...t.nodes, ...t.edges]);
    cy.batch(() => {
      cy.elements().removeClass("hl").addClass("faded");
      cy.elements().filter((ele) => path.has(ele.id())).removeClass("faded").addClass("hl");
    });
  }

  function clearSelection() {
    state.trajectory = null;
    if (state.cy) state.cy.elements().removeClass("hl faded");
    for (const item of document.querySelectorAll("#trajectories .traj")) item.classList.remove("selected");
    $("advantages").replaceChildren();
  }

  function drawAdvantages(t) {
    const runMethod = state.view.method;
    const scale = Object.fromEntries(methods.map((m) => [m, Math.max(1e-12, ...t.advantages[m].map(Math.abs))]));
    const head = el("tr", {}, el("th", {}, "t"), el("th", {}, "state"), el("th", {}, "action"),
      el("th", {}, "reward"), ...methods.map((m) => el("th", { class: m === runMethod ? "run" : null,
        title: m === runMethod ? "the run's method, with the run's config" : "this method's defaults" },
      m === runMethod ? `${m} (run)` : m)));
    const rows = t.actions.map((action, k) => {
      const node = state.group.byId.get(t.nodes[k]);
      return el("tr", { "data-step": k }, el("td", {}, k),
        el("td", { class: "state", title: node.key }, node.key),
        el("td", { title: t.valid[k] ? null : "invalid action" }, t.valid[k] ? action : `${action} (invalid)`),
        el("td", { class: "num" }, num(t.rewards[k], 2)),
        ...methods.map((m) => {
          const value = t.advantages[m][k];
          const alpha = Math.min(1, Math.abs(value) / scale[m]) * 0.45;
          const color = value >= 0 ? `rgba(26,127,55,${alpha})` : `rgba(207,34,46,${alpha})`;
          return el("td", { class: "num", "data-method": m, "data-value": value, title: String(value),
                            style: `background:${color}` }, num(value, 4));
        }));
    });
    $("advantages").replaceChildren(
      el("h3", {}, `Trajectory #${t.id} (${t.success ? "succeeded" : "failed"}): step advantages by credit method`),
      el("table", { id: "advantage-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }

  // ------------------------------------------------------------------ panels
  function nodeLink(id) {
    const n = state.group.byId.get(id);
    return el("a", { class: "node-link", onclick: () => { focus(id); showNode(id); } }, short(n.key, 60));
  }

  function focus(id) {
    const target = state.cy.getElementById(id);
    if (target.empty()) {
      state.cap = Math.max(state.cap, state.group.priority.indexOf(id) + 1);
      drawGraph();
    }
    state.cy.$(":selected").unselect();
    state.cy.getElementById(id).select();
  }

  function showNode(id) {
    const n = state.group.byId.get(id);
    const texts = state.view.texts;
    const share = n.visits ? n.successes / n.visits : 0;
    const parts = [el("h3", {}, n.goal ? "Goal" : "State"), el("pre", { class: "key" }, n.key),
      table([["visits", `${n.visits} trajectories (${n.revisits} revisits)`],
             ["successes", `${n.successes} of them (${Math.round(100 * share)}%)`],
             ["distance to goal", state.group.successes_total === 0 ? "no success in this group"
               : n.reaches_goal ? num(n.distance, 0) : `cannot reach it (${num(n.distance, 0)} used)`]])];
    if (n.milestone) {
      const m = n.milestone;
      parts.push(el("h3", { class: "good" }, "Milestone"), table([
        ["RCS reliability", num(m.reliability), "the task-normalised score the milestone potential is built from"],
        ["score S0", num(m.score), "lift + coverage + centrality"], ["lift", num(m.lift)],
        ["coverage", num(m.coverage)], ["centrality", num(m.centrality)],
        ["PCC evidence E", num(m.evidence), "branch-counterfactual credit + local progress"],
        ["PCC keeps it", m.kept ? "yes" : "no"], ["score after PCC", num(m.score_pcc)],
        ["branch credit b", num(m.bcc)], ["local progress ψ", num(m.progress)]]));
    }
    if (n.trap) {
      const t = n.trap;
      parts.push(el("h3", { class: "bad" }, "Trap"), table([
        ["RCS reliability", num(t.reliability), "the task-normalised trap score"], ["score", num(t.score)],
        ["failed visitors", t.failures], ["revisits", t.revisits]]));
    }
    const out = state.group.edges.filter((e) => e.source === id);
    if (n.branching) {
      parts.push(el("h3", { class: "warn" }, "Branching point"),
        el("table", {}, ...out.map((e) => el("tr", {}, el("td", {}, e.best ? "best ▶" : ""),
          el("td", {}, short(e.actions.map(([a]) => a).join(" / "), 40)),
          el("td", {}, `success ${num(e.success_rate, 2)}`), el("td", {}, `vs others ${num(e.lift, 2)}`)))));
    }
    if (texts) {
      parts.push(el("h3", {}, `Observations behind this key (${n.observations.length})`));
      if (n.observations.length > 1) {
        parts.push(el("p", { class: "warn" }, `${n.observations.length} different observations share this key.`));
      }
      for (const [text, count] of n.observations) {
        parts.push(el("pre", { class: "obs" }, `${count}× ${texts[text]}`));
        const others = n.goal ? [] : state.group.textNodes.get(text).filter((other) => other !== id);
        if (others.length) {
          parts.push(el("p", { class: "warn" }, "This observation is also seen under another key: ",
            ...others.flatMap((other) => [nodeLink(other), " "])));
        }
      }
    }
    $("panel").replaceChildren(...parts);
  }

  function showEdge(id) {
    const e = state.group.byId.get(id);
    $("panel").replaceChildren(el("h3", {}, "Transition"),
      el("p", {}, "from ", nodeLink(e.source), " to ", nodeLink(e.target)),
      table([["trajectories", e.trajectories],
             ["successes", `${e.successes} of them (${Math.round(100 * e.success_rate)}%)`],
             ["vs the other actions here", e.lift === null ? "no other action" : num(e.lift, 3),
              "its success rate minus the mean of the state's other transitions"]]),
      el("h3", {}, "Actions"),
      el("table", {}, ...e.actions.map(([action, count]) => el("tr", {}, el("td", {}, `${count}×`),
                                                                 el("td", {}, action)))));
  }

  // -------------------------------------------------------------------- start
  function start() {
    const run = summary.run;
    $("run-title").textContent = `${run.name}`;
    $("run-summary").textContent = `${run.method ?? "?"} on ${run.env ?? "?"}: ${run.n_tasks ?? "?"} tasks × ` +
      `${run.group_size ?? "?"} rollouts per iteration, ${run.total_timesteps ?? "?"} env steps; batches kept ` +
      `every ${run.keep_batch_every ?? "?"} iterations and the last.`;
    drawCurve();
    drawKeptList();
    $("group-select").addEventListener("change", (event) => selectGroup(Number(event.target.value)));
    $("show-more").addEventListener("click", () => { state.cap += CAP_STEP; drawGraph(); });
    $("fit").addEventListener("click", () => state.cy && state.cy.fit());
    $("clear").addEventListener("click", clearSelection);
    openIteration(summary.included[summary.included.length - 1]);
    document.body.dataset.readyMs = String(performance.now()); // since navigation start (the benchmark reads it)
    document.body.dataset.ready = "true";
  }

  window.milegpoReport = {
    openIteration, selectGroup, selectTrajectory, clearSelection,
    get cy() { return state.cy; },
    get curve() { return state.curve; },
    get group() { return state.group; },
    get iteration() { return state.iteration; },
  };
  start();
})();
