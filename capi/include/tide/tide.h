/*
 * tide.h: the stable C API of tide (C99). docs/capi.md is the guide; this header is the
 * reference.
 *
 * An engine handle reaches a tide engine either over ZeroMQ (tide_engine_connect: a
 * running tided, local or remote) or in this process (tide_engine_open_embedded: the
 * controller runs on a thread here and starts worker processes itself). Every function
 * after that is the same for both.
 *
 * Conventions
 * - Every fallible function returns int: TIDE_OK (0) or a negative TIDE_ERR_* code. The
 *   calling thread's last error message is tide_error_last(); tide_strerror(code) is a
 *   static description of a code. Codes are never reused or renumbered.
 * - Handles are opaque and typed. A handle that was closed, or that this library never
 *   made, is answered with TIDE_ERR_INVALID_HANDLE; closing NULL does nothing.
 * - Strings returned through char ** are owned by the caller and freed with
 *   tide_string_free. Strings inside a tide_event stay valid until the next poll of its
 *   subscription, or until the callback returns.
 * - Option structs start with a version: initialise them with *_INIT or *_init() and
 *   set only the fields you need. NULL options mean the defaults. Fields are only ever
 *   appended; a struct of a newer version than the library knows is refused.
 * - Threads: a tide_engine may be used from any number of threads at once (requests are
 *   serialised). A tide_subscription is used by one thread at a time; its callback runs
 *   on a thread of the library, may call any engine function, and must not close its
 *   own subscription (that returns TIDE_ERR_REENTRANT).
 */
#ifndef TIDE_TIDE_H
#define TIDE_TIDE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TIDE_API __attribute__((visibility("default")))
#else
#define TIDE_API
#endif

/* ---- Versions ----------------------------------------------------------------------- */

#define TIDE_VERSION_MAJOR 0
#define TIDE_VERSION_MINOR 1
#define TIDE_VERSION_PATCH 0
#define TIDE_VERSION_NUMBER (TIDE_VERSION_MAJOR * 10000 + TIDE_VERSION_MINOR * 100 + TIDE_VERSION_PATCH)

/* The library's version, "0.1.0"; static storage. Thread-safe. */
TIDE_API const char *tide_version(void);
/* TIDE_VERSION_NUMBER of the library loaded at run time (compare with the header's). */
TIDE_API int tide_version_number(void);

/* ---- Status codes ------------------------------------------------------------------- */

#define TIDE_OK 0
/* The engine refused the request (docs/protocol.md, error codes 1-11, negated). */
#define TIDE_ERR_BAD_REQUEST -1
#define TIDE_ERR_UNSUPPORTED_VERSION -2
#define TIDE_ERR_UNKNOWN_TYPE -3
#define TIDE_ERR_NOT_FOUND -4     /* no such run (or export) */
#define TIDE_ERR_INVALID_STATE -5 /* the run's state does not allow it */
#define TIDE_ERR_INVALID_RECIPE -6
#define TIDE_ERR_INVALID_VALUE -7 /* set: not a field, not live, out of range */
#define TIDE_ERR_TOO_LARGE -8
#define TIDE_ERR_UNAUTHORIZED -9  /* the CURVE key's role may not do this */
#define TIDE_ERR_UNAVAILABLE -10  /* more workers than the engine has slots */
#define TIDE_ERR_INTERNAL -11
/* Raised by the library itself. */
#define TIDE_ERR_INVALID_ARGUMENT -20 /* a NULL or malformed argument */
#define TIDE_ERR_INVALID_HANDLE -21   /* closed, or not made by this library */
#define TIDE_ERR_TIMEOUT -22          /* no answer in time; the request may still take effect */
#define TIDE_ERR_TRANSPORT -23        /* cannot connect, or an unreadable reply */
#define TIDE_ERR_IO -24               /* a local file could not be read or written */
#define TIDE_ERR_REENTRANT -25        /* a callback tried to close its own subscription */
#define TIDE_ERR_STRUCT_VERSION -26   /* an option struct newer than this library */

/* The calling thread's message for its last failed call ("" if none); valid until its
 * next call into the library. Thread-safe. */
TIDE_API const char *tide_error_last(void);
/* A static description of a code; "unknown status code" for others. Thread-safe. */
TIDE_API const char *tide_strerror(int code);
/* Frees a string the library returned; NULL does nothing. */
TIDE_API void tide_string_free(char *s);

/* ---- Engines ------------------------------------------------------------------------ */

typedef struct tide_engine tide_engine;

