// Follows a running job on its page: output as it arrives, and the "Hosts and tasks" view
// fetched again (drawn by the server) when events arrive. When the job ends, the page is
// loaded again, so it shows what the store holds, as a finished job's page always does. The page works without this script; it
// only stops being live.
(function () {
  "use strict";

  var job = document.getElementById("job");
  if (!job || job.getAttribute("data-live") !== "true") {
    return;
  }
  var output = document.getElementById("output");
  var summary = document.getElementById("summary");
  var state = document.getElementById("job-state");
  var live = document.getElementById("live-status");

  // The output keeps at most this many characters, dropping the oldest, so a long run does
  // not grow the page without bound.
  var maxOutput = 2 * 1024 * 1024;

  function atBottom() {
    return output.scrollHeight - output.scrollTop - output.clientHeight < 40;
  }

  function append(text, noteLevel) {
    var follow = atBottom();
    if (noteLevel) {
      var span = document.createElement("span");
      span.className = "note note-" + noteLevel;
      span.textContent = text;
      output.appendChild(span);
    } else {
      output.appendChild(document.createTextNode(text));
    }
    while (output.textContent.length > maxOutput && output.firstChild) {
      output.removeChild(output.firstChild);
    }
    if (follow) {
      output.scrollTop = output.scrollHeight;
    }
  }

  function setState(text, cls) {
    state.textContent = text;
    state.className = "badge " + cls;
  }

  // setStarted shows the start as the server draws times: UTC, to the second.
  function setStarted(at) {
    var started = document.getElementById("job-started");
    var t = new Date(at);
    if (started && !isNaN(t.getTime())) {
      started.textContent = t.toISOString().slice(0, 19).replace("T", " ") + " UTC";
    }
  }

  function setLive(text, cls) {
    live.textContent = text;
    live.className = "live-status " + (cls || "");
  }

  // One summary fetch at a time; events arriving meanwhile ask for one more afterwards.
  var fetching = false;
  var again = false;
  function refreshSummary() {
    if (fetching) {
      again = true;
      return;
    }
    fetching = true;
    again = false;
    fetch(job.getAttribute("data-summary"), { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (resp) {
        if (!resp.ok) {
          throw new Error("summary: " + resp.status);
        }
        return resp.text();
      })
      .then(function (html) {
        // Drawn by the app's own templates, which escape everything that came from a host.
        summary.innerHTML = html;
      })
      .catch(function () {})
      .then(function () {
        fetching = false;
        if (again) {
          setTimeout(refreshSummary, 300);
        }
      });
  }

  var url = job.getAttribute("data-stream") + "?after=" + encodeURIComponent(job.getAttribute("data-after"));
  var source = new EventSource(url);
  setLive("Connecting…");

  source.onopen = function () {
    setLive("Live", "on");
  };
  source.onerror = function () {
    if (source.readyState === EventSource.CLOSED) {
      setLive("The live view stopped: reload the page.", "lost");
    } else {
      setLive("Connection lost; reconnecting…", "lost");
    }
  };

  source.addEventListener("record", function (e) {
    var rec;
    try {
      rec = JSON.parse(e.data);
    } catch (err) {
      return;
    }
    var d = rec.data || {};
    switch (rec.kind) {
      case "output":
        append(d.text || "");
        break;
      case "start":
        setState("running", "state-running");
        setStarted(rec.at);
        append("rte: " + d.playbook + " started on " + d.instance + " (pid " + d.pid + ")\n", "info");
        break;
      case "log":
        append("rte " + d.level + ": " + d.message + "\n", d.level);
        break;
      case "events":
        refreshSummary();
        break;
      case "end":
        setState(d.status, "status-" + d.status);
        break;
    }
  });

  // The stream's last event: the job has ended and every record was sent.
  source.addEventListener("job", function () {
    source.close();
    setLive("Ended");
    window.location.reload();
  });
})();
