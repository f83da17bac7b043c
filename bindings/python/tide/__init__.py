"""tide for Python: the C API (libtide.so) through ctypes, standard library only.

    import tide
    with tide.Engine.embedded(state_dir="/tmp/tide-state") as engine:   # or tide.Engine.connect()
        run = engine.submit(recipe_name="llama/llama-tiny")
        for event in run.events(kind="metrics", timeout=60):
            print(event.step, event.loss)
            if event.step >= 20:
                break
        run.set("optimizer.lr", 5e-4)
        run.stop()
        print(run.wait(timeout=120))

Events are polled (no library thread calls into Python), so they fit notebooks and
asyncio alike. The library is found through $TIDE_LIBRARY, then beside this package in a
source tree (build/capi), then the system's libtide.so.0. docs/capi.md has the rules.
"""
import ctypes
import ctypes.util
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

__all__ = ["Engine", "Run", "RunStatus", "Event", "Subscription", "TideError", "STATES", "FINISHED"]

STATES = ["", "queued", "starting", "running", "paused", "stopping", "restarting", "completed", "stopped",
          "failed", "cancelled"]
FINISHED = ("completed", "stopped", "failed", "cancelled")
_TIMEOUT = -22


class TideError(Exception):
    """A failed call: `code` is the TIDE_ERR_* value, `name` its short name."""

    NAMES = {-1: "bad_request", -2: "unsupported_version", -3: "unknown_type", -4: "not_found",
             -5: "invalid_state", -6: "invalid_recipe", -7: "invalid_value", -8: "too_large",
             -9: "unauthorized", -10: "unavailable", -11: "internal", -20: "invalid_argument",
             -21: "invalid_handle", -22: "timeout", -23: "transport", -24: "io", -25: "reentrant",
             -26: "struct_version"}

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.name = self.NAMES.get(code, "unknown")


def _find_library() -> str:
    if os.environ.get("TIDE_LIBRARY"):
        return os.environ["TIDE_LIBRARY"]
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.join(here, "..", "..", "..", "build", "capi", "libtide.so.0")
    if os.path.exists(candidate):
        return candidate
    found = ctypes.util.find_library("tide")
    if not found:
        raise OSError("libtide.so not found: set TIDE_LIBRARY or build tide (make -C build tide_capi)")
    return found


class _ConnectOptions(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("timeout_ms", ctypes.c_int32), ("server_public_key", ctypes.c_char_p),
                ("client_public_key", ctypes.c_char_p), ("client_secret_key", ctypes.c_char_p)]


class _EmbeddedOptions(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("state_dir", ctypes.c_char_p), ("worker_executable", ctypes.c_char_p),
                ("cpu_slots", ctypes.c_int32), ("cores", ctypes.c_int32), ("gpus", ctypes.c_char_p),
                ("log_level", ctypes.c_char_p)]


class _SubmitOptions(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("recipe_text", ctypes.c_char_p), ("recipe_file", ctypes.c_char_p),
                ("recipe_name", ctypes.c_char_p), ("overrides", ctypes.POINTER(ctypes.c_char_p)),
                ("overrides_count", ctypes.c_size_t), ("workers", ctypes.c_int32), ("priority", ctypes.c_int32),
                ("idempotency_key", ctypes.c_char_p), ("workdir", ctypes.c_char_p)]


class _PlanOptions(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("recipe_text", ctypes.c_char_p), ("recipe_file", ctypes.c_char_p),
                ("recipe_name", ctypes.c_char_p), ("overrides", ctypes.POINTER(ctypes.c_char_p)),
                ("overrides_count", ctypes.c_size_t), ("device", ctypes.c_char_p), ("nodes", ctypes.c_int32),
                ("devices_per_node", ctypes.c_int32), ("top", ctypes.c_int32)]


class _RunStatus(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("id", ctypes.c_char * 128), ("name", ctypes.c_char * 64),
                ("state", ctypes.c_int32), ("workers", ctypes.c_int32), ("last_step", ctypes.c_int64),
                ("total_steps", ctypes.c_int64), ("attempt", ctypes.c_int64), ("restarts", ctypes.c_int64),
                ("loss", ctypes.c_double), ("lr", ctypes.c_double), ("tokens_per_second", ctypes.c_double),
                ("final_loss", ctypes.c_double), ("run_dir", ctypes.c_char * 1024), ("error", ctypes.c_char * 1024)]


class _ExportOptions(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("step", ctypes.c_int64), ("dtype", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_int32), ("adapter", ctypes.c_int32)]


