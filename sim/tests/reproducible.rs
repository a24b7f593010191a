//! A seed gives one run, from one process to the next: tokio's `select!` picks among ready branches with an RNG
//! it seeds from the process (turmoil seeds it only under the `tokio_unstable` cfg), so every `select!` in the
//! code the simulation runs polls in a fixed order (`biased;`). A `select!` without it once made `lease` seed 2
//! end in one of two histories (a client connection ended at the instant shutdown began: gracefully or not).
//! Dependencies that read std's clock (h2 forgets a stream it reset after 1 s of it) read simulated time too
//! (`sim_clock`), so a loaded machine does not change a run; a crash closes the host's connections in one order
//! (`net::HostSockets`), so earlier runs in the process do not either (`one_seed_gives_one_trace_digest` runs each
//! scenario's seed twice in one process).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sim::world::{Settings, World};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `select!` invocations whose first line inside the braces (comments aside) is not `biased;`.
fn unbiased_selects(source: &str) -> Vec<usize> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.trim_end().ends_with("select! {") || line.trim_start().starts_with("//") {
            continue;
        }
        let first = lines[i + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.is_empty() && !l.starts_with("//"));
        if first != Some("biased;") {
            found.push(i + 1);
        }
    }
    found
}

#[test]
fn the_checker_finds_a_select_without_a_fixed_order() {
    let unbiased = "tokio::select! {\n    // why\n    a = x => {}\n}\n";
    let biased = "tokio::select! {\n    // why\n    biased;\n    a = x => {}\n}\n";
    assert_eq!(unbiased_selects(unbiased), vec![1]);
    assert!(unbiased_selects(biased).is_empty());
}

#[test]
fn every_select_in_simulated_code_polls_in_a_fixed_order() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in ["proxy/src", "sim/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found the sources: {files:?}");
    let mut selects = 0;
    let mut offenders = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).expect("readable source");
        selects += source.matches("select! {").count();
        offenders.extend(
            unbiased_selects(&source)
                .into_iter()
                .map(|line| format!("{}:{line}", file.display())),
        );
    }
    assert!(selects >= 10, "found the select!s ({selects})");
    assert!(
        offenders.is_empty(),
        "select! without `biased;` (its order would come from an unseeded RNG): {offenders:?}"
    );
}

#[test]
fn std_clock_on_a_simulated_host_reads_simulated_time() {
    let mut world = World::new(Settings::quiet(1, 1));
    let measured = Arc::new(Mutex::new(None));
    let out = measured.clone();
    world.client("c0", async move {
        #[allow(
            clippy::disallowed_methods,
            reason = "what a dependency such as h2 reads is what this test checks"
        )]
        let std_now = std::time::Instant::now;
        let before = std_now();
        tokio::time::sleep(Duration::from_secs(10)).await;
        *out.lock().unwrap() = Some(std_now() - before);
        Ok(())
    });
    let finished = world.run();
    assert_eq!(finished.sim_error, None);
    let elapsed = measured.lock().unwrap().expect("the client ran");
    // Ten simulated seconds, give or take one simulation step (a step is a few milliseconds); on the machine's
    // clock the run takes a fraction of that.
    assert!(
        elapsed.abs_diff(Duration::from_secs(10)) < Duration::from_millis(50),
        "std's clock moved {elapsed:?} while the host slept 10 s of simulated time"
    );
}
