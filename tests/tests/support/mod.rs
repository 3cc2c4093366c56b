//! Running node processes from tests: bounded waits, and every process reaped even when a test
//! fails (each job runs in its own process group, killed whole on timeout or drop).

#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a finished job printed and how it ended.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn assert_pass(&self, scenario: &str) {
        assert!(
            self.code == Some(0) && self.stdout.contains(&format!("PASS {scenario}")),
            "{scenario} failed: {self:#?}"
        );
    }
}

/// A process group that is killed when dropped.
pub struct Job {
    child: Option<Child>,
}

impl Job {
    pub fn spawn(mut cmd: Command) -> Job {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        Job { child: Some(cmd.spawn().expect("spawn test node")) }
    }

    /// Waits at most `timeout`; on timeout kills the group and panics with what it printed.
    pub fn wait(mut self, timeout: Duration) -> Outcome {
        let child = self.child.take().expect("not waited yet");
        let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
        let start = Instant::now();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(timeout) {
            Ok(out) => out.expect("wait for test node"),
            Err(_) => {
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                let out = rx.recv().expect("killed job reaped").expect("output");
                panic!(
                    "job did not finish within {timeout:?}; killed.\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        };
        // Nodes are reaped by their launcher; kill any straggler of the group all the same.
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        Outcome {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: start.elapsed(),
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
        }
    }
}

/// The test node binary.
pub fn testnode() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tmk-testnode"));
    // Parallel tests must not collide on the fixed heap address: each job gets its own.
    cmd.env_remove("TMK_RANK").env_remove("TMK_ROOT").env_remove("TMK_NPROCS");
    cmd
}

/// A heap base unique to this test process and `slot`, so concurrent jobs never collide:
/// 2 GiB slots in `0x5000_0000_0000..0x7000_0000_0000`, inside the 47-bit user address space.
pub fn heap_base(slot: u64) -> String {
    let base = 0x5000_0000_0000u64 + ((std::process::id() as u64 % 256) * 64 + slot % 64) * (1 << 31);
    format!("{base:#x}")
}

/// Runs `scenario` on `n` local nodes.
pub fn run(scenario: &str, n: usize, slot: u64) -> Outcome {
    run_with(scenario, n, slot, &[])
}

/// Runs `scenario` on `n` local nodes with extra environment variables.
pub fn run_with(scenario: &str, n: usize, slot: u64, env: &[(&str, &str)]) -> Outcome {
    let mut cmd = testnode();
    cmd.envs(env.iter().copied());
    cmd.args([scenario, "-n", &n.to_string()])
        .env("TMK_HEAP_SIZE", "64MiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    Job::spawn(cmd).wait(Duration::from_secs(120))
}
