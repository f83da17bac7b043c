// Package tide drives tide training engines from Go through the C API (libtide.so):
// a tided over ZeroMQ (Connect) or an engine inside this process (OpenEmbedded).
//
//	engine, err := tide.OpenEmbedded(tide.EmbeddedOptions{StateDir: "/tmp/tide-state"})
//	run, err := engine.Submit(tide.Submit{RecipeName: "llama/llama-tiny"})
//	events, err := engine.Subscribe(ctx, run.ID, "metrics")
//	for e := range events.C { fmt.Println(e.Step, *e.Loss) }
//
// Errors are *Error values carrying the C status code. An Engine may be used from many
// goroutines; docs/capi.md states the rules of the C API underneath. By default cgo
// links the source tree's build/capi/libtide.so (with an rpath); set CGO_LDFLAGS for an
// installed library.
package tide

/*
#cgo CFLAGS: -I${SRCDIR}/../../capi/include
#cgo LDFLAGS: -L${SRCDIR}/../../build/capi -ltide -Wl,-rpath,${SRCDIR}/../../build/capi
#include <stdlib.h>
#include "tide/tide.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"
	"unsafe"
)

// Error is a failed call: Code is the TIDE_ERR_* value.
type Error struct {
	Code    int
	Message string
}

func (e *Error) Error() string { return e.Message }

// Status codes a caller may want to tell apart (the C header lists them all).
const (
	ErrBadRequest      = int(C.TIDE_ERR_BAD_REQUEST)
	ErrNotFound        = int(C.TIDE_ERR_NOT_FOUND)
	ErrInvalidState    = int(C.TIDE_ERR_INVALID_STATE)
	ErrInvalidRecipe   = int(C.TIDE_ERR_INVALID_RECIPE)
	ErrInvalidValue    = int(C.TIDE_ERR_INVALID_VALUE)
	ErrInvalidArgument = int(C.TIDE_ERR_INVALID_ARGUMENT)
	ErrInvalidHandle   = int(C.TIDE_ERR_INVALID_HANDLE)
	ErrTimeout         = int(C.TIDE_ERR_TIMEOUT)
	ErrIO              = int(C.TIDE_ERR_IO)
)

// IsCode reports whether err is a tide *Error with this code.
func IsCode(err error, code int) bool {
	e, ok := err.(*Error)
	return ok && e.Code == code
}

func check(rc C.int) error {
	if rc == C.TIDE_OK {
		return nil
	}
	return &Error{Code: int(rc), Message: C.GoString(C.tide_error_last())}
}

// cstr converts s for C; "" becomes NULL (the C API's "not given").
func cstr(s string) *C.char {
	if s == "" {
		return nil
	}
	return C.CString(s)
}

func free(p *C.char) {
	if p != nil {
		C.free(unsafe.Pointer(p))
	}
}

func takeString(call func(out **C.char) C.int) (string, error) {
	var out *C.char
	if err := check(call(&out)); err != nil {
		return "", err
	}
	defer C.tide_string_free(out)
	return C.GoString(out), nil
}

// takeJSON decodes a JSON out-string into out.
func takeJSON(call func(out **C.char) C.int, out any) error {
	text, err := takeString(call)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(text), out)
}

func nanToNil(x C.double) *float64 {
	if math.IsNaN(float64(x)) {
		return nil
	}
	v := float64(x)
	return &v
}

// Version is the loaded library's version ("0.1.0").
func Version() string { return C.GoString(C.tide_version()) }

// State is a run's state.
type State int

const (
	Queued     State = State(C.TIDE_RUN_QUEUED)
	Starting   State = State(C.TIDE_RUN_STARTING)
	Running    State = State(C.TIDE_RUN_RUNNING)
	Paused     State = State(C.TIDE_RUN_PAUSED)
	Stopping   State = State(C.TIDE_RUN_STOPPING)
	Restarting State = State(C.TIDE_RUN_RESTARTING)
	Completed  State = State(C.TIDE_RUN_COMPLETED)
	Stopped    State = State(C.TIDE_RUN_STOPPED)
	Failed     State = State(C.TIDE_RUN_FAILED)
	Cancelled  State = State(C.TIDE_RUN_CANCELLED)
)

// Finished are the states a run ends in.
var Finished = []State{Completed, Stopped, Failed, Cancelled}

func (s State) String() string { return C.GoString(C.tide_run_state_name(C.int(s))) }

// Engine is a handle to a tide engine; safe for concurrent use.
type Engine struct {
	h *C.tide_engine
}

// ConnectOptions reach a tided; the zero value means loopback defaults, no CURVE.
type ConnectOptions struct {
	TimeoutMs       int32
	ServerPublicKey string // CURVE: all three keys (Z85), or none
	ClientPublicKey string
	ClientSecretKey string
}

// Connect reaches a tided at endpoint ("" for the local daemon's ipc socket).
func Connect(endpoint string, opts ConnectOptions) (*Engine, error) {
	var o C.tide_connect_options
	C.tide_connect_options_init(&o)
	o.timeout_ms = C.int32_t(opts.TimeoutMs)
	o.server_public_key = cstr(opts.ServerPublicKey)
	o.client_public_key = cstr(opts.ClientPublicKey)
	o.client_secret_key = cstr(opts.ClientSecretKey)
	defer free(o.server_public_key)
	defer free(o.client_public_key)
	defer free(o.client_secret_key)
	ep := cstr(endpoint)
	defer free(ep)
	var h *C.tide_engine
	if err := check(C.tide_engine_connect(&h, ep, &o)); err != nil {
		return nil, err
	}
	return &Engine{h: h}, nil
}

// EmbeddedOptions configure an engine inside this process; zero values are defaults.
type EmbeddedOptions struct {
	StateDir         string
	WorkerExecutable string // the tide binary; "": $TIDE_WORKER or beside libtide
	CPUSlots         int32
	Cores            int32
	GPUs             string // "auto" (""), "none", "0,1"
	LogLevel         string // "warn" ("")
}

// OpenEmbedded starts an engine in this process (controller thread, worker processes).
func OpenEmbedded(opts EmbeddedOptions) (*Engine, error) {
	var o C.tide_embedded_options
	C.tide_embedded_options_init(&o)
	o.state_dir = cstr(opts.StateDir)
	o.worker_executable = cstr(opts.WorkerExecutable)
	o.cpu_slots = C.int32_t(opts.CPUSlots)
	o.cores = C.int32_t(opts.Cores)
	o.gpus = cstr(opts.GPUs)
	o.log_level = cstr(opts.LogLevel)
	defer free(o.state_dir)
	defer free(o.worker_executable)
	defer free(o.gpus)
	defer free(o.log_level)
	var h *C.tide_engine
	if err := check(C.tide_engine_open_embedded(&h, &o)); err != nil {
		return nil, err
	}
	return &Engine{h: h}, nil
}

// Close disconnects, or ends an embedded engine's workers and threads. Later calls on
// the engine return an *Error with ErrInvalidHandle.
func (e *Engine) Close() { C.tide_engine_close(e.h) }

// Info describes the engine (docs/protocol.md, info).
func (e *Engine) Info() (map[string]any, error) {
	var info map[string]any
	err := takeJSON(func(out **C.char) C.int { return C.tide_engine_info(e.h, out) }, &info)
	return info, err
}

// Submit describes a run: one of RecipeText, RecipeFile and RecipeName.
type Submit struct {
	RecipeText, RecipeFile, RecipeName string
	Overrides                          []string // "field=value"
	Workers, Priority                  int32
	IdempotencyKey, Workdir            string
}

// cStrings copies list into a C array of C strings; release frees them.
func cStrings(list []string) (**C.char, C.size_t, func()) {
	if len(list) == 0 {
		return nil, 0, func() {}
	}
	arr := C.malloc(C.size_t(len(list)) * C.size_t(unsafe.Sizeof(uintptr(0))))
	items := (*[1 << 20]*C.char)(arr)[:len(list):len(list)]
	for i, s := range list {
		items[i] = C.CString(s)
	}
	return (**C.char)(arr), C.size_t(len(list)), func() {
		for _, item := range items {
			free(item)
		}
		C.free(arr)
	}
}

// PlanQuestion asks for a recipe's layouts ranked on a cluster: one of RecipeText,
// RecipeFile and RecipeName; Nodes x DevicesPerNode Devices ("h100-80", "a100-80", ...;
// "" or "cpu": the engine's machine); Top ranked layouts (0: 10).
type PlanQuestion struct {
	RecipeText, RecipeFile, RecipeName string
	Overrides                          []string // "field=value"
	Device                             string
	Nodes, DevicesPerNode, Top         int32
}

// Plan ranks the recipe's layouts by predicted speed, with memory per rank itemised
// (docs/planner.md): the plan as decoded JSON, schema tide.plan/1.
func (e *Engine) Plan(q PlanQuestion) (map[string]any, error) {
	var o C.tide_plan_options
	C.tide_plan_options_init(&o)
	o.recipe_text = cstr(q.RecipeText)
	o.recipe_file = cstr(q.RecipeFile)
	o.recipe_name = cstr(q.RecipeName)
	o.device = cstr(q.Device)
	defer free(o.recipe_text)
	defer free(o.recipe_file)
	defer free(o.recipe_name)
	defer free(o.device)
	var release func()
	o.overrides, o.overrides_count, release = cStrings(q.Overrides)
	defer release()
	o.nodes = C.int32_t(q.Nodes)
	o.devices_per_node = C.int32_t(q.DevicesPerNode)
	o.top = C.int32_t(q.Top)
	var plan map[string]any
	err := takeJSON(func(out **C.char) C.int { return C.tide_engine_plan(e.h, &o, out) }, &plan)
	return plan, err
}

// Run is one run of an engine.
type Run struct {
	engine *Engine
	ID     string
}

// Submit queues a run.
func (e *Engine) Submit(s Submit) (*Run, error) {
	var o C.tide_submit_options
	C.tide_submit_options_init(&o)
	o.recipe_text = cstr(s.RecipeText)
	o.recipe_file = cstr(s.RecipeFile)
	o.recipe_name = cstr(s.RecipeName)
	o.idempotency_key = cstr(s.IdempotencyKey)
	o.workdir = cstr(s.Workdir)
	defer free(o.recipe_text)
	defer free(o.recipe_file)
	defer free(o.recipe_name)
	defer free(o.idempotency_key)
	defer free(o.workdir)
	var release func()
	o.overrides, o.overrides_count, release = cStrings(s.Overrides)
	defer release()
	o.workers = C.int32_t(s.Workers)
	o.priority = C.int32_t(s.Priority)
	id, err := takeString(func(out **C.char) C.int { return C.tide_run_submit(e.h, &o, out) })
	if err != nil {
		return nil, err
	}
	return &Run{engine: e, ID: id}, nil
}

// Run is the run with this id (not checked until used).
func (e *Engine) Run(id string) *Run { return &Run{engine: e, ID: id} }

// Runs lists every run, oldest first.
func (e *Engine) Runs() ([]map[string]any, error) {
	var runs []map[string]any
	err := takeJSON(func(out **C.char) C.int { return C.tide_run_list(e.h, out) }, &runs)
	return runs, err
}

// Status is a run's state and latest figures; nil pointers are not known yet.
type Status struct {
	ID, Name          string
	State             State
	Workers           int
	LastStep          int64
	TotalSteps        int64
	Attempt, Restarts int64
	Loss, LR          *float64
	TokensPerSecond   *float64
	FinalLoss         *float64
	RunDir, Error     string
}

func (r *Run) call(f func(id *C.char) C.int) error {
	id := C.CString(r.ID)
	defer C.free(unsafe.Pointer(id))
	return check(f(id))
}

// Status asks the engine for the run's status.
func (r *Run) Status() (Status, error) {
	var s C.tide_run_status
	s.version = C.TIDE_RUN_STATUS_VERSION
	if err := r.call(func(id *C.char) C.int { return C.tide_run_status_get(r.engine.h, id, &s) }); err != nil {
		return Status{}, err
	}
	return Status{
		ID: C.GoString(&s.id[0]), Name: C.GoString(&s.name[0]), State: State(s.state), Workers: int(s.workers),
		LastStep: int64(s.last_step), TotalSteps: int64(s.total_steps), Attempt: int64(s.attempt),
		Restarts: int64(s.restarts), Loss: nanToNil(s.loss), LR: nanToNil(s.lr),
		TokensPerSecond: nanToNil(s.tokens_per_second), FinalLoss: nanToNil(s.final_loss),
		RunDir: C.GoString(&s.run_dir[0]), Error: C.GoString(&s.error[0]),
	}, nil
}

// Wait blocks until the run is in one of states (default: Finished) or ctx ends.
func (r *Run) Wait(ctx context.Context, states ...State) (State, error) {
	if len(states) == 0 {
		states = Finished
	}
	var mask C.uint32_t
	for _, s := range states {
		mask |= 1 << uint(s)
	}
	for {
		var got C.int32_t
		err := r.call(func(id *C.char) C.int { return C.tide_run_wait(r.engine.h, id, mask, 200, &got) })
		if err == nil {
			return State(got), nil
		}
		if !IsCode(err, ErrTimeout) {
			return 0, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
}

// Pause holds the run at its next step boundary.
func (r *Run) Pause() error {
	return r.call(func(id *C.char) C.int { return C.tide_run_pause(r.engine.h, id) })
}

// Resume continues a paused run, or a stopped or failed one from its checkpoint.
func (r *Run) Resume() error {
	return r.call(func(id *C.char) C.int { return C.tide_run_resume(r.engine.h, id) })
}

// Stop checkpoints, then ends the run.
func (r *Run) Stop() error {
	return r.call(func(id *C.char) C.int { return C.tide_run_stop(r.engine.h, id) })
}

// Cancel ends the workers now, without a checkpoint.
func (r *Run) Cancel() error {
	return r.call(func(id *C.char) C.int { return C.tide_run_cancel(r.engine.h, id) })
}

// Checkpoint saves a checkpoint at the next step boundary.
func (r *Run) Checkpoint() error {
	return r.call(func(id *C.char) C.int { return C.tide_run_checkpoint(r.engine.h, id) })
}

// Set changes a live recipe field: run.Set("optimizer.lr", 5e-4).
func (r *Run) Set(field string, value any) error {
	text, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("tide: %s: %w", field, err)
	}
	f, v := C.CString(field), C.CString(string(text))
	defer C.free(unsafe.Pointer(f))
	defer C.free(unsafe.Pointer(v))
	return r.call(func(id *C.char) C.int { return C.tide_run_set(r.engine.h, id, f, v) })
}

// Metrics returns the run's metrics rows after sinceStep.
func (r *Run) Metrics(sinceStep int64) ([]map[string]any, error) {
	id := C.CString(r.ID)
	defer C.free(unsafe.Pointer(id))
	var rows []map[string]any
	err := takeJSON(func(out **C.char) C.int {
		return C.tide_run_metrics(r.engine.h, id, C.int64_t(sinceStep), out)
	}, &rows)
	return rows, err
}

// Request sends any protocol request (docs/protocol.md) and returns its reply's body,
// for what the typed methods do not cover.
func (e *Engine) Request(kind string, body any) (map[string]any, error) {
	text, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	ckind, cbody := C.CString(kind), C.CString(string(text))
	defer free(ckind)
	defer free(cbody)
	var reply map[string]any
	err = takeJSON(func(out **C.char) C.int { return C.tide_engine_request(e.h, ckind, cbody, out) }, &reply)
	return reply, err
}

// Checkpoint is one committed checkpoint of a run; Dir is on the engine's machine.
type Checkpoint struct {
	Step       int64          `json:"step"`
	Dir        string         `json:"dir"`
	TokensSeen int64          `json:"tokens_seen"`
	Layout     map[string]int `json:"layout"`
	Files      int            `json:"files"`
	Bytes      int64          `json:"bytes"`
	Error      string         `json:"error"`
}

// Checkpoints lists the run's committed checkpoints, oldest first.
func (r *Run) Checkpoints() ([]Checkpoint, error) {
	id := C.CString(r.ID)
	defer C.free(unsafe.Pointer(id))
	var list []Checkpoint
	err := takeJSON(func(out **C.char) C.int { return C.tide_run_checkpoints(r.engine.h, id, out) }, &list)
	return list, err
}

// Export is an export of a checkpoint to Hugging Face files.
type Export struct {
	ID         string `json:"id"`
	Step       int64  `json:"step"`
	Checkpoint string `json:"checkpoint"`
	Out        string `json:"out"`
	Dtype      string `json:"dtype"`
	State      string `json:"state"` // running, done, failed
	Error      string `json:"error"`
	Log        string `json:"log"`
}

// ExportOptions chooses what Export writes; the zero value exports the newest checkpoint
// in F32.
type ExportOptions struct {
	Step    int64  // the checkpoint's step; 0: the newest (no checkpoint is saved at step 0)
	Dtype   string // "F32" (""), "BF16" or "F16"
	Adapter bool   // a LoRA run's adapters alone, as PEFT's adapter directory
}

// Export writes a checkpoint, whatever layout saved it, as Hugging Face safetensors +
// config.json into outDir on the engine's machine (relative: inside the run directory),
// and waits for it until ctx ends (the export goes on in the engine then). A failed
// export is an *Error with the export's own message.
func (r *Run) Export(ctx context.Context, outDir string, opts ExportOptions) (Export, error) {
	var o C.tide_export_options
	C.tide_export_options_init(&o)
	if opts.Step > 0 {
		o.step = C.int64_t(opts.Step)
	}
	if opts.Adapter {
		o.adapter = 1
	}
	o.timeout_ms = 0 // started here, waited for below so that ctx can end the wait
	dtype, out := cstr(opts.Dtype), C.CString(outDir)
	defer free(dtype)
	defer free(out)
	o.dtype = dtype
	var x Export
	err := r.call(func(id *C.char) C.int {
		var text *C.char
		rc := C.tide_checkpoint_export(r.engine.h, id, out, &o, &text)
		if text != nil {
			defer C.tide_string_free(text)
			if e := json.Unmarshal([]byte(C.GoString(text)), &x); e != nil {
				return C.TIDE_ERR_TRANSPORT
			}
		}
		return rc
	})
	for err == nil && x.State == "running" {
		select {
		case <-ctx.Done():
			return x, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		var reply map[string]any
		if reply, err = r.engine.Request("exports", map[string]string{"run": r.ID, "export": x.ID}); err != nil {
			break
		}
		text, _ := json.Marshal(reply["export"])
		err = json.Unmarshal(text, &x)
	}
	if err == nil && x.State == "failed" {
		err = &Error{Code: ErrIO, Message: fmt.Sprintf("%s: %s", x.ID, x.Error)}
	}
	return x, err
}

// Event is one engine event (docs/protocol.md, Events).
type Event struct {
	Run, Kind string
	Seq       int64
	Time      float64
	Step      int64    // metrics: the step; -1 otherwise
	Loss      *float64 // metrics: the loss
	State     State    // state events: the new state
	Snapshot  bool
	Body      map[string]any
}

// Subscription delivers events on C until its context ends or polling fails; then C is
// closed and Err says why (nil when the context ended).
type Subscription struct {
	C    <-chan Event
	err  error
	done chan struct{}
}

// Err is the error that ended the subscription, once C is closed.
func (s *Subscription) Err() error {
	<-s.done
	return s.err
}

// Subscribe delivers the events of a run ("" for all) of a kind ("" for all) until ctx
// ends.
func (e *Engine) Subscribe(ctx context.Context, runID, kind string) (*Subscription, error) {
	r, k := cstr(runID), cstr(kind)
	defer free(r)
	defer free(k)
	var handle *C.tide_subscription
	if err := check(C.tide_subscribe(e.h, r, k, &handle)); err != nil {
		return nil, err
	}
	out := make(chan Event, 64)
	sub := &Subscription{C: out, done: make(chan struct{})}
	go func() {
		defer close(sub.done)
		defer close(out)
		defer C.tide_subscription_close(handle)
		for ctx.Err() == nil {
			var ev C.tide_event
			rc := C.tide_subscription_poll(handle, 100, &ev)
			if rc == C.TIDE_ERR_TIMEOUT {
				continue
			}
			if err := check(rc); err != nil {
				sub.err = err
				return
			}
			event := Event{Run: C.GoString(ev.run), Kind: C.GoString(ev.kind), Seq: int64(ev.seq),
				Time: float64(ev.time), Step: int64(ev.step), Loss: nanToNil(ev.loss), State: State(ev.state),
				Snapshot: ev.snapshot != 0}
			_ = json.Unmarshal([]byte(C.GoString(ev.body_json)), &event.Body)
			select {
			case out <- event:
			case <-ctx.Done():
				return
			}
		}
	}()
	return sub, nil
}
