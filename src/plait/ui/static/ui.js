// plait's web UI: details on hover for the ops chart, and the live events stream.
(function () {
  "use strict";
  function tooltips() {
    var tip = document.getElementById("tip");
    if (!tip) return;
    document.querySelectorAll(".gantt .bar").forEach(function (bar) {
      bar.addEventListener("mousemove", function (ev) {
        tip.textContent = bar.getAttribute("data-detail");
        tip.hidden = false;
        tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
        tip.style.top = (ev.clientY + 14) + "px";
      });
      bar.addEventListener("mouseleave", function () { tip.hidden = true; });
    });
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text == null ? "" : String(text);
    row.appendChild(td);
    return td;
  }

  function clock(t) {
    var d = new Date(t * 1000);
    return d.toTimeString().slice(0, 8);
  }

  function live() {
    var marker = document.getElementById("live");
    var table = document.querySelector("#events tbody");
    if (!marker || !table) return;
    var cursor = marker.getAttribute("data-cursor");
    var job = marker.getAttribute("data-job");
    var src = marker.getAttribute("data-src");
    function poll() {
      var url = src + "?after=" + encodeURIComponent(cursor) + (job ? "&job=" + encodeURIComponent(job) : "");
      fetch(url, {credentials: "same-origin"}).then(function (r) {
        if (r.status === 401) {
          // the session ended (logged out, or its token revoked): no more polls, and
          // the login page, which comes back here
          var back = location.pathname + location.search;
          location.assign(src.replace(/events\.json$/, "login") + "?next=" + encodeURIComponent(back));
          throw new Error("logged out");
        }
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      }).then(function (page) {
        page.events.forEach(function (e) {
          var row = document.createElement("tr");
          row.className = "new";
          row.setAttribute("data-seq", e.seq);
          cell(row, clock(e.time));
          cell(row, e.kind);
          var jobCell = cell(row, "");
          if (e.job) {
            var a = document.createElement("a");
            a.href = src.replace(/events\.json$/, "jobs/") + encodeURIComponent(e.job);
            a.textContent = e.job;
            jobCell.appendChild(a);
          }
          cell(row, e.task);
          cell(row, e.machine);
          cell(row, e.actor || e.source);
          cell(row, e.message);
          cell(row, (e.reason || "") + (e.decision ? " · " + e.decision : ""));
          table.insertBefore(row, table.firstChild);
        });
        while (table.rows.length > 1000) table.deleteRow(table.rows.length - 1);
        cursor = page.cursor;
        marker.textContent = "(live)";
        setTimeout(poll, page.more ? 100 : 2000);
      }).catch(function (err) {
        if (err.message === "logged out") { marker.textContent = "(logged out)"; return; }
        marker.textContent = "(reconnecting: " + err.message + ")";
        setTimeout(poll, 5000);
      });
    }
    setTimeout(poll, 2000);
  }

  document.addEventListener("DOMContentLoaded", function () { tooltips(); live(); });
})();
