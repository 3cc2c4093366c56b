//! Running this bench binary again as a separate launcher (a process can start only one job),
//! with a bound: the child is killed and reaped if it does not finish in time, and on any
//! early return of ours.

use crate::Result;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The prefix of the line a re-executed launcher prints its JSON on.
pub const JSON_TAG: &str = "TMK_BENCH_JSON";

/// Kills and reaps the child on drop unless it was reaped already.
struct Reaper(Option<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs this executable again, with the same arguments, without the `TMK_*` variables of a node
/// and with `env` added; waits at most `timeout`; returns its standard output. Its standard
/// error goes to ours.
///
/// The child is told our pid as `TMK_LAUNCHER_PID`, which `Tmk::startup` reads to make the
/// child die with us (`PR_SET_PDEATHSIG`) even if we are killed; it then passes its own pid to
/// the nodes it spawns.
pub fn run_self(env: &[(&str, &str)], timeout: Duration) -> Result<String> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1));
    for var in ["TMK_RANK", "TMK_ROOT", "TMK_NPROCS", "TMK_LAUNCHER_PID"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied())
        .env("TMK_LAUNCHER_PID", std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut reaper = Reaper(Some(cmd.spawn()?));
    let child = reaper.0.as_mut().expect("just spawned");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    // Nodes the child spawns inherit the pipe: read on a thread and wait for the text bounded.
    std::thread::spawn(move || {
        let mut text = String::new();
        let r = stdout.read_to_string(&mut text).map(|_| text);
        let _ = tx.send(r);
    });
    let deadline = Instant::now() + timeout;
    let status: ExitStatus = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            return Err(format!("the re-executed launcher did not finish within {timeout:?}; killed").into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    reaper.0 = None;
    if !status.success() {
        return Err(format!("the re-executed launcher failed: {status}").into());
    }
    let wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
    Ok(rx.recv_timeout(wait).map_err(|_| "no output from the re-executed launcher")??)
}

/// The JSON object after [`JSON_TAG`] in `stdout`, if any.
pub fn tagged_json(stdout: &str) -> Option<&str> {
    stdout.lines().find_map(|l| l.strip_prefix(JSON_TAG)).map(str::trim)
}
