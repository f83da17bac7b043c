//! Drive tide training engines from Rust, through the C API (`libtide.so.0`).
//!
//! ```no_run
//! let engine = tide::Engine::embedded(&tide::EmbeddedOptions { state_dir: Some("/tmp/tide-state".into()), ..Default::default() })?;
//! let run = engine.submit(&tide::Submit { recipe_name: Some("llama/llama-tiny".into()), ..Default::default() })?;
//! let mut events = engine.subscribe(Some(run.id()), Some("metrics"))?;
//! while let Some(e) = events.poll(Some(std::time::Duration::from_secs(60)))? {
//!     println!("step {:?} loss {:?}", e.step, e.loss);
//!     if e.step >= Some(20) { break; }
//! }
//! run.set("optimizer.lr", "5e-4")?;
//! run.stop()?;
//! # Ok::<(), tide::Error>(())
//! ```
//!
//! Bodies (info, lists, metrics, event bodies) are JSON text, for the JSON crate of your
//! choice; this crate depends on nothing but the C library. `Engine` is `Send + Sync`
//! (the C API serialises requests on an engine); a `Subscription` is `Send` but used by
//! one thread at a time, as the C API requires.
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::c_char;
use std::ptr;
use std::time::{Duration, Instant};

use tide_sys as sys;

/// A failed call: `code` is the C API's `TIDE_ERR_*` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: i32,
    pub message: String,
}

impl Error {
    pub const NOT_FOUND: i32 = sys::TIDE_ERR_NOT_FOUND;
    pub const INVALID_STATE: i32 = sys::TIDE_ERR_INVALID_STATE;
    pub const INVALID_RECIPE: i32 = sys::TIDE_ERR_INVALID_RECIPE;
    pub const INVALID_VALUE: i32 = sys::TIDE_ERR_INVALID_VALUE;
    pub const INVALID_ARGUMENT: i32 = sys::TIDE_ERR_INVALID_ARGUMENT;
    pub const INVALID_HANDLE: i32 = sys::TIDE_ERR_INVALID_HANDLE;
    pub const TIMEOUT: i32 = sys::TIDE_ERR_TIMEOUT;
    pub const BAD_REQUEST: i32 = sys::TIDE_ERR_BAD_REQUEST;
    pub const IO: i32 = sys::TIDE_ERR_IO;
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (tide error {})", self.message, self.code)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(rc: i32) -> Result<()> {
    if rc == sys::TIDE_OK {
        return Ok(());
    }
    let message = unsafe { CStr::from_ptr(sys::tide_error_last()) }
        .to_string_lossy()
        .into_owned();
    Err(Error { code: rc, message })
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error {
        code: sys::TIDE_ERR_INVALID_ARGUMENT,
        message: format!("{what} contains a NUL byte"),
    })
}

fn opt_cstring(s: &Option<String>, what: &str) -> Result<Option<CString>> {
    s.as_deref().map(|v| cstring(v, what)).transpose()
}

fn ptr_of(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |c| c.as_ptr())
}

// The out-string is freed whatever the call returned: some set it on failure too
// (tide_checkpoint_export).
fn take_string(call: impl FnOnce(*mut *mut c_char) -> i32) -> Result<String> {
    let mut out: *mut c_char = ptr::null_mut();
    let rc = call(&mut out);
    let mut text = String::new();
    if !out.is_null() {
        text = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
        unsafe { sys::tide_string_free(out) };
    }
    check(rc)?;
    Ok(text)
}

fn text_of(chars: &[c_char]) -> String {
    unsafe { CStr::from_ptr(chars.as_ptr()) }.to_string_lossy().into_owned()
}

fn finite(x: f64) -> Option<f64> {
    if x.is_nan() {
        None
    } else {
        Some(x)
    }
}

fn millis(timeout: Option<Duration>) -> i32 {
    timeout.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32)
}

/// The loaded library's version ("0.1.0").
pub fn version() -> String {
    unsafe { CStr::from_ptr(sys::tide_version()) }
        .to_string_lossy()
        .into_owned()
}

/// A run's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Queued,
    Starting,
    Running,
    Paused,
    Stopping,
    Restarting,
    Completed,
    Stopped,
    Failed,
    Cancelled,
}

