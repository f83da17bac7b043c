// Trains the bundled tiny LLaMA for 30 steps through the Go binding: live metrics, an lr
// change at step 10, a checkpoint at step 20, then the end.
//
//	cd examples/go && TIDE_EXAMPLE_DATA=../../data/kjv go run .     (after `make data`)
//
// TIDE_ENDPOINT=tcp://host:7450 drives a running tided instead of an embedded engine.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"tide.dev/tide"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func run() error {
	var engine *tide.Engine
	var err error
	if ep := os.Getenv("TIDE_ENDPOINT"); ep != "" {
		engine, err = tide.Connect(ep, tide.ConnectOptions{})
	} else {
		engine, err = tide.OpenEmbedded(tide.EmbeddedOptions{StateDir: env("TIDE_STATE_DIR", "/tmp/tide-example-go")})
	}
	if err != nil {
		return err
	}
	defer engine.Close()
	workdir, _ := os.Getwd()
	r, err := engine.Submit(tide.Submit{RecipeName: "llama/llama-tiny", Workdir: workdir, Overrides: []string{
		"schedule.steps=30", "eval.every=0", "log_every=5", "data.path=" + env("TIDE_EXAMPLE_DATA", "data/kjv")}})
	if err != nil {
		return err
	}
	fmt.Println("submitted", r.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	metrics, err := engine.Subscribe(ctx, r.ID, "metrics")
	if err != nil {
		return err
	}
	changed, saved, last := false, false, int64(0)
	for e := range metrics.C {
		last = e.Step
		fmt.Printf("step %d loss %.4f\n", e.Step, *e.Loss)
		if e.Step >= 10 && !changed {
			changed = true
			if err := r.Set("optimizer.lr", 1e-3); err != nil {
				return err
			}
			fmt.Println("optimizer.lr set to 1e-3")
		}
		if e.Step >= 20 && !saved {
			saved = true
			if err := r.Checkpoint(); err != nil {
				return err
			}
			fmt.Println("checkpoint requested")
		}
		if e.Step >= 30 {
			break
		}
	}
	if last < 30 {
		return fmt.Errorf("the metrics ended at step %d: %v", last, metrics.Err())
	}
	state, err := r.Wait(ctx)
	if err != nil {
		return err
	}
	st, err := r.Status()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s after %d steps, final loss %.4f\n", st.ID, state, st.LastStep, *st.FinalLoss)
	if state != tide.Completed {
		return fmt.Errorf("the run ended %s", state)
	}
	return nil
}