#define TIDE_CONNECT_OPTIONS_VERSION 1
typedef struct tide_connect_options {
  uint32_t version;
  int32_t timeout_ms; /* per request; 0: 10000 */
  /* CURVE toward a daemon serving it (all three, Z85 text, or all NULL). */
  const char *server_public_key;
  const char *client_public_key;
  const char *client_secret_key;
} tide_connect_options;
#define TIDE_CONNECT_OPTIONS_INIT {TIDE_CONNECT_OPTIONS_VERSION, 0, NULL, NULL, NULL}
TIDE_API void tide_connect_options_init(tide_connect_options *options);

/* Connects to a tided at `endpoint` ("tcp://host:7450", "ipc:///path/command.sock"; NULL:
 * the local daemon's ipc socket in $TIDE_STATE_DIR or ~/.local/state/tide) and checks that
 * it answers. *out is closed with tide_engine_close. */
TIDE_API int tide_engine_connect(tide_engine **out, const char *endpoint, const tide_connect_options *options);

#define TIDE_EMBEDDED_OPTIONS_VERSION 1
typedef struct tide_embedded_options {
  uint32_t version;
  const char *state_dir;         /* registry and run directories; NULL: as for tided */
  const char *worker_executable; /* tide-worker; NULL: $TIDE_WORKER, else beside libtide */
  int32_t cpu_slots;             /* 0: 1 */
  int32_t cores;                 /* cores the slots share; 0: this machine's */
  const char *gpus;              /* "auto" (NULL), "none", or "0,1" */
  const char *log_level;         /* "warn" (NULL), "info", "debug", "error" */
} tide_embedded_options;
#define TIDE_EMBEDDED_OPTIONS_INIT {TIDE_EMBEDDED_OPTIONS_VERSION, NULL, NULL, 0, 0, NULL, NULL}
TIDE_API void tide_embedded_options_init(tide_embedded_options *options);

/* Starts an engine inside this process: the controller on a thread of the library,
 * serving ipc sockets in the state directory, workers as child processes. Only one
 * embedded engine (or tided) may serve a state directory at a time. The controller's log
 * goes to <state_dir>/tided.log. */
TIDE_API int tide_engine_open_embedded(tide_engine **out, const tide_embedded_options *options);

/* Closes the handle. An embedded engine ends its runs' workers (they are queued to resume
 * when an engine next opens the state directory) and its threads before this returns.
 * Subscriptions made from the engine stay valid handles and must still be closed. NULL
 * does nothing. */
TIDE_API void tide_engine_close(tide_engine *engine);

/* The engine's description (docs/protocol.md, info) as JSON. */
TIDE_API int tide_engine_info(tide_engine *engine, char **json_out);

/* Any protocol request: `type` and its JSON `body` (NULL: {}); the reply's body as JSON.
 * For what the typed functions do not cover. */
TIDE_API int tide_engine_request(tide_engine *engine, const char *type, const char *body_json, char **reply_json_out);

/* ---- Runs --------------------------------------------------------------------------- */

#define TIDE_RUN_QUEUED 1
#define TIDE_RUN_STARTING 2
#define TIDE_RUN_RUNNING 3
#define TIDE_RUN_PAUSED 4
#define TIDE_RUN_STOPPING 5
#define TIDE_RUN_RESTARTING 6
#define TIDE_RUN_COMPLETED 7
#define TIDE_RUN_STOPPED 8
#define TIDE_RUN_FAILED 9
#define TIDE_RUN_CANCELLED 10
/* A state's bit in a mask for tide_run_wait. */
#define TIDE_RUN_STATE_BIT(state) (1u << (state))
#define TIDE_RUN_FINISHED_MASK                                                                  \
  (TIDE_RUN_STATE_BIT(TIDE_RUN_COMPLETED) | TIDE_RUN_STATE_BIT(TIDE_RUN_STOPPED) |              \
   TIDE_RUN_STATE_BIT(TIDE_RUN_FAILED) | TIDE_RUN_STATE_BIT(TIDE_RUN_CANCELLED))

/* "running", ...; "unknown" for other values. Static storage. */
TIDE_API const char *tide_run_state_name(int state);

