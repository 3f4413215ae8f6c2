"""Drives the consoles in headless Chromium (Debian's chromium + chromium-driver) with
Selenium, as their users would, for tests/it/console.rs.

    console_browser.py hub BASE_URL TOKEN FAILING_ID SCREENSHOT_DIR
    console_browser.py harvest BASE_URL SLOW_SOURCE DOWN_SOURCE AUDITED_SOURCE SCREENSHOT_DIR
    console_browser.py crawl BASE_URL TOKEN|- SCREENSHOT_DIR

`crawl` signs in (with TOKEN, unless `-`), then follows every link of every console page
(same origin; a link out of /console/ is fetched from the page, not followed further) and
reports in its findings `visited` (pages loaded), `checked` (other links fetched) and `bad`
([url, status, the page linking it]) for every answer that is not 2xx; the browser's console
errors are reported as in the other modes.

Talks to the test over stdin/stdout: prints a word when it needs the test to act (`FIX`: the
hub's failing subscriber has been seen, mend it; `MORE`: the slow source's progress was read,
let more through) and waits for a line on stdin; prints one JSON line of findings at the end.
Exits non-zero, with the reason on stderr, when a step fails.
"""

import json
import os
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

MODE, BASE, SHOTS = sys.argv[1], sys.argv[2], sys.argv[-1]
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
    ):
        o.add_argument(flag)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=o, service=Service(DRIVER))


findings = {"pages": {}, "console_errors": [], "clicks_to_redeliver_form": None}
d = browser()
wait = WebDriverWait(d, 30)


def page_weight():
    """Bytes of the page and everything it loaded."""
    return d.execute_script(
        "var n = performance.getEntriesByType('navigation')[0];"
        "var r = performance.getEntriesByType('resource');"
        "return (n ? n.decodedBodySize : 0) + r.reduce(function (a, e) { return a + e.decodedBodySize; }, 0);"
    )


def console_log(name, refused=None):
    """The browser's console entries since the last look, kept as errors; `refused` is the
    status of a refusal the step meant to provoke, whose network entry is no error."""
    for entry in d.get_log("browser"):
        if entry.get("level") not in ("SEVERE", "WARNING"):
            continue
        if refused and entry.get("source") == "network" and "status of %d" % refused in entry.get("message", ""):
            continue
        findings["console_errors"].append({"page": name, **entry})


def shot(name, refused=None):
    os.makedirs(SHOTS, exist_ok=True)
    d.save_screenshot(os.path.join(SHOTS, name + ".png"))
    findings["pages"][name] = {"url": d.current_url, "bytes": page_weight(), "title": d.title}
    console_log(name, refused)


def steady(f):
    """`f()`, again when a live update replaced the element under it meanwhile."""
    for _ in range(20):
        try:
            return f()
        except StaleElementReferenceException:
            time.sleep(0.05)
    return f()


def fail(why):
    shot("failure")
    print(why + "\nat " + d.current_url + "\n" + d.find_element(By.TAG_NAME, "body").text[:3000], file=sys.stderr)
    d.quit()
    sys.exit(1)


