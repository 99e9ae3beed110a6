// Lists that update themselves (/hosts, /jobs): every few seconds the page is fetched again and
// the element marked data-live-s replaced by its new copy, while the tab is visible. Without
// JavaScript the page's Refresh link remains.
(function () {
  "use strict";
  var region = document.querySelector("[data-live-s]");
  if (!region || !window.fetch || !window.DOMParser) { return; }
  var every = 1000 * (parseFloat(region.dataset.liveS) || 5);
  var note = document.getElementById("live-note");
  function poll() {
    if (document.hidden) { window.setTimeout(poll, every); return; }
    fetch(window.location.href, {credentials: "same-origin", cache: "no-store"})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById(region.id);
        if (fresh) { region.replaceWith(fresh); region = fresh; }
        if (note) { note.textContent = "Updated " + new Date().toLocaleTimeString() + "; updates itself every " + every / 1000 + " s."; }
        window.setTimeout(poll, every);
      })
      .catch(function (error) {
        if (note) { note.textContent = "Live updates paused (" + error.message + "); retrying."; }
        window.setTimeout(poll, every * 3);
      });
  }
  window.setTimeout(poll, every);
})();