class _Event(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("run", ctypes.c_char_p), ("kind", ctypes.c_char_p),
                ("seq", ctypes.c_int64), ("time", ctypes.c_double), ("step", ctypes.c_int64),
                ("loss", ctypes.c_double), ("state", ctypes.c_int32), ("snapshot", ctypes.c_int32),
                ("body_json", ctypes.c_char_p)]


_lib = ctypes.CDLL(_find_library())
_p = ctypes.c_void_p
_s = ctypes.c_char_p
_out_str = ctypes.POINTER(ctypes.c_void_p)  # char **, freed with tide_string_free
for name, args in {
    "tide_engine_connect": [ctypes.POINTER(_p), _s, ctypes.POINTER(_ConnectOptions)],
    "tide_engine_open_embedded": [ctypes.POINTER(_p), ctypes.POINTER(_EmbeddedOptions)],
    "tide_engine_info": [_p, _out_str],
    "tide_engine_request": [_p, _s, _s, _out_str],
    "tide_run_submit": [_p, ctypes.POINTER(_SubmitOptions), _out_str],
    "tide_engine_plan": [_p, ctypes.POINTER(_PlanOptions), _out_str],
    "tide_run_status_get": [_p, _s, ctypes.POINTER(_RunStatus)],
    "tide_run_list": [_p, _out_str],
    "tide_run_wait": [_p, _s, ctypes.c_uint32, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)],
    "tide_run_pause": [_p, _s], "tide_run_resume": [_p, _s], "tide_run_stop": [_p, _s],
    "tide_run_cancel": [_p, _s], "tide_run_checkpoint": [_p, _s],
    "tide_run_set": [_p, _s, _s, _s],
    "tide_run_metrics": [_p, _s, ctypes.c_int64, _out_str],
    "tide_run_checkpoints": [_p, _s, _out_str],
    "tide_checkpoint_export": [_p, _s, _s, ctypes.POINTER(_ExportOptions), _out_str],
    "tide_subscribe": [_p, _s, _s, ctypes.POINTER(_p)],
    "tide_subscription_poll": [_p, ctypes.c_int32, ctypes.POINTER(_Event)],
    "tide_subscription_close": [_p],
}.items():
    fn = getattr(_lib, name)
    fn.argtypes = args
    fn.restype = ctypes.c_int
_lib.tide_engine_close.argtypes = [_p]
_lib.tide_engine_close.restype = None
_lib.tide_string_free.argtypes = [ctypes.c_void_p]
_lib.tide_string_free.restype = None
_lib.tide_error_last.restype = ctypes.c_char_p
_lib.tide_version.restype = ctypes.c_char_p

__version__ = _lib.tide_version().decode()


def _check(rc: int) -> None:
    if rc != 0:
        raise TideError(rc, _lib.tide_error_last().decode(errors="replace"))


def _b(text: Optional[str]) -> Optional[bytes]:
    return None if text is None else os.fsencode(text) if isinstance(text, os.PathLike) else text.encode()


def _take_string(call) -> str:
    out = ctypes.c_void_p()
    _check(call(ctypes.byref(out)))
    try:
        return ctypes.string_at(out.value).decode()
    finally:
        _lib.tide_string_free(out)


def _nan_to_none(x: float) -> Optional[float]:
    return None if math.isnan(x) else x


@dataclass
class RunStatus:
    id: str
    name: str
    state: str
    workers: int
    last_step: int
    total_steps: int
    attempt: int
    restarts: int
    loss: Optional[float]
    lr: Optional[float]
    tokens_per_second: Optional[float]
    final_loss: Optional[float]
    run_dir: str
    error: str


@dataclass
class Event:
    run: str
    kind: str
    seq: int
    time: float
    step: Optional[int]
    loss: Optional[float]
    state: Optional[str]
    snapshot: bool
    body: Dict[str, Any]


