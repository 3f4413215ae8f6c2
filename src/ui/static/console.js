// resourcesync-hub console: keeps the parts of a page marked data-live-part up to date by
// fetching the page again every data-live seconds and swapping those parts in. The pages are
// complete without it.
"use strict";
(function () {
  var every = Number(document.body.getAttribute("data-live"));
  if (!every || !window.fetch || !window.DOMParser) {
    return;
  }
  var banner = null;
  var refreshed = 0;
  function say(text) {
    if (!banner) {
      banner = document.createElement("p");
      banner.className = "error";
      banner.setAttribute("role", "status");
      document.getElementById("main").prepend(banner);
    }
    banner.textContent = text;
  }
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.redirected || r.status !== 200) {
          throw new Error(r.status === 200 ? "the session ended: sign in again" : "the server answered " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live-part]").forEach(function (part) {
          if (part.contains(document.activeElement) && document.activeElement !== document.body) {
            return;
          }
          var name = part.getAttribute("data-live-part");
          var next = fresh.querySelector('[data-live-part="' + name + '"]');
          if (next && next.innerHTML !== part.innerHTML) {
            part.innerHTML = next.innerHTML;
          }
        });
        if (banner) {
          banner.remove();
          banner = null;
        }
        refreshed += 1;
        document.body.setAttribute("data-refreshed", String(refreshed));
        window.setTimeout(refresh, every * 1000);
      })
      .catch(function (e) {
        say("Live updates stopped: " + e.message + ".");
      });
  }
  window.setTimeout(refresh, every * 1000);
})();
