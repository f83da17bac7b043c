"""Trains the bundled tiny LLaMA for 30 steps through the Python binding: live metrics, an
lr change at step 10, a checkpoint at step 20, then the end.

    python3 examples/python/train_tiny.py      (from the repository root, after `make data`)

TIDE_ENDPOINT=tcp://host:7450 drives a running tided instead of an embedded engine;
TIDE_EXAMPLE_DATA names another prepared dataset than data/kjv."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
import tide  # noqa: E402

endpoint = os.environ.get("TIDE_ENDPOINT")
engine = (tide.Engine.connect(endpoint) if endpoint else
          tide.Engine.embedded(state_dir=os.environ.get("TIDE_STATE_DIR", "/tmp/tide-example-python")))
with engine:
    run = engine.submit(recipe_name="llama/llama-tiny",
                        overrides=["schedule.steps=30", "eval.every=0", "log_every=5",
                                   "data.path=" + os.environ.get("TIDE_EXAMPLE_DATA", "data/kjv")])
    print(f"submitted {run.id}")
    changed = saved = False
    with run.events(kind="metrics", timeout=300) as metrics:
        for e in metrics:
            print(f"step {e.step} loss {e.loss:.4f}")
            if e.step >= 10 and not changed:
                run.set("optimizer.lr", 1e-3)
                changed = True
                print("optimizer.lr set to 1e-3")
            if e.step >= 20 and not saved:
                run.checkpoint()
                saved = True
                print("checkpoint requested")
            if e.step >= 30:
                break
    state = run.wait(timeout=300)
    st = run.status()
    print(f"{run.id} {state} after {st.last_step} steps, final loss {st.final_loss:.4f}")
    sys.exit(0 if state == "completed" else 1)
