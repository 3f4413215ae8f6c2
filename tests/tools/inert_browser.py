"""Opens bytes the server did not write (a collected record, a topic payload, a dump package)
in headless Chromium as a signed-in admin of the hub's console, for tests/it/security.rs.

    inert_browser.py BASE_URL TOKEN URL...

Each URL's bytes are a page whose script, were it run as the server's origin, would set the
title to RAN and use the admin's session to delete every subscription. Prints one JSON line:
{"opened": [{"url", "title", "ran"}], "console_after": <the subscriptions page's text>}.
Exits non-zero, with the reason on stderr, when a step fails.
"""

import json
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

BASE, TOKEN, URLS = sys.argv[1], sys.argv[2], sys.argv[3:]

o = webdriver.ChromeOptions()
o.binary_location = "/usr/bin/chromium"
for flag in (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
):
    o.add_argument(flag)
# A package is a download: keep it out of the way, never ask.
o.add_experimental_option(
    "prefs", {"download.default_directory": "/dev/null", "download.prompt_for_download": False}
)
d = webdriver.Chrome(options=o, service=Service("/usr/bin/chromedriver"))
wait = WebDriverWait(d, 30)
try:
    d.get(BASE + "/console/login")
    d.find_element(By.NAME, "token").send_keys(TOKEN)
    d.find_element(By.CSS_SELECTOR, "form button, form input[type=submit]").click()
    wait.until(ec.url_to_be(BASE + "/console/"))
    opened = []
    for url in URLS:
        d.get(url)
        wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
        # An inline script runs while the document is parsed: by now it would have set these.
        opened.append(
            {
                "url": url,
                "title": d.title,
                "ran": d.execute_script("return window.__ran === true"),
            }
        )
    d.get(BASE + "/console/subscriptions")
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
    print(json.dumps({"opened": opened, "console_after": d.find_element(By.TAG_NAME, "body").text}))
finally:
    d.quit()
