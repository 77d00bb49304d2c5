// The console's only script: served from this origin (the CSP forbids
// inline scripts), and the pages work without it, a little less smoothly.
"use strict";

// Copy buttons and confirmations are delegated from the document, so the
// parts a live page swaps in (below) behave like the rest.
document.addEventListener("click", function (e) {
  var b = e.target.closest && e.target.closest("[data-copy]");
  if (!b) return;
  // data-copy names the element whose text to copy.
  var el = document.getElementById(b.getAttribute("data-copy"));
  if (!el) return;
  var text = el.value !== undefined && (el.tagName === "INPUT" || el.tagName === "TEXTAREA") ? el.value : el.textContent;
  var done = function () { b.textContent = "Copied"; setTimeout(function () { b.textContent = "Copy"; }, 1500); };
  if (navigator.clipboard && navigator.clipboard.writeText) {
    navigator.clipboard.writeText(text).then(done, function () { select(el); });
  } else {
    select(el);
  }
});

// Forms that destroy something ask first.
document.addEventListener("submit", function (e) {
  var f = e.target;
  if (f.hasAttribute && f.hasAttribute("data-confirm") && !window.confirm(f.getAttribute("data-confirm"))) e.preventDefault();
});

document.documentElement.classList.add("js");
document.addEventListener("DOMContentLoaded", follow);

// The project switch switches on selection; without the script its
// button does.
document.addEventListener("change", function (e) {
  if (e.target.id === "project-switch") e.target.form.submit();
});

// follow keeps a live page current: it follows the project's event stream
// (one per tab; the browser resumes it with Last-Event-ID after a drop)
// and, on an event about what the page shows, reads the page again and
// swaps in its data-live parts, which the server rendered. data-follow
// names the one service a page is about; without it every service event
// counts.
function follow() {
  var src = document.querySelector("[data-events]");
  if (!src || !window.EventSource) return;
  var only = src.getAttribute("data-follow");
  // A live tail (logs) follows the stream's "logs" messages, which say
  // the service's log has a newer line; service events do not concern it.
  var tail = src.hasAttribute("data-tail");
  var es = new EventSource(src.getAttribute("data-events"));
  var pending = null;
  var refresh = function () {
    if (pending) return;
    // Events come in bursts (a status, then its operation): one read.
    pending = setTimeout(function () { pending = null; reread(es); }, 200);
  };
  // "ready" opens (and reopens) the stream: what changed before it is
  // read once.
  es.addEventListener("ready", refresh);
  es.addEventListener("logs", refresh);
  es.addEventListener("change", function (m) {
    if (tail) return;
    var ev;
    try { ev = JSON.parse(m.data); } catch (err) { return; }
    if (only) {
      if (ev.resource_id === only && ev.status === "DELETED") { gone(es); return; }
      if (ev.resource_id !== only && ev.resource_kind !== "replica_set") return;
    } else if (ev.resource_kind !== "service") {
      return;
    }
    refresh();
  });
}

// reread reads the page again and swaps each data-live part for the new
// one of the same id; a page that is no longer there (signed out,
// deleted) stops following.
function reread(es) {
  fetch(window.location.pathname + window.location.search, { credentials: "same-origin", headers: { "X-Console-Live": "1" } })
    .then(function (r) {
      if (!r.ok || new URL(r.url).pathname !== window.location.pathname) { if (es) es.close(); return null; }
      return r.text();
    })
    .then(function (html) {
      if (!html) return;
      var doc = new DOMParser().parseFromString(html, "text/html");
      document.querySelectorAll("[data-live]").forEach(function (old) {
        var fresh = doc.getElementById(old.id);
        if (fresh) old.replaceWith(document.importNode(fresh, true));
      });
      document.dispatchEvent(new CustomEvent("console:live"));
    })
    .catch(function () {});
}

// gone marks a deleted service's page as such.
function gone(es) {
  es.close();
  document.querySelectorAll("[data-service-id]").forEach(function (cell) {
    cell.textContent = "DELETED";
    cell.className = "status status-DELETED";
  });
  var note = document.getElementById("live-gone");
  if (note) {
    note.className = "notice";
    note.textContent = "This service has been deleted.";
  }
}

function select(el) {
  var r = document.createRange();
  r.selectNodeContents(el);
  var s = window.getSelection();
  s.removeAllRanges();
  s.addRange(r);
}
