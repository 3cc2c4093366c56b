//! Every app's command line: `--help` lists its flags and exits 0 without running anything; an
//! unknown flag, a stray argument, a flag without its value or a mode the app lacks exits 2
//! with a message naming it, as do a bad runtime setting and a size the app refuses, before any
//! node starts.

use std::process::Command;
use std::time::Duration;
use treadmarks_tests::Job;

const APPS: [(&str, &str, &[&str]); 11] = [
    ("sor", env!("CARGO_BIN_EXE_sor"), &["--rows", "--cols", "--iterations"]),
    ("jacobi3d", env!("CARGO_BIN_EXE_jacobi3d"), &["--nx", "--ny", "--nz", "--iterations"]),
    ("water", env!("CARGO_BIN_EXE_water"), &["--molecules", "--steps", "also --iterations"]),
    ("barnes", env!("CARGO_BIN_EXE_barnes"), &["--bodies", "--steps", "also --iterations", "--theta"]),
    ("tsp", env!("CARGO_BIN_EXE_tsp"), &["--cities", "--solve-below", "--seed"]),
    ("qsort", env!("CARGO_BIN_EXE_qsort"), &["--keys", "--threshold", "--seed"]),
    ("is", env!("CARGO_BIN_EXE_is"), &["--log2keys", "--log2max", "--iterations", "--seed"]),
    ("fft", env!("CARGO_BIN_EXE_fft"), &["--log2n"]),
    ("lu", env!("CARGO_BIN_EXE_lu"), &["--size", "--block"]),
    ("radix", env!("CARGO_BIN_EXE_radix"), &["--keys", "--bits", "--seed"]),
    ("matmul", env!("CARGO_BIN_EXE_matmul"), &["--size"]),
];

fn run(exe: &str, args: &[&str]) -> treadmarks_tests::Outcome {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    Job::spawn(cmd).wait(Duration::from_secs(60))
}

#[test]
fn help_lists_every_flag_and_runs_nothing() {
    for (name, exe, flags) in APPS {
        let out = run(exe, &["--help"]);
        assert_eq!(out.code, Some(0), "{name} --help: {out:#?}");
        assert!(out.stdout.starts_with(&format!("usage: {name} ")), "{name} --help: {out:#?}");
        assert!(!out.stdout.contains("RESULT app="), "{name} --help ran the app: {out:#?}");
        for flag in flags.iter().chain(&["-n N", "--mode"]) {
            assert!(out.stdout.contains(flag), "{name} --help does not list {flag}: {out:#?}");
        }
        assert_eq!(out.stdout.contains("mp:"), name == "radix", "{name} --help: {out:#?}");
    }
}

#[test]
fn help_wins_over_bad_settings() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_water"));
    cmd.args(["-n", "0", "--help"]).env("TMK_PIN", "2");
    let out = Job::spawn(cmd).wait(Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert!(out.stdout.starts_with("usage: water "), "{out:#?}");
}