impl State {
    const ALL: [State; 10] = [
        State::Queued,
        State::Starting,
        State::Running,
        State::Paused,
        State::Stopping,
        State::Restarting,
        State::Completed,
        State::Stopped,
        State::Failed,
        State::Cancelled,
    ];
    /// The states a run ends in.
    pub const FINISHED: [State; 4] = [State::Completed, State::Stopped, State::Failed, State::Cancelled];

    fn code(self) -> i32 {
        State::ALL.iter().position(|s| *s == self).unwrap() as i32 + sys::TIDE_RUN_QUEUED
    }
    fn from_code(code: i32) -> Option<State> {
        State::ALL.get((code - sys::TIDE_RUN_QUEUED) as usize).copied()
    }
    pub fn name(self) -> &'static str {
        unsafe { CStr::from_ptr(sys::tide_run_state_name(self.code())) }
            .to_str()
            .unwrap_or("unknown")
    }
}

/// How to reach a tided; the default is no CURVE and a 10 s request timeout.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    pub timeout: Option<Duration>,
    /// CURVE: all three keys (Z85) or none.
    pub server_public_key: Option<String>,
    pub client_public_key: Option<String>,
    pub client_secret_key: Option<String>,
}

/// An engine inside this process; `None` fields take the C API's defaults.
#[derive(Debug, Clone, Default)]
pub struct EmbeddedOptions {
    pub state_dir: Option<String>,
    pub worker_executable: Option<String>,
    pub cpu_slots: i32,
    pub cores: i32,
    pub gpus: Option<String>,
    pub log_level: Option<String>,
}

/// A run to queue: exactly one of `recipe_text`, `recipe_file`, `recipe_name`.
#[derive(Debug, Clone, Default)]
pub struct Submit {
    pub recipe_text: Option<String>,
    pub recipe_file: Option<String>,
    pub recipe_name: Option<String>,
    pub overrides: Vec<String>,
    pub workers: i32,
    pub priority: i32,
    pub idempotency_key: Option<String>,
    pub workdir: Option<String>,
}

/// A planning question: exactly one of `recipe_text`, `recipe_file`, `recipe_name`, and the
/// cluster: `nodes` x `devices_per_node` `device`s ("h100-80", "a100-80", ...; None or
/// "cpu": the engine's machine; 0: one); `top` ranked layouts (0: 10).
#[derive(Debug, Clone, Default)]
pub struct PlanQuestion {
    pub recipe_text: Option<String>,
    pub recipe_file: Option<String>,
    pub recipe_name: Option<String>,
    pub overrides: Vec<String>,
    pub device: Option<String>,
    pub nodes: i32,
    pub devices_per_node: i32,
    pub top: i32,
}

/// Which checkpoint `Run::export` writes, and how.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// The checkpoint's step; None: the newest.
    pub step: Option<i64>,
    /// "F32" (None), "BF16" or "F16".
    pub dtype: Option<String>,
    /// How long to wait for the export (None: until it ends; zero: return once started).
    pub timeout: Option<Duration>,
    /// A LoRA run's adapters alone, as PEFT's adapter directory, not the merged model.
    pub adapter: bool,
}

/// `field=value` overrides as the C API takes them: C strings and an array of pointers
/// to them, both alive as long as this is.
struct Overrides {
    _strings: Vec<CString>,
    pointers: Vec<*const c_char>,
}

impl Overrides {
    fn new(list: &[String]) -> Result<Overrides> {
        let strings = list
            .iter()
            .map(|o| cstring(o, "override"))
            .collect::<Result<Vec<_>>>()?;
        let pointers = strings.iter().map(|o| o.as_ptr()).collect();
        Ok(Overrides {
            _strings: strings,
            pointers,
        })
    }
    fn pointer(&self) -> *const *const c_char {
        if self.pointers.is_empty() {
            ptr::null()
        } else {
            self.pointers.as_ptr()
        }
    }
    fn count(&self) -> usize {
        self.pointers.len()
    }
}

/// A tide engine: a tided over ZeroMQ, or one embedded in this process. Closed on drop
/// (an embedded engine ends its workers and threads first).
pub struct Engine {
    handle: *mut sys::tide_engine,
}

// The C API allows an engine to be used from any number of threads at once.
unsafe impl Send for Engine {}
unsafe impl Sync for Engine {}

