//! The Rust binding against an embedded engine and a tided process: a whole run (submit ->
//! metrics -> set lr -> checkpoint -> stop) and its errors. Needs TIDE_BIN, TIDE_WORKER_BIN and TIDED_BIN.
use std::env;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

use tide::{Engine, Error, ExportOptions, PlanQuestion, State, Submit};

/// The recipe the C API tests use too.
const RECIPE: &str = include_str!("../../../../tests/capi/tiny.lua");

fn tide_bin() -> String {
    env::var("TIDE_BIN").expect("TIDE_BIN: the tide executable")
}

fn worker_bin() -> String {
    env::var("TIDE_WORKER_BIN").expect("TIDE_WORKER_BIN: the tide-worker executable")
}

/// A fresh directory holding the prepared dataset `ds`.
fn workdir(name: &str) -> PathBuf {
    let dir = env::temp_dir().join(format!("tide-rust-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let status = Command::new(tide_bin())
        .args([
            "data",
            "prepare",
            "/usr/share/common-licenses/GPL-3",
            "/usr/share/common-licenses/Apache-2.0",
        ])
        .arg("--out")
        .arg(dir.join("ds"))
        .args(["--tokenizer", "bytes", "--val-fraction", "0.1"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    dir
}

/// A number field of a JSON object text (enough for a test; bodies are JSON for any crate).
fn number(json: &str, key: &str) -> Option<f64> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &json[at..];
    let end = rest.find(|c: char| c == ',' || c == '}').unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

fn whole_run(engine: &Engine, work: &Path) {
    let run = engine
        .submit(&Submit {
            recipe_text: Some(RECIPE.into()),
            workdir: Some(work.to_string_lossy().into()),
            ..Default::default()
        })
        .unwrap();
    let mut metrics = engine.subscribe(Some(run.id()), Some("metrics")).unwrap();
    let minute = Some(Duration::from_secs(60));
    let mut last = 0;
    while last < 3 {
        let e = metrics.poll(minute).unwrap().expect("a metrics event");
        assert!(e.step.unwrap() > last && e.loss.is_some(), "{e:?}");
        last = e.step.unwrap();
    }
    run.set("optimizer.lr", "5e-4").unwrap();
    let changed = loop {
        let e = metrics.poll(minute).unwrap().expect("a metrics event");
        if (number(&e.body_json, "lr").unwrap() - 5e-4).abs() < 1e-12 {
            break e;
        }
    };
    assert_eq!(run.set("model.dim", "128").unwrap_err().code, Error::INVALID_VALUE);
    let mut saved = engine.subscribe(Some(run.id()), Some("checkpoint")).unwrap();
    run.checkpoint().unwrap();
    let checkpoint = saved.poll(minute).unwrap().expect("a checkpoint event");
    assert!(checkpoint.body_json.contains("\"ok\":true"), "{checkpoint:?}");
    run.stop().unwrap();
    assert_eq!(
        run.wait(&State::FINISHED, Some(Duration::from_secs(120))).unwrap(),
        State::Stopped
    );
    let st = run.status().unwrap();
    assert_eq!(st.state, Some(State::Stopped));
    assert!(st.last_step > changed.step.unwrap() && st.loss.is_some(), "{st:?}");
    assert!(run.metrics(0).unwrap().contains("\"loss\""));
    assert_eq!(engine.run("no-such-run-5").status().unwrap_err().code, Error::NOT_FOUND);
    assert_eq!(run.pause().unwrap_err().code, Error::INVALID_STATE);

    let saves = run.checkpoints().unwrap();
    let first_step = number(&checkpoint.body_json, "step").unwrap();
    assert!(saves.contains(&format!("\"step\":{}", first_step as i64)), "{saves}");
    assert!(saves.contains(&format!("\"step\":{}", st.last_step)), "{saves}");
    let options = ExportOptions {
        dtype: Some("BF16".into()),
        timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    };
    let exported = run.export("hf", &options).unwrap();
    assert!(exported.contains("\"state\":\"done\""), "{exported}");
    assert!(Path::new(&st.run_dir).join("hf").join("model.safetensors").is_file());
    let failed = run.export("/proc/tide-cannot-write-here", &options).unwrap_err();
    assert_eq!(failed.code, Error::IO, "{failed}");
    let adapter = ExportOptions {
        adapter: true,
        ..options.clone()
    };
    let refused = run.export("adapter", &adapter).unwrap_err();
    assert!(refused.message.contains("without LoRA adapters"), "{refused}");
    let missing = ExportOptions {
        step: Some(999_999),
        ..options
    };
    assert_eq!(run.export("hf2", &missing).unwrap_err().code, Error::BAD_REQUEST);
    println!(
        "{}: lr 5e-4 from step {}, checkpoint at step {}, stopped at {} (loss {:.4}), exported: {}",
        run.id(),
        changed.step.unwrap(),
        first_step,
        st.last_step,
        st.loss.unwrap(),
        exported
    );
}

#[test]
fn embedded() {
    let work = workdir("embedded");
    let engine = Engine::embedded(&tide::EmbeddedOptions {
        state_dir: Some(work.join("state").to_string_lossy().into()),
        worker_executable: Some(worker_bin()),
        cpu_slots: 1,
        ..Default::default()
    })
    .unwrap();
    whole_run(&engine, &work);
    let bad = engine.submit(&Submit {
        recipe_text: Some("return tide.recipe { model = }".into()),
        ..Default::default()
    });
    assert_eq!(bad.unwrap_err().code, Error::INVALID_RECIPE);
    assert_eq!(
        engine.submit(&Submit::default()).unwrap_err().code,
        Error::INVALID_ARGUMENT
    );
    // The planner through the engine: a plan of the recipe on 2 x 8 A100s, and an
    // unknown device refused by name.
    let question = PlanQuestion {
        recipe_text: Some(RECIPE.into()),
        overrides: vec!["batch.global_batch=16".into()],
        device: Some("a100-80".into()),
        nodes: 2,
        devices_per_node: 8,
        top: 3,
        ..Default::default()
    };
    let plan = engine.plan(&question).unwrap();
    assert!(plan.contains("\"schema\":\"tide.plan/1\""), "{plan}");
    assert!(number(&plan, "layouts_that_fit").unwrap() >= 1.0, "{plan}");
    let unknown = engine
        .plan(&PlanQuestion {
            device: Some("tpu-v9".into()),
            ..question
        })
        .unwrap_err();
    assert_eq!(unknown.code, Error::BAD_REQUEST);
    assert!(unknown.message.contains("tpu-v9"), "{}", unknown.message);
    drop(engine);
    std::fs::remove_dir_all(&work).unwrap();
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

#[test]
fn daemon() {
    let work = workdir("daemon");
    let state = work.join("state");
    let daemon = Daemon(
        Command::new(env::var("TIDED_BIN").expect("TIDED_BIN: the tided executable"))
            .args([
                "--foreground",
                "--cpu-slots",
                "1",
                "--no-tcp",
                "--worker",
                &worker_bin(),
                "--state-dir",
            ])
            .arg(&state)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..300 {
        if state.join("endpoints.json").exists() {
            break;
        }
        sleep(Duration::from_millis(100));
    }
    let endpoint = format!("ipc://{}", state.join("command.sock").display());
    let engine = Engine::connect(Some(&endpoint), &Default::default()).unwrap();
    whole_run(&engine, &work);
    drop(engine);
    drop(daemon);
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn engine_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}
    assert_send_sync::<Engine>();
    assert_send::<tide::Subscription>();
}
