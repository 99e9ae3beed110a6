// Job form: warn, as the user types, when the rounds asked for cannot reach a verdict for the
// matrix chosen. The rule lives on the server (evidence/analysis/stats.py units_for_verdict); it
// sends the rounds needed per number of comparisons in the warning's data-rounds-needed. This
// script only counts the comparisons: contexts x candidates (ablation: contexts x (features + 1)).
(function () {
  "use strict";
  var rounds = document.getElementById("rounds");
  var warning = document.getElementById("rounds-warning");
  var form = rounds && rounds.form;
  if (!rounds || !warning || !form) { return; }
  var needed = JSON.parse(warning.dataset.roundsNeeded || "{}");

  function items(text) {
    return text.split(/[,\s]+/).filter(function (part) { return part.length > 0; });
  }
  function comparisons() {
    var contexts = form.querySelectorAll("input[name=contexts]:checked").length +
      items(form.elements.custom_contexts.value).length;
    var mode = form.querySelector("input[name=mode]:checked");
    var candidates = 0;
    if (mode && mode.value === "ablation") {
      candidates = items(form.elements.features.value).length + 1;
    } else {
      for (var i = 1; form.elements["variant-" + i + "-name"]; i += 1) {
        if (["name", "ref", "flags"].some(function (part) {
          return form.elements["variant-" + i + "-" + part].value.trim() !== "";
        })) { candidates += 1; }
      }
    }
    return Math.max(contexts, 1) * Math.max(candidates, 1);
  }
  function update() {
    var family = comparisons();
    var need = needed[String(family)];
    var asked = parseInt(rounds.value, 10);
    if (!need || isNaN(asked) || asked >= need) {
      warning.hidden = true;
      warning.textContent = "";
      return;
    }
    warning.textContent = asked + " round" + (asked === 1 ? "" : "s") +
      " cannot reach a verdict: the robust interval of " + family + " comparison" +
      (family === 1 ? "" : "s") + " needs at least " + need +
      " rounds (independent process pairs), more when the spread is wide. The job is still " +
      "accepted.";
    warning.hidden = false;
  }
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
})();

// Job form: show the fields of the chosen mode only (the server reads no others), the ref column
// only for a repository (the embedded engine has no refs), and the candidate rows only where
// the mode compares variants (a range, a bisection or a commits job runs the baseline row's
// configuration).
(function () {
  "use strict";
  var form = document.querySelector("form.job-form");
  if (!form) { return; }
  function show() {
    var checked = form.querySelector("input[name=mode]:checked");
    var mode = checked ? checked.value : "ab";
    var range = form.elements.range ? form.elements.range.value.trim() : "";
    form.querySelectorAll("[data-modes]").forEach(function (element) {
      element.hidden = element.dataset.modes.split(" ").indexOf(mode) < 0;
    });
    var oneConfiguration = mode === "bisect" || mode === "commits" ||
      (mode === "history" && range !== "");
    form.querySelectorAll("tr.candidate").forEach(function (row) { row.hidden = oneConfiguration; });
    var hasRefs = form.elements.repository && form.elements.repository.value !== "";
    form.querySelectorAll(".ref-cell").forEach(function (cell) { cell.hidden = !hasRefs; });
  }
  form.addEventListener("input", show);
  form.addEventListener("change", show);
  show();
})();