def hub_flow(TOKEN, FAILING):
    try:
        # Signing in: a wrong token is refused, the right one lets in.
        d.get(BASE + "/console/")
        if "/console/login" not in d.current_url:
            fail("an anonymous visitor was not sent to the login form")
        d.find_element(By.ID, "token").send_keys("not-the-token" + Keys.ENTER)
        wait.until(ec.presence_of_element_located((By.ID, "login-error")))
        findings["wrong_token"] = d.find_element(By.ID, "login-error").text
        shot("login", refused=403)
        d.find_element(By.ID, "token").send_keys(TOKEN + Keys.ENTER)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "h1")))
        if d.find_element(By.CSS_SELECTOR, "h1").text != "Overview":
            fail("signing in with the token did not lead to the overview")
        cookie = d.get_cookie("rshub_console")
        findings["cookie"] = {k: cookie.get(k) for k in ("httpOnly", "sameSite", "path")}
        shot("overview")

        # A state-changing POST without the CSRF token, from the signed-in browser: refused.
        findings["post_without_csrf"] = d.execute_async_script(
            "var done = arguments[arguments.length - 1];"
            "fetch('/console/subscriptions/" + FAILING + "/retry', {method: 'POST', credentials: 'same-origin',"
            " headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: 'confirm=yes'})"
            ".then(function (r) { return r.text().then(function (t) { done([r.status, t]); }); });"
        )
        console_log("overview", refused=403)

        # Keyboard: the first Tab reaches the skip link.
        d.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
        findings["first_tab"] = d.switch_to.active_element.text

        # From the overview to the failing subscriber's redeliver form.
        clicks = 0
        d.find_element(By.CSS_SELECTOR, 'a[href="/console/subscriptions/%s"]' % FAILING).click()
        clicks += 1
        wait.until(ec.presence_of_element_located((By.ID, "redeliver-form")))
        findings["clicks_to_redeliver_form"] = clicks
        # Its attempts, 500 and the error in words.
        try:
            WebDriverWait(d, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda d: d.find_element(By.ID, "attempts").text.count(" 500 ") >= 3
            )
        except TimeoutException:
            fail("the failing subscriber's page shows no attempt answered 500")
        findings["attempts_text"] = steady(lambda: d.find_element(By.ID, "attempts").text)
        shot("subscription")

        # The list, filtered by state.
        d.get(BASE + "/console/subscriptions?state=failing")
        findings["failing_listed"] = [
            a.text for a in d.find_elements(By.CSS_SELECTOR, "#subscriptions tbody a")
        ]
        d.get(BASE + "/console/subscriptions")
        findings["listed_first"] = d.find_element(By.CSS_SELECTOR, "#subscriptions tbody a").text
        shot("subscriptions")
        d.get(BASE + "/console/sets")
        shot("sets")
        d.get(BASE + "/console/subscriptions?state=nonsense")
        findings["bad_filter"] = d.find_element(By.ID, "message").text
        shot("bad-input", refused=400)

        # The callback is mended; redeliver the last hour from the form.
        print("FIX", flush=True)
        sys.stdin.readline()
        d.get(BASE + "/console/subscriptions/" + FAILING)
        Select(d.find_element(By.ID, "window")).select_by_value("3600")
        d.find_element(By.CSS_SELECTOR, "#redeliver-form button").click()
        wait.until(ec.presence_of_element_located((By.ID, "confirm")))
        findings["confirm_text"] = d.find_element(By.ID, "confirm-what").text
        shot("confirm")
        d.find_element(By.ID, "confirm").click()
        wait.until(ec.presence_of_element_located((By.ID, "done")))
        findings["done"] = d.find_element(By.ID, "done").text
        # The page updates itself until it shows the deliveries.
        try:
            WebDriverWait(d, 60, ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda d: "delivered" in d.find_element(By.ID, "attempts").text
            )
        except TimeoutException:
            fail("the page never showed a delivered attempt after the redelivery")
        try:
            WebDriverWait(d, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda d: d.find_element(By.ID, "state").text == "active"
                and d.find_element(By.ID, "queued").text == "0"
            )
        except TimeoutException:
            pass
        findings["state_after"] = steady(lambda: d.find_element(By.ID, "state").text)
        findings["attempts_after"] = steady(lambda: d.find_element(By.ID, "attempts").text)
        shot("redelivered")

        # Signing out ends the session.
        d.find_element(By.CSS_SELECTOR, "form.logout button").click()
        wait.until(ec.presence_of_element_located((By.ID, "token")))
        d.get(BASE + "/console/")
        findings["after_logout"] = d.current_url
    except Exception as e:  # noqa: BLE001 - any failure is the test's failure, with the page
        fail("%s: %s" % (type(e).__name__, e))



