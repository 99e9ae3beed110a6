// Job page: re-render the progress section from /jobs/{id}/progress.json every 2 s until the
// job is final. Without JavaScript the server-rendered state and a refresh link remain.
(function () {
  "use strict";
  var section = document.getElementById("progress");
  if (!section || section.dataset.final === "true" || !window.fetch) { return; }
  var url = "/jobs/" + encodeURIComponent(section.dataset.job) + "/progress.json";
  var note = document.getElementById("refresh-note");
  var failures = 0;
  function poll() {
    fetch(url, {credentials: "same-origin", cache: "no-store"})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (state) {
        failures = 0;
        section.innerHTML = state.html;
        if (state.is_final) {
          section.dataset.final = "true";
          var cancel = document.getElementById("cancel");
          if (cancel) { cancel.remove(); }
          if (note) { note.textContent = "Final state: " + state.state + "."; }
          return;
        }
        window.setTimeout(poll, 2000);
      })
      .catch(function (error) {
        failures += 1;
        if (note) { note.textContent = "Live updates paused (" + error.message + "); retrying. Reload to refresh by hand."; }
        window.setTimeout(poll, Math.min(30000, 2000 * Math.pow(2, failures)));
      });
  }
  window.setTimeout(poll, 2000);
})();
