"""A real tided process for the tests, on loopback TCP ports it picks: needs only the
standard library, so that a test without pyzmq (the browser test) can start one too."""
import json
import os
import signal
import subprocess
import time


class Tided:
    """A tided process on a state directory, on loopback TCP ports it picks."""

    def __init__(self, tided, tide, state, slots=2, extra=(), env=None):
        self.cmd = [tided, "--foreground", "--state-dir", state, "--cpu-slots", str(slots), "--port", "0",
                    "--worker", tide, *extra]
        self.state = state
        self.env = {**os.environ, **(env or {})}
        self.proc = None

    def start(self):
        os.makedirs(self.state, exist_ok=True)
        ready = os.path.join(self.state, "endpoints.json")
        if os.path.exists(ready):
            os.remove(ready)
        self.log = open(os.path.join(self.state, "tided-test.log"), "a")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"tided exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with open(ready) as f:
                    ep = json.load(f)
                if ep.get("pid") == self.proc.pid:
                    self.endpoints = ep
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise AssertionError("tided did not write endpoints.json within 30 s")

    def tcp(self, kind):
        return next(e for e in self.endpoints[kind] if e.startswith("tcp://"))

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
