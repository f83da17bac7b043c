package tide

// The Go binding against an embedded engine and a tided process: a whole run (submit ->
// metrics -> set lr -> checkpoint -> stop) and its errors. Needs TIDE_BIN, TIDE_WORKER_BIN and TIDED_BIN.

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// recipe is the one the C API tests use too.
var recipe string

var work string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tide-go-")
	if err != nil {
		panic(err)
	}
	work = dir
	text, err := os.ReadFile(filepath.Join("..", "..", "tests", "capi", "tiny.lua"))
	if err != nil {
		panic(err)
	}
	recipe = string(text)
	prepare := exec.Command(os.Getenv("TIDE_BIN"), "data", "prepare", "/usr/share/common-licenses/GPL-3",
		"/usr/share/common-licenses/Apache-2.0", "--out", filepath.Join(work, "ds"), "--tokenizer", "bytes",
		"--val-fraction", "0.1")
	if out, err := prepare.CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(work)
	os.Exit(code)
}

func wholeRun(t *testing.T, engine *Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run, err := engine.Submit(Submit{RecipeText: recipe, Workdir: work})
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := engine.Subscribe(ctx, run.ID, "metrics")
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	for e := range metrics.C {
		if e.Step <= last || e.Loss == nil {
			t.Fatalf("metrics event out of order or without a loss: %+v", e)
		}
		last = e.Step
		if last >= 3 {
			break
		}
	}
	if err := run.Set("optimizer.lr", 5e-4); err != nil {
		t.Fatal(err)
	}
	var changedAt int64
	for e := range metrics.C {
		if lr, ok := e.Body["lr"].(float64); ok && math.Abs(lr-5e-4) < 1e-12 {
			changedAt = e.Step
			break
		}
	}
	if changedAt == 0 {
		t.Fatal("no metrics event with the new lr")
	}
	if err := run.Set("model.dim", 128); !IsCode(err, ErrInvalidValue) {
		t.Fatalf("setting a field that is not live: %v", err)
	}
	saved, err := engine.Subscribe(ctx, run.ID, "checkpoint")
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	e := <-saved.C
	if ok, _ := e.Body["ok"].(bool); !ok {
		t.Fatalf("checkpoint event: %+v", e)
	}
	if err := run.Stop(); err != nil {
		t.Fatal(err)
	}
	state, err := run.Wait(ctx)
	if err != nil || state != Stopped {
		t.Fatalf("wait: %v %v", state, err)
	}
	st, err := run.Status()
	if err != nil || st.State != Stopped || st.LastStep <= changedAt || st.Loss == nil {
		t.Fatalf("status: %+v %v", st, err)
	}
	rows, err := run.Metrics(0)
	if err != nil || len(rows) == 0 {
		t.Fatalf("metrics: %v %v", len(rows), err)
	}
	saves, err := run.Checkpoints()
	if err != nil || len(saves) < 2 || saves[len(saves)-1].Step != st.LastStep || saves[0].Layout["dp"] != 1 {
		t.Fatalf("checkpoints: %+v %v", saves, err)
	}
	exported, err := run.Export(ctx, "hf", ExportOptions{Dtype: "BF16"})
	if err != nil || exported.State != "done" || exported.Step != st.LastStep {
		t.Fatalf("export: %+v %v", exported, err)
	}
	if _, err := os.Stat(filepath.Join(st.RunDir, "hf", "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Export(ctx, "/proc/tide-cannot-write-here", ExportOptions{}); !IsCode(err, ErrIO) {
		t.Fatalf("export to an unwritable place: %v", err)
	}
	if _, err := run.Export(ctx, "hf2", ExportOptions{Step: 999999}); !IsCode(err, ErrBadRequest) {
		t.Fatalf("export of a step with no checkpoint: %v", err)
	}
	if _, err := run.Export(ctx, "adapter", ExportOptions{Adapter: true}); !IsCode(err, ErrIO) ||
		!strings.Contains(err.Error(), "without LoRA adapters") {
		t.Fatalf("the adapters of a run without LoRA: %v", err)
	}
	if _, err := engine.Run("no-such-run-3").Status(); !IsCode(err, ErrNotFound) {
		t.Fatalf("unknown run: %v", err)
	}
	if err := run.Pause(); !IsCode(err, ErrInvalidState) {
		t.Fatalf("pausing a stopped run: %v", err)
	}
	t.Logf("%s: lr 5e-4 from step %d, checkpoint at step %v, stopped at %d (loss %.4f), %d checkpoints, exported to %s",
		run.ID, changedAt, e.Body["step"], st.LastStep, *st.Loss, len(saves), exported.Out)
}

func TestEmbedded(t *testing.T) {
	engine, err := OpenEmbedded(EmbeddedOptions{StateDir: filepath.Join(work, "embedded"),
		WorkerExecutable: os.Getenv("TIDE_WORKER_BIN"), CPUSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	wholeRun(t, engine)
	engine.Close()
	if _, err := engine.Info(); !IsCode(err, ErrInvalidHandle) {
		t.Fatalf("a closed engine: %v", err)
	}
}

func TestDaemon(t *testing.T) {
	state := filepath.Join(work, "daemon")
	daemon := exec.Command(os.Getenv("TIDED_BIN"), "--foreground", "--state-dir", state, "--cpu-slots", "1",
		"--no-tcp", "--worker", os.Getenv("TIDE_WORKER_BIN"))
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = daemon.Process.Signal(os.Interrupt)
		_ = daemon.Wait()
	}()
	for i := 0; i < 300; i++ {
		if _, err := os.Stat(filepath.Join(state, "endpoints.json")); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	engine, err := Connect("ipc://"+filepath.Join(state, "command.sock"), ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	wholeRun(t, engine)
}

func TestBadRecipe(t *testing.T) {
	engine, err := OpenEmbedded(EmbeddedOptions{StateDir: filepath.Join(work, "bad"),
		WorkerExecutable: os.Getenv("TIDE_WORKER_BIN")})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	if _, err := engine.Submit(Submit{RecipeText: "return tide.recipe { model = }"}); !IsCode(err, ErrInvalidRecipe) {
		t.Fatalf("a broken recipe: %v", err)
	}
	if _, err := engine.Submit(Submit{}); !IsCode(err, ErrInvalidArgument) {
		t.Fatalf("no recipe: %v", err)
	}
}

func TestPlan(t *testing.T) {
	engine, err := OpenEmbedded(EmbeddedOptions{StateDir: filepath.Join(work, "plan"),
		WorkerExecutable: os.Getenv("TIDE_WORKER_BIN")})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	plan, err := engine.Plan(PlanQuestion{RecipeText: recipe, Overrides: []string{"batch.global_batch=16"},
		Device: "a100-80", Nodes: 2, DevicesPerNode: 8, Top: 3})
	if err != nil {
		t.Fatal(err)
	}
	ranked, _ := plan["ranked"].([]any)
	if plan["schema"] != "tide.plan/1" || len(ranked) == 0 || len(ranked) > 3 {
		t.Fatalf("plan: schema %v, %d ranked", plan["schema"], len(ranked))
	}
	if _, err := engine.Plan(PlanQuestion{RecipeText: recipe, Device: "tpu-v9"}); !IsCode(err, ErrBadRequest) ||
		!strings.Contains(err.Error(), "tpu-v9") {
		t.Fatalf("an unknown device: %v", err)
	}
}