impl Engine {
    /// Connects to a tided at `endpoint` (None: the local daemon's ipc socket).
    pub fn connect(endpoint: Option<&str>, options: &ConnectOptions) -> Result<Engine> {
        let ep = endpoint.map(|e| cstring(e, "endpoint")).transpose()?;
        let server = opt_cstring(&options.server_public_key, "server_public_key")?;
        let public = opt_cstring(&options.client_public_key, "client_public_key")?;
        let secret = opt_cstring(&options.client_secret_key, "client_secret_key")?;
        let o = sys::tide_connect_options {
            version: sys::TIDE_CONNECT_OPTIONS_VERSION,
            timeout_ms: options.timeout.map_or(0, |d| millis(Some(d))),
            server_public_key: ptr_of(&server),
            client_public_key: ptr_of(&public),
            client_secret_key: ptr_of(&secret),
        };
        let mut handle = ptr::null_mut();
        check(unsafe { sys::tide_engine_connect(&mut handle, ptr_of(&ep), &o) })?;
        Ok(Engine { handle })
    }

    /// Starts an engine in this process (a controller thread; workers as child processes).
    pub fn embedded(options: &EmbeddedOptions) -> Result<Engine> {
        let state = opt_cstring(&options.state_dir, "state_dir")?;
        let worker = opt_cstring(&options.worker_executable, "worker_executable")?;
        let gpus = opt_cstring(&options.gpus, "gpus")?;
        let level = opt_cstring(&options.log_level, "log_level")?;
        let o = sys::tide_embedded_options {
            version: sys::TIDE_EMBEDDED_OPTIONS_VERSION,
            state_dir: ptr_of(&state),
            worker_executable: ptr_of(&worker),
            cpu_slots: options.cpu_slots,
            cores: options.cores,
            gpus: ptr_of(&gpus),
            log_level: ptr_of(&level),
        };
        let mut handle = ptr::null_mut();
        check(unsafe { sys::tide_engine_open_embedded(&mut handle, &o) })?;
        Ok(Engine { handle })
    }

    /// The engine's description, JSON (docs/protocol.md, info).
    pub fn info(&self) -> Result<String> {
        take_string(|out| unsafe { sys::tide_engine_info(self.handle, out) })
    }

    /// Any protocol request; the reply's body as JSON.
    pub fn request(&self, kind: &str, body_json: &str) -> Result<String> {
        let k = cstring(kind, "type")?;
        let b = cstring(body_json, "body")?;
        take_string(|out| unsafe { sys::tide_engine_request(self.handle, k.as_ptr(), b.as_ptr(), out) })
    }

    /// The recipe's layouts ranked by predicted speed on the question's cluster, with
    /// memory per rank itemised (docs/planner.md): the plan as JSON, schema tide.plan/1.
    pub fn plan(&self, q: &PlanQuestion) -> Result<String> {
        let text = opt_cstring(&q.recipe_text, "recipe_text")?;
        let file = opt_cstring(&q.recipe_file, "recipe_file")?;
        let name = opt_cstring(&q.recipe_name, "recipe_name")?;
        let device = opt_cstring(&q.device, "device")?;
        let overrides = Overrides::new(&q.overrides)?;
        let o = sys::tide_plan_options {
            version: sys::TIDE_PLAN_OPTIONS_VERSION,
            recipe_text: ptr_of(&text),
            recipe_file: ptr_of(&file),
            recipe_name: ptr_of(&name),
            overrides: overrides.pointer(),
            overrides_count: overrides.count(),
            device: ptr_of(&device),
            nodes: q.nodes,
            devices_per_node: q.devices_per_node,
            top: q.top,
        };
        take_string(|out| unsafe { sys::tide_engine_plan(self.handle, &o, out) })
    }

