// Cuvil dashboard: every few seconds, ask whether the results database changed; if it did, fetch
// this page's content again and swap it in. No framework, no build step, nothing from the network.
"use strict";
(function () {
  const live = document.getElementById("live");
  const content = document.getElementById("content");
  if (!live || !content) return;
  const every = Number(live.dataset.pollMs) || 2000;
  let version = document.body.dataset.version;
  let busy = false;

  function stamp(text, stale) {
    live.textContent = text;
    live.classList.toggle("stale", stale);
  }

  async function poll() {
    if (busy) return;
    busy = true;
    try {
      const res = await fetch("/api/version", { cache: "no-store" });
      const now = (await res.json()).version;
      if (now !== version) {
        const url = new URL(location.href);  // this page's own URL: a path such as "//x" stays on this origin
        url.search = "?fragment=1";
        url.hash = "";
        const page = await fetch(url, { cache: "no-store" });
        if (page.ok) {
          content.innerHTML = await page.text();
          version = now;
          document.body.dataset.version = now;
        }
      }
      stamp("live, checked " + new Date().toLocaleTimeString(), false);
    } catch (err) {
      stamp("not updating: the dashboard server does not answer", true);
    } finally {
      busy = false;
    }
  }

  stamp("live", false);
  setInterval(poll, every);
})();
