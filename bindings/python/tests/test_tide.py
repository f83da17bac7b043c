"""The Python binding against an embedded engine and a tided process: a whole run
(submit -> metrics -> set lr -> checkpoint -> stop) and its errors.

Needs TIDE_BIN, TIDE_WORKER_BIN and TIDED_BIN (the executables) and TIDE_LIBRARY (libtide.so.0), as
ctest sets them: python3 -m unittest discover -s bindings/python/tests"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tide  # noqa: E402

TIDE_BIN, TIDED_BIN = os.environ["TIDE_BIN"], os.environ["TIDED_BIN"]
TIDE_WORKER_BIN = os.environ["TIDE_WORKER_BIN"]

# The recipe the C API tests use too.
with open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "capi", "tiny.lua")) as f:
    RECIPE = f.read()


def setUpModule():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tide-py-")
    subprocess.run([TIDE_BIN, "data", "prepare", "/usr/share/common-licenses/GPL-3",
                    "/usr/share/common-licenses/Apache-2.0", "--out", os.path.join(WORK, "ds"), "--tokenizer", "bytes",
                    "--val-fraction", "0.1"], check=True, stderr=subprocess.DEVNULL)


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


class WholeRun:
    engine: tide.Engine

    def test_a_whole_run(self):
        run = self.engine.submit(recipe=RECIPE, workdir=WORK)
        with run.events(kind="metrics", timeout=60) as metrics:
            steps = []
            for e in metrics:
                steps.append(e.step)
                if len(steps) >= 3:
                    break
            self.assertEqual(len(steps), 3)
            self.assertTrue(all(b > a for a, b in zip(steps, steps[1:])), steps)
            run.set("optimizer.lr", 5e-4)
            changed = next(e for e in metrics if abs(e.body["lr"] - 5e-4) < 1e-12)
            self.assertIsNotNone(changed.loss)
        with run.events(kind="checkpoint", timeout=60) as saved:
            run.checkpoint()
            event = saved.poll(60)
            self.assertTrue(event.body["ok"], event)
            self.assertTrue(os.path.isdir(event.body["path"]))
        run.stop()
        self.assertEqual(run.wait(timeout=120), "stopped")
        st = run.status()
        self.assertEqual((st.id, st.state), (run.id, "stopped"))
        self.assertGreater(st.last_step, changed.step)
        rows = run.metrics()
        self.assertEqual(rows[-1]["step"], st.last_step)
        self.assertIn(run.id, [r["id"] for r in self.engine.runs()])
        saved_steps = [c["step"] for c in run.checkpoints()]
        self.assertEqual(saved_steps[0], event.body["step"])
        self.assertEqual(saved_steps[-1], st.last_step)  # the stop's checkpoint
        exported = run.export("hf", dtype="F16", timeout=120)
        self.assertEqual((exported["state"], exported["step"]), ("done", st.last_step))
        self.assertTrue(os.path.isfile(os.path.join(st.run_dir, "hf", "model.safetensors")))
        with self.assertRaises(tide.TideError) as e:
            run.export("/proc/tide-cannot-write-here", timeout=120)
        self.assertEqual(e.exception.name, "io")
        with self.assertRaises(tide.TideError) as e:  # the adapters alone of a run without LoRA
            run.export("adapter", timeout=120, adapter=True)
        self.assertIn("without LoRA adapters", str(e.exception))
        print(f"\n{type(self).__name__}: {run.id} lr 5e-4 from step {changed.step}, checkpoint at step "
              f"{event.body['step']}, stopped at {st.last_step} (loss {st.loss:.4f}), checkpoints {saved_steps}, "
              f"exported to {exported['out']}")

    def test_plan(self):
        plan = self.engine.plan(recipe=RECIPE, device="a100-80", nodes=2, devices_per_node=8, top=3)
        self.assertEqual(plan["schema"], "tide.plan/1")
        self.assertEqual(plan["cluster"]["nodes"] * plan["cluster"]["devices_per_node"], 16)
        self.assertTrue(0 < len(plan["ranked"]) <= 3 <= plan["layouts_that_fit"], plan["layouts_that_fit"])
        steps = [p["time"]["step"] for p in plan["ranked"]]
        self.assertEqual(steps, sorted(steps))
        with self.assertRaises(tide.TideError) as e:
            self.engine.plan(recipe=RECIPE, device="tpu-v9")
        self.assertEqual(e.exception.name, "bad_request")
        self.assertIn("tpu-v9", str(e.exception))

    def test_errors(self):
        with self.assertRaises(tide.TideError) as e:
            self.engine.run("no-such-run-7").status()
        self.assertEqual(e.exception.name, "not_found")
        with self.assertRaises(tide.TideError) as e:
            self.engine.submit(recipe="return tide.recipe { model = }", workdir=WORK)
        self.assertEqual(e.exception.name, "invalid_recipe")
        self.assertIn("recipe", str(e.exception))
        with self.assertRaises(tide.TideError) as e:
            self.engine.submit(recipe=RECIPE, recipe_name="llama/llama-tiny")
        self.assertEqual(e.exception.name, "invalid_argument")


class Embedded(WholeRun, unittest.TestCase):
    def setUp(self):
        self.engine = tide.Engine.embedded(state_dir=os.path.join(WORK, f"embedded-{self._testMethodName}"),
                                           worker=TIDE_WORKER_BIN, cpu_slots=1)

    def tearDown(self):
        self.engine.close()

    def test_closed_engine(self):
        self.engine.close()
        with self.assertRaises(tide.TideError) as e:
            self.engine.info()
        self.assertEqual(e.exception.name, "invalid_handle")


class Daemon(WholeRun, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        state = os.path.join(WORK, "daemon")
        cls.proc = subprocess.Popen([TIDED_BIN, "--foreground", "--state-dir", state, "--cpu-slots", "1",
                                     "--no-tcp", "--worker", TIDE_WORKER_BIN], stderr=subprocess.DEVNULL)
        ready = os.path.join(state, "endpoints.json")
        deadline = time.time() + 30
        while not os.path.exists(ready) and time.time() < deadline:
            time.sleep(0.05)
        cls.endpoint = "ipc://" + os.path.join(state, "command.sock")

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(30)

    def setUp(self):
        self.engine = tide.Engine.connect(self.endpoint)

    def tearDown(self):
        self.engine.close()


if __name__ == "__main__":
    unittest.main()