    /// Queues a run.
    pub fn submit(&self, s: &Submit) -> Result<Run<'_>> {
        let text = opt_cstring(&s.recipe_text, "recipe_text")?;
        let file = opt_cstring(&s.recipe_file, "recipe_file")?;
        let name = opt_cstring(&s.recipe_name, "recipe_name")?;
        let key = opt_cstring(&s.idempotency_key, "idempotency_key")?;
        let workdir = opt_cstring(&s.workdir, "workdir")?;
        let overrides = Overrides::new(&s.overrides)?;
        let o = sys::tide_submit_options {
            version: sys::TIDE_SUBMIT_OPTIONS_VERSION,
            recipe_text: ptr_of(&text),
            recipe_file: ptr_of(&file),
            recipe_name: ptr_of(&name),
            overrides: overrides.pointer(),
            overrides_count: overrides.count(),
            workers: s.workers,
            priority: s.priority,
            idempotency_key: ptr_of(&key),
            workdir: ptr_of(&workdir),
        };
        let id = take_string(|out| unsafe { sys::tide_run_submit(self.handle, &o, out) })?;
        Ok(Run { engine: self, id })
    }

    /// The run with this id (checked when used).
    pub fn run(&self, id: &str) -> Run<'_> {
        Run {
            engine: self,
            id: id.to_string(),
        }
    }

    /// Every run, oldest first, as a JSON array.
    pub fn runs(&self) -> Result<String> {
        take_string(|out| unsafe { sys::tide_run_list(self.handle, out) })
    }

    /// Events of one run (None: all) of one kind (None: all), polled.
    pub fn subscribe(&self, run: Option<&str>, kind: Option<&str>) -> Result<Subscription> {
        let r = run.map(|v| cstring(v, "run")).transpose()?;
        let k = kind.map(|v| cstring(v, "kind")).transpose()?;
        let mut handle = ptr::null_mut();
        check(unsafe { sys::tide_subscribe(self.handle, ptr_of(&r), ptr_of(&k), &mut handle) })?;
        Ok(Subscription { handle })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        unsafe { sys::tide_engine_close(self.handle) };
    }
}

/// A run's state and latest figures; `None`: not known yet.
#[derive(Debug, Clone)]
pub struct Status {
    pub id: String,
    pub name: String,
    pub state: Option<State>,
    pub workers: i32,
    pub last_step: i64,
    pub total_steps: i64,
    pub attempt: i64,
    pub restarts: i64,
    pub loss: Option<f64>,
    pub lr: Option<f64>,
    pub tokens_per_second: Option<f64>,
    pub final_loss: Option<f64>,
    pub run_dir: String,
    pub error: String,
}

/// One run of an engine.
pub struct Run<'a> {
    engine: &'a Engine,
    id: String,
}

impl fmt::Debug for Run<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run").field("id", &self.id).finish()
    }
}

impl<'a> Run<'a> {
    pub fn id(&self) -> &str {
        &self.id
    }

    fn c_id(&self) -> Result<CString> {
        cstring(&self.id, "run id")
    }

    pub fn status(&self) -> Result<Status> {
        let id = self.c_id()?;
        let mut s: sys::tide_run_status = unsafe { std::mem::zeroed() };
        s.version = sys::TIDE_RUN_STATUS_VERSION;
        check(unsafe { sys::tide_run_status_get(self.engine.handle, id.as_ptr(), &mut s) })?;
        Ok(Status {
            id: text_of(&s.id),
            name: text_of(&s.name),
            state: State::from_code(s.state),
            workers: s.workers,
            last_step: s.last_step,
            total_steps: s.total_steps,
            attempt: s.attempt,
            restarts: s.restarts,
            loss: finite(s.loss),
            lr: finite(s.lr),
            tokens_per_second: finite(s.tokens_per_second),
            final_loss: finite(s.final_loss),
            run_dir: text_of(&s.run_dir),
            error: text_of(&s.error),
        })
    }

    /// Blocks until the run is in one of `states` or `timeout` passes (None: no limit).
    pub fn wait(&self, states: &[State], timeout: Option<Duration>) -> Result<State> {
        let id = self.c_id()?;
        let mask = states.iter().fold(0u32, |m, s| m | (1u32 << s.code()));
        let mut got = 0i32;
        let start = Instant::now();
        check(unsafe { sys::tide_run_wait(self.engine.handle, id.as_ptr(), mask, millis(timeout), &mut got) })?;
        State::from_code(got).ok_or_else(|| Error {
            code: sys::TIDE_ERR_INTERNAL,
            message: format!("unknown state {got} after {:?}", start.elapsed()),
        })
    }

    fn control(&self, f: unsafe extern "C" fn(*mut sys::tide_engine, *const c_char) -> i32) -> Result<()> {
        let id = self.c_id()?;
        check(unsafe { f(self.engine.handle, id.as_ptr()) })
    }