class Subscription:
    """Events of one run or all, one kind or all; iterate, or poll(timeout)."""

    def __init__(self, handle: ctypes.c_void_p, timeout: Optional[float]):
        self._handle = handle
        self._timeout = timeout

    def poll(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, or None when none came within `timeout` seconds (None: wait)."""
        if self._handle is None:
            raise TideError(-21, "the subscription is closed")
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        e = _Event()
        rc = _lib.tide_subscription_poll(self._handle, ms, ctypes.byref(e))
        if rc == _TIMEOUT:
            return None
        _check(rc)
        return Event(run=e.run.decode(), kind=e.kind.decode(), seq=e.seq, time=e.time,
                      step=None if e.step < 0 else e.step, loss=_nan_to_none(e.loss),
                      state=STATES[e.state] if 0 < e.state < len(STATES) else None, snapshot=bool(e.snapshot),
                      body=json.loads(e.body_json.decode()))

    def __iter__(self) -> Iterator[Event]:
        """Events until `timeout` seconds pass without one (None: forever)."""
        while True:
            event = self.poll(self._timeout)
            if event is None:
                return
            yield event

    def close(self) -> None:
        if self._handle is not None:
            _check(_lib.tide_subscription_close(self._handle))
            self._handle = None

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            _lib.tide_subscription_close(self._handle)


class Run:
    """One run of an engine, by id."""

    def __init__(self, engine: "Engine", run_id: str):
        self.engine = engine
        self.id = run_id

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    def status(self) -> RunStatus:
        s = _RunStatus()
        s.version = 1
        _check(_lib.tide_run_status_get(self.engine._h(), self.id.encode(), ctypes.byref(s)))
        return RunStatus(id=s.id.decode(), name=s.name.decode(), state=STATES[s.state], workers=s.workers,
                         last_step=s.last_step, total_steps=s.total_steps, attempt=s.attempt, restarts=s.restarts,
                         loss=_nan_to_none(s.loss), lr=_nan_to_none(s.lr),
                         tokens_per_second=_nan_to_none(s.tokens_per_second),
                         final_loss=_nan_to_none(s.final_loss), run_dir=s.run_dir.decode(), error=s.error.decode())

    def wait(self, states: Sequence[str] = FINISHED, timeout: Optional[float] = None) -> str:
        """Blocks until the run is in one of `states`; returns it. TideError 'timeout' after `timeout` s."""
        mask = 0
        for st in states:
            mask |= 1 << STATES.index(st)
        got = ctypes.c_int32()
        ms = -1 if timeout is None else int(timeout * 1000)
        _check(_lib.tide_run_wait(self.engine._h(), self.id.encode(), mask, ms, ctypes.byref(got)))
        return STATES[got.value]

    def pause(self) -> None:
        _check(_lib.tide_run_pause(self.engine._h(), self.id.encode()))

    def resume(self) -> None:
        _check(_lib.tide_run_resume(self.engine._h(), self.id.encode()))

    def stop(self) -> None:
        """Checkpoint, then end (state 'stopped'; resume() continues it)."""
        _check(_lib.tide_run_stop(self.engine._h(), self.id.encode()))

    def cancel(self) -> None:
        _check(_lib.tide_run_cancel(self.engine._h(), self.id.encode()))

    def checkpoint(self) -> None:
        _check(_lib.tide_run_checkpoint(self.engine._h(), self.id.encode()))

    def set(self, field: str, value: Any) -> None:
        """Changes a live recipe field: run.set("optimizer.lr", 5e-4)."""
        _check(_lib.tide_run_set(self.engine._h(), self.id.encode(), field.encode(), json.dumps(value).encode()))

    def metrics(self, since_step: int = 0) -> List[Dict[str, Any]]:
        return json.loads(_take_string(lambda out: _lib.tide_run_metrics(self.engine._h(), self.id.encode(),
                                                                          since_step, out)))

    def events(self, kind: Optional[str] = None, timeout: Optional[float] = None) -> Subscription:
        return self.engine.subscribe(self.id, kind, timeout)

    def checkpoints(self) -> List[Dict[str, Any]]:
        """Committed checkpoints, oldest first: step, dir, tokens_seen, layout, files, bytes."""
        return json.loads(_take_string(lambda out: _lib.tide_run_checkpoints(self.engine._h(), self.id.encode(), out)))

    def export(self, out_dir: str, step: Optional[int] = None, dtype: str = "F32",
               timeout: Optional[float] = None, adapter: bool = False) -> Dict[str, Any]:
        """Writes a checkpoint (default: the newest) as Hugging Face safetensors + config.json
        into out_dir on the engine's machine (relative: inside the run directory) and returns
        the export's description; adapter=True writes a LoRA run's adapters alone, as PEFT's
        adapter directory. timeout=0 returns once it started ("state": "running");
        a failed export raises TideError 'io', one still going after `timeout` s 'timeout'."""
        o = _ExportOptions(version=2, step=-1 if step is None else step, dtype=dtype.encode(),
                           timeout_ms=-1 if timeout is None else max(0, int(timeout * 1000)), adapter=int(adapter))
        out = ctypes.c_void_p()
        rc = _lib.tide_checkpoint_export(self.engine._h(), self.id.encode(), _b(out_dir), ctypes.byref(o),
                                         ctypes.byref(out))
        message = _lib.tide_error_last().decode(errors="replace")
        description = None
        if out.value:
            description = json.loads(ctypes.string_at(out.value).decode())
            _lib.tide_string_free(out)
        if rc != 0:
            raise TideError(rc, message)
        return description


class Engine:
    """A tide engine: a tided over ZeroMQ (connect) or one inside this process (embedded)."""

    def __init__(self, handle: ctypes.c_void_p):
        self._handle = handle

    @classmethod
    def connect(cls, endpoint: Optional[str] = None, timeout: float = 10.0, server_public_key: Optional[str] = None,
                client_public_key: Optional[str] = None, client_secret_key: Optional[str] = None) -> "Engine":
        o = _ConnectOptions(1, int(timeout * 1000), _b(server_public_key), _b(client_public_key),
                            _b(client_secret_key))
        h = ctypes.c_void_p()
        _check(_lib.tide_engine_connect(ctypes.byref(h), _b(endpoint), ctypes.byref(o)))
        return cls(h)

    @classmethod
    def embedded(cls, state_dir: Optional[str] = None, worker: Optional[str] = None, cpu_slots: int = 0,
                 cores: int = 0, gpus: Optional[str] = None, log_level: Optional[str] = None) -> "Engine":
        o = _EmbeddedOptions(1, _b(state_dir), _b(worker), cpu_slots, cores, _b(gpus), _b(log_level))
        h = ctypes.c_void_p()
        _check(_lib.tide_engine_open_embedded(ctypes.byref(h), ctypes.byref(o)))
        return cls(h)

    def _h(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise TideError(-21, "the engine is closed")
        return self._handle

    def close(self) -> None:
        """Ends an embedded engine's workers and threads; disconnects from a daemon."""
        if self._handle is not None:
            _lib.tide_engine_close(self._handle)
            self._handle = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def info(self) -> Dict[str, Any]:
        return json.loads(_take_string(lambda out: _lib.tide_engine_info(self._h(), out)))

    def request(self, type_: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Any protocol request (docs/protocol.md); the reply's body."""
        text = json.dumps(body or {}).encode()
        return json.loads(_take_string(lambda out: _lib.tide_engine_request(self._h(), type_.encode(), text, out)))

    def submit(self, recipe: Optional[str] = None, recipe_file: Optional[str] = None,
               recipe_name: Optional[str] = None, overrides: Sequence[str] = (), workers: int = 0,
               priority: int = 0, idempotency_key: Optional[str] = None, workdir: Optional[str] = None) -> Run:
        """Queues a run from recipe text, a file or a bundled name; overrides as ["optimizer.lr=1e-4"]."""
        arr = (ctypes.c_char_p * max(1, len(overrides)))(*[o.encode() for o in overrides])
        o = _SubmitOptions(1, _b(recipe), _b(recipe_file), _b(recipe_name), arr, len(overrides), workers, priority,
                           _b(idempotency_key), _b(workdir))
        return Run(self, _take_string(lambda out: _lib.tide_run_submit(self._h(), ctypes.byref(o), out)))

    def plan(self, recipe: Optional[str] = None, recipe_file: Optional[str] = None,
             recipe_name: Optional[str] = None, overrides: Sequence[str] = (), device: Optional[str] = None,
             nodes: int = 0, devices_per_node: int = 0, top: int = 0) -> Dict[str, Any]:
        """The recipe's layouts ranked on a cluster of `nodes` x `devices_per_node` `device`s
        (docs/planner.md; None: the engine's CPU): the plan, schema tide.plan/1."""
        arr = (ctypes.c_char_p * max(1, len(overrides)))(*[o.encode() for o in overrides])
        o = _PlanOptions(1, _b(recipe), _b(recipe_file), _b(recipe_name), arr, len(overrides), _b(device), nodes,
                         devices_per_node, top)
        return json.loads(_take_string(lambda out: _lib.tide_engine_plan(self._h(), ctypes.byref(o), out)))

    def runs(self) -> List[Dict[str, Any]]:
        return json.loads(_take_string(lambda out: _lib.tide_run_list(self._h(), out)))

    def run(self, run_id: str) -> Run:
        return Run(self, run_id)

    def subscribe(self, run_id: Optional[str] = None, kind: Optional[str] = None,
                  timeout: Optional[float] = None) -> Subscription:
        h = ctypes.c_void_p()
        _check(_lib.tide_subscribe(self._h(), _b(run_id), _b(kind), ctypes.byref(h)))
        return Subscription(h, timeout)
