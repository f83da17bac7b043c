//! Raw declarations of tide's C API, one for one with `capi/include/tide/tide.h` (the
//! reference for ownership and threading). Use the `tide` crate for a safe interface.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_double, c_int, c_void};

pub const TIDE_OK: c_int = 0;
pub const TIDE_ERR_BAD_REQUEST: c_int = -1;
pub const TIDE_ERR_UNSUPPORTED_VERSION: c_int = -2;
pub const TIDE_ERR_UNKNOWN_TYPE: c_int = -3;
pub const TIDE_ERR_NOT_FOUND: c_int = -4;
pub const TIDE_ERR_INVALID_STATE: c_int = -5;
pub const TIDE_ERR_INVALID_RECIPE: c_int = -6;
pub const TIDE_ERR_INVALID_VALUE: c_int = -7;
pub const TIDE_ERR_TOO_LARGE: c_int = -8;
pub const TIDE_ERR_UNAUTHORIZED: c_int = -9;
pub const TIDE_ERR_UNAVAILABLE: c_int = -10;
pub const TIDE_ERR_INTERNAL: c_int = -11;
pub const TIDE_ERR_INVALID_ARGUMENT: c_int = -20;
pub const TIDE_ERR_INVALID_HANDLE: c_int = -21;
pub const TIDE_ERR_TIMEOUT: c_int = -22;
pub const TIDE_ERR_TRANSPORT: c_int = -23;
pub const TIDE_ERR_IO: c_int = -24;
pub const TIDE_ERR_REENTRANT: c_int = -25;
pub const TIDE_ERR_STRUCT_VERSION: c_int = -26;

pub const TIDE_RUN_QUEUED: i32 = 1;
pub const TIDE_RUN_STARTING: i32 = 2;
pub const TIDE_RUN_RUNNING: i32 = 3;
pub const TIDE_RUN_PAUSED: i32 = 4;
pub const TIDE_RUN_STOPPING: i32 = 5;
pub const TIDE_RUN_RESTARTING: i32 = 6;
pub const TIDE_RUN_COMPLETED: i32 = 7;
pub const TIDE_RUN_STOPPED: i32 = 8;
pub const TIDE_RUN_FAILED: i32 = 9;
pub const TIDE_RUN_CANCELLED: i32 = 10;

pub const TIDE_CONNECT_OPTIONS_VERSION: u32 = 1;
pub const TIDE_EMBEDDED_OPTIONS_VERSION: u32 = 1;
pub const TIDE_SUBMIT_OPTIONS_VERSION: u32 = 1;
pub const TIDE_PLAN_OPTIONS_VERSION: u32 = 1;
pub const TIDE_RUN_STATUS_VERSION: u32 = 1;
pub const TIDE_EXPORT_OPTIONS_VERSION: u32 = 2;

#[repr(C)]
pub struct tide_engine {
    _private: [u8; 0],
}

#[repr(C)]
pub struct tide_subscription {
    _private: [u8; 0],
}

#[repr(C)]
pub struct tide_connect_options {
    pub version: u32,
    pub timeout_ms: i32,
    pub server_public_key: *const c_char,
    pub client_public_key: *const c_char,
    pub client_secret_key: *const c_char,
}

#[repr(C)]
pub struct tide_embedded_options {
    pub version: u32,
    pub state_dir: *const c_char,
    pub worker_executable: *const c_char,
    pub cpu_slots: i32,
    pub cores: i32,
    pub gpus: *const c_char,
    pub log_level: *const c_char,
}

#[repr(C)]
pub struct tide_submit_options {
    pub version: u32,
    pub recipe_text: *const c_char,
    pub recipe_file: *const c_char,
    pub recipe_name: *const c_char,
    pub overrides: *const *const c_char,
    pub overrides_count: usize,
    pub workers: i32,
    pub priority: i32,
    pub idempotency_key: *const c_char,
    pub workdir: *const c_char,
}

#[repr(C)]
pub struct tide_plan_options {
    pub version: u32,
    pub recipe_text: *const c_char,
    pub recipe_file: *const c_char,
    pub recipe_name: *const c_char,
    pub overrides: *const *const c_char,
    pub overrides_count: usize,
    pub device: *const c_char,
    pub nodes: i32,
    pub devices_per_node: i32,
    pub top: i32,
}

#[repr(C)]
pub struct tide_run_status {
    pub version: u32,
    pub id: [c_char; 128],
    pub name: [c_char; 64],
    pub state: i32,
    pub workers: i32,
    pub last_step: i64,
    pub total_steps: i64,
    pub attempt: i64,
    pub restarts: i64,
    pub loss: c_double,
    pub lr: c_double,
    pub tokens_per_second: c_double,
    pub final_loss: c_double,
    pub run_dir: [c_char; 1024],
    pub error: [c_char; 1024],
}