#define TIDE_SUBMIT_OPTIONS_VERSION 1
typedef struct tide_submit_options {
  uint32_t version;
  /* Exactly one of: */
  const char *recipe_text; /* the Lua text */
  const char *recipe_file; /* read here, sent as text */
  const char *recipe_name; /* a bundled recipe of the engine: "llama/llama-tiny" */
  const char *const *overrides; /* "field=value", as tide --set */
  size_t overrides_count;
  int32_t workers;               /* 0: the recipe's dp x cp x tp x pp */
  int32_t priority;              /* higher first; -1000..1000 */
  const char *idempotency_key;   /* NULL: none */
  const char *workdir;           /* relative recipe paths resolve here; NULL: this process's */
} tide_submit_options;
#define TIDE_SUBMIT_OPTIONS_INIT {TIDE_SUBMIT_OPTIONS_VERSION, NULL, NULL, NULL, NULL, 0, 0, 0, NULL, NULL}
TIDE_API void tide_submit_options_init(tide_submit_options *options);

/* Queues a run; its id (free with tide_string_free) in *run_id_out. */
TIDE_API int tide_run_submit(tide_engine *engine, const tide_submit_options *options, char **run_id_out);

#define TIDE_PLAN_OPTIONS_VERSION 1
typedef struct tide_plan_options {
  uint32_t version;
  /* Exactly one of (as in tide_submit_options): */
  const char *recipe_text;
  const char *recipe_file;
  const char *recipe_name;
  const char *const *overrides; /* "field=value", as tide --set */
  size_t overrides_count;
  const char *device;       /* "h100-80", "a100-80", ... (docs/planner.md); NULL or "cpu": the engine's machine */
  int32_t nodes;            /* 0: 1 */
  int32_t devices_per_node; /* 0: 1 */
  int32_t top;              /* ranked layouts returned; 0: 10 */
} tide_plan_options;
#define TIDE_PLAN_OPTIONS_INIT \
  { TIDE_PLAN_OPTIONS_VERSION, NULL, NULL, NULL, NULL, 0, NULL, 0, 0, 0 }
TIDE_API void tide_plan_options_init(tide_plan_options *options);

/* Ranks every layout of a recipe on a described cluster by predicted speed, with each
 * rank's memory itemised (docs/planner.md): the plan as JSON, schema tide.plan/1
 * (docs/plan.schema.json), the same `tide plan --json` prints, in *plan_json_out (free
 * with tide_string_free). A plan where nothing fits is a result, not an error (its
 * "ranked" is empty). Restrictions (tp, pp, zero), a device described field by field or
 * the attention kernel: the "plan" request through tide_engine_request. */
TIDE_API int tide_engine_plan(tide_engine *engine, const tide_plan_options *options, char **plan_json_out);

#define TIDE_RUN_STATUS_VERSION 1
typedef struct tide_run_status {
  uint32_t version; /* set by the caller: TIDE_RUN_STATUS_VERSION */
  char id[128];
  char name[64];
  int32_t state; /* TIDE_RUN_* */
  int32_t workers;
  int64_t last_step;
  int64_t total_steps;
  int64_t attempt;  /* worker groups started */
  int64_t restarts; /* after faults */
  double loss;      /* the latest step's; NaN before the first */
  double lr;        /* the latest step's learning rate; NaN before the first */
  double tokens_per_second;
  double final_loss; /* NaN until it finished */
  char run_dir[1024];
  char error[1024]; /* why it failed; "" otherwise */
} tide_run_status;
#define TIDE_RUN_STATUS_INIT \
  {TIDE_RUN_STATUS_VERSION, {0}, {0}, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, {0}, {0}}

/* Fills *status (its version set by the caller). */
TIDE_API int tide_run_status_get(tide_engine *engine, const char *run_id, tide_run_status *status);
/* Every run, oldest first, as a JSON array of run objects (docs/protocol.md, status). */
TIDE_API int tide_run_list(tide_engine *engine, char **json_out);
/* Waits until the run's state is in `state_mask` (TIDE_RUN_STATE_BIT bits) or timeout_ms
 * pass (-1: no limit): TIDE_OK with the state in *state_out (may be NULL), or
 * TIDE_ERR_TIMEOUT. */
TIDE_API int tide_run_wait(tide_engine *engine, const char *run_id, uint32_t state_mask, int32_t timeout_ms,
                           int32_t *state_out);

TIDE_API int tide_run_pause(tide_engine *engine, const char *run_id);
TIDE_API int tide_run_resume(tide_engine *engine, const char *run_id);
/* Saves a checkpoint, then ends the run (state stopped; resume continues it). */
TIDE_API int tide_run_stop(tide_engine *engine, const char *run_id);
/* Ends the workers now, without a checkpoint. */
TIDE_API int tide_run_cancel(tide_engine *engine, const char *run_id);
TIDE_API int tide_run_checkpoint(tide_engine *engine, const char *run_id);
/* Changes a live recipe field ("optimizer.lr"); `value` is JSON ("5e-4", "true") or, when
 * not valid JSON, a string. Checked before it is accepted; every rank applies it at the
 * same step. */
