// corral's dashboard: refresh the page's live part when the event stream says something
// changed, and stream a session's log tail. No framework; the server renders every page.
"use strict";

(function () {
  const REFRESH_GAP_MS = 1000; // at most one refresh a second, however many events arrive
  // ...and, with N dashboards open on the manager, at most every 20 x N times the last
  // fetch's duration: all of them together take about 5 % of the manager's time.
  const REFRESH_COST_FACTOR = 20;
  const LOG_MAX_CHARS = 200000; // the log tail keeps this much text

  let refreshing = false;
  let again = false;
  let lastRefresh = 0;
  let gapMs = REFRESH_GAP_MS;
  let timer = null;
  let seen = 0; // the newest event id the stream brought: a refresh must show it

  function live() {
    return document.querySelector("[data-live]");
  }

  function setState(text, state) {
    const el = document.getElementById("live-state");
    if (el) {
      el.textContent = text;
      el.dataset.state = state;
    }
  }

  function scheduleRefresh() {
    if (timer !== null) return;
    const wait = Math.max(0, lastRefresh + gapMs - Date.now());
    timer = setTimeout(function () {
      timer = null;
      refresh();
    }, wait);
  }

  async function refresh() {
    const region = live();
    if (!region) return;
    if (refreshing) {
      again = true;
      return;
    }
    refreshing = true;
    lastRefresh = Date.now();
    try {
      // `seen`: the manager may answer with data other dashboards asked for just now, but
      // only data read after the event that made this page refresh.
      const url = new URL(location.href);
      url.searchParams.set("seen", String(seen));
      const answer = await fetch(url, { credentials: "same-origin" });
      if (answer.redirected && answer.url.indexOf("/sign-in") >= 0) {
        location.assign(answer.url); // signed out meanwhile
        return;
      }
      const html = await answer.text();
      const open = Math.max(1, parseInt(answer.headers.get("X-Corral-Dashboards"), 10) || 1);
      const tookMs = Date.now() - lastRefresh;
      gapMs = Math.max(REFRESH_GAP_MS, REFRESH_COST_FACTOR * open * tookMs);
      const doc = new DOMParser().parseFromString(html, "text/html");
      const fresh = doc.getElementById(region.id);
      const focused = document.activeElement;
      // Never pull a control away from under the keyboard: wait for the next event.
      if (fresh && !(focused && region.contains(focused) && focused !== document.body)) {
        region.replaceChildren(...fresh.childNodes);
        document.dispatchEvent(new CustomEvent("corral:refreshed"));
      }
    } catch (err) {
      setState("○ refresh failed", "error");
    } finally {
      refreshing = false;
      if (again) {
        again = false;
        scheduleRefresh();
      }
    }
  }

  function listen() {
    const region = live();
    if (!region || typeof EventSource === "undefined") return;
    const root = document.querySelector("a.brand").getAttribute("href");
    // From the last event the page was rendered after: a change in between still arrives.
    const since = encodeURIComponent(region.dataset.since || "0");
    // A page about one entity (a session) is fetched again only for that entity's events:
    // the manager sends only those; a page of many things gets one message a batch.
    const entity = region.dataset.entity;
    const about = entity ? "&entity=" + encodeURIComponent(entity) : "";
    const source = new EventSource(root + "/stream?since=" + since + about);
    source.onopen = function () {
      setState("● live", "on");
    };
    source.onmessage = function (message) {
      let changed;
      try {
        changed = JSON.parse(message.data);
      } catch (err) {
        return;
      }
      if (typeof changed.id === "number" && changed.id > seen) seen = changed.id;
      // A gap (events the manager dropped for this page) may hold the entity's.
      if (entity && changed.kind !== "events.dropped" && changed.entity_id !== entity) return;
      scheduleRefresh();
    };
    source.onerror = function () {
      setState("○ reconnecting", "off"); // EventSource reconnects on its own
    };
  }

  async function tailLog() {
    const pre = document.getElementById("log");
    if (!pre) return;
    const state = document.getElementById("log-state");
    const say = function (text) {
      if (state) state.textContent = text;
    };
    say("reading the log…");
    try {
      const answer = await fetch(pre.dataset.logSrc, { credentials: "same-origin" });
      if (!answer.ok) {
        say("the log cannot be read (" + answer.status + ")");
        return;
      }
      say("following the log");
      const reader = answer.body.getReader();
      const decoder = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const stuck = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        let text = pre.textContent + decoder.decode(value, { stream: true });
        if (text.length > LOG_MAX_CHARS) text = text.slice(text.length - LOG_MAX_CHARS);
        pre.textContent = text;
        if (stuck) pre.scrollTop = pre.scrollHeight;
      }
      say("the session ended: this is its whole tail");
    } catch (err) {
      say("the log stream broke; reload to read it again");
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    listen();
    tailLog();
  });
})();
