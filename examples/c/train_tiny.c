/* Trains the bundled tiny LLaMA for 30 steps through the C API: live metrics, an lr change
 * at step 10, a checkpoint at step 20, then the end.
 *
 *   build/examples/c/train_tiny          (from the repository root, after `make data`)
 *
 * TIDE_ENDPOINT=tcp://host:7450 drives a running tided instead of an embedded engine;
 * TIDE_EXAMPLE_DATA names another prepared dataset than data/kjv. */
#include <stdio.h>
#include <stdlib.h>

#include "tide/tide.h"

static int fail(const char *what) {
  fprintf(stderr, "%s: %s\n", what, tide_error_last());
  return 1;
}

int main(void) {
  const char *endpoint = getenv("TIDE_ENDPOINT");
  const char *data = getenv("TIDE_EXAMPLE_DATA");
  char data_override[1024];
  const char *overrides[4];
  tide_engine *engine = NULL;
  tide_subscription *metrics = NULL;
  tide_submit_options submit = TIDE_SUBMIT_OPTIONS_INIT;
  tide_run_status status = TIDE_RUN_STATUS_INIT;
  tide_event event;
  char *run = NULL;
  int changed = 0, saved = 0, rc = 0;

  if (endpoint) {
    if (tide_engine_connect(&engine, endpoint, NULL) != TIDE_OK) return fail("connect");
  } else {
    tide_embedded_options options = TIDE_EMBEDDED_OPTIONS_INIT;
    options.state_dir = getenv("TIDE_STATE_DIR") ? getenv("TIDE_STATE_DIR") : "/tmp/tide-example-c";
    if (tide_engine_open_embedded(&engine, &options) != TIDE_OK) return fail("open an embedded engine");
  }
  snprintf(data_override, sizeof data_override, "data.path=%s", data ? data : "data/kjv");
  overrides[0] = "schedule.steps=30";
  overrides[1] = "eval.every=0";
  overrides[2] = "log_every=5";
  overrides[3] = data_override;
  submit.recipe_name = "llama/llama-tiny";
  submit.overrides = overrides;
  submit.overrides_count = 4;
  if (tide_run_submit(engine, &submit, &run) != TIDE_OK) {
    rc = fail("submit");
    goto done;
  }
  printf("submitted %s\n", run);
  if (tide_subscribe(engine, run, "metrics", &metrics) != TIDE_OK) {
    rc = fail("subscribe");
    goto done;
  }
  while (1) {
    if (tide_subscription_poll(metrics, 300000, &event) != TIDE_OK) {
      rc = fail("metrics");
      goto done;
    }
    printf("step %lld loss %.4f\n", (long long)event.step, event.loss);
    if (event.step >= 10 && !changed) {
      changed = 1;
      if (tide_run_set(engine, run, "optimizer.lr", "1e-3") != TIDE_OK) rc = fail("set lr");
      else printf("optimizer.lr set to 1e-3\n");
    }
    if (event.step >= 20 && !saved) {
      saved = 1;
      if (tide_run_checkpoint(engine, run) != TIDE_OK) rc = fail("checkpoint");
      else printf("checkpoint requested\n");
    }
    if (event.step >= 30) break;
  }
  if (tide_run_wait(engine, run, TIDE_RUN_FINISHED_MASK, 300000, NULL) != TIDE_OK ||
      tide_run_status_get(engine, run, &status) != TIDE_OK) {
    rc = fail("wait");
    goto done;
  }
  printf("%s %s after %lld steps, final loss %.4f\n", status.id, tide_run_state_name(status.state),
         (long long)status.last_step, status.final_loss);
  if (status.state != TIDE_RUN_COMPLETED) rc = 1;
done:
  tide_subscription_close(metrics);
  tide_string_free(run);
  tide_engine_close(engine);
  return rc;
}