TIDE_API int tide_run_set(tide_engine *engine, const char *run_id, const char *field, const char *value);
/* The run's metrics rows after step `since_step`, as a JSON array. */
TIDE_API int tide_run_metrics(tide_engine *engine, const char *run_id, int64_t since_step, char **json_out);

/* ---- Checkpoints ------------------------------------------------------------------ */

/* The run's committed checkpoints, oldest first, as a JSON array of objects: step, dir,
 * tokens_seen, layout {dp, cp, tp, pp, zero, world}, files, bytes (docs/protocol.md,
 * checkpoints). Paths are on the engine's machine. */
TIDE_API int tide_run_checkpoints(tide_engine *engine, const char *run_id, char **json_out);

#define TIDE_EXPORT_OPTIONS_VERSION 2
typedef struct tide_export_options {
  uint32_t version;
  int64_t step;       /* the checkpoint's step; -1: the newest committed */
  const char *dtype;  /* "F32" (NULL), "BF16" or "F16" */
  int32_t timeout_ms; /* how long to wait for the export to finish; -1: no limit; 0: do not wait */
  /* Version 2. Nonzero: a LoRA run's adapters alone, as PEFT's adapter directory
   * (adapter_config.json + adapter_model.safetensors), not the merged model. */
  int32_t adapter;
} tide_export_options;
#define TIDE_EXPORT_OPTIONS_INIT \
  { TIDE_EXPORT_OPTIONS_VERSION, -1, NULL, -1, 0 }
TIDE_API void tide_export_options_init(tide_export_options *options);

/* Writes one of the run's checkpoints, whatever layout saved it, as Hugging Face
 * safetensors + config.json into out_dir on the engine's machine (relative: inside the
 * run directory). The engine does it in a child process and this waits as the options
 * say: TIDE_OK when it is written (or started, with timeout_ms 0), TIDE_ERR_IO when it
 * failed (the message says why), TIDE_ERR_TIMEOUT when it is still going (it goes on).
 * Whenever the export was started, *export_json_out (may be NULL) is its description:
 * id, step, checkpoint, out, dtype, state ("running", "done", "failed"), error, log; the
 * run's "export" events follow it too. */
TIDE_API int tide_checkpoint_export(tide_engine *engine, const char *run_id, const char *out_dir,
                                    const tide_export_options *options, char **export_json_out);

/* ---- Events ------------------------------------------------------------------------- */

typedef struct tide_subscription tide_subscription;

typedef struct tide_event {
  uint32_t version;  /* 1 */
  const char *run;   /* the run's id */
  const char *kind;  /* "metrics", "state", "control", "checkpoint", "export", "log", "anomaly", "policy" */
  int64_t seq;       /* per run and engine epoch */
  double time;       /* Unix seconds */
  int64_t step;      /* metrics: the step; -1 for other kinds */
  double loss;       /* metrics: the loss; NaN for other kinds */
  int32_t state;     /* state: the new TIDE_RUN_*; 0 for other kinds */
  int32_t snapshot;  /* 1: repeats an earlier event for a late subscriber */
  const char *body_json; /* the whole body (docs/protocol.md, Events) */
} tide_event;

typedef void (*tide_event_fn)(const tide_event *event, void *user_data);

/* Subscribes to the events of one run (run_id) or all (NULL), of one kind or all (NULL).
 * Events are taken with tide_subscription_poll. A subscription drops what it cannot keep
 * (10,000 queued events) rather than slow training: seq shows the gap. */
TIDE_API int tide_subscribe(tide_engine *engine, const char *run_id, const char *kind, tide_subscription **out);
/* The same, delivered to `callback` on a thread of the library until the subscription is
 * closed. */
TIDE_API int tide_subscribe_callback(tide_engine *engine, const char *run_id, const char *kind, tide_event_fn callback,
                                     void *user_data, tide_subscription **out);
/* Waits up to timeout_ms (-1: no limit) for the next event: TIDE_OK with *event filled,
 * or TIDE_ERR_TIMEOUT. Not for callback subscriptions (TIDE_ERR_INVALID_STATE). */
TIDE_API int tide_subscription_poll(tide_subscription *subscription, int32_t timeout_ms, tide_event *event);
/* Stops delivery (joins the callback thread) and frees the subscription; NULL does
 * nothing. From inside its own callback: TIDE_ERR_REENTRANT, nothing changes. */
TIDE_API int tide_subscription_close(tide_subscription *subscription);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_TIDE_H */
