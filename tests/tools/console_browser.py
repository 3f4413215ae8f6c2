"""Drives the hub's console in headless Chromium (Debian's chromium + chromium-driver) with
Selenium, as an admin would, for tests/it/console.rs.

    console_browser.py BASE_URL TOKEN FAILING_ID SCREENSHOT_DIR

Talks to the test over stdin/stdout: prints `FIX` when it has seen the failing subscriber's
500s and waits for a line on stdin (the test then mends the callback); prints one JSON line of
findings at the end. Exits non-zero, with the reason on stderr, when a step fails.
"""

import json
import os
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE, TOKEN, FAILING, SHOTS = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
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


def fail(why):
    shot("failure")
    print(why + "\nat " + d.current_url + "\n" + d.find_element(By.TAG_NAME, "body").text[:3000], file=sys.stderr)
    d.quit()
    sys.exit(1)


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
        WebDriverWait(d, 30).until(
            lambda d: d.find_element(By.ID, "attempts").text.count(" 500 ") >= 3
        )
    except TimeoutException:
        fail("the failing subscriber's page shows no attempt answered 500")
    findings["attempts_text"] = d.find_element(By.ID, "attempts").text
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
        WebDriverWait(d, 60).until(
            lambda d: "delivered" in d.find_element(By.ID, "attempts").text
        )
    except TimeoutException:
        fail("the page never showed a delivered attempt after the redelivery")
    try:
        WebDriverWait(d, 30).until(
            lambda d: d.find_element(By.ID, "state").text == "active"
            and d.find_element(By.ID, "queued").text == "0"
        )
    except TimeoutException:
        pass
    findings["state_after"] = d.find_element(By.ID, "state").text
    findings["attempts_after"] = d.find_element(By.ID, "attempts").text
    shot("redelivered")

    # Signing out ends the session.
    d.find_element(By.CSS_SELECTOR, "form.logout button").click()
    wait.until(ec.presence_of_element_located((By.ID, "token")))
    d.get(BASE + "/console/")
    findings["after_logout"] = d.current_url
except Exception as e:  # noqa: BLE001 - any failure is the test's failure, with the page
    fail("%s: %s" % (type(e).__name__, e))

d.quit()
print(json.dumps(findings), flush=True)