    pub fn pause(&self) -> Result<()> {
        self.control(sys::tide_run_pause)
    }
    /// Continues a paused run, or a stopped or failed one from its latest checkpoint.
    pub fn resume(&self) -> Result<()> {
        self.control(sys::tide_run_resume)
    }
    /// Checkpoints, then ends the run.
    pub fn stop(&self) -> Result<()> {
        self.control(sys::tide_run_stop)
    }
    /// Ends the workers now, without a checkpoint.
    pub fn cancel(&self) -> Result<()> {
        self.control(sys::tide_run_cancel)
    }
    pub fn checkpoint(&self) -> Result<()> {
        self.control(sys::tide_run_checkpoint)
    }

    /// Changes a live recipe field; `value` is JSON text ("5e-4", "true") or a string.
    pub fn set(&self, field: &str, value: &str) -> Result<()> {
        let id = self.c_id()?;
        let f = cstring(field, "field")?;
        let v = cstring(value, "value")?;
        check(unsafe { sys::tide_run_set(self.engine.handle, id.as_ptr(), f.as_ptr(), v.as_ptr()) })
    }

    /// The metrics rows after `since_step`, as a JSON array.
    pub fn metrics(&self, since_step: i64) -> Result<String> {
        let id = self.c_id()?;
        take_string(|out| unsafe { sys::tide_run_metrics(self.engine.handle, id.as_ptr(), since_step, out) })
    }

    /// The committed checkpoints, oldest first, as a JSON array (step, dir, tokens_seen,
    /// layout, files, bytes).
    pub fn checkpoints(&self) -> Result<String> {
        let id = self.c_id()?;
        take_string(|out| unsafe { sys::tide_run_checkpoints(self.engine.handle, id.as_ptr(), out) })
    }

    /// Writes a checkpoint, whatever layout saved it, as Hugging Face safetensors +
    /// config.json into `out_dir` on the engine's machine (relative: inside the run
    /// directory); the export's description as JSON. A failed export is `Error::IO`, one
    /// still going after the timeout `Error::TIMEOUT` (it goes on in the engine).
    pub fn export(&self, out_dir: &str, options: &ExportOptions) -> Result<String> {
        let id = self.c_id()?;
        let out_dir = cstring(out_dir, "out_dir")?;
        let dtype = opt_cstring(&options.dtype, "dtype")?;
        let mut o: sys::tide_export_options = unsafe { std::mem::zeroed() };
        unsafe { sys::tide_export_options_init(&mut o) };
        o.step = options.step.unwrap_or(-1);
        o.dtype = ptr_of(&dtype);
        o.timeout_ms = millis(options.timeout);
        o.adapter = i32::from(options.adapter);
        take_string(|out| unsafe {
            sys::tide_checkpoint_export(self.engine.handle, id.as_ptr(), out_dir.as_ptr(), &o, out)
        })
    }
}

/// One engine event (docs/protocol.md, Events).
#[derive(Debug, Clone)]
pub struct Event {
    pub run: String,
    pub kind: String,
    pub seq: i64,
    pub time: f64,
    pub step: Option<i64>,
    pub loss: Option<f64>,
    pub state: Option<State>,
    pub snapshot: bool,
    pub body_json: String,
}

/// A subscription to engine events; closed on drop.
pub struct Subscription {
    handle: *mut sys::tide_subscription,
}

// One thread at a time may use a subscription; moving it between threads is allowed.
unsafe impl Send for Subscription {}

impl Subscription {
    /// The next event, or None when none came within `timeout` (None: wait).
    pub fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Event>> {
        let mut e: sys::tide_event = unsafe { std::mem::zeroed() };
        let rc = unsafe { sys::tide_subscription_poll(self.handle, millis(timeout), &mut e) };
        if rc == sys::TIDE_ERR_TIMEOUT {
            return Ok(None);
        }
        check(rc)?;
        let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        Ok(Some(Event {
            run: text(e.run),
            kind: text(e.kind),
            seq: e.seq,
            time: e.time,
            step: if e.step < 0 { None } else { Some(e.step) },
            loss: finite(e.loss),
            state: State::from_code(e.state),
            snapshot: e.snapshot != 0,
            body_json: text(e.body_json),
        }))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        unsafe { sys::tide_subscription_close(self.handle) };
    }
}