#[repr(C)]
pub struct tide_export_options {
    pub version: u32,
    pub step: i64,
    pub dtype: *const c_char,
    pub timeout_ms: i32,
    /// Version 2: nonzero, a LoRA run's adapters alone (PEFT's adapter directory).
    pub adapter: i32,
}

#[repr(C)]
pub struct tide_event {
    pub version: u32,
    pub run: *const c_char,
    pub kind: *const c_char,
    pub seq: i64,
    pub time: c_double,
    pub step: i64,
    pub loss: c_double,
    pub state: i32,
    pub snapshot: i32,
    pub body_json: *const c_char,
}

pub type tide_event_fn = Option<unsafe extern "C" fn(event: *const tide_event, user_data: *mut c_void)>;

extern "C" {
    pub fn tide_version() -> *const c_char;
    pub fn tide_version_number() -> c_int;
    pub fn tide_error_last() -> *const c_char;
    pub fn tide_strerror(code: c_int) -> *const c_char;
    pub fn tide_string_free(s: *mut c_char);

    pub fn tide_connect_options_init(options: *mut tide_connect_options);
    pub fn tide_engine_connect(
        out: *mut *mut tide_engine,
        endpoint: *const c_char,
        options: *const tide_connect_options,
    ) -> c_int;
    pub fn tide_embedded_options_init(options: *mut tide_embedded_options);
    pub fn tide_engine_open_embedded(out: *mut *mut tide_engine, options: *const tide_embedded_options) -> c_int;
    pub fn tide_engine_close(engine: *mut tide_engine);
    pub fn tide_engine_info(engine: *mut tide_engine, json_out: *mut *mut c_char) -> c_int;
    pub fn tide_engine_request(
        engine: *mut tide_engine,
        type_: *const c_char,
        body_json: *const c_char,
        reply_json_out: *mut *mut c_char,
    ) -> c_int;

    pub fn tide_run_state_name(state: c_int) -> *const c_char;
    pub fn tide_submit_options_init(options: *mut tide_submit_options);
    pub fn tide_run_submit(
        engine: *mut tide_engine,
        options: *const tide_submit_options,
        run_id_out: *mut *mut c_char,
    ) -> c_int;
    pub fn tide_plan_options_init(options: *mut tide_plan_options);
    pub fn tide_engine_plan(
        engine: *mut tide_engine,
        options: *const tide_plan_options,
        plan_json_out: *mut *mut c_char,
    ) -> c_int;
    pub fn tide_run_status_get(engine: *mut tide_engine, run_id: *const c_char, status: *mut tide_run_status) -> c_int;
    pub fn tide_run_list(engine: *mut tide_engine, json_out: *mut *mut c_char) -> c_int;
    pub fn tide_run_wait(
        engine: *mut tide_engine,
        run_id: *const c_char,
        state_mask: u32,
        timeout_ms: i32,
        state_out: *mut i32,
    ) -> c_int;
    pub fn tide_run_pause(engine: *mut tide_engine, run_id: *const c_char) -> c_int;
    pub fn tide_run_resume(engine: *mut tide_engine, run_id: *const c_char) -> c_int;
    pub fn tide_run_stop(engine: *mut tide_engine, run_id: *const c_char) -> c_int;
    pub fn tide_run_cancel(engine: *mut tide_engine, run_id: *const c_char) -> c_int;
    pub fn tide_run_checkpoint(engine: *mut tide_engine, run_id: *const c_char) -> c_int;
    pub fn tide_run_set(
        engine: *mut tide_engine,
        run_id: *const c_char,
        field: *const c_char,
        value: *const c_char,
    ) -> c_int;
    pub fn tide_run_metrics(
        engine: *mut tide_engine,
        run_id: *const c_char,
        since_step: i64,
        json_out: *mut *mut c_char,
    ) -> c_int;

    pub fn tide_run_checkpoints(engine: *mut tide_engine, run_id: *const c_char, json_out: *mut *mut c_char) -> c_int;
    pub fn tide_export_options_init(options: *mut tide_export_options);
    pub fn tide_checkpoint_export(
        engine: *mut tide_engine,
        run_id: *const c_char,
        out_dir: *const c_char,
        options: *const tide_export_options,
        export_json_out: *mut *mut c_char,
    ) -> c_int;

    pub fn tide_subscribe(
        engine: *mut tide_engine,
        run_id: *const c_char,
        kind: *const c_char,
        out: *mut *mut tide_subscription,
    ) -> c_int;
    pub fn tide_subscribe_callback(
        engine: *mut tide_engine,
        run_id: *const c_char,
        kind: *const c_char,
        callback: tide_event_fn,
        user_data: *mut c_void,
        out: *mut *mut tide_subscription,
    ) -> c_int;
    pub fn tide_subscription_poll(
        subscription: *mut tide_subscription,
        timeout_ms: i32,
        event: *mut tide_event,
    ) -> c_int;
    pub fn tide_subscription_close(subscription: *mut tide_subscription) -> c_int;
}
