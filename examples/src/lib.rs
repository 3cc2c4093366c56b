//! What the example applications share: argument parsing, timing and the PASS/FAIL verdict.
#![forbid(unsafe_code)]

use std::time::Instant;

/// Arguments left after the runtime took its own (`-n`, `--rank`, `--root`).
#[derive(Debug)]
pub struct Args {
    args: Vec<String>,
}

impl Args {
    /// Wraps the arguments.
    pub fn new(args: &[String]) -> Self {
        Args { args: args.to_vec() }
    }

    /// The value of `--name V` or `--name=V`, parsed, or `default`. Exits with a message if it
    /// does not parse.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        let flag = format!("--{name}");
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            let raw = if *a == flag {
                match it.next() {
                    Some(v) => v.clone(),
                    None => fail_usage(&format!("{flag} needs a value")),
                }
            } else if let Some(v) = a.strip_prefix(&flag).and_then(|r| r.strip_prefix('=')) {
                v.to_string()
            } else {
                continue;
            };
            return raw.parse().unwrap_or_else(|_| fail_usage(&format!("bad value {raw:?} for {flag}")));
        }
        default
    }
}

fn fail_usage(msg: &str) -> ! {
    treadmarks::report(&format!("error: {msg}"));
    std::process::exit(2);
}

/// A wall-clock timer.
#[derive(Debug)]
pub struct Timer(Instant);

impl Timer {
    /// Starts timing.
    pub fn start() -> Self {
        Timer(Instant::now())
    }

    /// Seconds since start.
    pub fn secs(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// Prints the verdict on its own line; returns the process exit status.
pub fn verdict(app: &str, ok: bool, detail: &str) -> std::process::ExitCode {
    if ok {
        println!("{app}: {detail}");
        println!("PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("{app}: {detail}");
        println!("FAIL");
        std::process::ExitCode::FAILURE
    }
}

/// The rows `[begin, end)` of `0..n` that node `me` of `nprocs` works on (contiguous blocks,
/// the first `n % nprocs` nodes one row larger).
pub fn block(n: usize, me: usize, nprocs: usize) -> (usize, usize) {
    let (q, r) = (n / nprocs, n % nprocs);
    let begin = me * q + me.min(r);
    (begin, begin + q + usize::from(me < r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_everything_once() {
        for n in 0..50 {
            for p in 1..6 {
                let mut next = 0;
                for me in 0..p {
                    let (b, e) = block(n, me, p);
                    assert_eq!(b, next);
                    next = e;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn flags_parse_both_ways() {
        let a = Args::new(&["--rows".into(), "12".into(), "--cols=7".into()]);
        assert_eq!(a.get("rows", 0usize), 12);
        assert_eq!(a.get("cols", 0usize), 7);
        assert_eq!(a.get("iterations", 5usize), 5);
    }
}
