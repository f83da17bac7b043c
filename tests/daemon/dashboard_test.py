"""The dashboard in a real browser: Debian's Chromium, headless, driven by Selenium through
chromedriver, against a real tided training real runs.

Usage: dashboard_test.py TIDED TIDE OUT_DIR   (screenshots go to OUT_DIR)
Runs under Debian's python3 (python3-selenium); needs nothing from .venv. scripts/setup.sh
installs chromium, chromium-driver and python3-selenium (Ubuntu: chromium-browser and
chromium-chromedriver, the snap's launchers); without them the test fails. Where the snap
cannot run, it is skipped (exit 77).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from tided_process import Tided  # noqa: E402

TIDED, TIDE, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
WORKER = os.path.join(os.path.dirname(TIDE), "tide-worker")
# Debian's names, else Ubuntu's (its Chromium is a snap: chromium-browser starts it).
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or shutil.which("chromium.chromedriver")
SKIPPED = 77  # ctest's SKIP_RETURN_CODE for this test
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
except ImportError:
    webdriver = None
if not (CHROMIUM and CHROMEDRIVER and webdriver):
    print("chromium, chromedriver or python3-selenium is missing: scripts/setup.sh installs them", file=sys.stderr)
    sys.exit(1)
# Ubuntu's chromium-browser package holds only a launcher for the snap, which cannot run
# where snapd does not (a container): that is a skip, said with the launcher's words. A
# Chromium that fails otherwise fails the test below.
_version = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=60)
if _version.returncode != 0 and "snap" in (_version.stdout + _version.stderr):
    print(f"skipped: {CHROMIUM} is the snap's launcher and the snap cannot run here: "
          f"{(_version.stdout + _version.stderr).strip()}", file=sys.stderr)
    sys.exit(SKIPPED)

WORK = tempfile.mkdtemp(prefix="tided-test-")
STATE = os.path.join(WORK, "state")
# The C API tests' tiny LLaMA, trained until stopped, on the dataset "ds" in the workdir.
RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "capi", "tiny.lua")


def api(url, path, method="GET", body=None, token=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path.lstrip("/"), data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def wait(what, predicate, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def submit(*sets, workers=1):
    out = subprocess.run([TIDE, "submit", RECIPE, "--state-dir", STATE, "--workers", str(workers),
                          *[a for s in sets for a in ("--set", s)]],
                         cwd=WORK, check=True, capture_output=True, text=True)
    return out.stdout.split()[0]


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1400,1800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def read(driver, css, how):
    """how(element) of the first match ("" when none); the live page redraws parts of itself,
    so an element may go between finding and reading it: read it again."""
    for _ in range(20):
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            return how(found[0]) if found else ""
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError(f"{css} kept being replaced")


def text_of(driver, css):
    return read(driver, css, lambda e: e.text)


def points(driver, css):
    return int(read(driver, css, lambda e: e.get_attribute("data-points")) or 0)


def click(driver, css):
    driver.find_element(By.CSS_SELECTOR, css).click()


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, text in (("ds", "GPL-3"), ("ds2", "GPL-2")):
        subprocess.run([TIDE, "data", "prepare", f"/usr/share/common-licenses/{text}", "--out",
                        os.path.join(WORK, name), "--tokenizer", "bytes", "--val-fraction", "0.1"], check=True,
                       stderr=subprocess.DEVNULL)
    d = Tided(TIDED, WORKER, STATE, slots=3).start()
    driver = None
    try:
        url = d.endpoints["http"]
        token = open(os.path.join(STATE, "dashboard.token")).read().strip()
        printed = subprocess.run([TIDE, "dashboard", "--state-dir", STATE], check=True, capture_output=True,
                                 text=True)
        assert printed.stdout.strip() == url and "dashboard.token" in printed.stderr, printed
        # Two runs: one on two ranks that trains until the test ends it, and a short one at
        # another rate on a blend of two datasets, validated every 10 steps.
        long_run = submit("parallel.dp=2", workers=2)
        short_run = submit("optimizer.lr=3e-3", "schedule.steps=40", "eval.every=10", "data.path=",
                           'data.blend=[{"path": "ds", "weight": 3}, {"path": "ds2"}]')
        wait("the short run to complete", lambda: api(url, f"api/runs/{short_run}")[1]["run"]["state"] == "completed",
             timeout=120)

        driver = browser()
        driver.get(f"{url}#/run/{long_run}")
        # The loss curve gains points while the run trains: the stream, not a reload.
        first = wait("points on the loss chart", lambda: points(driver, "#chart-loss"))
        wait("new points on the loss chart", lambda: points(driver, "#chart-loss") >= first + 5)
        assert "running" in text_of(driver, "#run-state"), text_of(driver, "#run-state")
        # Where rank 0's steps went, and each rank's step time as the stream brings it.
        assert points(driver, "#chart-time-split") > 0
        wait("the per-rank chart", lambda: points(driver, "#chart-ranks") >= 3)
        legend = read(driver, "#chart-ranks", lambda e: e.get_attribute("textContent"))
        assert "rank 0" in legend and "rank 1" in legend, legend
        print(f"run page: the loss chart went from {first} to {points(driver, '#chart-loss')} points live")

        # A control without the token is refused, and nothing changes.
        click(driver, "#pause")
        refused = wait("the refusal", lambda: "refused" in text_of(driver, "#control-result")
                       and text_of(driver, "#control-result"))
        assert "token" in refused, refused
        logged = driver.get_log("browser")  # the browser reports the 403 itself; nothing else
        assert all("status of 403" in e["message"] for e in logged if e["level"] == "SEVERE"), logged
        time.sleep(1)
        run = api(url, f"api/runs/{long_run}")[1]["run"]
        assert run["state"] == "running" and run["live"] == {}, run
        print(f"without the token: '{refused}'; the run went on")

        # With the token (typed into the page, kept in its localStorage): a new lr, pause, resume.
        driver.find_element(By.CSS_SELECTOR, "#token").send_keys(token)
        click(driver, "#token-save")
        driver.find_element(By.CSS_SELECTOR, "#lr-input").send_keys("5e-4")
        click(driver, "#set-lr")
        wait("the lr change accepted", lambda: "accepted" in text_of(driver, "#control-result"))
        run = wait("the change applied", lambda: (lambda r: r["live"] and r)(api(url, f"api/runs/{long_run}")[1]["run"]))
        assert run["live"] == {"optimizer.lr": 5e-4}, run["live"]
        # The step's row follows the control event that set `live`.
        rows = wait("the step with the change", lambda: (lambda rows: any(r.get("changes") for r in rows) and rows)(
            api(url, f"api/runs/{long_run}/metrics?limit=100000")[1]["metrics"]), timeout=30)
        changed = [r for r in rows if r.get("changes")]
        assert changed[0]["changes"] == {"optimizer.lr": 5e-4} and changed[0]["lr"] == 5e-4, changed[:1]
        k = changed[0]["step"]
        before = next(r for r in rows if r["step"] == k - 1)
        assert before["lr"] == 1e-3, before
        wait("the page's lr", lambda: text_of(driver, "#run-lr") == "0.0005")
        print(f"set lr from the page: step {k - 1} at 1e-3, step {k} at 5e-4 (metrics.jsonl)")

        click(driver, "#pause")
        wait("paused", lambda: api(url, f"api/runs/{long_run}")[1]["run"]["state"] == "paused")
        wait("the page to show paused", lambda: "paused" in text_of(driver, "#run-state"))
        held = api(url, f"api/runs/{long_run}")[1]["run"]["last_step"]
        time.sleep(1.5)
        assert api(url, f"api/runs/{long_run}")[1]["run"]["last_step"] == held
        click(driver, "#resume")
        wait("running again", lambda: api(url, f"api/runs/{long_run}")[1]["run"]["last_step"] > held + 2)
        wait("the page to show running", lambda: "running" in text_of(driver, "#run-state"))
        print(f"paused from the page at step {held} (held 1.5 s), resumed")

        # A checkpoint now, then its verification, both from the page: the table shows the
        # save and then its verdict.
        click(driver, "#checkpoint")
        wait("the checkpoint in the table", lambda: driver.find_elements(By.CSS_SELECTOR, "#checkpoints .verify-button"))
        click(driver, "#checkpoints .verify-button")
        wait("the checkpoint verified", lambda: read(driver, "#checkpoints td.verify",
                                                      lambda e: e.get_attribute("data-state")) == "done", timeout=60)
        assert "sound" in text_of(driver, "#checkpoints td.verify"), text_of(driver, "#checkpoints td.verify")
        print(f"checkpoint now and verify from the page: '{text_of(driver, '#checkpoints td.verify')}'")

        # The view survives a reload: smoothing and log scale from localStorage.
        driver.execute_script("const s = document.querySelector('#smoothing'); s.value = '0.6';"
                              "s.dispatchEvent(new Event('input'));")
        click(driver, "#log-scale")
        history = api(url, f"api/runs/{long_run}/metrics?source=ranks&limit=100000")[1]["metrics"]
        driver.refresh()
        wait("the page after a reload", lambda: points(driver, "#chart-loss"))
        # The per-rank chart of a page opened late has the run's history (ranks.jsonl), from
        # its first step, not only what the stream brought since.
        wait("the per-rank history", lambda: points(driver, "#chart-ranks") >= len(history), timeout=10)
        first_rank_step = read(driver, "#chart-ranks", lambda e: e.get_attribute("data-first-step"))
        assert first_rank_step == str(history[0]["step"]), (first_rank_step, history[0])
        assert driver.find_element(By.CSS_SELECTOR, "#smoothing").get_attribute("value") == "0.6"
        assert driver.find_element(By.CSS_SELECTOR, "#log-scale").is_selected()
        # The change is in the events of a page opened after it (from the metrics rows).
        wait("the change in the events list", lambda: f"step {k}" in text_of(driver, "#events")
             and "optimizer.lr = 0.0005" in text_of(driver, "#events"))
        assert "optimizer.lr" in text_of(driver, "#recipe") or "lr = 1e-3" in text_of(driver, "#recipe"), \
            text_of(driver, "#recipe")[:200]
        wait("the log tail", lambda: text_of(driver, "#log"))
        driver.save_screenshot(os.path.join(OUT, "run-page.png"))

        # Compare: the two runs' loss curves on one chart, chosen in the address.
        driver.get(f"{url}#/compare/{long_run},{short_run}")
        wait("the compare chart", lambda: points(driver, "#compare-chart") > 40)
        labels = read(driver, "#compare-chart", lambda e: e.get_attribute("textContent"))  # not as styled
        assert long_run in labels and short_run in labels, labels
        driver.save_screenshot(os.path.join(OUT, "compare-page.png"))
        print(f"compare page: {long_run} and {short_run} on one chart")

        # The blend's run: each dataset's validation loss is a series of the loss chart.
        driver.get(f"{url}#/run/{short_run}")
        legend = wait("each dataset's validation loss", lambda: (lambda t: "validation ds2" in t and t)(
            read(driver, "#chart-loss", lambda e: e.get_attribute("textContent"))))
        assert "validation ds" in legend.replace("validation ds2", ""), legend
        driver.save_screenshot(os.path.join(OUT, "blend-run-page.png"))
        print(f"run page of the blend {short_run}: validation ds and ds2 on the loss chart")

        # The runs page lists both, with their states.
        driver.get(url)
        wait("the runs table", lambda: text_of(driver, f'tr[data-run="{short_run}"]'))
        assert "completed" in text_of(driver, f'tr[data-run="{short_run}"]')
        assert "running" in text_of(driver, f'tr[data-run="{long_run}"]')
        assert "2×1×1" in text_of(driver, f'tr[data-run="{long_run}"]'), text_of(driver, f'tr[data-run="{long_run}"]')
        driver.save_screenshot(os.path.join(OUT, "runs-page.png"))

        # The page ran only its own scripts, under its policy, without an error.
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        assert api(url, f"api/runs/{long_run}/cancel", "POST", {}, token)[0] == 200
        print(f"screenshots: {', '.join(sorted(os.listdir(OUT)))} in {OUT}")
        print("dashboard: ok")
    except BaseException:
        if driver:  # what the page said, for the failure's report
            driver.save_screenshot(os.path.join(OUT, "failure.png"))
            for entry in driver.get_log("browser"):
                print(f"browser: {entry['level']} {entry['message']}")
        raise
    finally:
        if driver:
            driver.quit()
        d.stop()
        subprocess.run(["pkill", "-KILL", "-f", STATE], check=False)
        shutil.rmtree(WORK, ignore_errors=True)


main()
