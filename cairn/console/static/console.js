// The Cairn console's one script: reads the JSON API every second and draws the page.
//
// Every string that comes from a task (names, messages, file contents, tool arguments,
// reasons) reaches the page through textContent or setAttribute only, never as markup.
// A change is a POST with the page's CSRF secret, asked for with confirm() first; its
// outcome (or the one-line reason it failed, as `cairn` prints it) shows in #outcome.
"use strict";
(function () {
  var POLL_MS = 1000;
  var ENDED = ["succeeded", "failed", "cancelled", "unrecoverable"]; // no action changes these
  var csrf = document.querySelector('meta[name="cairn-csrf"]').getAttribute("content");
  var body = document.body;
  var drawn = {}; // what each part was last drawn from: unchanged data is not redrawn

  function el(tag, props) {
    var node = document.createElement(tag);
    Object.keys(props || {}).forEach(function (key) {
      if (key === "text") node.textContent = props[key];
      else if (key === "className") node.className = props[key];
      else node.setAttribute(key, props[key]);
    });
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function fill(tbody, rows, empty, columns) {
    tbody.replaceChildren();
    if (!rows.length) {
      tbody.appendChild(el("tr", {}, el("td", { colspan: String(columns), className: "empty", text: empty })));
    }
    rows.forEach(function (row) { tbody.appendChild(row); });
  }

  function changed(part, data) {
    var text = JSON.stringify(data);
    if (drawn[part] === text) return false;
    drawn[part] = text;
    return true;
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        return response.json().then(function (data) {
          if (!response.ok) throw new Error(data.error || response.statusText);
          return data;
        });
      });
  }

  function post(url, payload) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Cairn-CSRF": csrf },
      body: JSON.stringify(payload || {}),
    }).then(function (response) {
      return response.json().then(function (data) {
        if (!response.ok) throw new Error(data.error || response.statusText);
        return data;
      });
    });
  }

  function say(text, ok, link) {
    var box = document.getElementById("outcome");
    box.hidden = false;
    box.className = ok ? "ok" : "error";
    box.replaceChildren(el("span", { text: text }));
    if (link) box.appendChild(el("a", { href: link.href, text: link.text }));
  }

  // Ask, POST, say how it went. `describe` turns the answer into the line shown.
  function act(question, url, payload, describe) {
    if (!window.confirm(question)) return;
    post(url, payload).then(function (data) {
      var shown = describe(data);
      say(shown.text, true, shown.link);
      refresh();
    }, function (error) { say(error.message, false); });
  }

  function tokens(usage) {
    usage = usage || {};
    return (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
  }

  function cost(usage) {
    return usage && usage.cost_usd ? "$" + usage.cost_usd.toFixed(4) : "";
  }

  function age(iso) {
    if (!iso) return "";
    var s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 60) return Math.floor(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    if (s < 86400) return Math.floor(s / 3600) + " h";
    return Math.floor(s / 86400) + " d";
  }

  function state(value) { return el("span", { className: "state state-" + value, text: value }); }

  function taskLink(id) { return el("a", { href: "/tasks/" + encodeURIComponent(id), text: id }); }

  function api(task) { return "/api/tasks/" + encodeURIComponent(task); }

  // The task list ---------------------------------------------------------------------
  function drawTasks(statuses) {
    var filter = document.getElementById("state-filter").value;
    var shown = statuses.filter(function (s) { return !filter || s.status === filter; });
    document.getElementById("task-count").textContent = shown.length + " of " + statuses.length;
    fill(document.querySelector("#tasks tbody"), shown.map(function (s) {
      return el("tr", { "data-task": s.task_id },
        el("td", {}, taskLink(s.task_id)), el("td", { className: "state-cell" }, state(s.status)),
        el("td", { text: s.superstep }), el("td", { text: s.epoch }),
        el("td", { text: s.latest_checkpoint === null ? "" : s.latest_checkpoint }),
        el("td", { text: tokens(s.usage) }), el("td", { text: cost(s.usage) }),
        el("td", { text: s.agents.length }), el("td", { className: "age", text: age(s.submitted_at) }));
    }), filter ? "no task is " + filter : "no tasks", 9);
  }

  function startTasks() {
    var select = document.getElementById("state-filter");
    select.value = new URLSearchParams(window.location.search).get("state") || "";
    select.addEventListener("change", function () {
      var url = new URL(window.location.href);
      if (select.value) url.searchParams.set("state", select.value);
      else url.searchParams.delete("state");
      window.history.replaceState(null, "", url);
      drawn = {};
      refresh();
    });
    return function () {
      return getJSON("/api/tasks").then(function (statuses) {
        if (changed("tasks", [statuses, select.value, statuses.map(function (s) { return age(s.submitted_at); })])) drawTasks(statuses);
      });
    };
  }

  // Approvals (the queue, and a task's own) -------------------------------------------
  function decide(call, approved) {
    var url = api(call.task_id) + (approved ? "/approve" : "/reject");
    var what = call.tool + " (" + call.call + ") of " + call.agent + " in " + call.task_id;
    if (approved) {
      act("Approve " + what + "?", url, { agent: call.agent, call: call.call }, function (d) {
        return { text: "approved " + d.tool + " (" + d.call + ") of " + d.agent };
      });
      return;
    }
    var reason = window.prompt("Reject " + what + "? The model reads your reason:", "");
    if (reason === null) return;
    if (!reason.trim()) { say("reject: give a reason (the model reads it)", false); return; }
    post(url, { agent: call.agent, call: call.call, reason: reason }).then(function (d) {
      say("rejected " + d.tool + " (" + d.call + ") of " + d.agent, true);
      refresh();
    }, function (error) { say(error.message, false); });
  }

  function drawApprovals(calls, withTask) {
    fill(document.querySelector("#approvals tbody"), calls.map(function (c) {
      var approve = el("button", { type: "button", className: "approve", text: "approve" });
      var reject = el("button", { type: "button", className: "reject", text: "reject" });
      approve.addEventListener("click", function () { decide(c, true); });
      reject.addEventListener("click", function () { decide(c, false); });
      return el("tr", { "data-agent": c.agent, "data-call": c.call },
        withTask ? el("td", {}, taskLink(c.task_id)) : null,
        el("td", { text: c.agent }), el("td", { text: c.call }), el("td", { text: c.tool }),
        el("td", {}, el("pre", { className: "arguments", text: JSON.stringify(c.arguments, null, 2) })),
        el("td", { className: "decide" }, approve, " ", reject));
    }), "no tool call waits for a person", withTask ? 6 : 5);
  }

  function countApprovals() {
    return getJSON("/api/approvals").then(function (calls) {
      document.getElementById("approval-count").textContent = calls.length ? "(" + calls.length + ")" : "";
      return calls;
    });
  }

  function startApprovals() {
    return function () {
      return countApprovals().then(function (calls) {
        if (changed("approvals", calls)) drawApprovals(calls, true);
      });
    };
  }

  // One task ----------------------------------------------------------------------------
  function drawSummary(s) {
    // The latest GC closed the superstep before the one running (if one is): both are named.
    var running = s.running_superstep !== null && s.running_superstep !== undefined;
    var gc = s.latest_checkpoint === null ? "none" : s.latest_checkpoint + (running ? " at superstep " + s.superstep : "");
    var parts = [state(s.status), el("span", { id: "superstep", text: running ? " running superstep " + s.running_superstep : " superstep " + s.superstep }),
      " · epoch ", el("b", { id: "epoch", text: s.epoch }), " · latest GC " + gc,
      " · " + tokens(s.usage) + " tokens", cost(s.usage) ? " (" + cost(s.usage) + ")" : ""];
    if (s.restoring) parts.push(" · restoring");
    if (s.reason) parts.push(el("span", { className: "reason", text: " · " + s.reason }));
    if (s.forked_from) parts.push(" · forked from ", taskLink(s.forked_from.task_id), " at GC " + s.forked_from.checkpoint);
    if (s.error) parts.push(el("span", { className: "error", text: " · " + s.error }));
    var summary = document.getElementById("summary");
    summary.replaceChildren();
    parts.forEach(function (p) { summary.append(p); });
    fill(document.querySelector("#agents tbody"), s.agents.map(function (a) {
      var who = a.spawned_by ? a.name + " (spawned by " + a.spawned_by + ")" : a.name;
      var held = a.held ? el("span", { className: "reason", title: a.held, text: " (held: budget)" }) : "";
      return el("tr", { "data-agent": a.name }, el("td", { text: who }), el("td", {}, state(a.status), held),
        el("td", { text: a.step === null ? "?" : a.step }), el("td", { text: tokens(a.usage) }),
        el("td", { text: tokens(a.usage.replayed) }), el("td", { className: "retries", text: a.retries || 0 }),
        lastError(a.last_error));
    }), "no agents yet", 7);
    document.getElementById("verify").textContent = s.verify_output || "(verify has not run, or printed nothing)";
    // Pause, resume and cancel are offered (they start hidden) only while the task can take them.
    var ended = ENDED.indexOf(s.status) >= 0;
    document.querySelectorAll("#task-actions button").forEach(function (button) {
      button.hidden = ended;
      button.disabled = ended;
    });
  }

  // An agent's latest failed attempt, recorded as it happened: when, which, what.
  function lastError(e) {
    if (!e) return el("td", { className: "last-error" });
    var what = (e.error_class ? e.error_class + ": " : "") + e.error;
    var when = new Date(e.at).toLocaleTimeString();
    return el("td", { className: "last-error error", title: e.at + " · " + e.event.replace("_", " ") + " · " + (e.process || ""),
      text: when + " · superstep " + e.superstep + " attempt " + e.attempt + " · " + what });
  }

  // What each agent's model has replied so far, while its reply streams (`stream: true`).
  function drawLive(replies) {
    var box = document.getElementById("streaming");
    var names = Object.keys(replies);
    box.replaceChildren();
    if (!names.length) {
      box.appendChild(el("p", { className: "meta", text: "no model reply is streaming" }));
      return;
    }
    names.forEach(function (name) {
      var r = replies[name];
      var cut = r.chars > r.text.length ? "…" : "";
      var text = el("pre", { className: "live-text", text: cut + r.text });
      var part = el("div", { className: "live-reply", "data-agent": name },
        el("h3", { text: name + " · superstep " + r.superstep + " · attempt " + r.attempt + " · " + r.chars + " characters" }),
        text);
      r.tool_calls.forEach(function (c) {
        part.appendChild(el("pre", { className: "call", text: c.name + " " + c.arguments }));
      });
      box.appendChild(part);
      text.scrollTop = text.scrollHeight; // the end is what is new
    });
  }

  // What wrote a GC, as `cairn checkpoints` says it: "restore of 3", "fork of T@1", "-".
  function originOf(gc) {
    if (!gc.origin) return "-";
    if (gc.source === null || gc.source === undefined) return gc.origin;
    if (gc.origin === "fork") return "fork of " + gc.source_task + "@" + gc.source;
    return gc.origin + (gc.origin === "rollback" ? " to " : " of ") + gc.source;
  }

  function drawCheckpoints(task, gcs) {
    fill(document.querySelector("#checkpoints tbody"), gcs.map(function (gc) {
      var restore = el("button", { type: "button", className: "restore", text: "restore" });
      var fork = el("button", { type: "button", className: "fork", text: "fork" });
      restore.addEventListener("click", function () {
        act("Restore every agent and file of " + task + " to GC " + gc.number + "?", api(task) + "/restore", { to: gc.number },
          function (d) { return { text: task + " restored to checkpoint " + d.restored_to + " (recorded as checkpoint " + d.checkpoint + ", epoch " + d.epoch + ")" }; });
      });
      fork.addEventListener("click", function () {
        act("Start a new task from GC " + gc.number + " of " + task + "?", api(task) + "/fork", { at: gc.number },
          function (d) { return { text: d.task_id + " forked from " + task + " at checkpoint " + gc.number + ": ", link: { href: "/tasks/" + encodeURIComponent(d.task_id), text: "open " + d.task_id } }; });
      });
      var where = [gc.hot ? el("span", { className: "tag hot", text: "hot" }) : null, " ",
        gc.cold ? el("span", { className: "tag cold", text: "cold" }) : null];
      var committed = gc.status === "COMMITTED";
      var members = Object.keys(gc.members).sort();
      return el("tr", { "data-gc": gc.number }, el("td", { text: gc.number }), el("td", {}, state(gc.status)),
        el("td", { text: gc.superstep }), el("td", { text: gc.epoch === null || gc.epoch === undefined ? "" : gc.epoch }),
        el("td", { className: "members", text: members.length > 3 ? members.length + " agents" : members.join(", ") }),
        el("td", { className: "origin", text: originOf(gc) }),
        el.apply(null, ["td", {}].concat(where)), el("td", { text: gc.created_at ? new Date(gc.created_at).toLocaleTimeString() : "" }),
        el("td", { text: gc.dropped ? "" : gc.size_bytes + " B" }), el("td", {}, committed ? restore : null, " ", committed ? fork : null,
          gc.error ? el("span", { className: "error", text: gc.error }) : null));
    }), "no checkpoint yet", 10);
    // A diff compares committed states: an aborted GC committed nothing to compare.
    var comparable = gcs.filter(function (gc) { return gc.status === "COMMITTED"; });
    ["diff-a", "diff-b"].forEach(function (id, side) {
      var select = document.getElementById(id);
      var kept = select.value;
      select.replaceChildren();
      comparable.forEach(function (gc) { select.appendChild(el("option", { value: gc.number, text: "GC " + gc.number })); });
      if (kept && comparable.some(function (gc) { return String(gc.number) === kept; })) select.value = kept;
      else if (comparable.length) select.value = String(comparable[side === 0 ? 0 : comparable.length - 1].number);
    });
  }

  function drawDiff(d) {
    var out = document.getElementById("diff");
    out.replaceChildren(el("p", { className: "meta", text: d.a.task_id + " GC " + d.a.checkpoint + " → " + d.b.task_id + " GC " + d.b.checkpoint }));
    Object.keys(d.agents).forEach(function (name) {
      var agent = d.agents[name];
      var box = el("div", { className: "agent-diff" }, el("h3", { text: name }));
      agent.messages_added.forEach(function (m) {
        box.appendChild(el("div", { className: "msg " + m.role }, el("span", { className: "who", text: m.role }),
          el("pre", { text: m.content || "" })));
      });
      agent.tool_calls_added.forEach(function (c) {
        box.appendChild(el("pre", { className: "call", text: c.tool + " " + JSON.stringify(c.arguments || {}) +
          (c.error ? "\n  error: " + c.error : c.result ? "\n  → " + c.result : "") }));
      });
      if (!agent.messages_added.length && !agent.tool_calls_added.length) box.appendChild(el("p", { className: "meta", text: "nothing added" }));
      out.appendChild(box);
    });
    var members = d.members || { joined: {}, left: [] };
    Object.keys(members.joined).forEach(function (name) {
      var by = members.joined[name];
      out.appendChild(el("p", { text: "joined: " + name + (by ? " (spawned by " + by + ")" : "") }));
    });
    if (members.left.length) out.appendChild(el("p", { text: "left: " + members.left.join(", ") }));
    var files = d.files;
    out.appendChild(el("h3", { text: "Files" }));
    if (files.added.length) out.appendChild(el("p", { text: "added: " + files.added.join(", ") }));
    if (files.removed.length) out.appendChild(el("p", { text: "removed: " + files.removed.join(", ") }));
    Object.keys(files.changed).forEach(function (path) {
      var pre = el("pre", { className: "udiff" });
      files.changed[path].split("\n").forEach(function (line) {
        var kind = line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "";
        pre.appendChild(el("span", { className: kind, text: line }));
      });
      out.appendChild(el("div", { className: "file-diff", "data-path": path }, el("h4", { text: path }), pre));
    });
    if (!files.added.length && !files.removed.length && !Object.keys(files.changed).length) out.appendChild(el("p", { className: "meta", text: "no file changed" }));
  }

  function startTask() {
    var task = body.getAttribute("data-task");
    document.querySelectorAll("#task-actions button").forEach(function (button) {
      var action = button.getAttribute("data-action");
      button.addEventListener("click", function () {
        act(action.charAt(0).toUpperCase() + action.slice(1) + " " + task + "?", api(task) + "/" + action, {},
          function (d) { return { text: d.task_id + ": " + d.status }; });
      });
    });
    document.getElementById("diff-show").addEventListener("click", function () {
      var a = document.getElementById("diff-a").value, b = document.getElementById("diff-b").value;
      getJSON(api(task) + "/diff?a=" + encodeURIComponent(a) + "&b=" + encodeURIComponent(b))
        .then(drawDiff, function (error) { say(error.message, false); });
    });
    document.getElementById("timeline-reload").addEventListener("click", function () {
      var frame = document.getElementById("timeline");
      frame.setAttribute("src", frame.getAttribute("src"));
    });
    return function () {
      return Promise.all([getJSON(api(task)), getJSON(api(task) + "/checkpoints"), getJSON(api(task) + "/approvals"), countApprovals(),
        getJSON(api(task) + "/live")])
        .then(function (got) {
          if (changed("status", got[0])) drawSummary(got[0]);
          if (changed("checkpoints", got[1])) drawCheckpoints(task, got[1]);
          if (changed("approvals", got[2])) drawApprovals(got[2], false);
          if (changed("live", got[4])) drawLive(got[4]);
        });
    };
  }

  // Live ------------------------------------------------------------------------------
  var starts = { tasks: startTasks, task: startTask, approvals: startApprovals };
  var page = body.getAttribute("data-page");
  var read = starts[page] ? starts[page]() : countApprovals;
  var timer = null, reading = false, again = false;

  // One read at a time: a refresh asked for during a read (after an action) follows it.
  function refresh() {
    if (reading) { again = true; return; }
    if (timer !== null) window.clearTimeout(timer);
    timer = null;
    reading = true;
    var live = document.getElementById("live");
    read().then(function () {
      live.textContent = "live";
      live.className = "live ok";
      live.setAttribute("data-read-at", String(Date.now()));
    }, function (error) {
      live.textContent = "not live: " + error.message;
      live.className = "live error";
    }).then(function () {
      reading = false;
      if (again) { again = false; refresh(); } else timer = window.setTimeout(refresh, POLL_MS);
    });
  }

  refresh();
})();