def harvest_flow(SLOW, DOWN, AUDITED):
    try:
        d.get(BASE + "/console/")
        wait.until(ec.presence_of_element_located((By.ID, "sources")))
        findings["rows"] = len(d.find_elements(By.CSS_SELECTOR, "#sources tbody tr"))
        findings["down_row"] = steady(lambda: d.find_element(By.ID, "source-" + DOWN).text)
        findings["open_files"] = steady(lambda: d.find_element(By.ID, "open-files").text)

        def progress():
            def read():
                bars = d.find_elements(By.CSS_SELECTOR, "#source-%s progress" % SLOW)
                return int(bars[0].get_attribute("value")) if bars else None

            return steady(read)

        try:
            WebDriverWait(d, 60).until(lambda d: (progress() or 0) > 0)
        except TimeoutException:
            fail("the slow source's row shows no running baseline")
        first = progress()
        findings["progress_first"] = first
        findings["progress_max"] = steady(
            lambda: d.find_element(By.CSS_SELECTOR, "#source-%s progress" % SLOW).get_attribute("max")
        )
        shot("harvest-sources")
        print("MORE", flush=True)
        sys.stdin.readline()
        try:
            WebDriverWait(d, 60).until(lambda d: (progress() or 0) > first)
        except TimeoutException:
            fail("the progress bar did not move (stayed at %s)" % first)
        findings["progress_then"] = progress()
        findings["slow_row"] = steady(lambda: d.find_element(By.ID, "source-" + SLOW).text)
        print("REST", flush=True)
        sys.stdin.readline()

        steady(lambda: d.find_element(By.CSS_SELECTOR, "#source-%s a" % AUDITED).click())
        wait.until(ec.presence_of_element_located((By.ID, "run-audit")))
        d.find_element(By.ID, "run-audit").click()
        try:
            WebDriverWait(d, 120, ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda d: "SYNC" in d.find_element(By.ID, "audit-state").text
            )
        except TimeoutException:
            fail("the audit's verdict never showed")
        findings["audit"] = steady(lambda: d.find_element(By.ID, "audit-state").text)
        findings["status_text"] = steady(lambda: d.find_element(By.ID, "status").text[:2000])
        shot("harvest-source")
    except Exception as e:  # noqa: BLE001 - any failure is the test's failure, with the page
        fail("%s: %s" % (type(e).__name__, e))


def crawl(TOKEN):
    try:
        if TOKEN != "-":
            d.get(BASE + "/console/login")
            d.find_element(By.ID, "token").send_keys(TOKEN + Keys.ENTER)
            wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "h1")))
        findings.update({"visited": 0, "checked": 0, "bad": [], "pages_seen": []})
        todo, seen = [(BASE + "/console/", "start")], set()
        while todo and findings["visited"] < 200:
            url, via = todo.pop(0)
            if url in seen:
                continue
            seen.add(url)
            path = url[len(BASE):]
            if not path.startswith("/console/"):
                # Fetched from the page: a document, a feed, an API answer.
                status = d.execute_async_script(
                    "var done = arguments[arguments.length - 1];"
                    "fetch(arguments[0], {credentials: 'same-origin'}).then(function (r) { done(r.status); }, function (e) { done(String(e)); });",
                    url,
                )
                findings["checked"] += 1
                if not (isinstance(status, int) and 200 <= status < 300):
                    findings["bad"].append([url, status, via])
                continue
            d.get(url)
            findings["visited"] += 1
            findings["pages_seen"].append(path)
            status = d.execute_script(
                "var n = performance.getEntriesByType('navigation')[0]; return n ? n.responseStatus : null;"
            )
            if not (isinstance(status, int) and 200 <= status < 300):
                findings["bad"].append([url, status, via])
            console_log(path)
            hrefs = d.execute_script(
                "return Array.prototype.map.call(document.querySelectorAll('a[href]'), function (a) { return a.href; });"
            )
            for h in hrefs:
                h = h.split("#")[0]
                if h.startswith(BASE + "/") and h not in seen:
                    todo.append((h, path))
    except Exception as e:  # noqa: BLE001 - any failure is the test's failure, with the page
        fail("%s: %s" % (type(e).__name__, e))


if MODE == "hub":
    hub_flow(sys.argv[3], sys.argv[4])
elif MODE == "crawl":
    crawl(sys.argv[3])
else:
    harvest_flow(sys.argv[3], sys.argv[4], sys.argv[5])
d.quit()
print(json.dumps(findings), flush=True)
