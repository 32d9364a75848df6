// Live progress of a sync job: polls /console/jobs/<id>/progress once a second until the job has finished and
// writes each field as text (never as HTML). Served from /console/static, allowed by the page's CSP.
(function () {
  "use strict";
  var root = document.getElementById("job");
  if (!root || root.getAttribute("data-finished") === "true") { return; }
  var url = "/console/jobs/" + encodeURIComponent(root.getAttribute("data-job-id")) + "/progress";
  function show(job) {
    Object.keys(job).forEach(function (name) {
      var el = root.querySelector('[data-field="' + name + '"]');
      var value = job[name];
      if (el && (typeof value === "string" || typeof value === "number")) { el.textContent = String(value); }
    });
    var state = root.querySelector('[data-field="state"]');
    if (state) { state.className = "badge state-" + String(job.state || ""); }
    var errors = document.getElementById("errors");
    if (errors && Array.isArray(job.errors)) {
      errors.textContent = "";
      job.errors.forEach(function (e) { var li = document.createElement("li"); li.textContent = String(e);
                                        errors.appendChild(li); });
    }
    if (job.state !== "unknown") {
      var waiting = root.querySelector('[data-field="waiting"]');
      if (waiting) { waiting.remove(); }
    }
  }
  function poll() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (job) {
        if (!job) { return; }
        show(job);
        if (job.finished) { root.setAttribute("data-finished", "true"); return; }
        window.setTimeout(poll, 1000);
      })
      .catch(function () { window.setTimeout(poll, 3000); });
  }
  window.setTimeout(poll, 500);
})();
