// The console's only script: served from this origin (the CSP forbids
// inline scripts), and the pages work without it, a little less smoothly.
"use strict";

document.addEventListener("DOMContentLoaded", function () {
  // Copy buttons: data-copy names the element whose text to copy.
  document.querySelectorAll("[data-copy]").forEach(function (b) {
    b.addEventListener("click", function () {
      var el = document.getElementById(b.getAttribute("data-copy"));
      if (!el) return;
      var text = el.value !== undefined && el.tagName === "INPUT" ? el.value : el.textContent;
      var done = function () { b.textContent = "Copied"; setTimeout(function () { b.textContent = "Copy"; }, 1500); };
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(text).then(done, function () { select(el); });
      } else {
        select(el);
      }
    });
  });

  // Forms that destroy something ask first.
  document.querySelectorAll("form[data-confirm]").forEach(function (f) {
    f.addEventListener("submit", function (e) {
      if (!window.confirm(f.getAttribute("data-confirm"))) e.preventDefault();
    });
  });

  // Live status: rows with data-status-url refresh their status cell.
  var live = document.querySelectorAll("[data-status-url]");
  if (live.length) {
    setInterval(function () {
      live.forEach(function (cell) {
        fetch(cell.getAttribute("data-status-url"), { credentials: "same-origin", headers: { "Accept": "application/json" } })
          .then(function (r) { return r.ok ? r.json() : null; })
          .then(function (j) {
            if (!j) return;
            cell.textContent = j.status;
            cell.className = "status status-" + j.status;
          })
          .catch(function () {});
      });
    }, 3000);
  }
});

function select(el) {
  var r = document.createRange();
  r.selectNodeContents(el);
  var s = window.getSelection();
  s.removeAllRanges();
  s.addRange(r);
}
