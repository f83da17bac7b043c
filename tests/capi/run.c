/* A whole run through the C API only: submit, live metrics through a callback (which
 * calls back into the engine), a live lr change, a checkpoint, stop; then a run left
 * training when an embedded engine closes, which must leave no process or thread behind.
 *
 * Usage: run embedded STATE_DIR WORKER WORKDIR RECIPE
 *        run connect ENDPOINT WORKDIR RECIPE */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "tide/tide.h"

#define CHECK(call)                                                                              \
  do {                                                                                           \
    int rc_ = (call);                                                                            \
    if (rc_ != TIDE_OK) {                                                                        \
      fprintf(stderr, "FAIL %s:%d %s: %d %s\n", __FILE__, __LINE__, #call, rc_, tide_error_last()); \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)
#define REQUIRE(cond)                                                        \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "FAIL %s:%d %s\n", __FILE__, __LINE__, #cond);         \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

struct seen {
  pthread_mutex_t mu;
  tide_engine *engine;
  tide_subscription *self;
  int metrics;
  int64_t last_step;
  double last_lr;
  int reentrant_close;    /* what closing its own subscription returned */
  int status_from_inside; /* what a status call from inside the callback returned */
};

static void on_event(const tide_event *e, void *user_data) {
  struct seen *s = (struct seen *)user_data;
  tide_run_status st = TIDE_RUN_STATUS_INIT;
  int rc = tide_run_status_get(s->engine, e->run, &st);
  double lr = NAN;
  const char *at = strstr(e->body_json, "\"lr\":");
  if (at) lr = strtod(at + 5, NULL);
  pthread_mutex_lock(&s->mu);
  s->metrics += 1;
  s->last_step = e->step;
  s->last_lr = lr;
  s->status_from_inside = rc;
  if (s->self && s->reentrant_close == 0) s->reentrant_close = tide_subscription_close(s->self);
  pthread_mutex_unlock(&s->mu);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int count_entries(const char *dir) {
  int n = 0;
  struct dirent *d;
  DIR *p = opendir(dir);
  if (!p) return -1;
  while ((d = readdir(p)) != NULL)
    if (d->d_name[0] != '.') ++n;
  closedir(p);
  return n;
}

static char *submit(tide_engine *engine, const char *workdir, const char *recipe) {
  char *id = NULL;
  tide_submit_options o = TIDE_SUBMIT_OPTIONS_INIT;
  /* TIDE_TEST_DEVICE=cuda: the same run on a GPU (run_test.sh ... cuda). */
  static char device[64];
  const char *overrides[1];
  const char *wanted = getenv("TIDE_TEST_DEVICE");
  o.recipe_file = recipe;
  o.workdir = workdir;
  if (wanted && *wanted) {
    snprintf(device, sizeof device, "device=%s", wanted);
    overrides[0] = device;
    o.overrides = overrides;
    o.overrides_count = 1;
  }
  CHECK(tide_run_submit(engine, &o, &id));
  return id;
}

int main(int argc, char **argv) {
  const int embedded = argc == 6 && strcmp(argv[1], "embedded") == 0;
  const char *workdir, *recipe;
  tide_engine *engine = NULL;
  tide_subscription *sub = NULL, *checkpoints = NULL;
  struct seen s;
  tide_run_status st = TIDE_RUN_STATUS_INIT;
  tide_event ev;
  int32_t state = 0;
  char *id, *text = NULL;
  double deadline;
  int rc, threads_before;

  if (!embedded && !(argc == 5 && strcmp(argv[1], "connect") == 0)) {
    fprintf(stderr, "usage: run embedded STATE_DIR WORKER WORKDIR RECIPE | run connect ENDPOINT WORKDIR RECIPE\n");
    return 2;
  }
  workdir = argv[argc - 2];
  recipe = argv[argc - 1];
  threads_before = count_entries("/proc/self/task");
  if (embedded) {
    tide_embedded_options o = TIDE_EMBEDDED_OPTIONS_INIT;
    o.state_dir = argv[2];
    o.worker_executable = argv[3];
    o.cpu_slots = 2;
    CHECK(tide_engine_open_embedded(&engine, &o));
  } else {
    CHECK(tide_engine_connect(&engine, argv[2], NULL));
  }

  /* The planner through the engine: the recipe's layouts on 4 x 8 H100s, ranked; a
   * device it does not know is refused by name, with nothing written out. */
  {
    tide_plan_options po = TIDE_PLAN_OPTIONS_INIT;
    char *plan = NULL;
    po.recipe_file = recipe;
    po.device = "h100-80";
    po.nodes = 4;
    po.devices_per_node = 8;
    po.top = 3;
    CHECK(tide_engine_plan(engine, &po, &plan));
    REQUIRE(strstr(plan, "\"schema\":\"tide.plan/1\"") != NULL && strstr(plan, "\"devices_per_node\":8") != NULL);
    printf("plan: %.80s...\n", plan);
    tide_string_free(plan);
    plan = NULL;
    po.device = "tpu-v9";
    REQUIRE(tide_engine_plan(engine, &po, &plan) == TIDE_ERR_BAD_REQUEST && plan == NULL);
    REQUIRE(strstr(tide_error_last(), "tpu-v9") != NULL);
    po.device = "h100-80";
    po.nodes = -2;
    REQUIRE(tide_engine_plan(engine, &po, &plan) == TIDE_ERR_INVALID_ARGUMENT && strstr(tide_error_last(), "nodes"));
  }

  memset(&s, 0, sizeof s);
  pthread_mutex_init(&s.mu, NULL);
  s.engine = engine;
  id = submit(engine, workdir, recipe);
  printf("submitted %s\n", id);
  CHECK(tide_subscribe_callback(engine, id, "metrics", on_event, &s, &sub));
  pthread_mutex_lock(&s.mu);
  s.self = sub;
  pthread_mutex_unlock(&s.mu);
  CHECK(tide_subscribe(engine, id, "checkpoint", &checkpoints));
  CHECK(tide_run_wait(engine, id, TIDE_RUN_STATE_BIT(TIDE_RUN_RUNNING), 120000, &state));

  /* Live metrics, then an lr change seen in them. */
  deadline = now() + 60;
  for (;;) {
    int enough;
    pthread_mutex_lock(&s.mu);
    enough = s.metrics >= 5;
    pthread_mutex_unlock(&s.mu);
    if (enough) break;
    REQUIRE(now() < deadline);
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  CHECK(tide_run_set(engine, id, "optimizer.lr", "5e-4"));
  rc = tide_run_set(engine, id, "model.dim", "128");
  REQUIRE(rc == TIDE_ERR_INVALID_VALUE && strstr(tide_error_last(), "model.dim"));
  deadline = now() + 60;
  for (;;) {
    int applied;
    pthread_mutex_lock(&s.mu);
    applied = fabs(s.last_lr - 5e-4) < 1e-12;
    pthread_mutex_unlock(&s.mu);
    if (applied) break;
    REQUIRE(now() < deadline);
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  pthread_mutex_lock(&s.mu);
  printf("%d metrics events; lr 5e-4 from step %lld; status from inside the callback: %d; closing the "
         "subscription from inside: %d (%s)\n",
         s.metrics, (long long)s.last_step, s.status_from_inside, s.reentrant_close, tide_strerror(s.reentrant_close));
  REQUIRE(s.status_from_inside == TIDE_OK && s.reentrant_close == TIDE_ERR_REENTRANT);
  pthread_mutex_unlock(&s.mu);

  /* Checkpoint now, then stop. */
  CHECK(tide_run_checkpoint(engine, id));
  CHECK(tide_subscription_poll(checkpoints, 60000, &ev));
  REQUIRE(strcmp(ev.kind, "checkpoint") == 0 && strstr(ev.body_json, "\"ok\":true"));
  printf("checkpoint: %s\n", ev.body_json);
  CHECK(tide_run_stop(engine, id));
  CHECK(tide_run_wait(engine, id, TIDE_RUN_FINISHED_MASK, 120000, &state));
  REQUIRE(state == TIDE_RUN_STOPPED);
  CHECK(tide_run_status_get(engine, id, &st));
  REQUIRE(st.state == TIDE_RUN_STOPPED && st.last_step > 5 && strcmp(st.id, id) == 0 && st.run_dir[0] == '/');
  CHECK(tide_run_metrics(engine, id, 0, &text));
  REQUIRE(text[0] == '[' && strstr(text, "\"loss\""));
  tide_string_free(text);
  printf("%s stopped at step %lld, loss %.4f\n", st.id, (long long)st.last_step, st.loss);

  /* Its checkpoints (the one asked for, the one of the stop), and an export of the newest. */
  CHECK(tide_run_checkpoints(engine, id, &text));
  REQUIRE(text[0] == '[' && strstr(text, "\"step\"") && strstr(text, "\"layout\""));
  printf("checkpoints: %s\n", text);
  tide_string_free(text);
  {
    tide_export_options x = TIDE_EXPORT_OPTIONS_INIT;
    char path[2048];
    FILE *f;
    x.dtype = "BF16";
    x.timeout_ms = 120000;
    CHECK(tide_checkpoint_export(engine, id, "hf", &x, &text));
    REQUIRE(strstr(text, "\"state\":\"done\"") && strstr(text, "\"dtype\":\"BF16\""));
    printf("export: %s\n", text);
    tide_string_free(text);
    snprintf(path, sizeof path, "%s/hf/model.safetensors", st.run_dir);
    REQUIRE((f = fopen(path, "rb")) != NULL);
    fclose(f);
    snprintf(path, sizeof path, "%s/hf/config.json", st.run_dir);
    REQUIRE((f = fopen(path, "rb")) != NULL);
    fclose(f);
    x.version = TIDE_EXPORT_OPTIONS_VERSION + 1;
    REQUIRE(tide_checkpoint_export(engine, id, "hf2", &x, &text) == TIDE_ERR_STRUCT_VERSION && text == NULL);
    x.version = TIDE_EXPORT_OPTIONS_VERSION;
    REQUIRE(tide_checkpoint_export(engine, id, NULL, &x, &text) == TIDE_ERR_INVALID_ARGUMENT &&
            strstr(tide_error_last(), "out_dir"));
    /* No checkpoint at that step: refused before anything starts. */
    x.step = 999999;
    REQUIRE(tide_checkpoint_export(engine, id, "hf2", &x, &text) == TIDE_ERR_BAD_REQUEST && text == NULL &&
            strstr(tide_error_last(), "999999"));
    /* Started, but it cannot write there: the export's own error, and its description. */
    x.step = -1;
    rc = tide_checkpoint_export(engine, id, "/proc/tide-cannot-write-here", &x, &text);
    REQUIRE(rc == TIDE_ERR_IO && strstr(tide_error_last(), "/proc/tide-cannot-write-here") && text &&
            strstr(text, "\"state\":\"failed\""));
    tide_string_free(text);
    /* The adapters alone of a run without LoRA: the export says why not. A version-1
     * caller's struct has no adapter field: whatever lies after it is not read. */
    x.adapter = 1;
    rc = tide_checkpoint_export(engine, id, "adapter", &x, &text);
    REQUIRE(rc == TIDE_ERR_IO && strstr(tide_error_last(), "without LoRA adapters") && text &&
            strstr(text, "\"adapter\":true"));
    tide_string_free(text);
    x.version = 1;
    CHECK(tide_checkpoint_export(engine, id, "hf-v1", &x, &text));
    REQUIRE(text && strstr(text, "\"adapter\":false"));
    tide_string_free(text);
    x.version = TIDE_EXPORT_OPTIONS_VERSION;
    x.adapter = 0;
  }

  /* Errors with the run: unknown, wrong state. */
  REQUIRE(tide_run_status_get(engine, "no-such-run-1", &st) == TIDE_ERR_NOT_FOUND);
  REQUIRE(tide_run_pause(engine, "run-\xcf") == TIDE_ERR_BAD_REQUEST && strstr(tide_error_last(), "not UTF-8"));
  REQUIRE(tide_run_pause(engine, id) == TIDE_ERR_INVALID_STATE && strstr(tide_error_last(), "stopped"));
  CHECK(tide_subscription_close(sub));
  CHECK(tide_subscription_close(checkpoints));
  tide_string_free(id);

  if (embedded) {
    /* Closing with a run still training: its workers end, and so do the threads. */
    id = submit(engine, workdir, recipe);
    CHECK(tide_run_wait(engine, id, TIDE_RUN_STATE_BIT(TIDE_RUN_RUNNING), 120000, &state));
    tide_engine_close(engine);
    REQUIRE(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD);
    REQUIRE(count_entries("/proc/self/task") == threads_before);
    REQUIRE(tide_engine_info(engine, &text) == TIDE_ERR_INVALID_HANDLE);
    printf("closed with %s training: no child process, %d thread(s) as before\n", id, threads_before);
    tide_string_free(id);
  } else {
    tide_engine_close(engine);
  }
  printf("capi run (%s): ok\n", argv[1]);
  return 0;
}
