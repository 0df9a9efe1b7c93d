// The ksquad console's only script (served from this origin; the pages allow no other). It keeps pages live:
// it never builds markup from data. What it inserts is either the server's own escaped HTML (the runs table,
// fetched again) or text set with textContent.
"use strict";

// The runs table: fetched again every few seconds with the page's filters, while the page is in view (a tab in
// the background asks nothing), and less often when the console says it is busy (429: its Retry-After).
function refreshTables() {
  for (const box of document.querySelectorAll("[data-refresh]")) {
    const source = box.getAttribute("data-refresh");
    const again = async () => {
      let wait = 2000;
      if (!document.hidden) {
        try {
          const answer = await fetch(source, { credentials: "same-origin", headers: { Accept: "text/html" } });
          if (answer.ok && !answer.redirected) {
            box.innerHTML = await answer.text(); // the server's escaped rendering of the same table
            showTimes(box);
          } else if (answer.status === 429) {
            wait = 1000 * Math.max(2, Number(answer.headers.get("Retry-After")) || 5);
          }
        } catch (err) {
          // the next look tries again
        }
      }
      setTimeout(again, wait);
    };
    setTimeout(again, 2000);
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
