// Evidence page: "copy Markdown for the PR" through the clipboard API; where that is refused
// (no permission, not a secure context) the Markdown box opens with its text selected.
(function () {
  "use strict";
  var button = document.getElementById("cb-copy-md");
  var box = document.getElementById("cb-markdown-box");
  var text = document.getElementById("cb-markdown");
  var status = document.getElementById("cb-copy-status");
  if (!button || !text) { return; }
  button.hidden = false;
  function fallback() {
    box.open = true;
    text.focus();
    text.select();
    var copied = false;
    try { copied = document.execCommand("copy"); } catch (error) { copied = false; }
    status.textContent = copied ? "Copied." : "Press Ctrl+C (or Cmd+C) to copy.";
  }
  button.addEventListener("click", function () {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text.value).then(function () {
        status.textContent = "Copied.";
      }, fallback);
    } else {
      fallback();
    }
  });
})();
