/* Every public function called with NULL and with invalid handles: a status code and a
 * message, never a crash. Compiled as strict C99 (-std=c99 -pedantic -Werror), which also
 * checks that tide.h is C. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tide/tide.h"

static int failures = 0;

static void expect(int got, int want, const char *call, const char *message_part) {
  const char *message = tide_error_last();
  if (got != want) {
    fprintf(stderr, "FAIL %s: returned %d (%s), expected %d; message: %s\n", call, got, tide_strerror(got), want,
            message);
    ++failures;
  } else if (want != TIDE_OK && (message[0] == '\0' || (message_part && !strstr(message, message_part)))) {
    fprintf(stderr, "FAIL %s: message '%s' lacks '%s'\n", call, message, message_part ? message_part : "(any)");
    ++failures;
  }
}

#define EXPECT(call, want, part) expect((call), (want), #call, (part))

int main(void) {
  tide_engine *engine = NULL;
  tide_subscription *sub = NULL;
  char *text = NULL;
  int32_t state = 0;
  tide_event event;
  tide_run_status status = TIDE_RUN_STATUS_INIT;
  tide_connect_options connect = TIDE_CONNECT_OPTIONS_INIT;
  tide_embedded_options embedded = TIDE_EMBEDDED_OPTIONS_INIT;
  tide_submit_options submit = TIDE_SUBMIT_OPTIONS_INIT;
  tide_plan_options plan = TIDE_PLAN_OPTIONS_INIT;
  /* A pointer this library never made stands for a forged or closed handle. */
  int not_a_handle = 0;
  tide_engine *bogus = (tide_engine *)(void *)&not_a_handle;
  tide_subscription *bogus_sub = (tide_subscription *)(void *)&not_a_handle;

  if (tide_version_number() != TIDE_VERSION_NUMBER || strlen(tide_version()) < 5) {
    fprintf(stderr, "FAIL version: header %d, library %d (%s)\n", TIDE_VERSION_NUMBER, tide_version_number(),
            tide_version());
    ++failures;
  }
  if (strcmp(tide_strerror(TIDE_ERR_NOT_FOUND), "no such run") != 0 || strcmp(tide_strerror(12345), "unknown status code") != 0)
    ++failures;
  if (strcmp(tide_run_state_name(TIDE_RUN_RUNNING), "running") != 0 || strcmp(tide_run_state_name(99), "unknown") != 0)
    ++failures;

  /* Constructors. */
  EXPECT(tide_engine_connect(NULL, NULL, NULL), TIDE_ERR_INVALID_ARGUMENT, "out is NULL");
  connect.version = 0;
  EXPECT(tide_engine_connect(&engine, "tcp://127.0.0.1:1", &connect), TIDE_ERR_INVALID_ARGUMENT, "_INIT");
  connect.version = TIDE_CONNECT_OPTIONS_VERSION + 1;
  EXPECT(tide_engine_connect(&engine, "tcp://127.0.0.1:1", &connect), TIDE_ERR_STRUCT_VERSION, "knows up to");
  tide_connect_options_init(&connect);
  connect.server_public_key = "only-one-key";
  EXPECT(tide_engine_connect(&engine, "tcp://127.0.0.1:1", &connect), TIDE_ERR_INVALID_ARGUMENT, "CURVE needs");
  tide_connect_options_init(&connect);
  connect.timeout_ms = 200;
  EXPECT(tide_engine_connect(&engine, "tcp://127.0.0.1:1", &connect), TIDE_ERR_TIMEOUT, "tcp://127.0.0.1:1");
  EXPECT(tide_engine_connect(&engine, "not an endpoint", &connect), TIDE_ERR_TRANSPORT, "not an endpoint");
  if (engine != NULL) ++failures;
  EXPECT(tide_engine_open_embedded(NULL, NULL), TIDE_ERR_INVALID_ARGUMENT, "out is NULL");
  embedded.worker_executable = "/nonexistent/tide";
  EXPECT(tide_engine_open_embedded(&engine, &embedded), TIDE_ERR_INVALID_ARGUMENT, "/nonexistent/tide");
  tide_embedded_options_init(&embedded);
  embedded.cpu_slots = -1;
  EXPECT(tide_engine_open_embedded(&engine, &embedded), TIDE_ERR_INVALID_ARGUMENT, "cpu_slots -1");

  /* Every engine function with NULL and with a handle it never made. */
  EXPECT(tide_engine_info(NULL, &text), TIDE_ERR_INVALID_ARGUMENT, "engine is NULL");
  EXPECT(tide_engine_info(bogus, &text), TIDE_ERR_INVALID_HANDLE, "not made by this library");
  EXPECT(tide_engine_request(bogus, "info", NULL, &text), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_submit(bogus, &submit, &text), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_submit(NULL, NULL, NULL), TIDE_ERR_INVALID_ARGUMENT, NULL);
  EXPECT(tide_engine_plan(bogus, &plan, &text), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_engine_plan(NULL, NULL, NULL), TIDE_ERR_INVALID_ARGUMENT, NULL);
  tide_plan_options_init(NULL);
  EXPECT(tide_run_status_get(bogus, "r", &status), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_list(bogus, &text), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_wait(bogus, "r", TIDE_RUN_FINISHED_MASK, 0, &state), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_pause(bogus, "r"), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_resume(NULL, "r"), TIDE_ERR_INVALID_ARGUMENT, NULL);
  EXPECT(tide_run_stop(bogus, "r"), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_cancel(bogus, "r"), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_checkpoint(bogus, "r"), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_set(bogus, "r", "optimizer.lr", "1e-4"), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_metrics(bogus, "r", 0, &text), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_checkpoints(bogus, "r", &text), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_checkpoint_export(bogus, "r", "out", NULL, &text), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_run_checkpoints(bogus, "r", NULL), TIDE_ERR_INVALID_ARGUMENT, "json_out is NULL");
  EXPECT(tide_checkpoint_export(NULL, "r", "out", NULL, NULL), TIDE_ERR_INVALID_ARGUMENT, "engine is NULL");
  tide_export_options_init(NULL);
  EXPECT(tide_subscribe(bogus, NULL, NULL, &sub), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_subscribe_callback(NULL, NULL, NULL, NULL, NULL, &sub), TIDE_ERR_INVALID_ARGUMENT, "callback is NULL");
  EXPECT(tide_subscription_poll(NULL, 0, &event), TIDE_ERR_INVALID_ARGUMENT, "subscription is NULL");
  EXPECT(tide_subscription_poll(bogus_sub, 0, &event), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_subscription_close(bogus_sub), TIDE_ERR_INVALID_HANDLE, NULL);
  EXPECT(tide_subscription_close(NULL), TIDE_OK, NULL);
  tide_engine_close(NULL);
  tide_engine_close(bogus); /* not ours: ignored */
  tide_string_free(NULL);
  if (text != NULL || sub != NULL) {
    fprintf(stderr, "FAIL an out-pointer was set by a failed call\n");
    ++failures;
  }
  if (failures == 0) printf("capi misuse: ok\n");
  return failures == 0 ? 0 : 1;
}
