//! Trains the bundled tiny LLaMA for 30 steps through the Rust binding: live metrics, an
//! lr change at step 10, a checkpoint at step 20, then the end.
//!
//!     cd examples/rust && TIDE_EXAMPLE_DATA=../../data/kjv cargo run --offline   (after `make data`)
//!
//! TIDE_ENDPOINT=tcp://host:7450 drives a running tided instead of an embedded engine.
use std::env;
use std::time::Duration;

use tide::{Engine, State, Submit};

fn main() -> Result<(), tide::Error> {
    let engine = match env::var("TIDE_ENDPOINT") {
        Ok(ep) => Engine::connect(Some(&ep), &Default::default())?,
        Err(_) => Engine::embedded(&tide::EmbeddedOptions {
            state_dir: Some(env::var("TIDE_STATE_DIR").unwrap_or_else(|_| "/tmp/tide-example-rust".into())),
            ..Default::default()
        })?,
    };
    let data = env::var("TIDE_EXAMPLE_DATA").unwrap_or_else(|_| "data/kjv".into());
    let run = engine.submit(&Submit {
        recipe_name: Some("llama/llama-tiny".into()),
        overrides: vec![
            "schedule.steps=30".into(),
            "eval.every=0".into(),
            "log_every=5".into(),
            format!("data.path={data}"),
        ],
        ..Default::default()
    })?;
    println!("submitted {}", run.id());
    let mut metrics = engine.subscribe(Some(run.id()), Some("metrics"))?;
    let (mut changed, mut saved) = (false, false);
    while let Some(e) = metrics.poll(Some(Duration::from_secs(300)))? {
        let step = e.step.unwrap_or(0);
        println!("step {step} loss {:.4}", e.loss.unwrap_or(f64::NAN));
        if step >= 10 && !changed {
            changed = true;
            run.set("optimizer.lr", "1e-3")?;
            println!("optimizer.lr set to 1e-3");
        }
        if step >= 20 && !saved {
            saved = true;
            run.checkpoint()?;
            println!("checkpoint requested");
        }
        if step >= 30 {
            break;
        }
    }
    let state = run.wait(&State::FINISHED, Some(Duration::from_secs(300)))?;
    let st = run.status()?;
    println!(
        "{} {} after {} steps, final loss {:.4}",
        st.id,
        state.name(),
        st.last_step,
        st.final_loss.unwrap_or(f64::NAN)
    );
    if state != State::Completed {
        std::process::exit(1);
    }
    Ok(())
}
