// The ksquad console's only script (served from this origin; the pages allow no other). It keeps pages live:
// it never builds markup from data. What it inserts is either the server's own escaped HTML (the runs table,
// fetched again) or text set with textContent.
"use strict";

// The runs table: fetched again with the page's filters when the console says it changed (server-sent `change`
// events from data-changes), while the page is in view (a tab in the background holds no stream and asks
// nothing; back in view, or reconnected, it fetches once and follows again). When the console will not follow (its stream refused
// or ended: a budget, rights gone), the table is fetched every 10 s instead, and less often when the console says
// it is busy (429: its Retry-After).
function refreshTables() {
  for (const box of document.querySelectorAll("[data-refresh]")) {
    const source = box.getAttribute("data-refresh");
    const changes = box.getAttribute("data-changes");
    let fetching = false;
    let again = false;
    let events = null;
    let polling = null;
    let pollWait = 10000;
    const refresh = async () => {
      if (fetching) {
        again = true;
        return;
      }
      fetching = true;
      try {
        const answer = await fetch(source, { credentials: "same-origin", headers: { Accept: "text/html" } });
        if (answer.ok && !answer.redirected) {
          box.innerHTML = await answer.text(); // the server's escaped rendering of the same table
          showTimes(box);
        } else if (answer.status === 429) {
          pollWait = 1000 * Math.max(10, Number(answer.headers.get("Retry-After")) || 10);
        }
      } catch (err) {
        // the next change (or look) tries again
      }
      fetching = false;
      if (again) {
        again = false;
        refresh();
      }
    };
    const poll = () => {
      if (polling !== null) return;
      const look = () => {
        if (!document.hidden) refresh();
        polling = setTimeout(look, pollWait);
      };
      polling = setTimeout(look, pollWait);
    };
    const stopPolling = () => {
      if (polling !== null) clearTimeout(polling);
      polling = null;
    };
    let opened = 0;
    const follow = () => {
      if (events !== null || document.hidden || !changes) return;
      const stream = new EventSource(changes);
      events = stream;
      stream.addEventListener("open", () => {
        stopPolling();
        // (Re)connected: what changed while no stream was open is read once (the page's own rendering is fresh).
        if (opened++ > 0) refresh();
      });
      stream.addEventListener("change", refresh);
      const giveUp = () => {
        stream.close();
        if (events === stream) events = null;
        poll();
      };
      stream.addEventListener("end", giveUp);
      stream.addEventListener("error", () => {
        if (stream.readyState === EventSource.CLOSED) giveUp(); // refused: no reconnecting on its own
      });
    };
    document.addEventListener("visibilitychange", () => {
      if (document.hidden) {
        if (events !== null) events.close();
        events = null;
      } else {
        follow();
      }
    });
    if (changes) follow();
    else poll();
  }
}

// "Resumes in 42 s" beside every resumeAt, counted down each second.
function countdowns() {
  const tick = () => {
    for (const span of document.querySelectorAll("[data-countdown]")) {
      const left = Math.round((Date.parse(span.getAttribute("data-countdown")) - Date.now()) / 1000);
      span.textContent = left > 0 ? `(in ${formatSeconds(left)})` : "(due now)";
    }
  };
  tick();
  setInterval(tick, 1000);
}

function formatSeconds(total) {
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  return h ? `${h} h ${m} min` : m ? `${m} min ${s} s` : `${s} s`;
}

// Timestamps in the reader's own time.
function showTimes(root) {
  for (const time of root.querySelectorAll("time[datetime]")) {
    const at = new Date(time.getAttribute("datetime"));
    if (!Number.isNaN(at.getTime())) {
      time.textContent = at.toLocaleString();
      time.title = time.getAttribute("datetime");
    }
  }
}

// A run's page follows its events: progress is appended as text; a phase change reloads the page, which the
// server renders again (timeline, actions, countdown).
function followRun() {
  const run = document.querySelector("[data-events]");
  if (!run) return;
  const progress = document.getElementById("progress");
  const events = new EventSource(run.getAttribute("data-events"));
  let reloading = false;
  const reload = () => {
    if (!reloading) {
      reloading = true;
      events.close();
      setTimeout(() => window.location.reload(), 300);
    }
  };
  events.addEventListener("phase", reload);
  events.addEventListener("end", reload);
  events.addEventListener("status", (message) => {
    const event = JSON.parse(message.data);
    const item = document.createElement("li");
    const time = document.createElement("time");
    time.setAttribute("datetime", event.at);
    time.textContent = new Date(event.at).toLocaleString();
    item.append(time, " ", String(event.message || ""));
    progress.append(item);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  showTimes(document);
  countdowns();
  refreshTables();
  followRun();
});