#[test]
fn bad_command_lines_are_refused_by_name() {
    let cases: [(&[&str], &str); 5] = [
        (&["--no-such-flag", "1"], "unknown flag --no-such-flag"),
        (&["--mode", "seq", "stray"], "unexpected argument \"stray\""),
        (&["--mode", "seq", "--steps"], "--steps needs a value"),
        (&["--mode", "mpi"], "--mode must be one of dsm, seq, threads, not \"mpi\""),
        (&["--mode", "seq", "--steps", "many"], "bad value \"many\" for --steps"),
    ];
    for (args, message) in cases {
        let out = run(env!("CARGO_BIN_EXE_water"), args);
        assert_eq!(out.code, Some(2), "water {args:?}: {out:#?}");
        assert!(out.stderr.contains(message), "water {args:?} should say {message:?}: {out:#?}");
        assert!(!out.stdout.contains("RESULT app="), "water {args:?} ran: {out:#?}");
    }
    // Values are read and checked before any node starts: no node is left to report a peer gone.
    for (exe, args, message) in [
        (env!("CARGO_BIN_EXE_water"), &["-n", "2", "--steps", "many"][..], "bad value \"many\" for --steps"),
        (
            env!("CARGO_BIN_EXE_lu"),
            &["-n", "2", "--size", "100"][..],
            "lu: --size 100 is not a multiple of --block 32",
        ),
        (
            env!("CARGO_BIN_EXE_radix"),
            &["-n", "2", "--mode", "mp", "--bits", "17"][..],
            "radix: --bits 17 is not from 1 to 16",
        ),
        (
            env!("CARGO_BIN_EXE_tsp"),
            &["-n", "2", "--cities", "40"][..],
            "tsp: --cities 40 is not from 3 to 32",
        ),
        // Sizes whose arrays no machine here holds (seq aborted on the allocation).
        (
            env!("CARGO_BIN_EXE_fft"),
            &["--mode", "seq", "--log2n", "40"][..],
            "fft: --log2n 40: its arrays take 81920.0 GiB",
        ),
        (
            env!("CARGO_BIN_EXE_matmul"),
            &["-n", "2", "--size", "10000000"][..],
            "matmul: --size 10000000: its arrays take",
        ),
        (
            env!("CARGO_BIN_EXE_water"),
            &["--mode", "seq", "--iterations", "1000000000000000"][..],
            "water: --molecules 512 --steps 1000000000000000: its arrays take",
        ),
        (
            env!("CARGO_BIN_EXE_barnes"),
            &["-n", "2", "--bodies", "1000000000"][..],
            "barnes: --bodies 1000000000: its arrays take",
        ),
        (
            env!("CARGO_BIN_EXE_barnes"),
            &["--mode", "seq", "--bodies", "2000000000"][..],
            "barnes: --bodies 2000000000 is more than a tree's i32 slots can index",
        ),
        (
            env!("CARGO_BIN_EXE_jacobi3d"),
            &["--mode", "threads", "--nx", "100000", "--ny", "100000"][..],
            "jacobi3d: --nx 100000 --ny 100000 --nz 64: its arrays take",
        ),
        (
            env!("CARGO_BIN_EXE_tsp"),
            &["--mode", "seq", "--cities", "2"][..],
            "tsp: --cities 2 is not from 3 to 32",
        ),
        (
            env!("CARGO_BIN_EXE_sor"),
            &["-n", "2", "--cols", "1"][..],
            "sor: --cols 1 is not an even number of 2 or more",
        ),
        (
            env!("CARGO_BIN_EXE_sor"),
            &["--mode", "seq", "--cols", "131"][..],
            "sor: --cols 131 is not an even number",
        ),
        (
            env!("CARGO_BIN_EXE_radix"),
            &["--mode", "seq", "--keys", "18446744073709551615"][..],
            "radix: --keys 18446744073709551615 does not fit in a u32",
        ),
    ] {
        let out = run(exe, args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:#?}");
        assert!(out.stderr.contains(message), "{args:?} should say {message:?}: {out:#?}");
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: one message, from one process: {out:#?}");
    }
    let out = run(env!("CARGO_BIN_EXE_sor"), &["--mode", "mp"]);
    assert_eq!(out.code, Some(2), "sor has no mp mode: {out:#?}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sor"));
    cmd.args(["--mode", "seq"]).env("TMK_SPIN_US", "soon");
    let out = Job::spawn(cmd).wait(Duration::from_secs(60));
    assert_eq!(out.code, Some(2), "sor with TMK_SPIN_US=soon: {out:#?}");
    assert!(out.stderr.contains("bad value \"soon\" for TMK_SPIN_US"), "{out:#?}");
}

/// An argument that is not UTF-8 is refused by name, not a panic (`std::env::args` panics on
/// it).
#[test]
fn an_argument_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sor"));
    cmd.args(["--mode", "seq"]).arg(std::ffi::OsStr::from_bytes(b"--rows=\xff"));
    let out = Job::spawn(cmd).wait(Duration::from_secs(60));
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(out.stderr.contains("bad value \"--rows=\u{FFFD}\" for the command line"), "{out:#?}");
    assert!(!out.stderr.contains("panicked"), "{out:#?}");
}

/// water and barnes iterate over time steps: `--iterations` is another name for `--steps`, and
/// the last value given under either name wins.
#[test]
fn iterations_is_another_name_for_steps() {
    for (exe, args, size) in [
        (env!("CARGO_BIN_EXE_water"), &["--molecules", "8", "--iterations", "3"][..], "8 molecules, 3 steps"),
        (
            env!("CARGO_BIN_EXE_water"),
            &["--molecules", "8", "--iterations=5", "--steps", "2"][..],
            "8 molecules, 2 steps",
        ),
        (
            env!("CARGO_BIN_EXE_barnes"),
            &["--bodies", "64", "--steps", "5", "--iterations", "2"][..],
            "64 bodies, 2 steps",
        ),
    ] {
        let out = run(exe, &[&["--mode", "seq"][..], args].concat());
        assert_eq!(out.code, Some(0), "{args:?}: {out:#?}");
        assert!(out.stdout.contains(&format!("detail=\"{size}")), "{args:?} should run {size:?}: {out:#?}");
        assert!(out.stdout.lines().any(|l| l == "PASS"), "{args:?}: {out:#?}");
    }
}

/// A rank of `radix --mode mp` that exits before it joins the mesh fails the start-up at once,
/// by its rank, and rank 0 takes the ranks it started with it (none is left running).
#[test]
fn a_message_passing_rank_lost_at_start_up_is_named_and_nobody_is_left() {
    let tag = format!("apps-cli-mesh-{}", std::process::id());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_radix"));
    cmd.args(["-n", "3", "--mode", "mp", "--keys", "4096"]);
    cmd.env(treadmarks_examples::mesh::TEST_EXIT_ENV, "2").env("APPS_CLI_TAG", &tag);
    // Well inside the mesh's own 60 s wait for a rank.
    let out = Job::spawn(cmd).wait(Duration::from_secs(30));
    assert_eq!(out.code, Some(1), "{out:#?}");
    let message = "rank 2 ended with exit status: 3 before the mesh was complete";
    assert!(out.stderr.contains(message), "should say {message:?}: {out:#?}");
    let left: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("environ")).is_ok_and(|env| {
                env.split(|&b| b == 0).any(|var| var == format!("APPS_CLI_TAG={tag}").as_bytes())
            })
        })
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "ranks left running: {left:?}");
}
