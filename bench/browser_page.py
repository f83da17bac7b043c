"""One dashboard page of a run open in headless Chromium, for bench/daemon_load.py: it
prints `ready UNIX_SECONDS` once the page shows the run's step, then records each step the
page displays and when (a MutationObserver in the page), until its standard input closes;
then it prints the records as one JSON line: [[unix_seconds, step], ...].

Run by Debian's /usr/bin/python3 (python3-selenium, chromium, chromium-driver: what the
dashboard test uses), not the project's virtual environment.

Usage: browser_page.py URL   (e.g. http://127.0.0.1:7453/#/run/bench-1)
"""
import json
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

WATCH = """
window.__steps = [];
let last = null;
const note = () => {
  const field = document.querySelector('#run-step');
  if (!field) return;
  const step = parseInt(field.textContent, 10);
  if (Number.isFinite(step) && step !== last) { last = step; window.__steps.push([Date.now() / 1000, step]); }
};
new MutationObserver(note).observe(document.body, {subtree: true, childList: true, characterData: true});
note();
"""


def main():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1400,1800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(sys.argv[1])
        deadline = time.time() + 60
        while not driver.execute_script("const f = document.querySelector('#run-step'); return f && f.textContent;"):
            if time.time() > deadline:
                raise SystemExit("the run page showed no step within 60 s")
            time.sleep(0.1)
        driver.execute_script(WATCH)
        print(f"ready {time.time()}", flush=True)
        sys.stdin.read()  # until the bench closes it
        print(json.dumps(driver.execute_script("return window.__steps;")), flush=True)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
